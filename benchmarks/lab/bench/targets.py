"""The targets the project set for its committed runs (``benchmarks/results/catalogue.toml``'s ``[[targets]]``, read
into :class:`Target` records) and their verdicts: every ratio judged by the conservative end of its range, and no
verdict from runs that cannot make a claim (:class:`~lab.bench.stats.RatioRange`). How a target is measured is
one of :data:`MEASURES`; which runs it reads, its threshold and its wording are data."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.bench.committed import CommittedRun, committed_smollm2_steps
from lab.bench.stats import RatioRange, speedup_range


@dataclass(frozen=True)
class Target:
    """One target: what it asks (``what``), how it is measured (``measure``, a key of :data:`MEASURES`), the
    threshold and how a ratio must compare with it, and the runs it reads (catalogue keys, series expanded)."""

    id: str
    what: str
    measure: str
    reads: tuple[str, ...] = ()
    threshold: float | None = None
    compare: str = ">="
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """``ranges overlap``: label -> the runs of one command whose ranges must overlap."""
    variant: str | None = None
    """The rollout measures: the length variant read (``fixed`` or ``ragged``)."""
    backend: str | None = None
    """``update MFU``: only this backend's rows (all when ``None``)."""
    smollm2: tuple[Path, int, int] | None = None
    """``step speed-up``: also the SmolLM2 recipe's steps ``first``-``last`` in this folder (vLLM's against HF's)."""

    def read(self, runs: Mapping[str, CommittedRun]) -> list[CommittedRun]:
        """The runs this target reads, in its order."""
        return [runs[key] for key in self.reads]


@dataclass(frozen=True)
class Verdict:
    """A target with what the committed runs measured and its verdict (or why the runs make no claim)."""

    target: Target
    measured: str
    verdict: str

    def row(self) -> dict[str, str]:
        return {"target": self.target.what, "measured": self.measured, "verdict": self.verdict}


def _joined(verdicts: dict[str, str]) -> str:
    """One verdict when all agree, else each with what it is about."""
    if len(set(verdicts.values())) == 1:
        return next(iter(verdicts.values()))
    return "; ".join(f"{what}: {verdict}" for what, verdict in verdicts.items())


def _described(ratios: Sequence[tuple[str, RatioRange]]) -> str:
    """Each ratio with its range, named when there are several."""
    if len(ratios) == 1:
        return ratios[0][1].describe()
    return "; ".join(f"{name}: {ratio.describe()}" for name, ratio in ratios)


def _overlap(ranges: Sequence[RatioRange]) -> str:
    """``met`` when every range shares a stretch with every other, else ``missed``; no verdict from a non-claim."""
    not_claims = [r.caveat() for r in ranges if not r.is_claim]
    if not_claims:
        return not_claims[0]
    return "met" if max(r.low for r in ranges) <= min(r.high for r in ranges) else "missed"


def _step_ratios(target: Target, runs: Sequence[CommittedRun]) -> list[tuple[str, RatioRange]]:
    """The GRPO-step ratio (HF step / vLLM step) of each run read, by file name; then the SmolLM2 steps if asked."""
    ratios = [(run.name, run.step_ratio()) for run in runs]
    if target.smollm2:
        folder, first, last = target.smollm2
        ratios.append((f"SmolLM2-135M steps {first}-{last}",
                       committed_smollm2_steps(folder, first, last)["speedup_range"]))
    return ratios


def _step_speedup(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    ratios = _step_ratios(target, target.read(runs))
    return _described(ratios), _joined({name: r.verdict(target.threshold, target.compare) for name, r in ratios})


def _rollout_speedup(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    rows = [h for run in target.read(runs) for h in run.rollout_headlines() if h.variant == target.variant]
    return ("; ".join(f"{h.model}, {h.best}: {h.speedup.describe()}" for h in rows),
            _joined({h.model: h.speedup.verdict(target.threshold, target.compare) for h in rows}))


def _roofline_distance(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    rows = [h for run in target.read(runs) for h in run.rollout_headlines()
            if h.variant == target.variant and h.x_roofline]
    if not rows:
        return "-", "not measured"
    within = any(h.x_roofline <= target.threshold if target.compare == "<=" else h.x_roofline >= target.threshold
                 for h in rows)
    return (", ".join(f"{h.x_roofline:.1f}x the roofline time ({h.best}, median)" for h in rows),
            "met" if within else "missed")


def _engine_in_trainer(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    """vLLM's generate inside the trainer over the same engine timed in a fresh process beside it (``fresh_engine``):
    separate processes at separate times, never interleaved."""
    ratios = [(run.name, speedup_range(run.step["backends"]["vllm"]["vllm_generate_s"],
                                       run.step["fresh_engine"]["generate_s"], interleaved=False))
              for run in target.read(runs)]
    return _described(ratios), _joined({name: r.verdict(target.threshold, target.compare) for name, r in ratios})


def _update_mfu(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    rows = [r for run in target.read(runs) for r in run.split() if target.backend in (None, r["backend"])]
    if not rows:
        return "-", "not measured"
    stems = [r["file"].removesuffix(".json") for r in rows]
    shared = os.path.commonprefix(stems).rpartition("_")[0]  # the file names' common start, up to an underscore
    best = max(r["update MFU"] for r in rows)
    listed = ", ".join(f"{stem.removeprefix(shared).lstrip('_') or stem} {r['backend']} {r['update MFU']:.1%}"
                       for stem, r in zip(stems, rows))
    return f"{best:.1%} at best ({listed}; median steps)", "met" if best >= target.threshold else "missed"


def _ranges_overlap(target: Target, runs: Mapping[str, CommittedRun]) -> tuple[str, str]:
    ratios = {label: [runs[key].step_ratio() for key in keys] for label, keys in target.groups.items()}
    measured = "; ".join(f"{label}: " + " and ".join(f"{r.low:.2f}x..{r.high:.2f}x" for r in rs)
                         for label, rs in ratios.items())
    return measured, _joined({label: _overlap(rs) for label, rs in ratios.items()})


MEASURES: dict[str, Callable[[Target, Mapping[str, CommittedRun]], tuple[str, str]]] = {
    "rollout speed-up": _rollout_speedup,
    "step speed-up": _step_speedup,
    "roofline distance": _roofline_distance,
    "engine in the trainer": _engine_in_trainer,
    "update MFU": _update_mfu,
    "ranges overlap": _ranges_overlap,
}
"""How each kind of target is measured: (target, the committed runs by key) -> (what the runs it reads measured, the
verdict)."""


def judge(target: Target, runs: Mapping[str, CommittedRun]) -> Verdict:
    """The target's verdict from the committed runs (``runs``: catalogue key -> run)."""
    return Verdict(target, *MEASURES[target.measure](target, runs))


def run_verdicts(target: Target, runs: Mapping[str, CommittedRun]) -> list[dict[str, str | int]]:
    """For a ``step speed-up`` target: one row per run it reads, with the run's lengths, micro-batch, whether vLLM's
    importance-sampling correction was on (TRL's default where a file predates the setting), the step ratio with
    its range, and its own verdict."""
    rows = []
    for run in target.read(runs):
        correction = run.step["backends"]["vllm"].get("settings", {}).get("vllm_importance_sampling_correction", True)
        ratio = run.step_ratio()
        rows.append({"file": run.name, "lengths": run.workload,
                     "micro-batch": run.results["profile"]["per_device_train_batch_size"],
                     "correction": "on" if correction else "off", "HF / vLLM step": ratio.describe(),
                     "needed": f"{target.threshold:.1f}x", "verdict": ratio.verdict(target.threshold, target.compare)})
    return rows
