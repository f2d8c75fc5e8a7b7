"""GRPO step time: TRL server mode (vLLM on one device, training on another) vs vLLM colocate on one device.

Both parts run the same workload as ``lab.bench``'s GRPO step (``--profile seed``: 128 prompts x n=4, prompts
of ~128 tokens, 256 new tokens, micro-batches of 32, 1 warm-up + 2 timed steps, median), one after the other:

* ``server``: :func:`grpo_lab.scale.run_server_mode` with ``--rollout-devices`` / ``--train-devices``;
* ``colocate``: ``python -m lab.bench --parts grpo --grpo-backends vllm`` with the same sizes, on the
  first rollout device only.

    python benchmarks/scale_out/run.py --out OUT --profile seed --shape qwen2.5-0.5b   # 2 GPUs (README.md)
    python benchmarks/scale_out/run.py --out OUT --profile tiny                        # CPU smoke run

``--train-option beta=0.0`` changes the experiment of both parts (benchmarks/async_grpo compares without the KL term).

Writes ``OUT/scale_out_<profile>.json`` (both medians, their split and the ratio) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_lab import device, scale
from grpo_lab.data import write_jsonl
from grpo_lab.paths import TINY_MODEL_DIR
from grpo_lab.rollout import encode_prompts, load_tokenizer
from lab import bench
from lab.bench.cli import key_value
from lab.bench.profiles import STEP_FIELDS
from lab.bench.stats import median
from lab.bench.workload import shaped_model_dir

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
RUN_FILES = (scale.SERVER_LOG, scale.TRAINER_LOG, scale.RESULT_FILE, "metrics.jsonl", "config.json")
SIZES = (*STEP_FIELDS, "prompt_tokens", "grpo_steps", "grpo_warmup_steps")


def portable(command: list[str]) -> str:
    """A command line without this machine's interpreter and checkout paths."""
    return shlex.join(command).replace(sys.executable, "python").replace(str(REPO_ROOT), ".")


def server_part(model: str, rows: list[dict], profile: bench.BenchProfile, scratch: Path,
                config: scale.ServerModeConfig, out: Path, train_overrides: dict | None = None) -> dict:
    """The same TrainConfig as lab.bench.grpo_step.grpo_step_bench builds, with rollouts from the server."""
    dataset = scratch / "seed_workload.jsonl"
    write_jsonl(rows, dataset)
    longest = max(len(p.token_ids) for p in encode_prompts(load_tokenizer(model), [r["prompt"] for r in rows]))
    train_config = dataclasses.replace(
        bench.grpo_step_config(profile, model, dataset, longest, config.device or device.detect(),
                               **(train_overrides or {})),
        output_dir=str(scratch / "run-server"))
    try:
        result = scale.run_server_mode(config, train_config)
    finally:  # the logs come back with the results, also when something failed (the model stays in scratch)
        (out / "server_run").mkdir(exist_ok=True)
        for name in RUN_FILES:
            if (Path(train_config.output_dir) / name).is_file():
                shutil.copy(Path(train_config.output_dir) / name, out / "server_run" / name)
    skip = profile.grpo_warmup_steps
    timed = result.metrics[skip:]
    steps = result.step_seconds[skip:]
    generation = [r.get("timing/generation_s", float("nan")) for r in timed]
    reward = [r.get("timing/reward_s", float("nan")) for r in timed]
    return {"plan": result.to_dict()["plan"], "weight_sync": result.weight_sync,
            "server_start_s": result.server_start_seconds, "step_s": steps, "all_steps_s": result.step_seconds,
            "generation_s": generation, "reward_s": reward,
            "update_s": [s - g - w for s, g, w in zip(steps, generation, reward)],
            "mean_completion_tokens": [r.get("completions/mean_length") for r in timed],
            "server_stats": result.server_stats, "server_command": portable(result.server_command),
            "trainer_command": portable(result.trainer_command),
            "median": {key: median(values) for key, values in
                       (("step_s", steps), ("generation_s", generation), ("reward_s", reward),
                        ("update_s", [s - g - w for s, g, w in zip(steps, generation, reward)]))}}


