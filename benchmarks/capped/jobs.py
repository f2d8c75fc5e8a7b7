"""The capped jobs, as data: each a device memory cap and the rows it runs, one child process per row.

A row is a recipe under the job's cap (``GRPO_LAB_DEVICE_MEMORY_GIB``): ``trl`` rows train the write-up's bf16 recipe on
a random-weight model shape with TRL's ``GRPOTrainer`` (as ``benchmarks/memory/measure_gpu.py`` does: ``grpo_lab.train``
keeps fp32 master weights, which no 2B model fits in 32 GiB with), ``course`` rows run ``grpo_lab.train.prepare`` on
the course's ``gpu`` profile with ``TrainConfig`` overrides. Minutes are expected wall time on one H200, each job's
rows one after another; jobs are independent and run side by side (their caps add up to :data:`SIDE_BY_SIDE_GIB`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEED_SHAPE = "seed-2b-shaped"
SEED_RECIPE: dict[str, Any] = dict(precision="bf16", per_device_train_batch_size=8, num_generations=8,
                                   max_prompt_length=256, max_completion_length=256, gradient_checkpointing=True,
                                   beta=0.0)
"""The write-up's recipe (notebook 04, section 3): bf16 weights, micro-batch 8, 8 completions, 256 + 256 tokens,
gradient checkpointing (TRL's default), no reference model; completions forced to the maximum length."""
LORA = dict(lora_r=16, lora_alpha=32, lora_dropout=0.05)
QLORA_LEARNING_RATE = 2e-4
"""LoRA's rate in ``benchmarks/lora_smollm2`` (1.5 % -> 9.5 % greedy in 60 steps, +5.2 SE)."""
FORCED = dict(ignore_eos=True)


@dataclass(frozen=True)
class Row:
    """One run: ``kind`` ``trl`` (``settings``: planner / GRPOConfig overrides of :data:`SEED_RECIPE`, with
    ``vllm_gpu_memory_utilization`` None for the planner's share), ``course`` (``settings``: TrainConfig fields) or
    ``serve`` (``settings["run_of"]``: the row, of the same job, whose run it serves, from a fresh process)."""

    name: str
    kind: str
    settings: dict[str, Any]
    steps: int
    evaluate: bool = False
    """Held-out greedy accuracy before and after, on the trainer's engine (notebook 03's measure)."""
    expect: str = "fits"
    """What the planner says: ``fits`` or ``oom`` (checked on the CPU by ``tests/test_capped.py``)."""
    stand_in: str = "fraction"
    """How the smaller card is stood in for: ``fraction`` (torch's per-process fraction, as the package enforces a
    cap) or ``ballast`` (``ballast.py`` holds the rest of the device in a process of its own, so the driver has only
    the cap free; for sleep mode, whose released memory torch's fraction still counts)."""


@dataclass(frozen=True)
class Job:
    name: str
    cap_gib: float
    minutes: float
    what: str
    rows: tuple[Row, ...] = field(default=())


def _lengths(cap_gib: float) -> Job:
    rows = (Row("full FT, forced lengths", "course", {**FORCED}, 4),
            Row("LoRA, forced lengths", "course", {**FORCED, "use_peft": True, **LORA}, 4),
            Row("QLoRA, forced lengths", "course", {**FORCED, "use_peft": True, "load_in_4bit": True, **LORA}, 4))
    return Job(f"lengths-{cap_gib:g}", cap_gib, 3.5, f"SmolLM2, the gpu recipe with every completion at 256 tokens "
               f"(the planner's case), full FT / LoRA / QLoRA, 4 steps each, under {cap_gib:g} GiB", rows)


JOBS: dict[str, Job] = {job.name: job for job in (
    Job("seed-2b", 32, 5.5, "the write-up's headline: the 2B-shaped model (random weights) under 32 GiB, its bf16 "
        "recipe; vLLM at 0.6 runs out of memory, the planner's share does not, LoRA fits at 0.6, sleep mode at 0.55", (
            Row("full FT, vLLM 0.6 (the write-up's)", "trl", {"vllm_gpu_memory_utilization": 0.6}, 4, expect="oom"),
            Row("full FT, the planner's share", "trl", {"vllm_gpu_memory_utilization": None}, 3),
            Row("LoRA r=16, vLLM 0.6", "trl", {"vllm_gpu_memory_utilization": 0.6, **LORA}, 3),
            # awake, 0.5 already does not fit (the planner); asleep during the update, full FT fits beside 0.55
            Row("sleep mode, vLLM 0.55", "trl", {"vllm_gpu_memory_utilization": 0.55, "vllm_enable_sleep_mode": True},
                3),
        )),
    Job("qlora", 16, 6.0, "QLoRA on SmolLM2 under 16 GiB: 50 steps, held-out greedy accuracy before and after "
        "(notebook 03's measure), then served: the adapter on its 4-bit base, and merged", (
            Row("QLoRA r=16, learns", "course", {"use_peft": True, "load_in_4bit": True, **LORA,
                                                 "learning_rate": QLORA_LEARNING_RATE}, 50, evaluate=True),
            # a process of its own, as a learner serves a finished run: the trainer's memory is gone
            Row("QLoRA r=16, served", "serve", {"run_of": "QLoRA r=16, learns"}, 0),
        )),
    Job("qlora-adapter", 16, 6.0, "the qlora run again with the adapter handed to the engine (vllm_lora_sync="
        "'adapter'), so that its rollouts follow the policy: learns on the engine as on HF generate? then served", (
            Row("QLoRA r=16, adapter sync, learns", "course", {"use_peft": True, "load_in_4bit": True, **LORA,
                                                               "learning_rate": QLORA_LEARNING_RATE,
                                                               "vllm_lora_sync": "adapter"}, 50, evaluate=True),
            Row("QLoRA r=16, adapter sync, served", "serve", {"run_of": "QLoRA r=16, adapter sync, learns"}, 0),
        )),
    Job("seed-2b-sleep", 32, 4.0, "seed-2b's sleep-mode row again, on a device with only 32 GiB free (ballast.py) "
        "instead of under torch's fraction, which counts a sleeping engine's released memory (sleep_probe.json): "
        "vLLM at 0.55 asleep during the update (the planner: fits), then awake (the planner: out of memory)", (
            Row("sleep mode, vLLM 0.55, 32 GiB free", "trl", {"vllm_gpu_memory_utilization": 0.55,
                                                               "vllm_enable_sleep_mode": True}, 3, stand_in="ballast"),
            Row("full FT, vLLM 0.55 awake, 32 GiB free", "trl", {"vllm_gpu_memory_utilization": 0.55}, 3,
                expect="oom", stand_in="ballast"),
        )),
    _lengths(16), _lengths(24), _lengths(32),
)}
SIDE_BY_SIDE = ("seed-2b", "qlora", "lengths-16", "lengths-24", "lengths-32")
"""The jobs the README starts together: caps 32 + 16 + 16 + 24 + 32 GiB (a served model's share adds 4.8 GiB)."""
SIDE_BY_SIDE_GIB = sum(JOBS[name].cap_gib for name in SIDE_BY_SIDE)
OPTIONAL = {"bench-80": "the GRPO-step bench (notebook 06) under an 80 GiB cap, at the micro-batch the planner fits"}
BENCH_CAP_GIB = 80
BENCH_MINUTES = 4.0


def row_id(job: str, row: Row) -> str:
    """The row's file stem: ``<job>__<name as a slug>``."""
    slug = "".join(c if c.isalnum() else "-" for c in row.name.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return f"{job}__{slug}"
