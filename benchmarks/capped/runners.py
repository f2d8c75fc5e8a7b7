"""The two kinds of row, run on the GPU under the job's cap (``GRPO_LAB_DEVICE_MEMORY_GIB``, set by ``run.py``).

``trl``: TRL's ``GRPOTrainer`` on the 2B shape (random weights, bf16), the cap enforced with
``device.enforce_cap`` (or, for a ``ballast`` row, by ``ballast.py`` holding the rest of the device) and vLLM's
share converted with ``device.device_share``, as ``grpo_lab.train`` does.
``course``: ``grpo_lab.train.prepare`` on the ``gpu`` profile (SmolLM2 via ``GRPO_LAB_MODEL``), which does both itself.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobs import SEED_RECIPE, SEED_SHAPE, Row, row_id
from measure import PhaseClock, base_record, engine_allocation, finish, planned_fields, trl_plan

from grpo_lab import device, memory
from grpo_lab.memory import DeviceMemorySampler

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "memory"))
SERVED_PROBLEMS = 16
"""Held-out problems each served model answers (greedy, through the OpenAI API)."""


def seed_model(out: Path) -> Path:
    """The 2B-shaped model with random weights (bf16) and the course's tiny tokenizer, written once per job."""
    from standin import save_random_model

    folder = out / "models" / SEED_SHAPE
    if not (folder / "config.json").is_file():
        save_random_model(memory.course_configs()[SEED_SHAPE], folder)
    return folder


def longest_rows(tokenizer: Any, count: int = 64) -> tuple[list[dict], int]:
    """The ``count`` training rows with the longest prompts (chat template applied) and the longest's length: every
    step then pads to nearly the same length, the one the row is planned at."""
    from grpo_lab.data import load_split
    from grpo_lab.rollout import encode_prompts

    rows = load_split("train")
    lengths = [len(p.token_ids) for p in encode_prompts(tokenizer, [row["prompt"] for row in rows])]
    order = sorted(range(len(rows)), key=lengths.__getitem__, reverse=True)[:count]
    return [rows[i] for i in order], lengths[order[0]]


def run_trl_row(job: str, row: Row, cap_gib: float, out: Path) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    record = base_record(job, row, cap_gib, SEED_SHAPE)
    clock, engine, sampler = PhaseClock(), {}, DeviceMemorySampler(os.getpid(), "cuda").start()
    error = None
    try:
        model_dir = seed_model(out)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rows, prompt_length = longest_rows(tokenizer)
        budget = trl_plan(row, cap_gib, prompt_length)
        if row.stand_in == "ballast":  # run.py's ballast process left the driver cap_gib free: no fraction here
            record["extra"]["stand_in"] = ballast_check(cap_gib)
            cap = None
        else:
            cap = device.enforce_cap(device.Machine.detect(memory_gib=cap_gib))
        share = budget.vllm_gpu_memory_utilization
        device_share = cap.device_share(share) if cap else share
        record["planned"] = planned_fields(budget, SEED_RECIPE["per_device_train_batch_size"], 1, device_share)
        record["extra"]["cap"] = dataclasses.asdict(cap) if cap else None
        peft_config = None
        if row.settings.get("lora_r"):
            from grpo_lab import lora
            from grpo_lab.experiment import LORA_TARGET_MODULES

            peft_config = lora.lora_config(SimpleNamespace(
                use_peft=True, lora_r=row.settings["lora_r"], lora_alpha=row.settings["lora_alpha"],
                lora_dropout=row.settings["lora_dropout"], lora_target_modules=LORA_TARGET_MODULES))
        args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_vllm=True, vllm_mode="colocate", bf16=True,
                          model_init_kwargs={"dtype": "bfloat16"}, max_steps=row.steps, learning_rate=1e-6,
                          vllm_gpu_memory_utilization=device_share,
                          per_device_train_batch_size=SEED_RECIPE["per_device_train_batch_size"],
                          num_generations=SEED_RECIPE["num_generations"],
                          max_completion_length=SEED_RECIPE["max_completion_length"],
                          vllm_max_model_length=memory.context_window(prompt_length,
                                                                      SEED_RECIPE["max_completion_length"]),
                          gradient_checkpointing=SEED_RECIPE["gradient_checkpointing"], beta=SEED_RECIPE["beta"],
                          generation_kwargs={"ignore_eos": True}, logging_steps=1, report_to=[],
                          save_strategy="no", seed=0,
                          vllm_enable_sleep_mode=bool(row.settings.get("vllm_enable_sleep_mode")))
        with engine_allocation(engine):
            trainer = GRPOTrainer(model=str(model_dir), args=args, peft_config=peft_config,
                                  reward_funcs=lambda completions, **_: [float(len(str(c)) % 3) for c in completions],
                                  train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                                  callbacks=[clock.callback(SEED_RECIPE["per_device_train_batch_size"])])
        clock.install(trainer)
        trainer.train()
    except Exception as caught:  # torch's OutOfMemoryError too: the row's record says what happened
        error = caught
    return finish(record, clock, engine, sampler, error)


