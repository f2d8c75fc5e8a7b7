"""Performance: rollouts (HF generate vs vLLM vs vLLM + prefix caching), the GRPO step, and the roofline.

Three measurements in one process, written to one results file:

1. **Rollouts** (:func:`rollout_bench`): the write-up's workload (128 prompts x n=4, prompts of about 128 tokens,
   up to 256 new tokens) through the three configurations *alternately* (round 1: hf, vllm, vllm+prefix; round 2:
   vllm, vllm+prefix, hf; ...), after warm-up rounds, median of the repeats. Two variants: ``fixed`` (every
   completion exactly ``max_tokens`` long) and ``ragged`` (lengths as GRPO produces them: ending at the end
   token, or, for random weights that never end, drawn from a stated distribution). HF ``generate`` pads a
   batch to its longest member; vLLM's continuous batching does not, so the ragged variant is where it gains.
2. **GRPO step** (:func:`~lab.bench.grpo_step.grpo_step_bench`): TRL's ``GRPOTrainer`` step time with HF
   generate and with vLLM colocate, the backends interleaved step by step, split into generation, reward and update
   (the rest of the step) from :mod:`grpo_lab.train`'s metrics callback; min / median / max per backend and the
   ratio's range.
3. **Roofline** (:func:`measure_device`, :func:`roofline`): the device's copy bandwidth and matmul rate measured
   with torch, and from them the shortest time the workload could take (every decode step reads all weights
   and each sequence's KV cache; every token costs 2 FLOPs per weight), against which tokens/s are reported.

The modules, from the bottom up: :mod:`~lab.bench.profiles` and :mod:`~lab.bench.stats` (spreads and ratio
ranges), :mod:`~lab.bench.workload` and :mod:`~lab.bench.roofline`, py-spy's stacks
(:mod:`~lab.bench.stacks`), the three measurements (:mod:`~lab.bench.rollout_bench`,
:mod:`~lab.bench.grpo_step`, :mod:`~lab.bench.engine_probe`), the results file
(:mod:`~lab.bench.results`) and its figure (:mod:`~lab.bench.plots`), the whole run (:mod:`~lab.bench.run`) and the
command line (:mod:`~lab.bench.cli`). The committed runs are data: ``benchmarks/results/catalogue.json`` names every results
file, the series of runs and the project's targets, and :func:`read_catalogue` is its one reader
(:mod:`~lab.bench.catalogue`, over one file's record :mod:`~lab.bench.committed` and the verdicts
:mod:`~lab.bench.targets`).

From a shell (``--help`` lists every option)::

    python -m lab.bench --profile tiny                       # CPU: shipped tiny model, ~3 minutes
    python -m lab.bench --shape qwen2.5-1.5b --parts rollout,roofline    # GPU: random weights
    python -m lab.bench targets                              # the targets' verdicts from the committed runs

>>> from lab import bench
>>> bench.speedup_range([10.0, 11.0, 12.0, 10.5, 11.5], [5.0, 5.5, 6.0, 5.2, 5.8], interleaved=True).describe()
'2.00x (range 1.67x..2.40x)'
>>> bench.read_catalogue().verdict("fixed step 2x").verdict
'not met (only the high end reaches 2.00x)'
"""

from lab.bench.catalogue import read_catalogue
from lab.bench.cli import main
from lab.bench.committed import committed_smollm2_steps
from lab.bench.engine_probe import engine_probe
from lab.bench.grpo_step import HostCounters, bottleneck, grpo_step_config, step_memory
from lab.bench.plots import plot_bench
from lab.bench.profiles import BENCH_PROFILES, BenchProfile, default_profile_name, get_bench_profile
from lab.bench.results import load_results, save_results, summary
from lab.bench.rollout_bench import rollout_bench
from lab.bench.roofline import DATASHEET_RATES, measure_device, model_cost, roofline, workload_roofline
from lab.bench.run import run_bench
from lab.bench.stats import speedup_range
from lab.bench.workload import SHAPES, draw_lengths, ragged_model_dir, seed_workload, shaped_model_dir

__all__ = [
    # the measurements: the whole run, its profiles and workload, the rollouts, the GRPO step, the engine probe, the
    # roofline, the results file, a ratio with its range
    "run_bench", "main", "BenchProfile", "BENCH_PROFILES", "get_bench_profile", "default_profile_name",
    "seed_workload", "draw_lengths", "ragged_model_dir", "SHAPES", "shaped_model_dir", "rollout_bench",
    "grpo_step_config", "step_memory", "HostCounters", "bottleneck", "engine_probe", "measure_device", "model_cost",
    "roofline", "workload_roofline", "DATASHEET_RATES", "summary", "save_results", "load_results", "plot_bench",
    "speedup_range",
    # the committed runs: the catalogue's reader, and the SmolLM2 recipe's steps
    "read_catalogue", "committed_smollm2_steps",
]
