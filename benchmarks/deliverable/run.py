"""What a learner keeps: GSM8K on a small card, LoRA and QLoRA with the course's defaults, evaluated twice — on the
trainer's own engine (what the run sampled from) and with HF ``generate`` on the saved deliverable (``final/``, what a
learner evaluates, exports and serves) — then the run exported as a stock-TRL script and that script run alone.

One process per device call. For each kind (``--kinds qlora,lora``) the ``gpu`` profile with only ``use_peft`` (and
``load_in_4bit``) set trains on GSM8K's train split less a held-out part (as ``benchmarks/gsm8k/run.py`` splits it)
and scores the held-out problems greedily, strictly (``#### N``), leniently (the final number) and by format, before
and after: on the engine (the lent colocated engine) and on the deliverable with HF ``generate`` (before: the
deliverable at step 0, the untrained adapter on its base). Then ``grpo-lab export-recipe`` of the first run, and that
script run in a process that cannot import grpo_lab, for a few steps: its first step's reward beside the run's.

    GRPO_LAB_DEVICE_MEMORY_GIB=16 python3 benchmarks/deliverable/run.py --out $OUT   # one GPU, SmolLM2, a 16 GiB card
    python benchmarks/deliverable/run.py --smoke --out /tmp/deliverable               # the code path on a CPU

Writes ``$OUT/results.json`` and each run's ``config.json`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the offline GPU bundle
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from grpo_lab import data, device, evaluation, models, recipe  # noqa: E402  (after the path)
from grpo_lab.device import Machine  # noqa: E402
from grpo_lab.env import quiet_notebook  # noqa: E402
from grpo_lab.train import TrainConfig, prepare  # noqa: E402

_spec = importlib.util.spec_from_file_location("gsm8k_run", REPO / "benchmarks" / "gsm8k" / "run.py")
gsm8k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gsm8k)  # the GSM8K split and summaries, as benchmarks/gsm8k/run.py makes them

KINDS = {"qlora": dict(use_peft=True, load_in_4bit=True), "lora": dict(use_peft=True), "full": {}}
MEASURES = ("accuracy", "lenient", "format")
SMOKE = dict(profile="tiny", max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=32,
             use_vllm=False, save_steps=1000, max_prompt_length=400)


def gains(rows: list[dict[str, Any]], before: evaluation.Evaluation, after: evaluation.Evaluation) -> dict[str, Any]:
    out = {}
    for measure in MEASURES:
        gain = evaluation.greedy_gain(rows, before, after, measure)
        out[measure] = {**dataclasses.asdict(gain), "points": round(gain.points, 2),
                        "standard_errors": round(gain.standard_errors, 2), "describe": gain.describe()}
    return out


def initial_deliverable(training: Any, out: Path) -> str:
    """The deliverable at step 0: the untrained adapter on its base for QLoRA (PEFT starts the adapter at zero, so it
    answers as the base loaded as the deliverable loads it), else the base model itself."""
    config = training.config
    if not config.load_in_4bit:
        return config.model
    folder = out / "adapter-step-0"
    training.trainer.save_model(str(folder))
    training.trainer.processing_class.save_pretrained(str(folder))
    from grpo_lab import lora

    models.write_manifest(folder, {"base_model_path": models.resolve_model(config.model),
                                   "quantization": lora.quantization_kwargs(config)})
    return str(folder)


def run_kind(kind: str, args: argparse.Namespace, machine: Machine, train_file: Path, held: list[dict]) -> dict:
    overrides = dict(max_steps=args.max_steps, max_minutes=args.max_minutes, live_plot=False, train_types=(),
                     train_languages=(), max_prompt_length=gsm8k.MAX_PROMPT_LENGTH, output_dir=str(args.out / kind),
                     dataset=str(train_file), **KINDS[kind])
    if args.smoke:
        overrides.update(SMOKE)
    if args.model:
        overrides["model"] = args.model
    timings: dict[str, float] = {}
    phase = time.perf_counter()
    training = prepare(TrainConfig(**overrides), machine=machine)
    config = training.config
    timings["prepare_s"] = time.perf_counter() - phase
    greedy = dict(num_samples=0, max_tokens=config.max_completion_length)
    phase = time.perf_counter()
    engine_before = evaluation.evaluate(config.model, held, engine=training.rollout_engine(),
                                        backend=config.rollout_backend, **greedy)
    start = initial_deliverable(training, args.out / kind)
    hf_before = evaluation.evaluate(start, held, backend="hf", **greedy)
    timings["before_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    result = training.train()
    timings["train_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    engine_after = evaluation.evaluate(result.final_model_dir, held, engine=result.rollout_engine(),
                                       backend=config.rollout_backend, **greedy)
    timings["engine_after_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    hf_after = evaluation.evaluate(result.final_model_dir, held, backend="hf", **greedy)
    timings["hf_after_s"] = time.perf_counter() - phase
    on_engine, on_final = gains(held, engine_before, engine_after), gains(held, hf_before, hf_after)
    agreement = {}
    for measure in MEASURES:
        a, b = on_engine[measure], on_final[measure]
        changed = max(1, a["up"] + a["down"], b["up"] + b["down"])
        agreement[measure] = round(abs(a["points"] - b["points"]) / (100 * changed ** 0.5 / len(held)), 2)
    adapter = models.adapter_model(result.final_model_dir)
    return {"kind": kind, "run_dir": str(result.run_dir), "steps": result.global_step,
            "deliverable": adapter.describe() if adapter else f"final/ ({models.saved_dtype(result.final_model_dir)})",
            "recipe": {key: getattr(config, key) for key in (
                "model", "use_peft", "load_in_4bit", "vllm_lora_sync", "learning_rate", "lora_r", "lora_alpha",
                "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                "max_completion_length", "vllm_gpu_memory_utilization", "gradient_checkpointing", "max_steps")},
            "engine": on_engine, "deliverable_hf": on_final,
            "difference_in_standard_errors": agreement,
            "training": gsm8k.training_summary(result.metrics),
            "first_step": result.metrics[0] if result.metrics else {},
            "seconds": {key: round(value, 1) for key, value in timings.items()},
            "peak_torch_gib": round(device.peak_memory_bytes(kind=machine.kind) / 2**30, 2)}


def run_recipe_alone(run_dir: str, out: Path, steps: int) -> dict[str, Any]:
    """Export the run as a stock-TRL script and run it where grpo_lab cannot be imported: its first logged step."""
    script = recipe.export_recipe(run_dir, out / "trl_recipe.py", overwrite=True)
    env = {key: value for key, value in os.environ.items() if key != "MASTER_PORT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and not Path(p, "grpo_lab").is_dir())
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(script), "--max-steps", str(steps), "--output-dir",
                           str(out / "recipe-run")], cwd="/", env=env, capture_output=True, text=True, timeout=900)
    logged = []
    for line in done.stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and "'reward'" in line:
            try:
                logged.append(ast.literal_eval(line))
            except (ValueError, SyntaxError):
                pass
    (out / "recipe-run.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr[-20000:])
    header = script.read_text().split('"""')[1]
    return {"returncode": done.returncode, "seconds": round(time.perf_counter() - started, 1), "steps": len(logged),
            "first_step": logged[0] if logged else None, "header": header.strip(),
            "grpo_lab_importable": subprocess.run([sys.executable, "-c", "import grpo_lab"], cwd="/", env=env,
                                                  capture_output=True).returncode == 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", help="model folder or hub id (default: GRPO_LAB_MODEL, else the profile's)")
    parser.add_argument("--kinds", default="qlora,lora", help="comma-separated: qlora, lora, full")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--max-minutes", type=float, default=2.0, help="each run's time guard")
    parser.add_argument("--eval-size", type=int, default=300, help="held-out GSM8K problems")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--recipe-steps", type=int, default=4, help="steps of the exported script (0: skip it)")
    parser.add_argument("--smoke", action="store_true", help="the tiny profile on a CPU, LoRA: the code path")
    args = parser.parse_args(argv)
    quiet_notebook()
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = Machine.detect()
    kinds = ["lora"] if args.smoke else [k.strip() for k in args.kinds.split(",") if k.strip()]
    model = args.model or TrainConfig(**(SMOKE if args.smoke else {})).with_profile(machine).model
    sizes = dict(eval_size=16, train_rows=64) if args.smoke else dict(eval_size=args.eval_size,
                                                                      train_rows=args.train_rows)
    problems = data.load_gsm8k("train", path=gsm8k.DATA_FILE)
    parts = gsm8k.split_rows(problems, fits=gsm8k.prompt_fits(model, gsm8k.MAX_PROMPT_LENGTH), **sizes)
    train_file = data.write_jsonl(parts["train"], args.out / "gsm8k_train.jsonl")
    out_file = args.out / "results.json"  # rows of earlier processes kept: gpu.sh runs each kind in its own
    record = json.loads(out_file.read_text(encoding="utf-8")) if out_file.is_file() else {"runs": {}}
    record.update({
        "command": "python3 benchmarks/deliverable/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("GRPO_LAB_COMMIT", "unknown"),
        "machine": {"kind": machine.kind, "device": device.device_name(kind=machine.kind),
                    "memory_gib": round(machine.memory_gib, 2), "device_gib": machine.device_gib},
        "smoke": args.smoke, "model": model,
        "data": {"held_out": len(parts["held_out"]), "train_rows": len(parts["train"]),
                 "hold_out_seed": data.GSM8K_SPLIT_SEED, "max_prompt_length": gsm8k.MAX_PROMPT_LENGTH}})

    def write() -> None:  # after each row: a later one that fails keeps what came before
        record["total_s"] = round(time.perf_counter() - started, 1)
        out_file.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")

    rows = {}
    for kind in kinds:
        rows[kind] = record["runs"][kind] = run_kind(kind, args, machine, train_file, parts["held_out"])
        write()
    if args.recipe_steps:
        record["recipe"] = run_recipe_alone(rows[kinds[0]]["run_dir"], args.out, args.recipe_steps)
        write()
    for kind, row in rows.items():
        print(f"{kind}: {row['steps']} steps; the deliverable: {row['deliverable']}")
        for measure in MEASURES:
            print(f"  engine     {row['engine'][measure]['describe']}")
            print(f"  final (HF) {row['deliverable_hf'][measure]['describe']}")
    if args.recipe_steps:
        print(f"recipe alone: exit {record['recipe']['returncode']}, {record['recipe']['steps']} steps logged, "
              f"first step {record['recipe']['first_step']}")
    print(f"wrote {args.out / 'results.json'} in {record['total_s']:.0f} s")
    return 0


if __name__ == "__main__":  # vLLM starts worker processes: the guard keeps them from re-running this file
    raise SystemExit(main())
