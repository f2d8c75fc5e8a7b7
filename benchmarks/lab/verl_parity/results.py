"""The committed verl runs of ``benchmarks/verl``, as records with their provenance, and the numbers
notebook 07 prints from them: means before and after, how many standard errors an accuracy change is, verl's step
against TRL colocate's on the same experiment.

>>> results = read_verl_results()
>>> results.verl_version, results.merged.step, results.smollm2_checkpoint_step
('0.9.1', 20, 14)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import runs
from lab.committed import Provenance, read_committed
from lab.committed import BENCHMARKS_DIR
from lab.results import SMOLLM2_DIR, smollm2_run
from lab.verl_parity.check import RunCheck, check_run
from lab.verl_parity.metrics import side_by_side, validation_metric, validation_scores
from lab.verl_parity.parity import read_metrics

VERL_DIR = BENCHMARKS_DIR / "verl"
VERL_RESULTS = VERL_DIR / "results.json"
"""``benchmarks/verl/run.py``'s record of every phase: environment, the tiny run, merge, deploy, TRL, SmolLM2."""
VERL_RUNS = VERL_DIR / "results"
"""verl's files of each run (``tiny``, ``smollm2``, ``smollm2-first-call``), TRL's of the tiny experiment (``trl``)."""
TRL_TINY_METRICS = VERL_RUNS / "trl" / runs.METRICS_FILE
"""TRL's colocated run of the tiny experiment, which the verl ``tiny`` run is compared with."""
TRL_SMOLLM2 = SMOLLM2_DIR
"""TRL's colocated run of the SmolLM2 recipe (notebook 03's GPU results, read by :func:`lab.results.smollm2_run`),
which the verl ``smollm2`` run is compared with."""
FIRST_CALL = "smollm2-first-call"
"""The SmolLM2 call stopped by its time limit after its validation before training: the "before" of SmolLM2."""


@dataclass(frozen=True)
class StepParts:
    """verl's median step after its warm-up steps, by part, in seconds (None: verl did not log the part)."""

    step_s: float
    generation_s: float
    old_log_prob_s: float
    ref_s: float | None
    update_actor_s: float
    update_weights_s: float

    LABELS = {"step_s": "whole step", "generation_s": "generation", "old_log_prob_s": "old log-probs",
              "ref_s": "reference log-probs", "update_actor_s": "actor update",
              "update_weights_s": "weight sync to vLLM"}

    @classmethod
    def from_median(cls, median: dict[str, float]) -> StepParts:
        """From ``step_timings(...)["median"]`` (verl's ``timing_s/*`` names)."""
        return cls(median["step_s"], median["gen"], median["old_log_prob"], median.get("ref"),
                   median["update_actor"], median["update_weights"])

    def describe(self, *parts: str) -> str:
        """``"old log-probs 1.94 s, actor update 6.24 s"`` for the named fields (default: all that were logged)."""
        names = parts or tuple(name for name in self.LABELS if getattr(self, name) is not None)
        return ", ".join(f"{self.LABELS[name]} {getattr(self, name):.2f} s" for name in names)


@dataclass(frozen=True)
class MergedModel:
    """The tiny run's checkpoint merged by verl's model merger, then exported and served the notebook 05 way."""

    step: int
    merge_seconds: float
    verified: bool
    """The merged folder passed ``verify_export`` and its tensors are the served ones."""
    export_ok: bool
    same_tensors: bool
    tensors_changed: int
    """Tensors that training changed beyond bf16 rounding, of ``tensors_compared``."""
    tensors_compared: int
    server_start_s: float
    reply: str
    answer_key: str
    answered: bool


@dataclass(frozen=True)
class VerlResults:
    """What ``benchmarks/verl/run.py`` recorded of verl's runs on one GPU (the run files are checked separately:
    :func:`committed_check`)."""

    verl_version: str
    merged: MergedModel
    tiny_step: StepParts
    smollm2_step: StepParts
    smollm2_checkpoint_step: int
    provenance: Provenance


