"""The targets the project set itself for its committed H200 runs, which runs each target reads, and their verdicts:
every ratio judged by the conservative end of its range, and no verdict from files that cannot make a claim
(:class:`~grpo_lab.bench.stats.RatioRange`). The readers of the files are in :mod:`grpo_lab.bench.committed`."""

from __future__ import annotations

from pathlib import Path

from grpo_lab.bench.committed import (
    committed_file,
    committed_grpo_split,
    committed_grpo_steps,
    committed_ragged_headlines,
    committed_smollm2_steps,
)
from grpo_lab.bench.results import load_results, step_ratio
from grpo_lab.bench.stats import RatioRange, speedup_range
from grpo_lab.paths import RESULTS_DIR
from grpo_lab.results import SMOLLM2_DIR

GRPO_STEP_TARGETS = (
    ("vLLM generate inside the trainer at most 1.2x the same engine in a fresh process", 1.2, "<="),
    ("GRPO step, fixed lengths: vLLM colocate at least 2x HF generate", 2.0, ">="),
    ("GRPO step, ragged lengths: vLLM colocate at least 3.3x HF generate (the write-up's ratio)", 3.3, ">="),
)
"""The targets set for the colocated GRPO step on one H200: (what, threshold, how the ratio must compare)."""
MFU_TARGET = ("update MFU at least 35 %", 0.35)
VLLM_MFU_TARGET = ("update MFU at least 30 %, fixed lengths, the vLLM path (issue 26)", 0.30)
REPEAT_TARGET = "repeated runs of the same command: their GRPO-step ratio ranges overlap"
INTERLEAVED_RUNS = ("grpo step interleaved 1", "grpo step interleaved 2", "grpo step interleaved 3",
                    "grpo step interleaved 4", "grpo step interleaved 5", "grpo step interleaved 6",
                    "grpo step interleaved 7")
"""One command (fixed lengths), the backends alternating step by step: runs 1 and 2 back to back on one machine, run 3
on another machine of the same kind a session later, with flat log-probs (``trainer.extract_flat_logprobs``), run 4 on
a third machine with the same engine timed in a fresh process beside it (``fresh_engine``) and the host's work per step
(``host``); runs 5 and 6 on a fourth machine, the device's memory cache kept between steps (no ``empty_cache`` at the
hand-over), run 5 under py-spy (:data:`ENGINE_PROFILE`); run 7 on a fifth machine, generation with the garbage collector
paused (``trainer.collection_paused``), beside :data:`NO_CORRECTION_RUNS`."""
NO_CORRECTION_RUNS = ("grpo step fixed no correction", "grpo step ragged no correction",
                      "grpo step ragged no correction 2")
"""The step with vLLM's importance-sampling correction off (``TrainConfig.vllm_importance_sampling_correction``): the
loss HF generate's path computes, the colocated engine sampling without log-probs
(``trainer.reads_sampling_logprobs``). Fixed and ragged lengths on run 7's machine, just before it; ragged again on a
sixth machine, just after ragged run 4 (the correction on)."""
RAGGED_RUNS = ("grpo step ragged interleaved", "grpo step ragged interleaved 2", "grpo step ragged interleaved 3",
               "grpo step ragged interleaved 4", "grpo step ragged micro-batch 128", "grpo step ragged micro-batch 128 2")
"""The ragged-length step, the backends alternating step by step: run 2 with length-grouped micro-batches
(``trainer.groups_by_length``), on run 4's machine; run 3 also with the cache kept, on runs 5-6's machine; run 4 with
the generation's garbage collector paused, on a sixth machine, just before the second ragged run without the
correction. The last two in micro-batches of 128 as :data:`MICRO_BATCH_RUNS` (session 11, two machines, each just
before a fixed run in micro-batches of 128)."""
MICRO_BATCH_RUNS = ("grpo step fixed micro-batch 128", "grpo step fixed micro-batch 64",
                    "grpo step fixed micro-batch 128 2", "grpo step fixed micro-batch 128 3",
                    "grpo step fixed micro-batch 128 4")
