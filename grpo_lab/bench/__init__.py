"""Performance: rollouts (HF generate vs vLLM vs vLLM + prefix caching), the GRPO step, and the roofline.

Three measurements in one process, written to one results file:

1. **Rollouts** (:func:`rollout_bench`): the write-up's workload (128 prompts x n=4, prompts of about 128 tokens,
   up to 256 new tokens) through the three configurations *alternately* (round 1: hf, vllm, vllm+prefix; round 2:
   vllm, vllm+prefix, hf; ...), after warm-up rounds, median of the repeats. Two variants: ``fixed`` (every
   completion exactly ``max_tokens`` long) and ``ragged`` (lengths as GRPO produces them: ending at the end
   token, or, for random weights that never end, drawn from a stated distribution). HF ``generate`` pads a
   batch to its longest member; vLLM's continuous batching does not, so the ragged variant is where it gains.
2. **GRPO step** (:func:`~grpo_lab.bench.grpo_step.grpo_step_bench`): TRL's ``GRPOTrainer`` step time with HF
   generate and with vLLM colocate, the backends interleaved step by step, split into generation, reward and update
   (the rest of the step) from :mod:`grpo_lab.train`'s metrics callback; min / median / max per backend and the
   ratio's range.
3. **Roofline** (:func:`measure_device`, :func:`roofline`): the device's copy bandwidth and matmul rate measured
   with torch, and from them the shortest time the workload could take (every decode step reads all weights
   and each sequence's KV cache; every token costs 2 FLOPs per weight), against which tokens/s are reported.

The modules, from the bottom up: :mod:`~grpo_lab.bench.profiles` and :mod:`~grpo_lab.bench.stats` (spreads and ratio
ranges), :mod:`~grpo_lab.bench.workload` and :mod:`~grpo_lab.bench.roofline`, py-spy's stacks
(:mod:`~grpo_lab.bench.stacks`), the three measurements (:mod:`~grpo_lab.bench.rollout_bench`,
:mod:`~grpo_lab.bench.grpo_step`, :mod:`~grpo_lab.bench.engine_probe`), the results file
(:mod:`~grpo_lab.bench.results`), the whole run (:mod:`~grpo_lab.bench.run`) and the command line
(:mod:`~grpo_lab.bench.cli`). The committed runs are data: ``benchmarks/results/catalogue.json`` names every results
file, the series of runs and the project's targets, and :func:`read_catalogue` is its one reader
(:mod:`~grpo_lab.bench.catalogue`, over one file's record :mod:`~grpo_lab.bench.committed` and the verdicts
:mod:`~grpo_lab.bench.targets`).

``grpo_lab.bench`` is the course's measurement lab, not part of ``grpo_lab.__all__``: its names may change between
versions (CHANGELOG.md says how).

From a shell (``--help`` lists every option)::

    python -m grpo_lab.bench --profile tiny                       # CPU: shipped tiny model, ~3 minutes
    python -m grpo_lab.bench --shape qwen2.5-1.5b --parts rollout,roofline    # GPU: random weights

>>> from grpo_lab import bench
>>> bench.speedup_range([10.0, 11.0, 12.0, 10.5, 11.5], [5.0, 5.5, 6.0, 5.2, 5.8], interleaved=True).describe()
'2.00x (range 1.67x..2.40x)'
>>> bench.read_catalogue().verdict("fixed step 2x").verdict
'not met (only the high end reaches 2.00x)'
"""


from grpo_lab import device
from grpo_lab.bench.catalogue import read_catalogue
from grpo_lab.bench.cli import main
from grpo_lab.bench.committed import committed_smollm2_steps
from grpo_lab.bench.engine_probe import engine_probe
from grpo_lab.bench.grpo_step import HostCounters, bottleneck, grpo_step_config, step_memory
from grpo_lab.bench.profiles import BENCH_PROFILES, BenchProfile, default_profile_name, get_bench_profile
from grpo_lab.bench.results import load_results, save_results, summary
from grpo_lab.bench.rollout_bench import rollout_bench
from grpo_lab.bench.roofline import DATASHEET_RATES, measure_device, model_cost, roofline, workload_roofline
from grpo_lab.bench.run import run_bench
from grpo_lab.bench.stats import speedup_range
from grpo_lab.bench.workload import draw_lengths, ragged_model_dir, seed_workload
from grpo_lab.deprecation import moved_names

