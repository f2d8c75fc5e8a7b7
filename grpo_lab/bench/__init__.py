"""Performance: rollouts (HF generate vs vLLM vs vLLM + prefix caching), the GRPO step, and the roofline.

Three measurements in one process, written to one results file:

1. **Rollouts** (:func:`rollout_bench`): the seed's workload (128 prompts x n=4, prompts of about 128 tokens, up
   to 256 new tokens) through the three configurations *alternately* (round 1: hf, vllm, vllm+prefix; round 2:
   vllm, vllm+prefix, hf; ...), after warm-up rounds, median of the repeats. Two variants: ``fixed`` (every
   completion exactly ``max_tokens`` long) and ``ragged`` (lengths as GRPO produces them: ending at the end
   token, or, for random weights that never end, drawn from a stated distribution). HF ``generate`` pads a
   batch to its longest member; vLLM's continuous batching does not, so the ragged variant is where it gains.
2. **GRPO step** (:func:`grpo_step_bench`): TRL's ``GRPOTrainer`` step time with HF generate and with vLLM
   colocate, the backends interleaved step by step, split into generation, reward and update (the rest of the step)
   from :mod:`grpo_lab.train`'s metrics callback; min / median / max per backend and the ratio's range.
3. **Roofline** (:func:`measure_device`, :func:`roofline`): the device's copy bandwidth and matmul rate measured
   with torch, and from them the shortest time the workload could take (every decode step reads all weights
   and each sequence's KV cache; every token costs 2 FLOPs per weight), against which tokens/s are reported.

The modules, from the bottom up: :mod:`~grpo_lab.bench.profiles` and :mod:`~grpo_lab.bench.stats` (spreads and ratio
ranges), :mod:`~grpo_lab.bench.workload` and :mod:`~grpo_lab.bench.roofline`, py-spy's stacks
(:mod:`~grpo_lab.bench.stacks`), the three measurements (:mod:`~grpo_lab.bench.rollout_bench`,
:mod:`~grpo_lab.bench.grpo_step`, :mod:`~grpo_lab.bench.engine_probe`), the results file
(:mod:`~grpo_lab.bench.results`), the committed runs' readers (:mod:`~grpo_lab.bench.committed`), the project's
targets for those runs and their verdicts (:mod:`~grpo_lab.bench.targets`), the whole run (:mod:`~grpo_lab.bench.run`)
and the command line (:mod:`~grpo_lab.bench.cli`).

From a shell (``--help`` lists every option)::

    python -m grpo_lab.bench --profile tiny                       # CPU: shipped tiny model, ~3 minutes
    python -m grpo_lab.bench --shape qwen2.5-1.5b --parts rollout,roofline    # GPU: random weights

>>> from grpo_lab.bench import alternating_orders
>>> alternating_orders(("hf", "vllm", "vllm+prefix"), 2)
[['hf', 'vllm', 'vllm+prefix'], ['vllm', 'vllm+prefix', 'hf']]
"""