"""The fixed step with TRL's default correction, the generation batch of 512 completions in micro-batches of 128 (4
per optimizer step) or 64 (8) instead of the seed profile's 32 (16), vLLM's share lowered to 0.25 / 0.45 to make
room for the larger activations beside two trainers (``--per-device-train-batch-size``, ``--train-option
vllm_gpu_memory_utilization=...``). The course's ``gpu`` profile asks for 128 and lets the memory planner fit it. The
first three on the sixth machine, in that order; 128 again on a seventh (3) and an eighth (4), run 4 with the deferred
correction's metrics kept on the device (``trainer.masked_statistic``)."""
LOW_END_TARGETS = (
    ("GRPO step's low end, fixed lengths: vLLM colocate at least 1.6x HF generate (issue 26)", 1.6,
     (*INTERLEAVED_RUNS, NO_CORRECTION_RUNS[0], *MICRO_BATCH_RUNS)),
    ("GRPO step's low end, ragged lengths: vLLM colocate at least 2x HF generate (issue 26)", 2.0,
     (*RAGGED_RUNS, *NO_CORRECTION_RUNS[1:])),
)
"""Issue 26's targets for the ratio's conservative end: (what, threshold, the runs it is read from, each with its own
verdict)."""
RAGGED_RUN = RAGGED_RUNS[-1]
"""The ragged target's file: the newest ragged run."""
ENGINE_RUN = "grpo step interleaved 4"
"""The engine target's file: the newest run that timed the trainer's engine against a fresh one on the same machine."""


def _overlap(ranges: list[RatioRange]) -> str:
    """``met`` when every range shares a stretch with every other, else ``missed``; no verdict from a non-claim."""
    not_claims = [r.caveat() for r in ranges if not r.is_claim]
    if not_claims:
        return not_claims[0]
    return "met" if max(r.low for r in ranges) <= min(r.high for r in ranges) else "missed"


def committed_grpo_step_targets(folder: str | Path = RESULTS_DIR / "h200") -> list[dict[str, str]]:
    """Each of :data:`GRPO_STEP_TARGETS`, :data:`MFU_TARGET` and :data:`REPEAT_TARGET` with what the committed step
    files measured and a verdict from the ratio's conservative end, or why the files make no claim. Fixed lengths:
    the interleaved runs (:data:`INTERLEAVED_RUNS`), each with its own verdict where they differ; ragged lengths:
    :data:`RAGGED_RUN`."""
    fixed = load_results(committed_file(ENGINE_RUN, folder))["grpo_step"]
    fresh = fixed["fresh_engine"]
    in_trainer = fixed["backends"]["vllm"]["vllm_generate_s"]
    # separate processes at separate times: never interleaved
    engine = speedup_range(in_trainer, fresh["generate_s"], interleaved=False)
    runs = [(committed_file(key, folder).name, step_ratio(load_results(committed_file(key, folder))["grpo_step"]))
            for key in INTERLEAVED_RUNS]
    (what, threshold, how), (fixed_what, fixed_threshold, _), (ragged_what, ragged_threshold, _) = GRPO_STEP_TARGETS
    ragged = step_ratio(load_results(committed_file(RAGGED_RUN, folder))["grpo_step"])
    rows = [{"target": what, "measured": engine.describe(), "verdict": engine.verdict(threshold, how)},
            {"target": fixed_what, "measured": "; ".join(f"{name}: {ratio.describe()}" for name, ratio in runs),
             "verdict": _verdicts(runs, fixed_threshold)},
            {"target": ragged_what, "measured": ragged.describe(), "verdict": ragged.verdict(ragged_threshold)}]
    files = {committed_file(key, folder).name for key in ("grpo step fixed", "grpo step ragged", *INTERLEAVED_RUNS,
                                                          *RAGGED_RUNS, *NO_CORRECTION_RUNS, *MICRO_BATCH_RUNS)}
    split = [r for r in committed_grpo_split(folder) if r["file"] in files]
    for (what, threshold), rows_read in ((MFU_TARGET, split), (VLLM_MFU_TARGET, [
            r for r in split if r["backend"] == "vllm" and r["workload"] == "fixed"])):
        mfu = max(r["update MFU"] for r in rows_read)
        rows.append({"target": what, "measured": f"{mfu:.1%} at best (" + ", ".join(
            f"{r['file'].removeprefix('grpo_step_seed_qwen2.5-0.5b_').removesuffix('.json')} {r['backend']} "
            f"{r['update MFU']:.1%}" for r in rows_read) + "; median steps)",
                     "verdict": "met" if mfu >= threshold else "missed"})
    repeats = {"micro-batches of 32": [ratio for _, ratio in runs],
               **{f"{workload}, micro-batches of 128": [
                   step_ratio(load_results(committed_file(key, folder))["grpo_step"]) for key in keys]
                  for workload, keys in (("fixed", [k for k in MICRO_BATCH_RUNS if "128" in k]),
                                         ("ragged", [k for k in RAGGED_RUNS if "128" in k]))}}
    ranges = {label: " and ".join(f"{r.low:.2f}x..{r.high:.2f}x" for r in ratios) for label, ratios in repeats.items()}
    rows.append({"target": REPEAT_TARGET, "measured": "; ".join(f"{label}: {text}" for label, text in ranges.items()),
                 "verdict": _joined({label: _overlap(ratios) for label, ratios in repeats.items()})})
    for target, threshold, keys in LOW_END_TARGETS:
        ratios = [(committed_file(key, folder).name, step_ratio(load_results(committed_file(key, folder))["grpo_step"]))
                  for key in keys]
        rows.append({"target": target, "measured": "; ".join(f"{name}: {ratio.describe()}" for name, ratio in ratios),
                     "verdict": _verdicts(ratios, threshold)})
    return rows


