"""The course's starting points (:data:`PROFILES`, overrides of ``TrainConfig`` fields) and how one is picked."""

from __future__ import annotations

import os
from typing import Any

from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.memory import STEP_DEFAULTS
from grpo_lab.paths import TINY_MODEL_DIR

PROFILE_ENV = "GRPO_LAB_PROFILE"
QWEN_SMALL = "Qwen/Qwen2.5-0.5B-Instruct"
AUTO = "auto"
VLLM_MODES = ("colocate", "server")
LORA_SYNC_MODES = {
    "merge": "TRL's: the adapter merged into the base, every weight sent to the engine, unmerged again",
    "adapter": "the engine keeps the base and loads the adapter itself each step (vLLM's LoRA support)",
}
"""How a LoRA policy reaches its colocated vLLM engine (``TrainConfig.vllm_lora_sync``)."""
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Qwen2/Llama decoder layer (PEFT's ``"all-linear"`` there; the LM head stays frozen)."""
LORA_LEARNING_RATE_SCALE = 10.0
"""A LoRA run's default learning rate is the profile's times this (TRL's LoRA guidance)."""
SMALLER_STEP_LEVERS = ("lower vllm_gpu_memory_utilization to the planner's share (vllm_gpu_memory_utilization='auto')",
                       "LoRA (use_peft=True)", "vLLM in server mode on other devices (grpo_lab.scale)")

# `tiny` learns fast on a CPU. `gpu`/`npu`: a small real instruct model, 16 prompts x 8 completions per step, a format
# reward (a small model first has to learn the `#### N` line) and a reference model; a smaller step rarely gives such
# a model a group with a signal. The planner fits the micro-batch to the device. The language is the profile's choice:
# the course's small real models read English best (a hub copy carries no manifest to say so); the tiny model reads both.
_ACCELERATOR_RECIPE: dict[str, Any] = dict(
    model=QWEN_SMALL, **STEP_DEFAULTS,
    per_device_train_batch_size=128, learning_rate=2e-5, max_steps=300, lr_scheduler_type="constant_with_warmup",
    warmup_steps=10.0, beta=0.04, use_vllm=True, save_steps=100, eval_size=400, temperature=0.7,
    rewards=("correctness", "format"), reward_weights=(1.0, 0.2), train_languages=("en",))
PROFILES: dict[str, dict[str, Any]] = {
    "tiny": dict(model=str(TINY_MODEL_DIR), max_prompt_length=96, max_completion_length=32, num_generations=8,
                 per_device_train_batch_size=32, learning_rate=5e-5, max_steps=250, lr_scheduler_type="constant",
                 warmup_steps=0.0, beta=0.0, use_vllm=False, save_steps=100, eval_size=200, temperature=1.0,
                 rewards=("correctness",), reward_weights=(1.0,), train_languages=()),
    "gpu": dict(_ACCELERATOR_RECIPE),
    "npu": dict(_ACCELERATOR_RECIPE),
}
"""The course's profiles by name: each a table of :class:`TrainConfig` overrides."""
PROFILE_DEVICE = {"tiny": "cpu", "gpu": "cuda", "npu": "npu"}
"""The device each profile is made for (the doctor warns when the machine differs)."""
DEFAULT_FOR_DEVICE = {kind: name for name, kind in PROFILE_DEVICE.items()}
PROFILE_FIELDS = tuple(PROFILES["tiny"])
"""The fields every profile sets (their TrainConfig default is None)."""

CPU_BACKEND_REASON = ("HF generate: for a model of a few million parameters on a CPU, vLLM colocate is not faster per "
                      "step and its engine takes long to start; pass use_vllm=True to use it anyway (the CPU "
                      "weight-sync fix is applied automatically)")


class ProfileError(ConfigError):
    """An unknown profile name or profile field."""


def profile_name(name: str | None = None, machine: Machine | None = None) -> str:
    """The profile to use: ``name``, else ``GRPO_LAB_PROFILE``, else the machine's device's (detected if not given)."""
    chosen = name or os.environ.get(PROFILE_ENV) or DEFAULT_FOR_DEVICE[(machine or Machine.detect()).kind]
    key = str(chosen).strip().lower()
    if key not in PROFILES:
        raise ProfileError(f"Unknown profile {chosen!r}: use one of {', '.join(PROFILES)} "
                           f"(set {PROFILE_ENV} or pass profile=...).")
    return key


