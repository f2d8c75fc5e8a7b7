"""One GRPO experiment, described once: :class:`TrainConfig` under TRL's names, planned for a machine by :func:`plan`.

* :data:`PROFILES`: the course's three starting points (``tiny`` on a CPU, ``gpu``, ``npu``), tables of overrides for
  :class:`TrainConfig`; ``GRPO_LAB_PROFILE`` picks one, ``GRPO_LAB_MODEL`` replaces its model;
* :meth:`TrainConfig.resolve`: every field filled in for a :class:`~grpo_lab.device.Machine`;
* :func:`plan`: the resolved experiment, its memory budget, vLLM's share in the device's units, the cap to enforce
  and the one translation to TRL's ``GRPOConfig`` (:meth:`Plan.trl_kwargs`); :func:`memory_budget` the planner's
  budget alone;
* :func:`load_train_rows`: the rows it trains on.

>>> from grpo_lab.device import Machine
>>> from grpo_lab.experiment import TrainConfig
>>> config = TrainConfig(profile="tiny").resolve(Machine("cpu", bf16=True, memory_gib=24))
>>> config.num_generations, config.num_prompts_per_step, config.max_model_len
(8, 4, 128)
"""

from __future__ import annotations

__all__ = [
    "PROFILES", "Plan", "TrainConfig", "choose_vllm_memory", "default_train_types", "fine_tuned_on_training_rows",
    "get_profile", "memory_budget", "plan", "plans_for", "profile_name",
]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
from grpo_lab.experiment.config import TrainConfig, get_profile, plans_for
from grpo_lab.experiment.plan import Plan, memory_budget, plan, trl_kwargs
from grpo_lab.experiment.planning import choose_vllm_memory
from grpo_lab.experiment.profiles import (
    AUTO,
    CPU_BACKEND_REASON,
    DEFAULT_FOR_DEVICE,
    LORA_SYNC_MODES,
    LORA_TARGET_MODULES,
    PROFILE_DEVICE,
    PROFILE_ENV,
    PROFILES,
    QWEN_SMALL,
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
)