def ballast_check(cap_gib: float) -> dict[str, Any]:
    """What the driver leaves this row at its start, beside ``ballast.py``'s process: about ``cap_gib`` free."""
    import torch

    free, total = torch.cuda.mem_get_info()
    found = {"how": "ballast.py holds the rest of the device in a process of its own; no per-process fraction",
             "driver_free_at_start_gib": round(free / 2**30, 3), "driver_total_gib": round(total / 2**30, 3)}
    if free > (cap_gib + 1) * 2**30:
        raise RuntimeError(f"the ballast row found {free / 2**30:.1f} GiB free, more than its {cap_gib:g} GiB: the "
                           "ballast process is not holding the rest of the device")
    return found


def run_course_row(job: str, row: Row, cap_gib: float, out: Path) -> dict[str, Any]:
    from grpo_lab import experiment
    from grpo_lab.device import Machine
    from grpo_lab.env import quiet_notebook
    from grpo_lab.train import TrainConfig, prepare

    quiet_notebook()
    record = base_record(job, row, cap_gib, Path(os.environ.get("GRPO_LAB_MODEL", "")).name)
    clock, engine, sampler = PhaseClock(), {}, DeviceMemorySampler(os.getpid(), "cuda").start()
    error = None
    try:
        machine = Machine.detect()  # GRPO_LAB_DEVICE_MEMORY_GIB: the capped device
        run_dir = out / "runs" / row_id(job, row)
        shutil.rmtree(run_dir, ignore_errors=True)  # a row run again on the same machine starts afresh
        config = TrainConfig(**row.settings, max_steps=row.steps, live_plot=False, save_steps=10**6,
                             output_dir=str(run_dir)).resolve(machine)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.model)
        longest = experiment.check_prompt_lengths(experiment.load_train_rows(config), tokenizer,
                                                  config.max_prompt_length)
        budget = experiment.memory_budget(dataclasses.replace(config, max_prompt_length=longest), machine)
        record["planned"] = planned_fields(budget, config.per_device_train_batch_size,
                                           config.gradient_accumulation_steps,
                                           machine.device_share(config.vllm_gpu_memory_utilization))
        record["extra"]["as_the_learner_plans_it"] = experiment.memory_budget(config, machine).summary()
        with engine_allocation(engine):
            training = prepare(config, callbacks=[clock.callback(config.generation_batch_size)], machine=machine)
        clock.install(training.trainer)
        if row.evaluate:
            record["extra"].update(train_and_evaluate(training, config, row, record))
        else:
            training.trainer.train()  # the steps only: no final model to save for a measurement row
    except Exception as caught:
        error = caught
    return finish(record, clock, engine, sampler, error)


def train_and_evaluate(training: Any, config: Any, row: Row, record: dict[str, Any]) -> dict[str, Any]:
    """Notebook 03's measure around the run: greedy accuracy on the held-out problems, before on the trainer's engine,
    after on it again (with the trained weights); for QLoRA also on HF ``generate``, base against ``final/``: TRL
    syncs a 4-bit policy by merging the adapter into 4-bit codes, which can round it away (2026-12-05: the engine's
    greedy answers after 50 steps were the base's, 0.25 % -> 0.25 %)."""
    from grpo_lab import evaluation
    from grpo_lab.data import load_split

    rows = load_split("eval")
    before = evaluation.evaluate(config.model, rows, num_samples=1, max_tokens=config.max_completion_length,
                                 backend=config.rollout_backend, engine=training.rollout_engine())
    result = training.train()
    after = evaluation.evaluate(result.final_model_dir, rows, num_samples=1, max_tokens=config.max_completion_length,
                                backend=config.rollout_backend, engine=result.rollout_engine())
    measured = {"greedy_accuracy": gain_fields(evaluation.greedy_gain(rows, before, after)),
                "run_dir": str(result.run_dir), "train_seconds": round(result.seconds, 1)}
    if config.load_in_4bit:  # the engine may not see the adapter (qlora_merge_probe.py): the trained model itself too
        measured["greedy_accuracy_hf"] = {
            "how": "HF generate, the full-precision base before and final/ (the base plus the trained adapter's delta)",
            **gain_fields(evaluation.greedy_gain(rows, *(
                evaluation.evaluate(model, rows, num_samples=1, max_tokens=config.max_completion_length, backend="hf")
                for model in (config.model, result.final_model_dir))))}
    return measured


