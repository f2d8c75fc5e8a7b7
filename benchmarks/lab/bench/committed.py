"""One committed results file as a record (:class:`CommittedRun`): what it measured, read back as rows and small
records, each ratio with its range (a ratio from too few runs, or from backends that did not alternate, says it is
no claim: :class:`~lab.bench.stats.RatioRange`). :func:`~lab.bench.catalogue.read_catalogue` builds one per
file the catalogue names; notebooks print these, never the JSON."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from lab.bench.results import SCHEMA, check_results, paired_step_ratios, step_ratio
from lab.bench.roofline import DATASHEET_RATES, extra_forwards, model_cost, update_mfu
from lab.bench.stacks import Stacks
from lab.bench.stats import RatioRange, Spread, median, speedup_range
from lab.bench.workload import SHAPES
from lab.committed import Provenance, read_committed
from lab.results import SMOLLM2_DIR, smollm2_run

ROLLOUT_HEADER = (f"{'file':<36}{'model':<31}{'variant':<9}{'config':<13}{'new tokens':>11}{'tok/s':>9}{'vs hf':>8}"
                  f"{'range':>14}")
"""The header of :meth:`CommittedRun.rollout_lines`' columns."""
DEFERRED_CORRECTION_SINCE = datetime(2026, 12, 1, 17, 56, 18, tzinfo=timezone.utc)
"""When GRPOLabTrainer began taking vLLM's correction from the loss's own forward (commit 095862f) wherever
:func:`grpo_lab.trainer.defers_correction` holds, as it does on every bench profile (one generation per optimizer
step). The bench records it (``settings.deferred_correction``) since the run after; older files say it by their date."""
ENGINE_PARTS = (
    ("scheduling the next step (Scheduler.schedule)", "Scheduler.schedule ("),
    ("recording each request's new token (Scheduler.update_from_output)", "Scheduler.update_from_output ("),
    ("outputs for the caller (OutputProcessor.process_outputs)", "OutputProcessor.process_outputs ("),
    ("  of which the sampled tokens' log-probs (LogprobsProcessor)", "LogprobsProcessor.update_from_output ("),
    ("the model's forward on the device (execute_model)", "UniProcExecutor.execute_model ("),
    ("sampling on the device (sample_tokens)", "UniProcExecutor.sample_tokens ("),
)
"""The parts of vLLM 0.26's engine step as :func:`engine_profile` reports them: (label, the function whose inclusive
samples it counts). The first five are separate calls of one step; the log-probs are inside the outputs."""


@dataclass(frozen=True)
class StepRatio:
    """One committed GRPO-step comparison: each backend's timed steps and the ratio HF step / vLLM step."""

    model: str
    workload: str
    hf: Spread
    vllm: Spread
    ratio: RatioRange
    provenance: Provenance

    def describe(self) -> str:
        return (f"{self.model}, {self.workload}: HF generate {self.hf.describe()}, vLLM colocate "
                f"{self.vllm.describe()}; ratio {self.ratio.describe()}")


@dataclass(frozen=True)
class RolloutHeadline:
    """One committed rollout file and length variant: HF's rate, the fastest vLLM config, its speed-up over HF with
    the range over the repeats, its distance from the roofline time, and what prefix caching changed."""

    model: str
    variant: str
    param_bytes: int | None
    hf_tokens_per_s: float
    best: str
    best_tokens_per_s: float
    speedup: RatioRange
    x_roofline: float | None
    vllm_tokens_per_s: dict[str, float]
    vllm_median_s: dict[str, float]
    prefix_gain: float | None
    provenance: Provenance


def deferred_correction(block: dict[str, Any], backend: str, created: str) -> bool:
    """Whether a committed GRPO-step backend ran without TRL's old-log-prob forward: as recorded, else from the date."""
    recorded = block.get("settings", {}).get("deferred_correction")
    if recorded is not None:
        return bool(recorded)
    return backend == "vllm" and datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z") >= DEFERRED_CORRECTION_SINCE


def rollout_command(settings: dict[str, Any]) -> str:
    """The command of a ``grpo-lab rollout --json`` file, rebuilt from the settings it recorded (its output file left
    out); on a shape, ``python -m lab.rollout``. Empty without settings."""
    if not settings:
        return ""
    flags = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in settings.items()
                     if value is not None and name != "json")
    return f"{'python -m lab.rollout' if settings.get('shape') else 'grpo-lab rollout'} {flags}"


