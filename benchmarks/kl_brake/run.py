"""The KL brake, measured: the tiny profile trained with ``beta = 0`` and with ``beta > 0`` (a frozen reference model),
same seeds, same steps, same data; held-out accuracy before and after each, split into the types GRPO trained on and
the types it did not. Every beta runs with every seed, so the spread between seeds says how large a difference
between betas must be to mean something.

Notebook 03 shows what training does to the types it rewards and to the ones it does not; the usual brake on the second
is a KL penalty to the reference model (TRL's ``beta``). This script measures whether that brake works at this scale,
and at what cost to the trained types. Its JSON is committed and read by notebook 03 (README.md has the command and the
numbers of the committed run).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \\
      .venv/bin/python benchmarks/kl_brake/run.py --betas 0,0.04,0.4 --seeds 0,1 --max-steps 250 \
      --out benchmarks/kl_brake/results.json

A run folder per beta and seed goes to ``--runs`` (default ``runs/kl_brake/``); a finished one is evaluated again, not
retrained, so an interrupted session continues where it stopped. The JSON is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from grpo_lab import env, evaluation, runs
from grpo_lab.data import load_split
from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig
from grpo_lab.paths import REPO_ROOT
from grpo_lab.train import train


def _mean(records: list[dict], key: str, first: int | None = None, last: int | None = None) -> float | None:
    values = [r[key] for r in records if key in r]
    values = values[:first] if first else values[-last:] if last else values
    return sum(values) / len(values) if values else None


def run_beta(beta: float, seed: int, base: TrainConfig, machine: Machine, runs_dir: Path, rows: list[dict],
             before: evaluation.Evaluation) -> dict:
    config = TrainConfig(**{**base.to_dict(), "beta": beta, "seed": seed,
                            "output_dir": str(runs_dir / f"beta-{beta:g}-seed-{seed}")})
    final = Path(config.output_dir) / runs.FINAL
    if final.is_dir():
        print(f"beta={beta:g} seed={seed}: {final} exists, evaluating it again (delete the folder to retrain)",
              flush=True)
        steps = None
    else:
        result = train(config, machine=machine)
        steps = result.global_step
    records = runs.read_metrics(Path(config.output_dir) / runs.METRICS_FILE)
    resolved = config.resolve(machine)
    after = evaluation.evaluate(final, rows, max_tokens=resolved.max_completion_length)
    window = 25
    return {
        "beta": beta, "seed": seed, "steps": steps or (records[-1]["step"] if records else None),
        "train_seconds": sum(r.get("step_time", 0.0) for r in records),  # the sum of step times, also for a reused run
        "eval_seconds": after.seconds,
        "train_metrics": {f"{key}_{part}_{window}": _mean(records, key, **{part: window})
                          for key in ("reward", "kl", "entropy") for part in ("first", "last")},
        "changes": evaluation.changes(before.report, after.report, resolved.train_types),
        "after": after.report.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--betas", default="0,0.04,0.4", help="comma-separated KL coefficients (include 0)")
    parser.add_argument("--max-steps", type=int, default=250)
    parser.add_argument("--seeds", default="0,1", help="comma-separated training seeds, each run with every beta")
    parser.add_argument("--eval-size", type=int, default=400, help="held-out problems (default all 400)")
    parser.add_argument("--runs", type=Path, default=REPO_ROOT / "runs" / "kl_brake")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args(argv)
    env.quiet_notebook()  # the same quiet output as the notebooks: this log is read by people
    betas = [float(b) for b in args.betas.split(",") if b.strip()]
    seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
    machine = Machine.detect()
    base = TrainConfig(profile="tiny", max_steps=args.max_steps, live_plot=False)
    resolved = base.resolve(machine)
    rows = load_split("eval")[:args.eval_size]
    started = time.perf_counter()
    before = evaluation.evaluate(resolved.model, rows, max_tokens=resolved.max_completion_length)
    print(f"before: {before.seconds:.0f} s\n{before.report.table()}", flush=True)
    result = {
        "what": "tiny profile, beta = 0 vs beta > 0 (frozen reference model), same seeds and steps",
        "command": "python benchmarks/kl_brake/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"device": machine.kind, "cpus": os.cpu_count(), "load_average_start": os.getloadavg(),
                    "platform": platform.platform(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "versions": {k: v for k, v in env.installed_versions(["torch", "transformers", "trl"]).items() if v},
        "settings": {"max_steps": args.max_steps, "seeds": seeds, "betas": betas, "eval_size": len(rows),
                     "train_types": list(resolved.train_types), "learning_rate": resolved.learning_rate,
                     "num_generations": resolved.num_generations,
                     "per_device_train_batch_size": resolved.per_device_train_batch_size,
                     "eval": {"num_samples": before.report.k, "temperature": before.report.temperature}},
        "before": before.report.to_dict(), "before_eval_seconds": before.seconds, "runs": [],
    }
    for seed, beta in ((seed, beta) for seed in seeds for beta in betas):
        result["runs"].append(run_beta(beta, seed, base, machine, args.runs, rows, before))
        result["total_seconds"] = time.perf_counter() - started
        result["machine"]["load_average_end"] = os.getloadavg()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        last = result["runs"][-1]
        for group in (g for g in ("trained", "untrained") if g in last["changes"]):
            for key in evaluation.METRICS:
                c = last["changes"][group][key]
                print(f"beta={beta:g} seed={seed} {group:9s} {key:18s} {c['before']:6.1%} → {c['after']:6.1%} "
                      f"({c['points']:+.1f})")
        print(f"beta={beta:g} seed={seed}: train {last['train_seconds']:.0f} s, KL last 25 steps "
              f"{last['train_metrics']['kl_last_25']}", flush=True)
    print(f"wrote {args.out} ({result['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
