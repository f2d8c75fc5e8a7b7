"""The GRPO config: TRL names -> verl's Hydra overrides (:func:`grpo_settings`), and how Hydra reads them."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import AUTO, TrainConfig, default_train_types, trl_kwargs
from grpo_lab.memory import VLLM_MEMORY_FRACTION
from grpo_lab.verl_export.folder import (
    LAUNCH_FILE,
    MODEL_KEY,
    PATH_KEYS,
    REWARD_FILE,
    REWARD_FUNCTION,
    TEST_FILE,
    TRAIN_FILE,
)
from grpo_lab.verl_export.target import VerlTarget

LOSS_AGG_MODE = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm"}
LR_SCHEDULER = {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"}
NORM_BY_STD = {"group": True, "none": False, "false": False, "true": True}
"""TRL name -> verl name, for the settings whose vocabulary differs."""


@dataclass
class Setting:
    """One verl override, with where its value comes from (shown in the export's README)."""

    key: str
    value: Any
    source: str


def resolve_experiment(config: TrainConfig | None, device: str = "cuda") -> TrainConfig:
    """The experiment filled for a verl target of kind ``device`` (profile, training types; an ``"auto"`` vLLM share
    becomes ``memory.VLLM_MEMORY_FRACTION["verl"]``), without reading this machine: verl picks its own dtype."""
    config = (config or TrainConfig()).with_profile()
    values: dict[str, Any] = {"device": device, "output_dir": None}
    if config.train_types is None:
        values["train_types"] = default_train_types(config.model) or ()
    if config.vllm_gpu_memory_utilization == AUTO:
        values["vllm_gpu_memory_utilization"] = VLLM_MEMORY_FRACTION["verl"]
    return dataclasses.replace(config, **values)


def grpo_settings(config: TrainConfig, target: VerlTarget, num_train_rows: int) -> list[Setting]:
    """verl's overrides from a resolved experiment's TRL fields and the target; raises early on what verl rejects."""
    trl = trl_kwargs(config, use_vllm=True, vllm_share=config.vllm_gpu_memory_utilization)
    tp, devices, gpus = target.rollout_tensor_parallel_size, target.total_devices, target.n_gpus_per_node
    if gpus < 1 or target.nnodes < 1 or tp < 1:
        raise ConfigError("n_gpus_per_node, nnodes and rollout_tensor_parallel_size must be at least 1 "
                          f"(got {gpus}, {target.nnodes}, {tp}).")
    if gpus % tp:
        fits = [d for d in range(1, gpus + 1) if gpus % d == 0]
        raise ConfigError(f"rollout_tensor_parallel_size={tp} does not divide n_gpus_per_node={gpus}: each vLLM engine "
                          f"needs {tp} devices of one node. Use one of {fits}.")
    loss_agg = LOSS_AGG_MODE.get(trl["loss_type"])
    if loss_agg is None:
        raise ConfigError(f"loss_type={trl['loss_type']!r} has no verl equivalent here; use one of "
                         f"{sorted(LOSS_AGG_MODE)} (verl's loss_agg_mode {sorted(set(LOSS_AGG_MODE.values()))}).")
    norm_by_std = NORM_BY_STD.get(str(trl["scale_rewards"]).lower())
    if norm_by_std is None:
        raise ConfigError(f"scale_rewards={trl['scale_rewards']!r}: verl's GRPO normalises by the group std or not at "
                         "all; use scale_rewards='group' or 'none'.")
    scheduler = LR_SCHEDULER.get(trl["lr_scheduler_type"])
    if scheduler is None:
        raise ConfigError(f"lr_scheduler_type={trl['lr_scheduler_type']!r}: verl schedules 'constant' or 'cosine' "
                         f"(with warmup); use one of {sorted(LR_SCHEDULER)}.")
    completions_per_step = trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] * devices
    prompts_per_step = completions_per_step // trl["num_generations"]
    steps_per_epoch = num_train_rows // prompts_per_step
    if steps_per_epoch < 1:
        raise ConfigError(f"{num_train_rows} training rows are fewer than one step's {prompts_per_step} prompts "
                         f"({devices} devices × {trl['per_device_train_batch_size']} completions / "
                         f"{trl['num_generations']}); lower per_device_train_batch_size or use more rows.")
    warmup = 0.0 if trl["lr_scheduler_type"] == "constant" else float(trl["warmup_steps"] or 0)  # HF ignores it there
    beta = float(trl["beta"])
    settings = [
        Setting("algorithm.adv_estimator", "grpo", "GRPO: advantages normalised within each prompt's group"),
        Setting("algorithm.norm_adv_by_std_in_grpo", norm_by_std, f"TRL scale_rewards={trl['scale_rewards']!r}"),
        Setting("algorithm.use_kl_in_reward", False, "TRL puts the KL in the loss, not in the reward"),
        Setting("data.train_files", TRAIN_FILE, f"{num_train_rows} rows: the experiment's training rows"),
        Setting("data.val_files", TEST_FILE, f"{target.val_size} rows of the course's eval split"),
        Setting("data.train_batch_size", prompts_per_step,
                f"prompts per step = per_device_train_batch_size {trl['per_device_train_batch_size']} × "
                f"gradient_accumulation_steps {trl['gradient_accumulation_steps']} × {devices} devices / "
                f"num_generations {trl['num_generations']}"),
        Setting("data.max_prompt_length", config.max_prompt_length, "max_prompt_length (grpo_lab checks prompts)"),
        Setting("data.max_response_length", trl["max_completion_length"], "TRL max_completion_length"),
        Setting("data.filter_overlong_prompts", True, "drop prompts longer than max_prompt_length"),
        Setting("data.truncation", "error", "never cut a prompt silently"),
        Setting("data.seed", trl["seed"], "TRL seed (data order)"),
        Setting(MODEL_KEY, config.model, f"TRL model (MODEL_PATH overrides it in {LAUNCH_FILE})"),
        Setting("actor_rollout_ref.model.enable_gradient_checkpointing", True, "TRL gradient_checkpointing"),
        Setting("actor_rollout_ref.actor.optim.lr", trl["learning_rate"], "TRL learning_rate"),
        Setting("actor_rollout_ref.actor.optim.lr_scheduler_type", scheduler,
                f"TRL lr_scheduler_type={trl['lr_scheduler_type']!r}"),
        (Setting("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", float(warmup), f"TRL warmup_steps={warmup}")
         if warmup < 1 else
         Setting("actor_rollout_ref.actor.optim.lr_warmup_steps", int(warmup), f"TRL warmup_steps={warmup}")),
        Setting("actor_rollout_ref.actor.optim.weight_decay", 0.0, "TRL weight_decay (verl's default is 0.01)"),
        Setting("actor_rollout_ref.actor.ppo_mini_batch_size", prompts_per_step,
                "one update per batch of rollouts, as TRL with num_iterations=1"),
        Setting("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", trl["per_device_train_batch_size"],
                "TRL per_device_train_batch_size (completions per forward pass)"),
        Setting("actor_rollout_ref.actor.loss_agg_mode", loss_agg, f"TRL loss_type={trl['loss_type']!r}"),
        Setting("actor_rollout_ref.actor.use_kl_loss", beta > 0, f"TRL beta={beta:g} > 0 loads a reference model"),
        Setting("actor_rollout_ref.actor.kl_loss_coef", beta, "TRL beta"),
        Setting("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", "TRL's k3 estimator (verl clamps it)"),
        Setting("actor_rollout_ref.actor.entropy_coeff", 0, "TRL has no entropy bonus"),
        Setting("actor_rollout_ref.rollout.name", "vllm", "TRL use_vllm (colocated, as verl's hybrid engine)"),
        Setting("actor_rollout_ref.rollout.n", trl["num_generations"], "TRL num_generations (the group size)"),
        Setting("actor_rollout_ref.rollout.temperature", trl["temperature"], "TRL temperature"),
        Setting("actor_rollout_ref.rollout.top_p", trl["top_p"], "TRL top_p"),
        Setting("actor_rollout_ref.rollout.tensor_model_parallel_size", tp, "devices per vLLM engine"),
        Setting("actor_rollout_ref.rollout.gpu_memory_utilization", trl["vllm_gpu_memory_utilization"],
                "TRL vllm_gpu_memory_utilization (the memory plan)"),
        Setting("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", trl["per_device_train_batch_size"],
                "old log-probs, same micro batch as training"),
        Setting("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", trl["per_device_train_batch_size"],
                "reference log-probs, same micro batch as training"),
        Setting("reward.custom_reward_function.path", REWARD_FILE, f"TRL rewards {list(config.rewards)}"),
        Setting("reward.custom_reward_function.name", REWARD_FUNCTION, "verl's reward signature"),
        Setting("trainer.device", target.device, "cuda or npu"),
        Setting("trainer.n_gpus_per_node", target.n_gpus_per_node, "devices per node"),
        Setting("trainer.nnodes", target.nnodes, "nodes (more than 1: start a Ray cluster first)"),
        Setting("trainer.total_training_steps", trl["max_steps"], "TRL max_steps"),
        Setting("trainer.total_epochs", math.ceil(trl["max_steps"] / steps_per_epoch),
                f"enough passes for max_steps ({steps_per_epoch} steps per epoch)"),
        Setting("trainer.save_freq", trl["save_steps"], "TRL save_steps"),
        Setting("trainer.test_freq", trl["save_steps"], "greedy accuracy on test.parquet, also before training"),
        Setting("trainer.critic_warmup", 0, "GRPO has no critic"),
        Setting("trainer.logger", ["console"], "add 'wandb' or 'tensorboard' as you like"),
        Setting("trainer.project_name", target.project_name, "experiment tracking"),
        Setting("trainer.experiment_name", target.experiment_name, "experiment tracking"),
    ]
    if device_module.is_npu(target.device):
        settings.append(Setting("actor_rollout_ref.rollout.enable_chunked_prefill", False,
                                "as in verl's Ascend quick start (vllm-ascend)"))
    return settings


def absolute_overrides(overrides: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """The overrides with the folder's files as absolute paths (what verl is given at launch)."""
    folder = Path(folder).resolve()
    return {key: str(folder / value) if key in PATH_KEYS else value for key, value in overrides.items()}


def hydra_value(value: Any) -> str:
    """A value as Hydra's command-line grammar reads it back (``True``, ``5e-06``, ``['console']``, ``'a b'``)."""
    if isinstance(value, bool):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    plain = text and all(c.isalnum() or c in "_-./~@:+" for c in text) and text.lower() not in (
        "true", "false", "null", "none", "nan", "inf")
    with contextlib.suppress(ValueError):
        float(text)
        plain = False  # a number must be quoted to stay a string
    return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override_args(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` strings for ``python3 -m verl.trainer.main_ppo`` (or Hydra's ``compose``)."""
    return [f"{key}={hydra_value(value)}" for key, value in overrides.items()]