def colocate_part(args: argparse.Namespace, out: Path, first_device: int | None) -> dict:
    """lab.bench's colocate GRPO step with the same sizes, on one device."""
    command = [sys.executable, "-m", "lab.bench", "--profile", args.profile, "--parts", "grpo",
               "--grpo-backends", "vllm", "--out", str(out), "--name", f"colocate_{args.profile}"]
    command += ["--shape", args.shape] if args.shape else []
    for name in SIZES:
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for key, value in args.train_option:
        command += ["--train-option", f"{key}={json.dumps(value)}"]
    env = dict(os.environ)
    if first_device is not None:
        env.update(device.visible_devices_env([first_device]))
    subprocess.run(command, check=True, env=env)
    step = json.loads((out / f"colocate_{args.profile}.json").read_text())["grpo_step"]["backends"]["vllm"]
    return {"command": portable(command), **step}


def earlier_parts(path: Path, profile: dict, shape: str | None, running: str, train_overrides: dict) -> dict:
    """The parts an earlier run of the same workload left in ``path`` and this run does not repeat (so the two
    parts can run in separate calls, each on a device of its own).

    A file for another workload is not merged: mixing sizes would make the comparison meaningless.
    """
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text(encoding="utf-8"))
    if (earlier.get("profile") != json.loads(json.dumps(profile)) or earlier.get("shape") != shape
            or earlier.get("train_overrides", {}) != train_overrides):  # as stored
        raise SystemExit(f"{path} holds another workload ({earlier.get('profile')}, shape {earlier.get('shape')}); "
                         f"use another --out for this one")
    kept = {name: earlier[name] for name in ("server", "colocate") if name in earlier and name not in running}
    return {**kept, "earlier_run": {"command": earlier.get("command"), "created": earlier.get("created"),
                                    "parts": sorted(kept)}} if kept else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--profile", choices=sorted(bench.BENCH_PROFILES), default="seed")
    parser.add_argument("--shape", default=None, help="random weights of this architecture (e.g. qwen2.5-0.5b)")
    parser.add_argument("--parts", default="server,colocate")
    parser.add_argument("--rollout-devices", type=scale.device_indices, default=None)
    parser.add_argument("--train-devices", type=scale.device_indices, default=None)
    for name in SIZES:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--train-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="TrainConfig override for both parts, e.g. beta=0.0")
    args = parser.parse_args(argv)
    scale.exit_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    profile = bench.get_bench_profile(args.profile, **{n: getattr(args, n) for n in SIZES
                                                            if getattr(args, n) is not None})
    config = scale.ServerModeConfig(rollout_devices=args.rollout_devices, train_devices=args.train_devices,
                                    train_timeout_s=480).resolved()
    plan = scale.plan_devices(config.device, rollout_devices=config.rollout_devices,
                              train_devices=config.train_devices)
    path = args.out / f"scale_out_{profile.name}.json"
    results = earlier_parts(path, profile.as_dict(), args.shape, args.parts, dict(args.train_option))
    results.update({"command": "python benchmarks/scale_out/run.py " + shlex.join(argv or sys.argv[1:]),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "profile": profile.as_dict(),
                    "shape": args.shape, "train_overrides": dict(args.train_option), "device": {"kind": plan.kind, "name": device.device_name(kind=plan.kind),
                                                    "count": device.device_count(plan.kind)},
                    "weights": "random (speed only)" if args.shape else "real"})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-lab-scale-") as scratch:
        scratch = Path(scratch)
        model = (str(shaped_model_dir(args.shape, scratch / "model", random_weights=True)) if args.shape
                 else str(TINY_MODEL_DIR))
        rows = bench.seed_workload(load_tokenizer(model), profile.num_prompts, profile.prompt_tokens)
        if "server" in args.parts:
            results["server"] = server_part(model, rows, profile, scratch, config, args.out, dict(args.train_option))
    if "colocate" in args.parts:
        results["colocate"] = colocate_part(args, args.out, plan.rollout_devices[0] if plan.rollout_devices else None)
    if "server" in results and "colocate" in results:
        results["speedup_server_vs_colocate"] = (results["colocate"]["median"]["step_s"]
                                                 / results["server"]["median"]["step_s"])
    results["seconds"] = time.perf_counter() - started
    path.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\n{'layout':<34}{'step':>9}{'generation':>12}{'reward':>9}{'update':>9}")
    for name in ("colocate", "server"):
        if name in results:
            m = results[name]["median"]
            print(f"{name:<34}{m['step_s']:>8.2f}s{m['generation_s']:>11.2f}s{m['reward_s']:>8.3f}s"
                  f"{m['update_s']:>8.2f}s")
    if "speedup_server_vs_colocate" in results:
        print(f"server mode vs colocate: {results['speedup_server_vs_colocate']:.2f}x per step")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