__all__ = [
    # the measurements: the whole run, its profiles and workload, the rollouts, the GRPO step, the engine probe, the
    # roofline, the results file, a ratio with its range
    "run_bench", "main", "BenchProfile", "BENCH_PROFILES", "get_bench_profile", "seed_workload", "draw_lengths",
    "ragged_model_dir", "rollout_bench", "grpo_step_config", "step_memory", "HostCounters", "bottleneck",
    "engine_probe", "measure_device", "model_cost", "roofline", "workload_roofline", "DATASHEET_RATES", "summary",
    "save_results", "load_results", "speedup_range",
    # the committed runs: the catalogue's reader, and the SmolLM2 recipe's steps (notebooks 03 and 06)
    "read_catalogue", "committed_smollm2_steps",
]

# Deprecated names. Moved in 0.2.0 (removed in 0.3.0): RESULTS_DIR. Moving now, with the catalogue: the names this
# package exported in 0.2.0 live in its modules (same objects), the readers of committed runs are the catalogue's.
_MOVED_IN_0_2_0 = moved_names(__name__, {"RESULTS_DIR": "grpo_lab.paths:RESULTS_DIR"}, since="0.2.0")
_NOW_IN = {
    "grpo_lab.bench.cli": ("build_parser", "key_value"),
    "grpo_lab.bench.committed": ("RolloutHeadline", "StepRatio"),
    "grpo_lab.bench.engine_probe": ("trl_engine_settings",),
    "grpo_lab.bench.grpo_step": ("OWN_LENGTHS", "STEP_SPLIT", "Turns", "grpo_step_bench", "interleaved_turns"),
    "grpo_lab.bench.profiles": ("CONFIGS", "GRPO_WORKLOADS", "PARTS", "PREFIX_OFF_MODES", "RAGGED_MODES",
                                "STEP_FIELDS", "VARIANTS", "BenchError"),
    "grpo_lab.bench.results": ("REQUIRED_KEYS", "SCHEMA", "check_results", "step_ratio"),
    "grpo_lab.bench.rollout_bench": ("CONFIG_MEANING", "PREFIX_OFF_MEANING", "Measurement", "bench_engine_config"),
    "grpo_lab.bench.roofline": ("DeviceRates", "ModelCost", "Roofline", "add_roofline", "extra_forwards",
                                "sequence_flops", "update_mfu"),
    "grpo_lab.bench.run": ("SEED_REFERENCE",),
    "grpo_lab.bench.stats": ("MIN_RUNS", "RatioRange", "Spread", "alternating_orders", "median"),
    "grpo_lab.bench.workload": ("RAGGED_STOP_PROBABILITY", "ragged_description"),
    "grpo_lab.committed": ("Provenance",),
}
_READERS = {  # 0.2.0 reader -> the catalogue's method (same arguments: a committed folder, by default h200/)
    "committed_file": "file", "committed_grpo_split": "grpo_split", "committed_grpo_steps": "grpo_steps",
    "committed_grpo_table": "grpo_table", "committed_rollout_headlines": "rollout_headlines",
    "committed_rollout_table": "rollout_table", "targets_markdown": "targets_markdown",
}
_AS_DATA = ("the committed runs and the project's targets are data now: benchmarks/results/catalogue.json, read by "
            "grpo_lab.bench.read_catalogue()")
_MOVED_NOW = moved_names(__name__, moved={
    name: f"{module}:{name}" for module, names in _NOW_IN.items() for name in names
}, computed={
    **{old: (f"grpo_lab.bench.read_catalogue().{method}", "", lambda method=method: getattr(read_catalogue(), method))
       for old, method in _READERS.items()},
    "DEFAULT_PROFILE": ("grpo_lab.bench.profiles.default_profile_name(kind)", "",
                        lambda: {kind: default_profile_name(kind) for kind in device.KINDS}),
}, removed={
    "COMMITTED": f"{_AS_DATA}; its .runs by key (each run's .path)",
    "GRPO_STEP_TARGETS": f"{_AS_DATA}; its .targets",
    "MFU_TARGET": f"{_AS_DATA}; its .target('update MFU')",
    "PERFORMANCE_TARGETS": f"{_AS_DATA}; its .targets",
    "committed_grpo_step_targets": f"{_AS_DATA}; its .verdicts() (Verdict records)",
    "committed_targets": f"{_AS_DATA}; its .verdicts() (Verdict records)",
})


def __getattr__(name: str):
    """The names that left this package's exports: each warns and returns its replacement, or says what to use."""
    return (_MOVED_IN_0_2_0 if name == "RESULTS_DIR" else _MOVED_NOW)(name)
