"""One GRPO experiment, described once: :class:`TrainConfig` under TRL's names, and everything derived from it.

A GRPO step's shape (prompts per step, ``num_generations``, lengths, micro-batch) and the training recipe are
written down once, here. Everything else asks the config for what it needs through one named function:

* :data:`PROFILES`: the course's three starting points (``tiny`` on a CPU, ``gpu``, ``npu``), tables of
  overrides for :class:`TrainConfig`; ``GRPO_LAB_PROFILE`` picks one, ``GRPO_LAB_MODEL`` replaces its model;
* :meth:`TrainConfig.resolve`: every field filled in for a :class:`~grpo_lab.device.Machine` (its device, bf16
  support and memory are passed in, never read behind the caller's back); ``vllm_gpu_memory_utilization="auto"``
  becomes the memory planner's number (:func:`choose_vllm_memory`);
* :func:`memory_budget` (the memory planner's budget of this step on a machine), :meth:`TrainConfig.rollout_config` (the
  rollout engine that samples like the trainer), :meth:`TrainConfig.training_shape` (the planner's input),
  :attr:`TrainConfig.max_model_len` (vLLM's context window, also what serving needs), :func:`load_train_rows`.

The trainer (:mod:`grpo_lab.train`), the server mode (:mod:`grpo_lab.scale`), the verl export, the bench's GRPO
step, the doctor and serving all start from a ``TrainConfig``.

The package's rooms: :mod:`.profiles` (the tables), :mod:`.config` (``TrainConfig`` itself, :func:`get_profile`,
:func:`plans_for`), :mod:`.planning` (what the memory planner says of a config) and :mod:`.rows` (its training rows
and rewards). Import from ``grpo_lab.experiment``: every name is here.

>>> from grpo_lab.device import Machine
>>> from grpo_lab.experiment import TrainConfig
>>> config = TrainConfig(profile="tiny").resolve(Machine("cpu", bf16=True, memory_gib=24))
>>> config.num_generations, config.num_prompts_per_step, config.max_model_len
(8, 4, 128)
"""

from grpo_lab.experiment.config import TrainConfig, get_profile, plans_for
from grpo_lab.experiment.planning import (
    LengthMargin,
    choose_vllm_memory,
    fit_micro_batch,
    length_margin,
    memory_budget,
    needs_checkpointing,
)
from grpo_lab.experiment.profiles import (
    AUTO,
    CPU_BACKEND_REASON,
    DEFAULT_FOR_DEVICE,
    LORA_TARGET_MODULES,
    PROFILE_DEVICE,
    PROFILE_ENV,
    PROFILE_FIELDS,
    PROFILES,
    QWEN_SMALL,
    SMALLER_STEP_LEVERS,
    LORA_SYNC_MODES,
    VLLM_MODES,
    ProfileError,
    profile_name,
)
from grpo_lab.experiment.rows import (
    check_lengths,
    check_prompt_lengths,
    default_train_types,
    fine_tuned_on_training_rows,
    load_train_rows,
    model_languages,
    reward_spec,
)

__all__ = [
    "AUTO", "CPU_BACKEND_REASON", "DEFAULT_FOR_DEVICE", "LORA_TARGET_MODULES", "LengthMargin", "PROFILES",
    "PROFILE_DEVICE",
    "PROFILE_ENV", "PROFILE_FIELDS", "QWEN_SMALL", "SMALLER_STEP_LEVERS", "VLLM_MODES", "LORA_SYNC_MODES", "ProfileError", "TrainConfig",
    "check_lengths", "check_prompt_lengths", "choose_vllm_memory", "default_train_types", "fine_tuned_on_training_rows",
    "fit_micro_batch", "get_profile", "length_margin", "load_train_rows", "memory_budget", "model_languages",
    "needs_checkpointing",
    "plans_for", "profile_name", "reward_spec",
]

# --------------------------------------------------------------------------------------------------
# Deprecated names (0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

__getattr__ = moved_names(__name__, {"plan_memory": ("grpo_lab.experiment:memory_budget",
                                                     "grpo_lab.memory.plan_memory is the planner itself")}, since="0.2.0")
