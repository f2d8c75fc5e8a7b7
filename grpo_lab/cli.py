"""`grpo-lab` command line: ``grpo-lab env`` and one subcommand per module with a ``main(argv)``."""

from __future__ import annotations

__all__ = ["SUBCOMMANDS"]

import argparse
import importlib
import json
import os
import sys

from grpo_lab import env
from grpo_lab.errors import GrpoLabError

# subcommand -> (module whose main(argv) runs it, one-line help)
SUBCOMMANDS = {
    "build-tiny-model": ("grpo_lab.tiny_model", "rebuild the shipped tiny model and its manifest"),
    "course": ("grpo_lab.course", "run every course notebook headless, in order"),
    "doctor": ("grpo_lab.doctor", "diagnose the environment and a config: pass / warn / fail with the fix"),
    "rollout": ("grpo_lab.rollout", "HF generate and vLLM side by side on eval prompts; tokens/s"),
    "train": ("grpo_lab.train", "a GRPO run with TRL GRPOTrainer from a profile plus overrides"),
    "export-recipe": ("grpo_lab.recipe", "write a run as one standalone Python script for stock TRL (datasets, "
                                         "transformers, trl, peft; no grpo_lab)"),
    "serve": ("grpo_lab.deploy", "verify a model folder and serve it with vLLM's OpenAI-compatible server"),
    "load-test": ("grpo_lab.load_test", "serve a model folder on 127.0.0.1 and load-test it: N concurrent streaming "
                                        "clients, throughput, latency percentiles, errors by kind"),
    "scale": ("grpo_lab.scale", "TRL server mode: a vLLM rollout server on its own device(s), the trainer on the "
                                "others via accelerate launch"),
    "async-grpo": ("grpo_lab.async_grpo", "asynchronous GRPO (TRL's AsyncGRPOTrainer): the vLLM server keeps "
                                          "generating while the trainer updates, staleness bounded"),
    "verl-export": ("grpo_lab.verl_export", "write verl's GRPO inputs (parquet, compute_score, Hydra overrides, "
                                            "launch script) from a training config"),
}


def env_main(argv: list[str]) -> int:
    """`grpo-lab env`: print the environment report; exit 1 if the smoke test fails."""
    parser = argparse.ArgumentParser(prog="grpo-lab env", description="Environment report and stack check.")
    parser.add_argument("--smoke", action="store_true", help="also run forward+backward on the device")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    result = env.report(smoke=args.smoke)
    print(json.dumps(result.as_dict(), indent=2, default=str) if args.json else result)
    return 1 if args.smoke and (result.smoke is None or not result.smoke.ok) else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"env": "environment report: versions, verified-stack verdict, device, smoke test",
                **{name: help_ for name, (_, help_) in SUBCOMMANDS.items()}}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: grpo-lab COMMAND [options]\n\ncommands:")
        for name, help_ in commands.items():
            print(f"  {name:18s} {help_}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\ngrpo-lab: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    name, rest = argv[0], argv[1:]
    if name == "env":
        return env_main(rest)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return module.main(rest) or 0
    except GrpoLabError as exc:  # its message says what went wrong and what to do: no traceback
        if os.environ.get("GRPO_LAB_DEBUG"):
            raise
        print(f"grpo-lab {name}: {exc}\n(GRPO_LAB_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