from grpo_lab.bench.cli import build_parser, key_value, main
from grpo_lab.bench.committed import (
    COMMITTED,
    ENGINE_PARTS,
    ENGINE_PROFILE,
    Provenance,
    RolloutHeadline,
    StepRatio,
    committed_engine_profile,
    committed_file,
    committed_grpo_split,
    committed_grpo_steps,
    committed_grpo_table,
    committed_host_work,
    committed_paired_step_ratios,
    committed_ragged_headlines,
    committed_rollout_headlines,
    committed_rollout_table,
    committed_smollm2_steps,
    deferred_correction,
)
from grpo_lab.bench.engine_probe import engine_probe, trl_engine_settings
from grpo_lab.bench.grpo_step import (
    OWN_LENGTHS,
    STEP_SPLIT,
    HostCounters,
    Turns,
    bottleneck,
    grpo_step_bench,
    grpo_step_config,
    interleaved_turns,
    step_memory,
)
from grpo_lab.bench.profiles import (
    BENCH_PROFILES,
    CONFIGS,
    DEFAULT_PROFILE,
    GRPO_WORKLOADS,
    PARTS,
    PREFIX_OFF_MODES,
    RAGGED_MODES,
    STEP_FIELDS,
    VARIANTS,
    BenchError,
    BenchProfile,
    get_bench_profile,
)
from grpo_lab.bench.results import (
    REQUIRED_KEYS,
    SCHEMA,
    check_results,
    load_results,
    paired_step_ratios,
    save_results,
    step_ratio,
    summary,
)
from grpo_lab.bench.rollout_bench import (
    CONFIG_MEANING,
    PREFIX_OFF_MEANING,
    Measurement,
    bench_engine_config,
    rollout_bench,
)
from grpo_lab.bench.roofline import (
    DATASHEET_RATES,
    DeviceRates,
    ModelCost,
    Roofline,
    add_roofline,
    extra_forwards,
    measure_device,
    model_cost,
    roofline,
    sequence_flops,
    update_mfu,
    workload_roofline,
)
from grpo_lab.bench.run import SEED_REFERENCE, run_bench
from grpo_lab.bench.stacks import Stacks, function_of
from grpo_lab.bench.stats import (
    MIN_RUNS,
    RatioRange,
    Spread,
    alternating_orders,
    median,
    paired_ratios,
    speedup_range,
)
from grpo_lab.bench.targets import (
    ENGINE_RUN,
    GRPO_STEP_TARGETS,
    INTERLEAVED_RUNS,
    LOW_END_TARGETS,
    MFU_TARGET,
    MICRO_BATCH_RUNS,
    NO_CORRECTION_RUNS,
    PERFORMANCE_TARGETS,
    RAGGED_RUN,
    RAGGED_RUNS,
    REPEAT_TARGET,
    VLLM_MFU_TARGET,
    committed_grpo_step_targets,
    committed_low_end_runs,
    committed_targets,
    targets_markdown,
)
from grpo_lab.bench.workload import (
    RAGGED_STOP_PROBABILITY,
    draw_lengths,
    ragged_description,
    ragged_model_dir,
    seed_workload,
)
from grpo_lab.deprecation import moved_names

__all__ = [
    "BENCH_PROFILES", "COMMITTED", "CONFIGS", "CONFIG_MEANING", "DATASHEET_RATES", "DEFAULT_PROFILE", "ENGINE_PARTS",
    "ENGINE_PROFILE", "ENGINE_RUN", "GRPO_STEP_TARGETS", "INTERLEAVED_RUNS", "LOW_END_TARGETS", "NO_CORRECTION_RUNS",
    "MICRO_BATCH_RUNS", "RAGGED_RUN", "RAGGED_RUNS", "VLLM_MFU_TARGET",
    "REPEAT_TARGET", "GRPO_WORKLOADS", "MFU_TARGET", "MIN_RUNS", "OWN_LENGTHS", "PARTS", "PERFORMANCE_TARGETS",
    "PREFIX_OFF_MEANING", "PREFIX_OFF_MODES", "RAGGED_MODES", "RAGGED_STOP_PROBABILITY", "REQUIRED_KEYS", "SCHEMA",
    "SEED_REFERENCE", "STEP_FIELDS", "STEP_SPLIT", "VARIANTS", "BenchError", "BenchProfile", "DeviceRates",
    "HostCounters", "Measurement", "ModelCost", "Provenance", "RatioRange", "RolloutHeadline", "Roofline", "Spread",
    "Stacks", "StepRatio", "Turns", "add_roofline", "alternating_orders", "bench_engine_config", "bottleneck",
    "build_parser", "check_results", "committed_engine_profile", "committed_file", "committed_grpo_split",
    "committed_grpo_step_targets", "committed_grpo_steps", "committed_grpo_table", "committed_host_work",
    "committed_low_end_runs",
    "committed_paired_step_ratios", "committed_ragged_headlines", "committed_rollout_headlines",
    "committed_rollout_table", "committed_smollm2_steps", "committed_targets",
    "deferred_correction", "draw_lengths", "engine_probe", "extra_forwards", "function_of", "get_bench_profile",
    "grpo_step_bench", "grpo_step_config", "interleaved_turns", "key_value", "load_results", "main", "measure_device",
    "median", "model_cost", "ragged_description", "ragged_model_dir", "rollout_bench", "roofline", "run_bench",
    "paired_ratios", "paired_step_ratios", "save_results", "seed_workload", "sequence_flops", "speedup_range",
    "step_memory", "step_ratio", "summary", "targets_markdown",
    "trl_engine_settings", "update_mfu", "workload_roofline",
]

# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
__getattr__ = moved_names(__name__, moved={"RESULTS_DIR": "grpo_lab.paths:RESULTS_DIR"})
