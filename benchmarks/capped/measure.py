"""One row of a capped job, measured in this process: its plan, torch's peaks per step, the driver's count of this
process tree's device memory, step times, tokens per second, and where it ran out of memory if it did.

What "measured training peak" means here (as in ``benchmarks/memory/measure_gpu.py``): torch's peak allocated from the
first loss of a step to its end, less what the colocated vLLM engine allocated when it started (the engine lives in
the trainer's process under TRL's colocate mode), over the steps after the first (from the second on the AdamW states
exist); the planner's counterpart is its training peak (``MemoryBudget.training_peak_bytes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jobs import SEED_RECIPE, SEED_SHAPE, Row

from grpo_lab import memory
from grpo_lab.memory.sampler import gib
from lab.capped import OutOfMemory

OOM_MARKS = ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
             "insufficient memory", "less than desired gpu memory utilization")
"""How an out-of-memory failure reads (torch's, vLLM's at engine start)."""


def is_out_of_memory(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}".lower()
    return any(mark in text for mark in OOM_MARKS)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


def trl_plan(row: Row, cap_gib: float, prompt_length: int) -> memory.MemoryBudget:
    """The planner's budget of a ``trl`` row: the write-up's recipe on the 2B shape, on a CUDA device of ``cap_gib``,
    prompts padded to ``prompt_length`` (the longest the row's prompts have) and the share it runs at (None: the
    planner's own, chosen at the recipe's ``max_prompt_length``)."""
    settings = {k: v for k, v in row.settings.items() if k != "lora_alpha"}
    share = settings.pop("vllm_gpu_memory_utilization")
    recipe = {**SEED_RECIPE, **settings}
    config = memory.course_configs()[SEED_SHAPE]
    if share is None:
        share = memory.plan_memory(config, device_memory_gib=cap_gib, device_kind="cuda",
                                   **recipe).vllm_gpu_memory_utilization
    return memory.plan_memory(config, device_memory_gib=cap_gib, device_kind="cuda", vllm_gpu_memory_utilization=share,
                              **{**recipe, "max_prompt_length": prompt_length})


def planned_fields(budget: memory.MemoryBudget, micro_batch: int, accumulation: int, device_share: float) -> dict:
    return {"per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": accumulation,
            "vllm_gpu_memory_utilization": budget.vllm_gpu_memory_utilization, "device_share": device_share,
            "fits": budget.fits, "training_peak_gib": gib(budget.training_peak_bytes),
            "peak_phase": budget.peak_phase, "vllm_gib": gib(budget.vllm_bytes),
            "rollout_gib": gib(budget.rollout_bytes) if budget.rollout_bytes else None,
            "max_prompt_length": budget.shape.max_prompt_length,
            "max_completion_length": budget.shape.max_completion_length}


class PhaseClock:
    """Which step and phase a trainer is in (an out-of-memory error's record), each step's time, torch's peak of its
    update and the completion tokens it generated. :meth:`callback` is a ``TrainerCallback``; :meth:`install` wraps
    the trainer's loss and backward to mark their phases."""

    def __init__(self) -> None:
        self.step, self.phase = 0, "trainer start"
        self.seconds: list[float] = []
        self.update_peaks: list[int] = []
        self.tokens: list[float] = []
        self._start, self._in_loss = 0.0, False

    def callback(self, generation_batch: int) -> Any:
        import torch
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock.step, clock.phase, clock._in_loss = state.global_step + 1, "generation", False
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                clock._start = time.perf_counter()

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                clock.phase = "optimizer step"

            def on_step_end(self, args, state, control, **kwargs):
                torch.cuda.synchronize()
                clock.seconds.append(time.perf_counter() - clock._start)
                clock.update_peaks.append(torch.cuda.max_memory_allocated())
                clock.phase = "between steps"

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "completions/mean_length" in logs:
                    clock.tokens.append(logs["completions/mean_length"] * generation_batch)

        return Clock()

    def install(self, trainer: Any) -> None:
        import torch

        compute_loss, backward = trainer.compute_loss, trainer.accelerator.backward

        def loss(*args, **kwargs):
            if not self._in_loss:  # the step's first loss: generation and scoring are done, the update's peak begins
                self._in_loss = True
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.phase = "loss forward"
            return compute_loss(*args, **kwargs)

        def marked_backward(*args, **kwargs):
            self.phase = "backward"
            return backward(*args, **kwargs)

        trainer.compute_loss, trainer.accelerator.backward = loss, marked_backward

    def measured(self, vllm_resident: int | None) -> dict[str, Any]:
        later = self.update_peaks[1:] or self.update_peaks
        peak = max(later) if later else None
        training = None if peak is None or vllm_resident is None else peak - vllm_resident
        return {"training_peak_gib": gib(training), "max_allocated_gib": gib(peak),
                "vllm_resident_gib": gib(vllm_resident)}

    def tokens_per_second(self) -> float | None:
        pairs = list(zip(self.tokens, self.seconds))[1:]  # after the first step (compilation, warm-up)
        seconds = sum(s for _, s in pairs)
        return round(sum(t for t, _ in pairs) / seconds, 1) if seconds else None


@contextlib.contextmanager
def engine_allocation(record: dict[str, Any]):
    """While a trainer is built: what TRL's colocated ``LLM(...)`` allocated in this process (``vllm_resident``) and
    the share it was given (``gpu_memory_utilization``: of the real device, converted from the cap's)."""
    import torch
    from trl.generation import vllm_generation

    original = vllm_generation.LLM

    def counted(*args, **kwargs):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        llm = original(*args, **kwargs)
        torch.cuda.synchronize()
        record["vllm_resident"] = torch.cuda.memory_allocated() - before
        record["gpu_memory_utilization"] = kwargs.get("gpu_memory_utilization")
        return llm

    vllm_generation.LLM = counted
    try:
        yield
    finally:
        vllm_generation.LLM = original


def base_record(job: str, row: Row, cap_gib: float, model: str) -> dict[str, Any]:
    """A row's identity, before anything ran (an error row keeps it)."""
    return {"job": job, "name": row.name, "cap_gib": cap_gib, "model": model,
            "recipe": json.dumps(row.settings, sort_keys=True, default=str), "planned": {}, "measured": {},
            "steps": 0, "step_seconds": [], "tokens_per_second": None, "oom": None, "error": None, "extra": {},
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("GRPO_LAB_COMMIT", "unknown"), "device": device_name()}


def device_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def finish(record: dict[str, Any], clock: PhaseClock, engine: dict[str, Any], sampler: Any,
           error: BaseException | None) -> dict[str, Any]:
    """The record completed with what was measured (and the failure, if any)."""
    record["measured"] = {**clock.measured(engine.get("vllm_resident")), "device_used_gib": gib(sampler.stop()),
                          "gpu_memory_utilization_passed": engine.get("gpu_memory_utilization")}
    if error is not None:  # torch's peak since the failed step began: how close it came
        record["measured"]["max_allocated_at_failure_gib"] = gib(torch_peak())
    record["steps"], record["step_seconds"] = len(clock.seconds), [round(s, 3) for s in clock.seconds]
    record["tokens_per_second"] = clock.tokens_per_second()
    if error is not None and is_out_of_memory(error):
        record["oom"] = dataclasses.asdict(OutOfMemory(clock.step or None, clock.phase, first_line(error)))
    elif error is not None:
        record["error"] = first_line(error)
        record["extra"]["traceback"] = traceback.format_exception(error)[-6:]
    return record


def torch_peak() -> int | None:
    """torch's peak allocated since the last reset, where this process has a CUDA context."""
    import torch

    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def write(record: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return path