def gain_fields(gain: Any) -> dict[str, Any]:
    return {"before": gain.before, "after": gain.after, "points": gain.points,
            "standard_errors": gain.standard_errors, "problems": gain.count}


def run_serve_row(job: str, row: Row, cap_gib: float, out: Path) -> dict[str, Any]:
    """A finished run of this job (``row.settings["run_of"]``) served both ways from this fresh process, each server
    with its share of the capped device; the driver's count covers the servers (this process's children)."""
    from grpo_lab.data import load_split
    from grpo_lab.experiment import TrainConfig
    from jobs import JOBS

    record = base_record(job, row, cap_gib, Path(os.environ.get("GRPO_LAB_MODEL", "")).name)
    clock, sampler = PhaseClock(), DeviceMemorySampler(os.getpid(), "cuda").start()
    error = None
    try:
        trained = next(r for r in JOBS[job].rows if r.name == row.settings["run_of"])
        run_dir = out / "runs" / row_id(job, trained)
        record["extra"]["served"] = serve_both(run_dir, load_split("eval")[:SERVED_PROBLEMS],
                                               TrainConfig.from_file(run_dir))
    except Exception as caught:
        error = caught
    return finish(record, clock, {}, sampler, error)


def serve_both(run_dir: Path, rows: list[dict], config: Any) -> dict[str, Any]:
    """The QLoRA run served twice, each answering ``rows`` greedily: its adapter on the 4-bit base it trained on
    (vLLM's LoRA serving, ``--quantization bitsandbytes``), and ``final/`` (the adapter merged into full-precision
    weights). Records each server's start, its accuracy and how often the two agree."""
    from grpo_lab import deploy, rewards

    served = {}
    answers = {}
    for way, adapter in (("adapter on its 4-bit base", True), ("merged final/", False)):
        print(f"serving the {way} ...", flush=True)
        model, lora_adapter = deploy.served_weights(run_dir, adapter=adapter)
        serve = deploy.serve_config(model, config, lora_adapter=lora_adapter, enforce_eager=True,
                                    gpu_memory_utilization=memory.VLLM_MEMORY_FRACTION["engine"],
                                    quantization=deploy.served_quantization(run_dir, adapter=adapter))
        try:
            with deploy.VLLMServer(serve, log_path=run_dir / f"serve-{'adapter' if adapter else 'merged'}.log") as s:
                name = s.config.adapter_name if adapter else s.config.served_model_name
                texts = [deploy.chat(s, row["prompt"], max_tokens=config.max_completion_length, model=name).text
                         for row in rows]
                answers[way] = texts
                served[way] = {"start_seconds": round(s.start_seconds or 0, 1), "quantization": serve.quantization,
                               "accuracy": sum(rewards.is_correct(t, r["answer"]) for t, r in zip(texts, rows))
                               / len(rows), "problems": len(rows)}
        except Exception as error:  # the other way is still tried
            served[way] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        print(f"{way}: {served[way]}", flush=True)
    if len(answers) == 2:
        first, second = answers.values()
        served["same_greedy_text"] = sum(a == b for a, b in zip(first, second)) / len(rows)
    return served


def write_error(path: Path, job: str, row: Row, cap_gib: float, log_tail: str) -> None:
    """The row's record when its process died without writing one (killed, timed out, crashed in CUDA)."""
    from measure import write

    record = base_record(job, row, cap_gib, "")
    record["error"] = "the row's process ended without a record; its log's last lines are in extra.log_tail"
    record["extra"]["log_tail"] = log_tail[-6000:]
    write(record, path)