@dataclass(frozen=True)
class VerlConfiguration:
    """verl on SmolLM2 in one configuration on one GPU (``benchmarks/verl/run.py smollm2`` or ``smollm2-best``): the
    median step by part after verl's warm-up steps, and its start apart from its steps."""

    name: str
    step: StepParts
    steps_logged: int
    steps_asked: int
    wall_s: float
    """verl's whole run: Ray, the workers, vLLM's start, every step, the shutdown (or the stop at the time limit)."""
    steps_s: float
    """The sum of the logged steps' ``timing_s/step``."""
    step_range: tuple[float, float]
    """The fastest and slowest step of those in the median (after verl's warm-up steps)."""
    settings: dict[str, Any]
    """The export's overrides, then every override passed after them, last value per key (a later Hydra value wins)."""
    reasons: dict[str, str]
    """Why each override after the export's was passed."""

    @property
    def startup_s(self) -> float:
        """The run's wall time less its logged steps: verl's start, its shutdown, and a step cut off by a time limit."""
        return self.wall_s - self.steps_s


def smollm2_configurations(path: str | Path = VERL_RESULTS) -> dict[str, VerlConfiguration]:
    """The committed SmolLM2 runs of verl by phase name: ``smollm2`` (overrides chosen to fit a device call) and, where
    they ran, ``smollm2_best`` (verl's own defaults and performance settings, ``run.py best_settings``) and
    ``smollm2_best_padded`` (the same but padding removal off, a mistake of ``best_settings`` until 2026-12-02)."""
    body = read_committed(path)
    runs = {}
    for name in ("smollm2", "smollm2_best_padded", "smollm2_best"):
        section = body.get(name)
        if not section or not section.get("timings", {}).get("median"):
            continue
        attempt = next(a for a in reversed(section["attempts"]) if "seconds" in a)
        overrides = attempt["forced_overrides"]
        runs[name] = VerlConfiguration(
            name=name, step=StepParts.from_median(section["timings"]["median"]),
            steps_logged=section["steps_completed"], steps_asked=section["steps_asked"], wall_s=attempt["seconds"],
            steps_s=sum(row["step_s"] for row in section["timings"]["per_step"]),
            step_range=_step_range(section["timings"]),
            settings={**section["export"]["overrides"], **{o["key"].lstrip("+"): o["value"] for o in overrides}},
            reasons={o["key"].lstrip("+"): o["reason"] for o in overrides})
    return runs


def _step_range(timings: dict[str, Any]) -> tuple[float, float]:
    in_median = set(timings["steps_in_median"])
    kept = [row["step_s"] for row in timings["per_step"] if row["step"] in in_median]
    return min(kept), max(kept)


def configuration_changes(before: VerlConfiguration, after: VerlConfiguration,
                          ignore: Sequence[str] = ("trainer.",)) -> list[tuple[str, Any, Any, str]]:
    """The settings ``after`` runs with that ``before`` did not: (key, before's value, after's, after's reason); the
    bookkeeping keys (``ignore`` prefixes: step counts, folders) left out."""
    keys = [k for k in after.settings if not k.startswith(tuple(ignore))]
    return [(k, before.settings.get(k, "verl's default"), after.settings[k], after.reasons.get(k, "the export's"))
            for k in keys if before.settings.get(k) != after.settings[k]]


