"""Readers of the committed bench results (``benchmarks/results/``): each returns small typed records or rows with
the file's provenance (command, date, device), and every ratio with its range; a ratio from too few runs, or from
backends that did not alternate, is reported as no claim rather than given a verdict (:class:`~grpo_lab.bench.stats.
RatioRange`). Every committed bench file is named once, in :data:`COMMITTED`. The project's targets for these files,
and their verdicts, are in :mod:`grpo_lab.bench.targets`."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_lab.bench.results import SCHEMA, check_results, paired_step_ratios, step_ratio
from grpo_lab.bench.roofline import DATASHEET_RATES, extra_forwards, model_cost, update_mfu
from grpo_lab.bench.stacks import Stacks
from grpo_lab.bench.stats import RatioRange, Spread, median, speedup_range
from grpo_lab.committed import Provenance, read_committed
from grpo_lab.deprecation import moved_names
from grpo_lab.errors import ConfigError
from grpo_lab.paths import RESULTS_DIR
from grpo_lab.results import SMOLLM2_DIR, smollm2_run
from grpo_lab.rollout.compare import SHAPES

COMMITTED = {
    "cpu": ("cpu", "bench_tiny"),
    "rollout 0.5b": ("h200", "bench_seed_qwen2.5-0.5b"),
    "rollout 1.5b": ("h200", "bench_seed_qwen2.5-1.5b"),
    "grpo step first": ("h200", "grpo_step_seed_qwen2.5-0.5b"),
    "grpo step fixed": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed"),
    "grpo step ragged": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged"),
    "grpo step interleaved 1": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_1"),
    "grpo step interleaved 2": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_2"),
    "grpo step interleaved 3": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_3"),
    "grpo step ragged interleaved": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_interleaved_1"),
    "grpo step interleaved 4": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_4"),
    "grpo step ragged interleaved 2": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_interleaved_2"),
    "grpo step interleaved 5": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_5"),
    "grpo step interleaved 6": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_6"),
    "grpo step ragged interleaved 3": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_interleaved_3"),
    "grpo step interleaved 7": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_interleaved_7"),
    "grpo step fixed no correction": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection"),
    "grpo step ragged no correction": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_nocorrection"),
    "grpo step fixed micro-batch 128": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_mb128"),
    "grpo step ragged interleaved 4": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_interleaved_4"),
    "grpo step ragged no correction 2": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_nocorrection_2"),
    "rollout 0.5b 5 repeats": ("h200", "bench_seed_qwen2.5-0.5b_repeats5"),
    "grpo step fixed micro-batch 64": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_mb64"),
    "grpo step fixed micro-batch 128 2": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_mb128_2"),
    "grpo step ragged micro-batch 128": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_mb128"),
    "grpo step fixed micro-batch 128 3": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_mb128_3"),
    "grpo step fixed micro-batch 128 4": ("h200", "grpo_step_seed_qwen2.5-0.5b_fixed_mb128_4"),
    "grpo step ragged micro-batch 128 2": ("h200", "grpo_step_seed_qwen2.5-0.5b_ragged_mb128_2"),
}
"""The committed bench runs: key -> (folder under ``benchmarks/results``, file stem; ``.json`` and ``.png``)."""


def committed_file(key: str, folder: str | Path | None = None, suffix: str = ".json") -> Path:
    """The path of a committed run (:data:`COMMITTED`), in ``folder`` when given (a copy of its folder)."""
    subfolder, stem = COMMITTED[key]
    return Path(folder or RESULTS_DIR / subfolder) / f"{stem}{suffix}"


def _provenance(path: Path, data: dict[str, Any]) -> Provenance:
    """Where a bench file's numbers come from: its command, the day it was created, the device it names."""
    return Provenance(command=data.get("command", ""), date=str(data.get("created", "")),
                      device=data.get("environment", {}).get("device", {}).get("name", ""), path=path)


