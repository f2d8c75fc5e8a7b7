"""``python -m lab.bench``: options, the run, the printed tables, the files written; ``python -m lab.bench targets``
prints the project's targets table from the committed runs (the catalogue)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from grpo_lab import runs
from grpo_lab.errors import GrpoLabError
from lab.bench.catalogue import read_catalogue
from lab.bench.engine_probe import run_engine_probe
from lab.bench.profiles import (
    BENCH_PROFILES,
    CONFIGS,
    GRPO_WORKLOADS,
    PARTS,
    PREFIX_OFF_MODES,
    RAGGED_MODES,
    STEP_FIELDS,
    VARIANTS,
    get_bench_profile,
)
from lab.bench.results import save_results, summary
from lab.bench.rollout_bench import PREFIX_OFF_MEANING
from lab.bench.run import run_bench
from lab.bench.workload import SHAPES


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as JSON where it parses (``async_scheduling=true``), else as text."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE (VALUE in JSON, e.g. async_scheduling=true)")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _names(text: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m lab.bench``."""
    parser = argparse.ArgumentParser(
        prog="python -m lab.bench",
        description="HF generate vs vLLM vs vLLM + prefix caching (fixed and ragged lengths), the GRPO step "
                    "with HF generate vs vLLM colocate, and the roofline; prints ratios, writes JSON and a plot.")
    parser.add_argument("--profile", choices=sorted(BENCH_PROFILES),
                        help="sizes (default: tiny on the CPU, seed on accelerators)")
    parser.add_argument("--model", help="model folder (default: GRPO_LAB_MODEL or the shipped tiny model)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this architecture (speed only)")
    parser.add_argument("--parts", type=_names, default=PARTS, help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--configs", type=_names, default=CONFIGS, help=f"comma-separated, of {','.join(CONFIGS)}")
    parser.add_argument("--variants", type=_names, default=VARIANTS, help="comma-separated, of fixed,ragged")
    parser.add_argument("--ragged", choices=RAGGED_MODES,
                        help="uniform (default): lengths drawn from a stated distribution, the same for every "
                             "config; eos: each completion ends at the model's end token (real models)")
    parser.add_argument("--prefix-off", choices=PREFIX_OFF_MODES, default="salt",
                        help="how 'vllm' runs without prefix reuse: " + "; ".join(
                            f"{k}: {v}" for k, v in PREFIX_OFF_MEANING.items()))
    for name in (*STEP_FIELDS, "prompt_tokens", "warmup", "repeats", "grpo_steps", "grpo_warmup_steps"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="overrides the profile")
    parser.add_argument("--grpo-backends", type=_names, help="comma-separated, of hf,vllm (default: the profile's)")
    parser.add_argument("--grpo-workload", choices=GRPO_WORKLOADS, default="fixed",
                        help="fixed: every completion max_completion_length long; ragged: completions end early "
                             "(random weights: a stated share of the vocabulary ends them, see ragged_model_dir)")
    parser.add_argument("--max-num-seqs", type=int, help="vLLM (default: all sequences of the workload)")
    parser.add_argument("--hf-batch-size", type=int, help="HF generate (default: all sequences in one batch)")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--vllm-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra vllm.LLM argument (JSON value), repeatable: async_scheduling=true, "
                             "max_num_batched_tokens=16384, compilation_config='{\"cudagraph_capture_sizes\":[512]}'")
    parser.add_argument("--hf-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra model.generate argument, e.g. cache_implementation=static")
    parser.add_argument("--train-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="TrainConfig override for the GRPO step, e.g. beta=0.0")
    parser.add_argument("--out", help="folder for the JSON and the plot (default: runs/latest/bench)")
    parser.add_argument("--name", help="file name stem (default: bench_<profile>[_<shape>])")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.bench [--profile tiny] [--shape S] ...``: run, print the tables, write JSON + PNG."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["engine-probe"]:  # engine_probe's own process
        return run_engine_probe(argv[1])
    if argv[:1] == ["targets"]:
        print(read_catalogue().targets_markdown())
        return 0
    args = build_parser().parse_args(argv)
    sizes = {name: getattr(args, name) for name in (*STEP_FIELDS, "prompt_tokens", "warmup", "repeats", "grpo_steps",
                                                     "grpo_warmup_steps")
             if getattr(args, name) is not None}
    engine = {name: getattr(args, name) for name in ("max_num_seqs", "hf_batch_size", "gpu_memory_utilization",
                                                      "enforce_eager") if getattr(args, name) is not None}
    if args.vllm_option:
        engine["vllm_options"] = dict(args.vllm_option)
    if args.hf_option:
        engine["hf_generate_options"] = dict(args.hf_option)
    try:
        profile = get_bench_profile(args.profile, **sizes)
        command = "python -m lab.bench " + " ".join(shlex.quote(a) for a in argv)
        results = run_bench(profile, model=args.model, shape=args.shape, parts=args.parts, configs=args.configs,
                            variants=args.variants, ragged=args.ragged, prefix_off=args.prefix_off, engine=engine,
                            grpo_backends=args.grpo_backends, train_overrides=dict(args.train_option),
                            command=command.strip(), grpo_workload=args.grpo_workload)
    except GrpoLabError as error:
        print(f"python -m lab.bench: {error}")
        return 2
    print(summary(results))
    stem = args.name or f"bench_{profile.name}" + (f"_{args.shape}" if args.shape else "") + (
        f"_{args.grpo_workload}" if "grpo" in args.parts else "")
    json_path, png_path = save_results(results, args.out or runs.workspace("bench"), stem)
    print(f"\nwrote {json_path} and {png_path} ({results['seconds']:.0f} s in all)")
    return 0