def configurations_table(runs: dict[str, VerlConfiguration], labels: dict[str, str]) -> str:
    """verl's runs side by side as a Markdown table: each part's median, the steps' min..max, the steps logged and the
    start apart from the steps; ``labels`` names each run's column (by phase name)."""
    names = list(labels)
    lines = ["| | " + " | ".join(labels[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    for field, label in StepParts.LABELS.items():
        values = [getattr(runs[n].step, field) for n in names]
        lines.append(f"| {label}, median | " + " | ".join("not logged" if v is None else f"{v:.2f} s"
                                                          for v in values) + " |")
    lines.append("| whole step, min..max | " + " | ".join(
        f"{min(runs[n].step_range):.2f}..{max(runs[n].step_range):.2f} s" for n in names) + " |")
    lines.append("| steps logged (of asked) | " + " | ".join(
        f"{runs[n].steps_logged} of {runs[n].steps_asked}" for n in names) + " |")
    lines.append("| start and stop, not steps | " + " | ".join(f"{runs[n].startup_s:.0f} s" for n in names) + " |")
    return "\n".join(lines)


def changes_table(before: VerlConfiguration, after: VerlConfiguration) -> str:
    """:func:`configuration_changes` as a Markdown table (setting, before, after, why)."""
    lines = ["| setting | before | after | why |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {old} | {new} | {why} |" for key, old, new, why in configuration_changes(before, after)]
    return "\n".join(lines)


def read_verl_results(path: str | Path = VERL_RESULTS) -> VerlResults:
    """The committed ``benchmarks/verl/results.json`` as a record."""
    body = read_committed(path)
    merge, deploy = body["merge"], body["deploy"]
    change = deploy["change_from_base"]
    merged = MergedModel(step=merge["step"], merge_seconds=merge["seconds"],
                         verified=body["merged_checkpoint_verified"], export_ok=deploy["verify_export"]["ok"],
                         same_tensors=deploy["same_tensors"],
                         tensors_changed=change["tensors_changed_beyond_bf16_rounding"],
                         tensors_compared=change["tensors_compared"], server_start_s=deploy["server_start_s"],
                         reply=deploy["chat"]["reply"], answer_key=deploy["chat"]["answer_key"],
                         answered=deploy["answered"])
    command = "; ".join("python benchmarks/verl/run.py " + " ".join(call["argv"]) for call in body["calls"])
    return VerlResults(body["verl_pin"], merged, StepParts.from_median(body["tiny"]["timings"]["median"]),
                       StepParts.from_median(body["smollm2"]["timings"]["median"]),
                       body["smollm2"]["checkpoint"]["step"],
                       Provenance(command, body["updated"], body["device"].split(" (")[0].split(": ")[-1], Path(path)))


def committed_check(run: str) -> RunCheck:
    """:func:`check_run` of a committed verl run (``"tiny"``, ``"smollm2"``) with the export it ran."""
    folder = VERL_RUNS / run
    return check_run(folder, folder / "export_export.json", folder / "export_verl_overrides.yaml")


def committed_side_by_side(run: str) -> dict[str, Any]:
    """:func:`side_by_side` of a committed verl run and the TRL colocate run of the same experiment."""
    trl = runs.read_metrics(TRL_TINY_METRICS) if run == "tiny" else list(smollm2_run(TRL_SMOLLM2).metrics)
    return side_by_side(read_metrics(VERL_RUNS / run / runs.METRICS_FILE), trl)


def step_ratio(comparison: dict[str, Any], part: str = "step") -> float:
    """verl's median ``part`` as a multiple of TRL's, from :func:`side_by_side`."""
    return comparison["parts"][part]["verl_s"] / comparison["parts"][part]["trl_s"]


@dataclass(frozen=True)
class Change:
    """One quantity before and after training."""

    before: float
    after: float


def reward_change(records: Sequence[dict[str, Any]], parts: int) -> tuple[int, Change]:
    """The mean training reward of the first and of the last ``1/parts`` of the steps, and how many steps each is."""
    rewards = [r["reward"] for r in records]
    k = max(1, len(rewards) // parts)
    return k, Change(statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:]))


def smollm2_validation(check: RunCheck, names: Sequence[str] = ("acc", "format")) -> dict[str, Change]:
    """SmolLM2's validation means by name: before training (the first call's step 0: the second call skipped it)
    and after (the checked run's last validation)."""
    first = validation_scores(read_metrics(VERL_RUNS / FIRST_CALL / runs.METRICS_FILE))
    last = max(check.validation)
    return {name: Change(validation_metric(first, name)[0], validation_metric(check.validation, name)[last])
            for name in names}


def trl_smollm2_greedy_before(folder: str | Path = TRL_SMOLLM2) -> float:
    """Notebook 03's greedy accuracy of the base SmolLM2-135M on the same test prompts (``grpo_lab.evaluation``)."""
    return smollm2_run(folder).before["all"]["greedy"]


def difference_z(before: float, after: float, n: int) -> float:
    """How many standard errors ``after - before`` is, for two shares each measured on the same ``n`` prompts as
    independent evaluations: ``(p2 - p1) / sqrt((p1 (1 - p1) + p2 (1 - p2)) / n)``.

    >>> round(difference_z(0.0525, 0.0925, 400), 1)
    2.2
    """
    spread = math.sqrt((before * (1 - before) + after * (1 - after)) / n)
    return (after - before) / spread