def _bench_files(folder: str | Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """This bench's results files in ``folder`` (other JSON files skipped), checked."""
    for path in sorted(Path(folder).glob("*.json")):
        data = read_committed(path)
        if data.get("schema") == SCHEMA:
            yield path, check_results(data)


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


def committed_grpo_steps(folder: str | Path = RESULTS_DIR / "h200") -> list[StepRatio]:
    """Every committed GRPO-step file with both backends."""
    rows = []
    for path, data in _bench_files(folder):
        step = data.get("grpo_step") or {}
        if {"hf", "vllm"} <= set(step.get("backends", {})):
            rows.append(StepRatio(model=data["model"].get("shape") or data["model"]["path"],
                                  workload=step.get("workload", "fixed"),
                                  hf=Spread.of(step["backends"]["hf"]["step_s"]),
                                  vllm=Spread.of(step["backends"]["vllm"]["step_s"]), ratio=step_ratio(step),
                                  provenance=_provenance(path, data)))
    return rows


def committed_paired_step_ratios(folder: str | Path = RESULTS_DIR / "h200") -> list[dict[str, Any]]:
    """One row per committed GRPO-step file whose backends alternated: the ratio's range as the verdicts read it
    (slowest vLLM step over fastest HF step .. the reverse) beside the ratios round by round, where a drift of the
    machine during the run cancels (:func:`~grpo_lab.bench.stats.paired_ratios`)."""
    rows = []
    for path, data in _bench_files(folder):
        step = data.get("grpo_step") or {}
        paired = paired_step_ratios(step) if {"hf", "vllm"} <= set(step.get("backends", {})) else None
        if paired is not None:
            ratio = step_ratio(step)
            rows.append({"file": path.name, "workload": step.get("workload", "fixed"),
                         "range (extremes)": f"{ratio.low:.2f}x..{ratio.high:.2f}x",
                         "round by round": f"{paired.min:.2f}x..{paired.max:.2f}x",
                         "rounds": " ".join(f"{v:.2f}" for v in paired.values)})
    return rows


def committed_rollout_table(folder: str | Path = RESULTS_DIR / "h200") -> str:
    """A table of every rollout result in a folder of committed runs: this module's ``*.json`` and the older
    ``grpo-lab rollout --json`` files (one backend, no variants); each ratio with its range over the rounds."""
    lines = [f"{'file':<36}{'model':<31}{'variant':<9}{'config':<13}{'new tokens':>11}{'tok/s':>9}{'vs hf':>8}"
             f"{'range':>14}"]
    for path in sorted(Path(folder).glob("*.json")):
        data = read_committed(path)  # two schemas: this bench's and grpo-lab rollout's
        if data.get("schema") == SCHEMA and data.get("rollout"):
            for variant, block in data["rollout"]["variants"].items():
                per_token = {n: [t / k for t, k in zip(c["times_s"], c["new_tokens"])]
                             for n, c in block["configs"].items()}
                for name, r in block["configs"].items():
                    ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
                    bounds = speedup_range(per_token["hf"], per_token[name], interleaved=True) if (
                        name != "hf" and "hf" in per_token) else None
                    span = f"{bounds.low:.2f}..{bounds.high:.2f}x" if bounds else ""
                    lines.append(f"{path.name:<36}{data['model']['path']:<31}{variant:<9}{name:<13}"
                                 f"{median(r['new_tokens']):>11,.0f}{r['tokens_per_s']:>9,.0f}{ratio:>7.2f}x{span:>14}")
        elif "results" in data and "settings" in data:  # grpo-lab rollout --json: one call, no variants
            settings = data["settings"]
            model = (f"{settings['shape']} (random)" if settings.get("shape")
                     else str(settings.get("model") or "the tiny model"))
            for name, r in data["results"].items():
                lines.append(f"{path.name:<36}{model:<31}{'as run':<9}{name:<13}{r['new_tokens']:>11,}"
                             f"{r['tokens_per_s']:>9,.0f}{'-':>8}")
    return "\n".join(lines)


def committed_grpo_table(folder: str | Path = RESULTS_DIR / "h200") -> str:
    """A table of every GRPO-step result in a folder of committed runs: per backend the median step (min..max),
    generation and update, and the step ratio's range with its caveat."""
    files = list(_bench_files(folder))
    width = max((len(path.name) + 2 for path, _ in files), default=41)
    lines = [f"{'file':<{width}}{'model':<14}{'backend':<9}{'step s':>8}{'min..max':>14}{'gen s':>8}"
             f"{'update s':>9}  vs hf"]
    for path, data in files:
        step = data.get("grpo_step") or {}
        for name, r in step.get("backends", {}).items():
            m, spread = r["median"], Spread.of(r["step_s"])
            ratio = step_ratio(step).describe() if name == "vllm" and "hf" in step["backends"] else ""
            lines.append(f"{path.name:<{width}}{data['model'].get('shape') or data['model']['path']:<14}{name:<9}"
                         f"{m['step_s']:>8.2f}{f'{spread.min:.2f}..{spread.max:.2f}':>14}{m['generation_s']:>8.2f}"
                         f"{m['update_s']:>9.2f}  {ratio}")
    return "\n".join(lines)


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


def committed_rollout_headlines(folder: str | Path = RESULTS_DIR / "h200") -> list[RolloutHeadline]:
    """One :class:`RolloutHeadline` per committed bench file and length variant (the configs alternated round by
    round, so each ratio's range pairs the repeats' extremes: seconds per new token)."""
    rows = []
    for path, data in _bench_files(folder):
        for variant, block in (data.get("rollout") or {}).get("variants", {}).items():
            configs = block["configs"]
            best = max((name for name in configs if name != "hf"), key=lambda name: configs[name]["tokens_per_s"])
            per_token = {n: [t / k for t, k in zip(c["times_s"], c["new_tokens"])] for n, c in configs.items()}
            rows.append(RolloutHeadline(
                model=data["model"].get("shape") or data["model"]["path"], variant=variant,
                param_bytes=data.get("roofline", {}).get("model_cost", {}).get("param_bytes"),
                hf_tokens_per_s=configs["hf"]["tokens_per_s"], best=best,
                best_tokens_per_s=configs[best]["tokens_per_s"],
                speedup=speedup_range(per_token["hf"], per_token[best], interleaved=True),
                x_roofline=configs[best].get("x_roofline_time"),
                vllm_tokens_per_s={n: c["tokens_per_s"] for n, c in configs.items() if n != "hf"},
                vllm_median_s={n: c["median_s"] for n, c in configs.items() if n != "hf"},
                prefix_gain=(configs["vllm+prefix"]["tokens_per_s"] / configs["vllm"]["tokens_per_s"]
                             if {"vllm", "vllm+prefix"} <= set(configs) else None),
                provenance=_provenance(path, data)))
    return rows


def committed_ragged_headlines(folder: str | Path = RESULTS_DIR / "h200") -> dict[str, RolloutHeadline]:
    """The ragged-length headline of each model from its newest committed rollout file (a model re-run with more
    repeats keeps its older file beside the new one)."""
    newest: dict[str, RolloutHeadline] = {}
    for row in committed_rollout_headlines(folder):
        if row.variant == "ragged" and (row.model not in newest
                                        or row.provenance.date > newest[row.model].provenance.date):
            newest[row.model] = row
    return newest


ENGINE_PROFILE = RESULTS_DIR / "h200" / "profile_vllm_generate_fixed_interleaved_5.txt"
"""py-spy's samples (50 a second) inside vLLM's ``LLM.generate`` during the GRPO-step bench of ``grpo step interleaved
5``, the trainer's engine in the trainer's thread, each stack cut to 12 frames below the call (:class:`Stacks`)."""
ENGINE_PARTS = (
    ("scheduling the next step (Scheduler.schedule)", "Scheduler.schedule ("),
    ("recording each request's new token (Scheduler.update_from_output)", "Scheduler.update_from_output ("),
    ("outputs for the caller (OutputProcessor.process_outputs)", "OutputProcessor.process_outputs ("),
    ("  of which the sampled tokens' log-probs (LogprobsProcessor)", "LogprobsProcessor.update_from_output ("),
    ("the model's forward on the device (execute_model)", "UniProcExecutor.execute_model ("),
    ("sampling on the device (sample_tokens)", "UniProcExecutor.sample_tokens ("),
)
"""The parts of vLLM 0.26's engine step as :func:`committed_engine_profile` reports them: (label, the function whose
inclusive samples it counts). The first five are separate calls of one step; the log-probs are inside the outputs."""


DEFERRED_CORRECTION_SINCE = datetime(2026, 12, 1, 17, 56, 18, tzinfo=timezone.utc)
"""When GRPOLabTrainer began taking vLLM's correction from the loss's own forward (commit 095862f) wherever
:func:`grpo_lab.trainer.defers_correction` holds, as it does on every bench profile (one generation per optimizer
step). The bench records it (``settings.deferred_correction``) since the run after; older files say it by their date."""


def deferred_correction(block: dict[str, Any], backend: str, created: str) -> bool:
    """Whether a committed GRPO-step backend ran without TRL's old-log-prob forward: as recorded, else from the date."""
    recorded = block.get("settings", {}).get("deferred_correction")
    if recorded is not None:
        return bool(recorded)
    return backend == "vllm" and datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z") >= DEFERRED_CORRECTION_SINCE


def committed_grpo_split(folder: str | Path = RESULTS_DIR / "h200") -> list[dict[str, Any]]:
    """One row per committed GRPO-step result and backend: the median step, its split (what the trainer timed; the
    files written before the split existed have only generation / reward / update), and the update's MFU against the
    H200's dense bf16 peak, computed the same way for every file (:func:`update_mfu`, the gpu profile's beta, the
    forwards the trainer ran: :func:`deferred_correction`, and no old log-probs with the correction off)."""
    rows = []
    peak = DATASHEET_RATES["NVIDIA H200"].matmul_flops_per_s
    for path, data in _bench_files(folder):
        step = data.get("grpo_step")
        if not step or "backends" not in step or not data["model"].get("shape"):
            continue
        cost = model_cost(SHAPES[data["model"]["shape"]] | {"model_type": "qwen2"}, data["model"]["dtype"])
        prompt = step.get("max_prompt_length") or data["profile"].get("prompt_tokens")
        hf = step["backends"].get("hf", {}).get("median", {}).get("step_s")
        for name, block in step["backends"].items():
            m = block["median"]
            beta = block.get("settings", {}).get("beta", 0.04)
            deferred = deferred_correction(block, name, data["created"])
            correction = block.get("settings", {}).get("vllm_importance_sampling_correction", True)  # TRL's default
            row = {"file": path.name, "workload": step.get("workload", "fixed"), "backend": name,
                   **{key.removesuffix("_s"): round(value, 2) for key, value in m.items() if key.endswith("_s")},
                   "tokens": round(m["mean_completion_tokens"]),
                   "vs hf": round(hf / m["step_s"], 2) if hf else None,
                   "update MFU": round(update_mfu(block, cost, prompt, step["completions_per_step"], peak,
                                                  extra_forwards(name, beta, deferred, correction))["mfu"], 3)}
            rows.append(row)
    return rows


def committed_host_work(folder: str | Path = RESULTS_DIR / "h200") -> list[dict[str, Any]]:
    """One row per committed GRPO-step file and backend that recorded the host beside each step
    (:class:`~grpo_lab.bench.grpo_step.HostCounters`): the median step, the process's CPU seconds over all threads in
    it and their share of the step's wall time, Python's garbage-collection pauses and the device allocator's requests
    to the driver (medians over the timed steps)."""
    rows = []
    for path, data in _bench_files(folder):
        for name, block in ((data.get("grpo_step") or {}).get("backends") or {}).items():
            host = block.get("host")
            if not host:
                continue
            step, cpu = median(block["step_s"]), median(host["host_cpu_s"])
            rows.append({"file": path.name, "workload": data["grpo_step"].get("workload", "fixed"), "backend": name,
                         "step s": round(step, 2), "host CPU s": round(cpu, 2), "CPU / step": round(cpu / step, 2),
                         "GC pause s": round(median(host["gc_pause_s"]), 3),
                         "driver allocations": round(median(host["driver_allocations"]))})
    return rows


def committed_engine_profile(path: str | Path = ENGINE_PROFILE) -> list[dict[str, Any]]:
    """Where vLLM's generate spent the host's time inside the trainer (:data:`ENGINE_PROFILE`): each of
    :data:`ENGINE_PARTS` as a share of the samples, then the rest of the engine's loop. Shares, not seconds: py-spy
    missed some samples, and the ones it took are spread the same way."""
    stacks = Stacks.read(path)
    rows = [{"part": label, "share": stacks.share(function)} for label, function in ENGINE_PARTS]
    counted = sum(row["share"] for row in rows if not row["part"].startswith(" "))
    rows.append({"part": "the rest of the engine's loop", "share": 1.0 - counted})
    return rows


def committed_smollm2_steps(folder: str | Path = SMOLLM2_DIR, first: int = 3, last: int = 6) -> dict[str, Any]:
    """The committed SmolLM2-135M GRPO step on the H200 (:func:`grpo_lab.results.smollm2_run` of ``folder``), vLLM
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
            "vllm_run_step_s": vllm_run["step_s"], "vllm_run_steps": vllm_run["steps"], "device": run.device}


__getattr__ = moved_names(__name__, moved={name: f"grpo_lab.bench.targets:{name}" for name in (
    "GRPO_STEP_TARGETS", "MFU_TARGET", "REPEAT_TARGET", "INTERLEAVED_RUNS", "NO_CORRECTION_RUNS", "RAGGED_RUNS",
    "LOW_END_TARGETS", "RAGGED_RUN", "ENGINE_RUN", "PERFORMANCE_TARGETS", "committed_grpo_step_targets",
    "committed_targets", "targets_markdown")})
