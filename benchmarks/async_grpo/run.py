"""Asynchronous GRPO on two GPUs: completions trained per second against synchronous server mode and colocate, and
the reward curve over the same number of completions.

Parts, each its own call into the same ``--out`` (each writes its own file there; ``report`` assembles them):

    speed   the seed workload (``lab.bench``'s GRPO step: 128 prompts x 4 completions of 256 tokens, prompts of
            ~128 tokens, micro-batches of 32) on random weights of ``--shape``: the asynchronous trainer here
            (``grpo_lab.async_grpo``), then synchronous server mode and colocate through
            ``benchmarks/scale_out/run.py`` with the same sizes; beta=0 for all three (``AsyncGRPOTrainer`` has no
            reference model), so the comparison is like for like. Writes ``speed_async.json`` and
            ``scale_out/scale_out_seed.json``.
    curve   SmolLM2-135M-Instruct (``benchmarks/grpo_smollm2``'s model folder and English rows), synchronous server
            mode then asynchronous, the same steps and completions per step; reward per step. Writes
            ``curve_sync.json``, ``curve_async.json``.
    report  ``results.json`` (``speedup_vs_sync_server`` and the rest) and ``curves.png`` into ``--results``
            (default: ``benchmarks/async_grpo/``); runs anywhere, e.g. on the dev machine from the fetched ``--out``.

    python benchmarks/async_grpo/run.py speed --out OUT --shape qwen2.5-0.5b --rollout-devices 0 --train-devices 1
    python benchmarks/async_grpo/run.py curve --out OUT --model /tmp/grpo-smollm2/model \\
        --rollout-devices 0 --train-devices 1
    python benchmarks/async_grpo/run.py report --out OUT

On the CPU (2 cores, shared by server and trainer: it shows the script runs, not a speed):

    python benchmarks/async_grpo/run.py speed --out /tmp/async-cpu --profile tiny --num-prompts 4 \\
        --max-completion-length 16 --per-device-train-batch-size 8 --grpo-steps 3 --grpo-warmup-steps 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_lab import async_grpo, device, plots, runs, scale
from grpo_lab.data import load_split, write_jsonl
from grpo_lab.experiment import TrainConfig
from grpo_lab.paths import TINY_MODEL_DIR
from grpo_lab.rollout import encode_prompts, load_tokenizer
from lab import bench
from lab.bench.profiles import STEP_FIELDS
from lab.bench.stats import median
from lab.bench.workload import shaped_model_dir

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SCALE_OUT = REPO_ROOT / "benchmarks" / "scale_out" / "run.py"
RUN_FILES = (scale.SERVER_LOG, scale.TRAINER_LOG, runs.METRICS_FILE, runs.CONFIG_FILE, scale.RESULT_FILE,
             async_grpo.RESULT_FILE)
SIZES = (*STEP_FIELDS, "prompt_tokens", "grpo_steps", "grpo_warmup_steps")
NO_KL = {"beta": 0.0}
# The reward curve: benchmarks/grpo_smollm2's recipe (16 prompts x 8 at T=0.7, lr 2e-5 with 10 warmup steps, bf16
# autocast, correctness + 0.2 x format, English rows), without the KL term, for both layouts.
CURVE = dict(profile="gpu", per_device_train_batch_size=128, num_generations=8, max_prompt_length=160,
             max_completion_length=256, learning_rate=2e-5, lr_scheduler_type="constant_with_warmup", warmup_steps=10,
             beta=0.0, loss_type="dapo", temperature=0.7, rewards=("correctness", "format"),
             reward_weights=(1.0, 0.2), save_steps=10_000, logging_steps=1, seed=0, live_plot=False)
CURVE_LANGS = ("en",)


def portable(command: list[str] | str) -> str:
    """A command line without this machine's interpreter and checkout paths."""
    text = command if isinstance(command, str) else shlex.join(command)
    return text.replace(sys.executable, "python").replace(str(REPO_ROOT), ".")


