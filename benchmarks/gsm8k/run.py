"""GSM8K, a real task, with the course's recipe on a real model: held-out accuracy before and after, with errors.

One process, one device call: the profile's experiment (``TrainConfig().resolve(machine)``, the model from
``--model`` or ``GRPO_LAB_MODEL``) trains on GSM8K's train split, less a held-out part (``data.hold_out``) that is
evaluated greedily before and after training on the trainer's own engine, as notebook 03 does. Writes
``$OUT/results.json`` (``lab.results.gsm8k_run`` reads it), the run's ``metrics.jsonl`` and ``config.json``.

    python3 benchmarks/gsm8k/run.py --out $OUT                    # one H200, SmolLM2-135M: <= 3 minutes
    python benchmarks/gsm8k/run.py --smoke --out /tmp/gsm8k       # the same code on a CPU, tiny model, ~1 minute
    python benchmarks/gsm8k/run.py --model Qwen/Qwen2.5-1.5B-Instruct --max-steps 300 --max-minutes 60 \\
        --out runs/gsm8k-qwen1.5b                                 # a larger model, on a GPU of your own

The data: ``benchmarks/gsm8k/train.jsonl.xz`` (GSM8K's 7,473 training problems, MIT, ``LICENSE`` beside it) travels
with the repository; ``--data`` takes another copy (JSONL, compressed or not, or parquet).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the offline GPU bundle
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from grpo_lab import data  # noqa: E402  (after the path and the offline switches)

DATA_FILE = Path(__file__).resolve().parent / "train.jsonl.xz"
TRAIN_ROWS = 2000
"""Training problems (the first of the train part that fit ``max_prompt_length``): 40 steps of 16 prompts use 640."""
MAX_STEPS = 40
MAX_MINUTES = 1.25
"""The training's time guard (TrainConfig.max_minutes): with the engine's start and both evaluations the call stays
under 3 minutes on one H200 even if the steps run slower than expected; the record says how many steps ran."""
MAX_PROMPT_LENGTH = 320
"""GSM8K's questions run to ~1,000 characters: 320 tokens hold nearly all of them with a BPE tokenizer; longer
prompts are left out (the record counts them), since TRL would not truncate them."""
SMOKE = dict(profile="tiny", max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=32,
             use_vllm=False, save_steps=1000, max_prompt_length=400)
SMOKE_ROWS = dict(eval_size=16, train_rows=32)


def split_rows(rows: Sequence[dict[str, Any]], eval_size: int, train_rows: int,
               fits: Callable[[Sequence[dict[str, Any]]], list[bool]]) -> dict[str, Any]:
    """The held-out and training rows: ``data.hold_out`` first (so the held-out problems do not depend on the model),
    then only prompts that ``fits`` the experiment, then the first ``train_rows`` of the train part."""
    train, held = data.hold_out(rows, size=eval_size)
    kept_train = [row for row, ok in zip(train, fits(train)) if ok]
    kept_held = [row for row, ok in zip(held, fits(held)) if ok]
    return {"train": kept_train[:train_rows], "held_out": kept_held,
            "dropped_long_prompts": {"train": len(train) - len(kept_train), "held_out": len(held) - len(kept_held)}}


def prompt_fits(model: str, max_prompt_length: int) -> Callable[[Sequence[dict[str, Any]]], list[bool]]:
    """Whether each row's prompt, rendered with the model's chat template, is at most ``max_prompt_length`` tokens."""
    from transformers import AutoTokenizer

    from grpo_lab.rollout.prompts import encode_prompts

    tokenizer = AutoTokenizer.from_pretrained(model)
    return lambda rows: [len(p.token_ids) <= max_prompt_length
                         for p in encode_prompts(tokenizer, [row["prompt"] for row in rows])]


def share(gain) -> dict[str, Any]:
    """A paired greedy change (``evaluation.Gain``) as the record keeps it: its fields and its sentence."""
    return {**dataclasses.asdict(gain), "points": round(gain.points, 2), "standard_errors": round(gain.standard_errors, 2),
            "describe": gain.describe()}


def training_summary(metrics: Sequence[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """The training reward and the share of groups without a signal at the start and the end, the step times."""
    def mean(key: str, part: Sequence[dict[str, Any]]) -> float | None:
        values = [r[key] for r in part if key in r]
        return round(sum(values) / len(values), 4) if values else None

    first, last = metrics[:window], metrics[-window:]
    steps = [r["step_time"] for r in metrics[2:] or metrics if "step_time" in r]
    return {"reward_first": mean("reward", first), "reward_last": mean("reward", last),
            "frac_reward_zero_std_first": mean("frac_reward_zero_std", first),
            "frac_reward_zero_std_last": mean("frac_reward_zero_std", last),
            "completion_tokens_last": mean("completions/mean_length", last),
            "step_s_median": round(statistics.median(steps), 3) if steps else None, "window_steps": window}


def supervised_fine_tune(model: str, rows: Sequence[dict[str, Any]], out_dir: Path, epochs: float,
                         learning_rate: float, accelerator: bool) -> dict[str, Any]:
    """TRL's ``SFTTrainer`` on the training problems' worked solutions (loss on the solution only), saved to
    ``out_dir``: the seed write-up's first stage, before RL."""
    from trl import SFTConfig, SFTTrainer

    from grpo_lab.models import load_model_and_tokenizer

    model_obj, tokenizer = load_model_and_tokenizer(model, device="cpu", dtype="float32")
    args = SFTConfig(output_dir=str(out_dir / "work"), num_train_epochs=epochs, learning_rate=learning_rate,
                     lr_scheduler_type="cosine", warmup_steps=0.05, per_device_train_batch_size=16, max_length=640,
                     completion_only_loss=True, packing=False, seed=0, data_seed=0, use_cpu=not accelerator,
                     bf16=accelerator, save_strategy="no", report_to="none", logging_steps=10,
                     dataloader_num_workers=0, gradient_checkpointing=False, disable_tqdm=True)
    dataset = data.to_dataset([{"prompt": row["prompt"], "completion": [{"role": "assistant",
                                                                          "content": row["completion"]}]}
                               for row in rows])
    trainer = SFTTrainer(model=model_obj, args=args, train_dataset=dataset, processing_class=tokenizer)
    result = trainer.train()
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return {"epochs": epochs, "learning_rate": learning_rate, "steps": result.global_step,
            "train_loss": round(result.training_loss, 4), "rows": len(rows),
            "loss_log": [{"step": e["step"], "loss": round(e["loss"], 4)} for e in trainer.state.log_history
                         if "loss" in e]}