def committed_low_end_runs(folder: str | Path = RESULTS_DIR / "h200") -> list[dict[str, str | int]]:
    """One row per run that :data:`LOW_END_TARGETS` read: its lengths, micro-batch, whether vLLM's importance-sampling
    correction was on (TRL's default where a file predates the setting), the step ratio with its range, and the
    verdict of its low end."""
    rows = []
    for _, threshold, keys in LOW_END_TARGETS:
        for key in keys:
            path = committed_file(key, folder)
            data = load_results(path)
            step, ratio = data["grpo_step"], step_ratio(data["grpo_step"])
            correction = step["backends"]["vllm"].get("settings", {}).get("vllm_importance_sampling_correction", True)
            rows.append({"file": path.name, "lengths": step.get("workload", "fixed"),
                         "micro-batch": data["profile"]["per_device_train_batch_size"],
                         "correction": "on" if correction else "off", "HF / vLLM step": ratio.describe(),
                         "low end needed": f"{threshold:.1f}x", "verdict": ratio.verdict(threshold)})
    return rows


PERFORMANCE_TARGETS = (
    ("ragged rollout: vLLM at least 6x HF generate", 6.0, "x"),
    ("GRPO step at least 4x faster with vLLM colocate", 4.0, "x"),
    ("1.5B rollout within 3x of the roofline time", 3.0, "x roofline"),
)
"""The targets the project set itself for the H200 runs: (what, threshold, unit)."""


def _verdicts(ratios: list[tuple[str, RatioRange]], threshold: float) -> str:
    return _joined({what: ratio.verdict(threshold) for what, ratio in ratios})


def _joined(verdicts: dict[str, str]) -> str:
    """One verdict when all agree, else each with what it is about."""
    if len(set(verdicts.values())) == 1:
        return next(iter(verdicts.values()))
    return "; ".join(f"{what}: {verdict}" for what, verdict in verdicts.items())


def committed_targets(results_dir: str | Path = RESULTS_DIR / "h200",
                      smollm2_dir: str | Path = SMOLLM2_DIR) -> list[dict[str, str]]:
    """Each of :data:`PERFORMANCE_TARGETS` with what the committed files measured (ratios with their ranges) and a
    verdict from the conservative end, or why the files make no claim."""
    rollout, step, roofline = PERFORMANCE_TARGETS
    ragged = committed_ragged_headlines(results_dir)
    rows = [{"target": rollout[0], "measured": "; ".join(f"{m}, {r.best}: {r.speedup.describe()}"
                                                         for m, r in ragged.items()),
             "verdict": _verdicts([(m, r.speedup) for m, r in ragged.items()], rollout[1])}]
    steps = [(s.provenance.file, s.ratio) for s in committed_grpo_steps(results_dir)]
    smollm2 = committed_smollm2_steps(smollm2_dir)
    steps.append((f"SmolLM2-135M steps {smollm2['steps'][0]}-{smollm2['steps'][1]}", smollm2["speedup_range"]))
    rows.append({"target": step[0], "measured": "; ".join(f"{what}: {ratio.describe()}" for what, ratio in steps),
                 "verdict": _verdicts(steps, step[1])})
    large = [r for m, r in ragged.items() if "1.5b" in m]
    rows.append({"target": roofline[0],
                 "measured": ", ".join(f"{r.x_roofline:.1f}x the roofline time ({r.best}, median)"
                                       for r in large) or "-",
                 "verdict": ("met" if any(r.x_roofline <= roofline[1] for r in large) else "missed") if large
                 else "not measured"})
    return rows


def targets_markdown() -> str:
    """Every target with its measurement and verdict as one Markdown table (``benchmarks/results/README.md``)."""
    rows = committed_targets() + committed_grpo_step_targets()
    return "\n".join(["| target | measured | verdict |", "|---|---|---|",
                      *(f"| {r['target']} | {r['measured']} | {r['verdict']} |" for r in rows)])