@dataclass(frozen=True)
class CommittedRun:
    """One committed results file: ``python -m lab.bench``'s (schema ``grpo-lab.bench/1``, checked) or a single
    ``grpo-lab rollout --json`` call's; its catalogue key, its path and where its numbers came from."""

    key: str
    path: Path
    results: dict[str, Any]
    provenance: Provenance

    @classmethod
    def read(cls, key: str, path: str | Path, folder_device: str = "") -> CommittedRun:
        """The file in ``path``; ``folder_device``: the device the catalogue names for its folder, for files that do
        not record their own (a ``grpo-lab rollout --json`` call records neither its device nor its command)."""
        path = Path(path)
        data = read_committed(path)
        if data.get("schema") == SCHEMA:
            check_results(data)
        device = data.get("environment", {}).get("device", {}).get("name", "") or folder_device
        command = data.get("command") or rollout_command(data.get("settings", {}))
        return cls(key, path, data, Provenance(command=command, date=str(data.get("created", "")), device=device,
                                               path=path))

    @property
    def is_bench(self) -> bool:
        """A file of this bench (the other kind: one ``grpo-lab rollout --json`` call, one backend, no variants)."""
        return self.results.get("schema") == SCHEMA

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def plot(self) -> Path:
        """The plot :func:`~lab.bench.results.save_results` drew beside the JSON."""
        return self.path.with_suffix(".png")

    @property
    def model(self) -> str:
        return self.results["model"].get("shape") or self.results["model"]["path"]

    @property
    def step(self) -> dict[str, Any]:
        """The ``grpo_step`` block (empty where the run had no GRPO step)."""
        return self.results.get("grpo_step") or {}

    @property
    def workload(self) -> str:
        return self.step.get("workload", "fixed")

    @property
    def compares_backends(self) -> bool:
        """Whether the GRPO step ran with both HF generate and vLLM colocate."""
        return {"hf", "vllm"} <= set(self.step.get("backends", {}))

    def step_ratio(self) -> RatioRange:
        """HF step time over vLLM colocate step time, with its range (:func:`~lab.bench.results.step_ratio`)."""
        return step_ratio(self.step)

    def step_comparison(self) -> StepRatio | None:
        """Both backends' timed steps and their ratio, or ``None`` for a run without both."""
        if not self.compares_backends:
            return None
        backends = self.step["backends"]
        return StepRatio(model=self.model, workload=self.workload, hf=Spread.of(backends["hf"]["step_s"]),
                         vllm=Spread.of(backends["vllm"]["step_s"]), ratio=self.step_ratio(),
                         provenance=self.provenance)

    def paired_row(self) -> dict[str, Any] | None:
        """For a run whose backends alternated: the ratio's range as the verdicts read it (slowest vLLM step over
        fastest HF step .. the reverse) beside the ratios round by round, where a drift of the machine during the
        run cancels (:func:`~lab.bench.stats.paired_ratios`); else ``None``."""
        paired = paired_step_ratios(self.step) if self.compares_backends else None
        if paired is None:
            return None
        ratio = self.step_ratio()
        return {"file": self.name, "workload": self.workload,
                "range (extremes)": f"{ratio.low:.2f}x..{ratio.high:.2f}x",
                "round by round": f"{paired.min:.2f}x..{paired.max:.2f}x",
                "rounds": " ".join(f"{v:.2f}" for v in paired.values)}

    def split(self) -> list[dict[str, Any]]:
        """One row per GRPO-step backend: the median step, its split (what the trainer timed; files written before the
        split existed have only generation / reward / update), and the update's MFU against the H200's dense bf16
        peak, computed the same way for every file (:func:`~lab.bench.roofline.update_mfu`, the gpu profile's
        beta, the forwards the trainer ran: :func:`deferred_correction`, and no old log-probs with the correction
        off). Random-weight shapes only (a real model's cost is not in the file)."""
        step = self.step
        if "backends" not in step or not self.results["model"].get("shape"):
            return []
        data, peak = self.results, DATASHEET_RATES["NVIDIA H200"].matmul_flops_per_s
        cost = model_cost(SHAPES[data["model"]["shape"]] | {"model_type": "qwen2"}, data["model"]["dtype"])
        prompt = step.get("max_prompt_length") or data["profile"].get("prompt_tokens")
        hf = step["backends"].get("hf", {}).get("median", {}).get("step_s")
        rows = []
        for name, block in step["backends"].items():
            m, settings = block["median"], block.get("settings", {})
            forwards = extra_forwards(name, settings.get("beta", 0.04),
                                      deferred_correction(block, name, data["created"]),
                                      settings.get("vllm_importance_sampling_correction", True))  # TRL's default
            rows.append({"file": self.name, "workload": self.workload, "backend": name,
                         **{key.removesuffix("_s"): round(value, 2) for key, value in m.items() if key.endswith("_s")},
                         "tokens": round(m["mean_completion_tokens"]),
                         "vs hf": round(hf / m["step_s"], 2) if hf else None,
                         "update MFU": round(update_mfu(block, cost, prompt, step["completions_per_step"], peak,
                                                        forwards)["mfu"], 3)})
        return rows

    def host_work(self) -> list[dict[str, Any]]:
        """One row per GRPO-step backend that recorded the host beside each step
        (:class:`~lab.bench.grpo_step.HostCounters`): the median step, the process's CPU seconds over all its
        threads and their share of the step's wall time, Python's garbage-collection pauses and the device
        allocator's requests to the driver (medians over the timed steps)."""
        rows = []
        for name, block in (self.step.get("backends") or {}).items():
            host = block.get("host")
            if host:
                step, cpu = median(block["step_s"]), median(host["host_cpu_s"])
                rows.append({"file": self.name, "workload": self.workload, "backend": name,
                             "step s": round(step, 2), "host CPU s": round(cpu, 2), "CPU / step": round(cpu / step, 2),
                             "GC pause s": round(median(host["gc_pause_s"]), 3),
                             "driver allocations": round(median(host["driver_allocations"]))})
        return rows

    def rollout_headlines(self) -> list[RolloutHeadline]:
        """One :class:`RolloutHeadline` per length variant of the rollout part (the configs alternated round by round,
        so each ratio's range pairs the repeats' extremes: seconds per new token)."""
        rows = []
        variants = (self.results.get("rollout") or {}).get("variants", {}) if self.is_bench else {}
        for variant, block in variants.items():
            configs = block["configs"]
            best = max((name for name in configs if name != "hf"), key=lambda name: configs[name]["tokens_per_s"])
            per_token = {n: [t / k for t, k in zip(c["times_s"], c["new_tokens"])] for n, c in configs.items()}
            rows.append(RolloutHeadline(
                model=self.model, variant=variant,
                param_bytes=self.results.get("roofline", {}).get("model_cost", {}).get("param_bytes"),
                hf_tokens_per_s=configs["hf"]["tokens_per_s"], best=best,
                best_tokens_per_s=configs[best]["tokens_per_s"],
                speedup=speedup_range(per_token["hf"], per_token[best], interleaved=True),
                x_roofline=configs[best].get("x_roofline_time"),
                vllm_tokens_per_s={n: c["tokens_per_s"] for n, c in configs.items() if n != "hf"},
                vllm_median_s={n: c["median_s"] for n, c in configs.items() if n != "hf"},
                prefix_gain=(configs["vllm+prefix"]["tokens_per_s"] / configs["vllm"]["tokens_per_s"]
                             if {"vllm", "vllm+prefix"} <= set(configs) else None),
                provenance=self.provenance))
        return rows

    def rollout_lines(self) -> list[str]:
        """The file's rollout results as lines under :data:`ROLLOUT_HEADER`: per variant and config, the new tokens,
        tokens/s, the ratio over HF and its range over the rounds; a single ``grpo-lab rollout`` call as run."""
        lines = []
        if self.is_bench and self.results.get("rollout"):
            for variant, block in self.results["rollout"]["variants"].items():
                per_token = {n: [t / k for t, k in zip(c["times_s"], c["new_tokens"])]
                             for n, c in block["configs"].items()}
                for name, r in block["configs"].items():
                    ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
                    bounds = speedup_range(per_token["hf"], per_token[name], interleaved=True) if (
                        name != "hf" and "hf" in per_token) else None
                    span = f"{bounds.low:.2f}..{bounds.high:.2f}x" if bounds else ""
                    lines.append(f"{self.name:<36}{self.results['model']['path']:<31}{variant:<9}{name:<13}"
                                 f"{median(r['new_tokens']):>11,.0f}{r['tokens_per_s']:>9,.0f}{ratio:>7.2f}x{span:>14}")
        elif "results" in self.results and "settings" in self.results:
            settings = self.results["settings"]
            model = (f"{settings['shape']} (random)" if settings.get("shape")
                     else str(settings.get("model") or "the tiny model"))
            for name, r in self.results["results"].items():
                lines.append(f"{self.name:<36}{model:<31}{'as run':<9}{name:<13}{r['new_tokens']:>11,}"
                             f"{r['tokens_per_s']:>9,.0f}{'-':>8}")
        return lines

    def grpo_lines(self, width: int) -> list[str]:
        """The GRPO step per backend, a file column ``width`` wide: the median step (min..max), generation, update,
        and the step ratio's range with its caveat."""
        lines = []
        for name, r in self.step.get("backends", {}).items():
            m, spread = r["median"], Spread.of(r["step_s"])
            ratio = self.step_ratio().describe() if name == "vllm" and "hf" in self.step["backends"] else ""
            lines.append(f"{self.name:<{width}}{self.model:<14}{name:<9}{m['step_s']:>8.2f}"
                         f"{f'{spread.min:.2f}..{spread.max:.2f}':>14}{m['generation_s']:>8.2f}{m['update_s']:>9.2f}"
                         f"  {ratio}")
        return lines