def greedy_record(rows: Sequence[dict[str, Any]], before: Any, after: Any) -> dict[str, Any]:
    """Every greedy measure's paired change (strict ``#### N``, lenient final number, format)."""
    from grpo_lab import evaluation

    return {measure: share(evaluation.greedy_gain(rows, before, after, measure))
            for measure in evaluation.GREEDY_MEASURES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where results.json and the run folder go")
    parser.add_argument("--model", help="model folder or hub id (default: GRPO_LAB_MODEL, else the profile's)")
    parser.add_argument("--data", type=Path, default=DATA_FILE, help="GSM8K's train split (JSONL, .gz, .xz or parquet)")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--max-minutes", type=float, default=MAX_MINUTES, help="training's time guard")
    parser.add_argument("--eval-size", type=int, default=data.GSM8K_EVAL_SIZE, help="held-out problems")
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS)
    parser.add_argument("--use-peft", action="store_true", help="LoRA (r=16) instead of every weight")
    parser.add_argument("--sft-epochs", type=float, default=0.0,
                        help="first fine-tune on the training problems' worked solutions (TRL's SFTTrainer), then "
                             "GRPO from there: SFT then RL (0: GRPO from the base model)")
    parser.add_argument("--sft-learning-rate", type=float, default=5e-5)
    parser.add_argument("--smoke", action="store_true", help="the tiny profile on a CPU: the code path, no result")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    from grpo_lab import device, evaluation
    from grpo_lab.device import Machine
    from grpo_lab.env import quiet_notebook
    from grpo_lab.train import TrainConfig, prepare

    quiet_notebook()
    machine = Machine.detect()
    overrides = dict(max_steps=args.max_steps, max_minutes=args.max_minutes, live_plot=False, train_types=(),
                     max_prompt_length=MAX_PROMPT_LENGTH, use_peft=args.use_peft, output_dir=str(args.out / "run"))
    sizes = dict(eval_size=args.eval_size, train_rows=args.train_rows)
    if args.smoke:
        overrides.update(SMOKE)
        sizes.update(SMOKE_ROWS)
    model = args.model or TrainConfig(**overrides).with_profile(machine).model
    parts = split_rows(data.load_gsm8k("train", path=args.data), fits=prompt_fits(model, overrides["max_prompt_length"]),
                       **sizes)
    train_file = data.write_jsonl(parts["train"], args.out / "gsm8k_train.jsonl")
    config = TrainConfig(**overrides, model=model, dataset=str(train_file)).resolve(machine)
    held = parts["held_out"]
    timings = {"load_s": time.perf_counter() - started}
    engine_settings = dict(num_samples=1, max_tokens=config.max_completion_length, backend=config.rollout_backend)
    sft: dict[str, Any] = {}
    if args.sft_epochs:  # SFT then RL: the base model evaluated alone, fine-tuned, and GRPO starts from there
        phase = time.perf_counter()
        base = evaluation.evaluate(config.model, held, **engine_settings)
        timings["base_s"] = time.perf_counter() - phase
        phase = time.perf_counter()
        sft = supervised_fine_tune(config.model, parts["train"], args.out / "sft", args.sft_epochs,
                                   args.sft_learning_rate, device.is_accelerator(machine.kind))
        timings["sft_s"] = time.perf_counter() - phase
        config = dataclasses.replace(config, model=str(args.out / "sft"))

    phase = time.perf_counter()
    training = prepare(config, machine=machine)
    timings["prepare_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    before = evaluation.evaluate(config.model, held, engine=training.rollout_engine(), **engine_settings)
    timings["before_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    result = training.train()
    timings["train_s"] = time.perf_counter() - phase
    phase = time.perf_counter()
    after = evaluation.evaluate(result.final_model_dir, held, engine=result.rollout_engine(), **engine_settings)
    timings["after_s"] = time.perf_counter() - phase
    timings["total_s"] = time.perf_counter() - started

    record = {
        "command": "python3 benchmarks/gsm8k/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("GRPO_LAB_COMMIT", "unknown"),
        "machine": {"kind": machine.kind, "device": device.device_name(kind=machine.kind),
                    "memory_gib": round(machine.memory_gib, 1)},
        "smoke": args.smoke, "model": config.model, "profile": config.profile,
        "data": {"file": str(args.data.relative_to(REPO) if args.data.is_relative_to(REPO) else args.data),
                 "hold_out_seed": data.GSM8K_SPLIT_SEED, "held_out": len(held), "train_rows": len(parts["train"]),
                 "dropped_long_prompts": parts["dropped_long_prompts"], "max_prompt_length": config.max_prompt_length},
        "recipe": {key: getattr(config, key) for key in (
            "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
            "learning_rate", "beta", "temperature", "rewards", "reward_weights", "use_vllm",
            "vllm_gpu_memory_utilization", "use_peft", "max_steps", "max_minutes")},
        "steps": result.global_step,
        "seconds": {key: round(value, 1) for key, value in timings.items()},
        "training": training_summary(result.metrics),
        "accuracy": share(evaluation.greedy_gain(held, before, after, "accuracy")),
        "format": share(evaluation.greedy_gain(held, before, after, "format")),
        "grpo": greedy_record(held, before, after),
        "greedy_examples_after": after.greedy_texts[:3],
    }
    if sft:  # the changes of each stage: SFT (base -> SFT), GRPO (SFT -> GRPO), both (base -> GRPO)
        record["sft"] = {**sft, "changes": greedy_record(held, base, before)}
        record["base_to_grpo"] = greedy_record(held, base, after)
    (args.out / "results.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"{result.global_step} steps on {len(parts['train'])} GSM8K problems, {len(held)} held out, "
          f"{timings['total_s']:.0f} s in all")
    for stage, changes in (("SFT", record.get("sft", {}).get("changes", {})), ("GRPO", record["grpo"])):
        for change in changes.values():
            print(f"{stage}: {change['describe']}")
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":  # vLLM starts worker processes: the guard keeps them from re-running this file
    raise SystemExit(main())