def keep_logs(run_dir: Path, target: Path) -> None:
    """Copy a run's logs and records next to the results (also when the run failed)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            shutil.copy(run_dir / name, target / name)


def server_config(args: argparse.Namespace) -> scale.ServerModeConfig:
    extra = ("--enforce-eager",) if device.detect() == "cpu" else ()  # vLLM-CPU: no torch.compile at start
    return scale.ServerModeConfig(rollout_devices=args.rollout_devices, train_devices=args.train_devices,
                                  train_timeout_s=args.train_timeout, extra_server_args=extra)


def timed(step_seconds: list[float], warmup: int) -> list[float]:
    return step_seconds[warmup:] or step_seconds


def layout_row(step_seconds: list[float], warmup: int, completions_per_step: int, **facts) -> dict:
    steps = timed(step_seconds, warmup)
    middle = median(steps)
    return {"median_step_s": middle, "completions_per_second": completions_per_step / middle, "step_s": steps,
            "all_steps_s": step_seconds, "completions_per_step": completions_per_step, **facts}


# --------------------------------------------------------------------------------------------------
# speed: the seed workload, three layouts
# --------------------------------------------------------------------------------------------------
def speed(args: argparse.Namespace) -> None:
    profile = bench.get_bench_profile(args.profile, **{n: getattr(args, n) for n in SIZES
                                                            if getattr(args, n) is not None})
    config = server_config(args).resolved()
    warmup = profile.grpo_warmup_steps
    record = {"command": "python benchmarks/async_grpo/run.py " + shlex.join(sys.argv[1:]),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "profile": profile.as_dict(), "shape": args.shape,
              "train_overrides": NO_KL, "max_staleness": args.max_staleness, "device": _device()}
    if "async" in args.layouts:
        with tempfile.TemporaryDirectory(prefix="grpo-lab-async-") as scratch:
            scratch = Path(scratch)
            model = (str(shaped_model_dir(args.shape, scratch / "model", random_weights=True)) if args.shape
                     else str(args.model or TINY_MODEL_DIR))
            tokenizer = load_tokenizer(model)
            rows = bench.seed_workload(tokenizer, profile.num_prompts, profile.prompt_tokens)
            dataset = write_jsonl(rows, scratch / "seed_workload.jsonl")
            longest = max(len(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows]))
            train_config = dataclasses.replace(
                bench.grpo_step_config(profile, model, dataset, longest, config.device, **NO_KL),
                output_dir=str(scratch / "run-async"))
            try:
                result = async_grpo.run_async(async_grpo.AsyncConfig(max_staleness=args.max_staleness), config,
                                              train_config)
            finally:
                keep_logs(Path(train_config.output_dir), args.out / "async_run")
        per_step = result.completions_per_step
        record["async"] = layout_row(
            result.step_seconds, warmup, per_step, server_start_s=result.server_start_seconds,
            train_s=result.train_seconds, lag_counts=result.lag_counts, dropped_stale=result.dropped_stale,
            async_config=dataclasses.asdict(result.async_config), trl_workarounds=result.trl_workarounds,
            server_stats=result.server_stats, server_command=portable(result.server_command),
            trainer_command=portable(result.trainer_command),
            mean_completion_tokens=[r.get("completions/mean_length") for r in result.metrics[warmup:]],
            perf={key: [r.get(key) for r in result.metrics[warmup:]] for key in
                  ("perf/step_s", "perf/rollout_wait_s", "perf/fwd_bwd_s", "perf/optimizer_s", "perf/weight_sync_s",
                   "rollout/backpressure_s")})
        (args.out / "speed_async.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"async: {record['async']['median_step_s']:.2f} s per step, "
              f"{record['async']['completions_per_second']:.1f} completions/s, lags {result.lag_counts}")
    sync_layouts = [name for name in ("server", "colocate") if name in args.layouts]
    if sync_layouts:
        command = [sys.executable, str(SCALE_OUT), "--out", str(args.out / "scale_out"), "--profile", profile.name,
                   "--parts", ",".join(sync_layouts), "--train-option", "beta=0.0"]
        command += ["--shape", args.shape] if args.shape else []
        command += ["--rollout-devices", ",".join(map(str, args.rollout_devices))] if args.rollout_devices else []
        command += ["--train-devices", ",".join(map(str, args.train_devices))] if args.train_devices else []
        for name in SIZES:
            if getattr(args, name) is not None:
                command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        print("synchronous layouts:", portable(command), flush=True)
        subprocess.run(command, check=True)


# --------------------------------------------------------------------------------------------------
# curve: SmolLM2-135M, synchronous server mode vs asynchronous, the same completions
# --------------------------------------------------------------------------------------------------
def curve(args: argparse.Namespace) -> None:
    config = server_config(args)
    rows = [row for row in load_split("train") if row["lang"] in CURVE_LANGS]
    dataset = write_jsonl(rows, args.out / f"train_{'_'.join(CURVE_LANGS)}.jsonl")
    overrides = {"per_device_train_batch_size": args.per_device_train_batch_size,
                 "num_generations": args.num_generations, "max_completion_length": args.max_completion_length}
    recipe = {**CURVE, **{k: v for k, v in overrides.items() if v is not None}}
    if device.detect() == "cpu":  # the smoke run: the tiny model's recipe sizes
        recipe.update(profile="tiny", warmup_steps=0, lr_scheduler_type="constant", max_prompt_length=96,
                      learning_rate=5e-5)
    base = TrainConfig(**recipe, model=str(args.model or TINY_MODEL_DIR), dataset=str(dataset), train_types=(),
                       max_steps=args.steps)
    for layout in [name for name in ("server", "async") if name in args.layouts]:
        run_dir = args.out / f"curve_{layout}_run"
        shutil.rmtree(run_dir, ignore_errors=True)
        train_config = dataclasses.replace(base, output_dir=str(run_dir))
        started = time.perf_counter()
        if layout == "server":
            result = scale.run_server_mode(config, train_config)
            facts = {}
        else:
            result = async_grpo.run_async(async_grpo.AsyncConfig(max_staleness=args.max_staleness), config,
                                          train_config)
            facts = {"lag_counts": result.lag_counts, "dropped_stale": result.dropped_stale,
                     "async_config": dataclasses.asdict(result.async_config)}
        per_step = base.per_device_train_batch_size * base.gradient_accumulation_steps
        record = {"command": "python benchmarks/async_grpo/run.py " + shlex.join(sys.argv[1:]),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "layout": layout, "device": _device(),
                  "model": Path(base.model).name,
                  "recipe": {k: v for k, v in dataclasses.asdict(base).items() if k in {*recipe, "max_steps"}},
                  "wall_s": time.perf_counter() - started, "server_start_s": result.server_start_seconds,
                  **layout_row(result.step_seconds, 1, per_step, **facts),
                  "reward": [r.get("reward") for r in result.metrics],
                  "completions": [r["step"] * per_step for r in result.metrics],
                  "server_command": portable(result.server_command),
                  "trainer_command": portable(result.trainer_command)}
        (args.out / f"curve_{layout}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"curve, {layout}: {record['median_step_s']:.2f} s per step, mean reward of the last ten steps "
              f"{_mean(record['reward'][-10:]):.3f}", flush=True)


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------
def report(args: argparse.Namespace) -> None:
    results: dict = {"method": __doc__.split("\n\n")[1], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    speed_path = args.out / "speed_async.json"
    if speed_path.is_file():
        measured = json.loads(speed_path.read_text())
        layouts = {"async": measured.pop("async")}
        sync_path = args.out / "scale_out" / f"scale_out_{measured['profile']['name']}.json"
        sync = json.loads(sync_path.read_text()) if sync_path.is_file() else {}
        if sync and sync.get("train_overrides") != NO_KL:
            raise SystemExit(f"{sync_path} was measured with {sync.get('train_overrides')}, not {NO_KL}")
        per_step = layouts["async"]["completions_per_step"]
        for name in ("server", "colocate"):
            if name in sync:
                layouts[name] = layout_row(sync[name].get("all_steps_s") or sync[name].get("step_s"),
                                           measured["profile"]["grpo_warmup_steps"], per_step,
                                           median_split=sync[name]["median"], command=sync.get("command"))
        results["speed"] = {**measured, "layouts": layouts, "sync_command": sync.get("command")}
        for name, key in (("server", "speedup_vs_sync_server"), ("colocate", "speedup_vs_colocate")):
            if name in layouts:
                results[key] = layouts["async"]["completions_per_second"] / layouts[name]["completions_per_second"]
    curves = {layout: json.loads((args.out / f"curve_{layout}.json").read_text())
              for layout in ("server", "async") if (args.out / f"curve_{layout}.json").is_file()}
    if curves:
        results["curve"] = curves
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    if curves:
        names = {"server": "synchronous server mode", "async": "asynchronous"}
        figure = plots.plot_async_tradeoff({names[k]: {**v, "lag_counts": v.get("lag_counts")} for k, v in
                                            curves.items()},
                                           title=f"{next(iter(curves.values())).get('model', 'the model')}: the same "
                                                 f"completions, two layouts")
        figure.savefig(args.results / "curves.png", dpi=100)
    for name, row in results.get("speed", {}).get("layouts", {}).items():
        print(f"{name:>9}: {row['median_step_s']:6.2f} s per step, {row['completions_per_second']:7.1f} completions/s")
    for key in ("speedup_vs_sync_server", "speedup_vs_colocate"):
        if key in results:
            print(f"{key}: {results[key]:.2f}x")
    print(f"wrote {args.results / 'results.json'}")


def _device() -> dict:
    kind = device.detect()
    return {"kind": kind, "name": device.device_name(kind=kind), "count": device.device_count(kind)}


def _mean(values: list) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("speed", "curve", "report"))
    parser.add_argument("--out", required=True, type=Path, help="where the parts write (and report reads)")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent,
                        help="report: where results.json and curves.png go (default: next to this script)")
    parser.add_argument("--layouts", default="async,server,colocate", type=lambda t: t.split(","))
    parser.add_argument("--profile", choices=sorted(bench.BENCH_PROFILES), default="seed")
    parser.add_argument("--shape", default=None, help="speed: random weights of this architecture (qwen2.5-0.5b)")
    parser.add_argument("--model", default=None, help="a model folder (curve: SmolLM2; default: the tiny model)")
    parser.add_argument("--rollout-devices", type=scale.device_indices, default=None)
    parser.add_argument("--train-devices", type=scale.device_indices, default=None)
    parser.add_argument("--max-staleness", type=int, default=async_grpo.DEFAULT_MAX_STALENESS)
    parser.add_argument("--steps", type=int, default=60, help="curve: optimizer steps per layout")
    parser.add_argument("--train-timeout", type=float, default=540.0)
    for name in SIZES:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    args = parser.parse_args(argv)
    scale.exit_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    {"speed": speed, "curve": curve, "report": report}[args.part](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