def grpo_header(width: int) -> str:
    """The header of :meth:`CommittedRun.grpo_lines`' columns."""
    return (f"{'file':<{width}}{'model':<14}{'backend':<9}{'step s':>8}{'min..max':>14}{'gen s':>8}{'update s':>9}"
            "  vs hf")


def engine_profile(path: str | Path) -> list[dict[str, Any]]:
    """Where vLLM's generate spent the host's time (py-spy's stacks in ``path``, :class:`~lab.bench.stacks.
    Stacks`): each of :data:`ENGINE_PARTS` as a share of the samples, then the rest of the engine's loop. Shares, not
    seconds: py-spy missed some samples, and the ones it took are spread the same way."""
    stacks = Stacks.read(path)
    rows = [{"part": label, "share": stacks.share(function)} for label, function in ENGINE_PARTS]
    counted = sum(row["share"] for row in rows if not row["part"].startswith(" "))
    rows.append({"part": "the rest of the engine's loop", "share": 1.0 - counted})
    return rows


def committed_smollm2_steps(folder: str | Path = SMOLLM2_DIR, first: int = 3, last: int = 6) -> dict[str, Any]:
    """The committed SmolLM2-135M GRPO step (:func:`lab.results.smollm2_run` of ``folder``), vLLM
    colocate against HF ``generate`` over the same steps: ``run.py`` times HF's steps ``first``-``last``
    (``hf_generate``); the vLLM run's steps ``first``-``last`` come from its per-step records, so both columns
    cover the same steps (the vLLM mean over the whole run, with completions that shorten as it learns, is
    ``vllm_run_step_s``)."""
    run = smollm2_run(folder)
    window = [r for r in run.metrics if first <= r["step"] <= last]
    if not window:
        raise ConfigError(f"{folder}: no steps {first}-{last} in the vLLM run's metrics")
    vllm = {key: statistics.mean(r[key] for r in window) for key in ("step_time", "timing/generation_s")}
    hf, vllm_run = run.step_seconds["hf_generate"], run.step_seconds["vllm_colocate"]
    return {"steps": (first, last), "vllm_step_s": vllm["step_time"], "vllm_generation_s": vllm["timing/generation_s"],
            "hf_step_s": hf["step_s"], "hf_generation_s": hf["generation_s"],
            "speedup": hf["step_s"] / vllm["step_time"],
            "speedup_range": speedup_range([hf["step_s"]], [r["step_time"] for r in window], interleaved=False),
            "vllm_run_step_s": vllm_run["step_s"], "vllm_run_steps": vllm_run["steps"], "provenance": run.provenance}
