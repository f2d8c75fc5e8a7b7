"""LoRA GRPO next to the full fine-tune of the same recipe, on a real model (SmolLM2-135M-Instruct), one GPU.

Each variant is one device call (under ten minutes) and one child process, so that the colocated vLLM engine and the
device memory of one variant never reach the other's numbers:

    full    the course's ``gpu`` recipe as notebook 03 runs it (TrainConfig().resolve(machine), GRPO_LAB_MODEL)
    lora    the same, with ``use_peft=True`` (r=16, alpha=32 on every linear layer) and the learning rate ``--lora-lr``
            (adapters start at zero and learn in a low-rank subspace: the usual LoRA rate is ~10x the full one)
    sleep   full, with ``vllm_enable_sleep_mode=True``: the engine's weights and KV cache released during every
            update and woken for every generation; its step times next to full's are what sleep mode costs (GPU
            only: vLLM-CPU has no sleep mode, and the course refuses it there before anything loads)

What a variant measures, written to ``$OUT/<variant>.json``: held-out greedy accuracy on the 400 problems before and
after training with its paired standard error (the evaluation before training runs on the trainer's own engine, as
in notebook 03), every step's time (min / median / max after the first two), and the device memory: allocated once
the trainer and its engine are up, and the peak during training above that (torch's count), plus the device memory
in use (the driver's count, which also sees what a sleep-mode engine allocates outside torch's caching allocator).

    python3 benchmarks/lora_smollm2/run.py full --steps 60 --out $OUT      # one call
    python3 benchmarks/lora_smollm2/run.py lora --steps 60 --out $OUT      # the next call
    python3 benchmarks/lora_smollm2/run.py sleep --steps 60 --out $OUT     # and the next
    python benchmarks/lora_smollm2/run.py report --out benchmarks/lora_smollm2/results   # here: the side-by-side table
    python benchmarks/lora_smollm2/run.py full lora --smoke --out /tmp/x   # the same code on a CPU, in a minute
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

VARIANTS = ("full", "lora", "sleep")
LORA = dict(use_peft=True, lora_r=16, lora_alpha=32)
WARMUP_STEPS = 2  # not in the step-time spread: the first steps compile and fill caches
SMOKE = dict(profile="tiny", per_device_train_batch_size=8, num_generations=4, max_completion_length=32,
             use_vllm=False, save_steps=1000)


def in_use(memory) -> int:
    """Bytes of device memory in use (total - free: the driver's view, which also sees allocations outside torch)."""
    return memory.total_bytes - memory.free_bytes


def child(variant: str, steps: int, lora_lr: float, smoke: bool, out: Path) -> None:
    """Train one variant in this process and write its record."""
    import torch

    from grpo_lab import device, evaluation
    from grpo_lab.data import load_split
    from grpo_lab.device import Machine
    from grpo_lab.env import quiet_notebook
    from grpo_lab.train import TrainConfig, prepare

    quiet_notebook()
    machine = Machine.detect()
    overrides = dict(max_steps=steps, live_plot=False, output_dir=str(out / f"run-{variant}"))
    if smoke:
        overrides.update(SMOKE)
    if variant == "lora":
        overrides.update(LORA, learning_rate=lora_lr)
    if variant == "sleep":
        overrides.update(vllm_enable_sleep_mode=True)
    config = TrainConfig(**overrides).resolve(machine)
    rows = load_split("eval")[:16 if smoke else None]
    cuda = device.is_cuda(config.device)

    started = time.perf_counter()
    training = prepare(config, machine=machine)
    resident = torch.cuda.memory_allocated() if cuda else None
    in_use_after_prepare = in_use(device.memory_info(kind=config.device)) if cuda else None
    before = evaluation.evaluate(config.model, rows, max_tokens=config.max_completion_length,
                                 backend=config.rollout_backend, engine=training.rollout_engine())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result = training.train()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    in_use_after_training = in_use(device.memory_info(kind=config.device)) if cuda else None
    after = evaluation.evaluate(result.final_model_dir, rows, max_tokens=config.max_completion_length,
                                backend=config.rollout_backend, engine=result.rollout_engine())
    step_times = [m["step_time"] for m in result.metrics if "step_time" in m]
    timed = step_times[WARMUP_STEPS:] or step_times
    gain = evaluation.greedy_gain(rows, before, after)
    record = {
        "variant": variant, "command": f"python3 benchmarks/lora_smollm2/run.py {variant} --steps {steps}"
                                       + (f" --lora-lr {lora_lr:g}" if variant == "lora" else ""),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": machine.name,
        "model": Path(config.model).name, "steps": result.global_step,
        "seconds_total": round(time.perf_counter() - started, 1),
        "recipe": {k: getattr(config, k) for k in ("num_prompts_per_step", "num_generations", "learning_rate", "beta",
                                                   "temperature", "use_peft", "lora_r", "lora_alpha",
                                                   "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode",
                                                   "rollout_backend")},
        "step_seconds": {"min": min(timed), "median": statistics.median(timed), "max": max(timed), "n": len(timed),
                         "all": step_times},
        "train_seconds": round(result.seconds, 1),
        "memory_gib": None if not cuda else {"resident_after_prepare": resident / 2**30,
                                             "peak_during_training": peak / 2**30,
                                             "training_above_resident": (peak - resident) / 2**30,
                                             "device_in_use_after_prepare": in_use_after_prepare / 2**30,
                                             "device_in_use_after_training": in_use_after_training / 2**30},
        "greedy_accuracy": {"before": gain.before, "after": gain.after, "points": gain.points,
                            "standard_error_points": gain.standard_error_points,
                            "standard_errors": gain.standard_errors, "problems": gain.count},
        "evaluation_seconds": {"before": round(before.seconds, 1), "after": round(after.seconds, 1)},
        "frac_reward_zero_std_last_20": result.mean("frac_reward_zero_std", last=20),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{variant}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(describe(record))


def describe(record: dict) -> str:
    steps, acc, memory = record["step_seconds"], record["greedy_accuracy"], record["memory_gib"]
    line = (f"{record['variant']:4s}: {record['steps']} steps, step {steps['median']:.2f} s "
            f"({steps['min']:.2f}–{steps['max']:.2f}, n={steps['n']}); "
            f"greedy {acc['before']:.1%} → {acc['after']:.1%} ({acc['standard_errors']:+.1f} SE)")
    if memory:
        line += (f"; torch: {memory['resident_after_prepare']:.1f} GiB allocated after prepare, training peak "
                 f"+{memory['training_above_resident']:.2f} GiB above it")
    if memory and "device_in_use_after_prepare" in memory:  # the driver's view: sees a sleeping engine's release
        line += (f"; device in use {memory['device_in_use_after_prepare']:.1f} GiB after prepare, "
                 f"{memory['device_in_use_after_training']:.1f} GiB after training")
    return line


def report(out: Path) -> None:
    """The variants found in ``out``, side by side."""
    records = [json.loads((out / f"{v}.json").read_text()) for v in VARIANTS if (out / f"{v}.json").is_file()]
    if not records:
        raise SystemExit(f"no variant results in {out}")
    for record in records:
        print(describe(record))
    from lab.bench.stats import speedup_range

    timed = {r["variant"]: r["step_seconds"]["all"][WARMUP_STEPS:] or r["step_seconds"]["all"] for r in records}
    for variant in ("lora", "sleep"):
        if "full" in timed and variant in timed:  # separate processes, one after the other: never interleaved
            ratio = speedup_range(timed[variant], timed["full"], interleaved=False)
            print(f"step time, {variant} over full: {ratio.describe()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="+", choices=(*VARIANTS, "report", "child"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lora-lr", type=float, default=2e-4, help="LoRA's learning rate (full: the recipe's)")
    parser.add_argument("--smoke", action="store_true", help="the tiny model on the CPU, 2 steps, 16 problems")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/lora_smollm2")))
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = 2 if args.smoke else args.steps
    if args.what == ["child"]:
        child(args.variant, steps, args.lora_lr, args.smoke, args.out)
        return 0
    for what in args.what:
        if what == "report":
            report(args.out)
            continue
        command = [sys.executable, __file__, "child", "--variant", what, "--steps", str(steps),
                   "--lora-lr", str(args.lora_lr), "--out", str(args.out), *(["--smoke"] if args.smoke else [])]
        if subprocess.run(command).returncode != 0:
            print(f"{what}: failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
