"""Export the course's GRPO experiment to verl: parquet data, a ``compute_score`` reward module, the config.

verl (``python3 -m verl.trainer.main_ppo``) trains GRPO with Ray workers, FSDP and vLLM rollouts across many
GPUs or Ascend NPUs. This module writes what it needs from the same :class:`~grpo_lab.train.TrainConfig` that
``grpo-lab train`` runs, into one folder that can be copied to a verl machine:

* ``train.parquet`` / ``test.parquet``: the course rows in verl's format (``data_source``, ``prompt`` as chat
  messages, ``ability``, ``reward_model: {style: rule, ground_truth}``, ``extra_info: {split, index, ...}``);
* ``reward_fn.py`` with ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, scoring with
  ``grpo_lab_rewards.py`` beside it: a verbatim copy of :mod:`grpo_lab.rewards` (standard library only), because
  verl loads the reward file by path inside its workers, where grpo_lab is usually not installed;
* ``verl_overrides.yaml``: the Hydra overrides of verl's ``ppo_trainer`` config (``algorithm.adv_estimator=grpo``,
  KL loss ``low_var_kl`` with ``kl_loss_coef`` = TRL's ``beta``, ``rollout.n`` = ``num_generations``, rollout
  tensor parallel size, ``gpu_memory_utilization``, device counts …), paths relative to the folder;
* ``run_verl.sh``: the launch command with the device variables (Ascend: CANN environment,
  ``ASCEND_RT_VISIBLE_DEVICES``, ``HCCL_CONNECT_TIMEOUT``, ``trainer.device=npu``); ``README.md`` explains each
  setting and ``export.json`` records the experiment, file checksums and the schema check.

:func:`validate_overrides` checks every override key against verl's own config (the keys of verl's
``_generated_ppo_trainer.yaml``, plus Hydra composition of ``ppo_trainer`` in struct mode when ``hydra-core``
imports) wherever verl's config files can be found: an installed ``verl``, or ``GRPO_LAB_VERL_SOURCE`` naming a
verl wheel, checkout or config folder. grpo_lab never runs verl itself.

The module is named ``verl_export`` rather than ``verl`` so that it can never shadow the real ``verl`` package.

Example (CPU, a few seconds)::

    >>> from grpo_lab.train import TrainConfig
    >>> from grpo_lab.verl_export import VerlTarget, export_verl
    >>> export = export_verl("runs/verl-gpu", TrainConfig(profile="gpu"),
    ...                      VerlTarget(device="cuda", n_gpus_per_node=8))          # doctest: +SKIP
    >>> export.overrides["actor_rollout_ref.rollout.n"]                             # doctest: +SKIP
    4

From a shell: ``python -m grpo_lab.verl_export --out runs/verl-gpu --profile gpu --gpus 8`` (every
``grpo-lab train`` option works too).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shlex
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab import rewards as rewards_module
from grpo_lab.data import load_split
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import (
    AUTO,
    PROFILE_DEVICE,
    TrainConfig,
    default_train_types,
    load_train_rows,
)
from grpo_lab.memory import VLLM_MEMORY_FRACTION
from grpo_lab.rewards import RewardSet, prepare
from grpo_lab.train import build_parser as train_parser

DATA_SOURCE = "grpo_lab/arithmetic"
ABILITY = "math"
TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
REWARD_FILE = "reward_fn.py"
REWARD_FUNCTION = "compute_score"
REWARDS_SNAPSHOT = "grpo_lab_rewards.py"
OVERRIDES_FILE = "verl_overrides.yaml"
LAUNCH_FILE = "run_verl.sh"
README_FILE = "README.md"
MANIFEST_FILE = "export.json"
PATH_KEYS = ("data.train_files", "data.val_files", "reward.custom_reward_function.path")
"""Overrides holding a file of the export folder: stored relative, made absolute at launch."""
MODEL_KEY = "actor_rollout_ref.model.path"
VERL_CHECKED = ("0.7.1", "0.8.0", "0.9.1")
"""verl releases whose config schema accepted every exported key (Hydra composition) when this was written."""
VERL_SOURCE_ENV = "GRPO_LAB_VERL_SOURCE"
CANN_ENV_SCRIPTS = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh")

# TRL name -> verl name, for the settings whose vocabulary differs
LOSS_AGG_MODE = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean",
                 "dr_grpo": "seq-mean-token-sum-norm"}
LR_SCHEDULER = {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"}
NORM_BY_STD = {"group": True, "none": False, "false": False, "true": True}


# --------------------------------------------------------------------------------------------------
# Where verl runs
# --------------------------------------------------------------------------------------------------
@dataclass
class VerlTarget:
    """The verl machine(s): device kind, devices per node, nodes, rollout tensor parallelism, validation size."""

    device: str | None = None
    """``cuda`` or ``npu``; default the profile's device (``cuda`` for the CPU-only ``tiny`` profile)."""
    n_gpus_per_node: int | None = None
    """Devices per node (verl calls NPUs "gpus" too); default the devices of that kind visible here, else 1."""
    nnodes: int = 1
    rollout_tensor_parallel_size: int = 1
    """vLLM tensor parallel size per rollout engine; 1 fits the course's 0.5B model on one device."""
    val_size: int | None = None
    """Rows of ``test.parquet`` (the course's eval split); default the profile's ``eval_size``."""
    project_name: str = "grpo_lab"
    experiment_name: str | None = None
    """Default ``grpo-<profile>``."""

    def resolved(self, profile_device: str, profile_name: str, eval_size: int) -> VerlTarget:
        kind = (self.device or ("cuda" if profile_device == "cpu" else profile_device)).strip().lower()
        if kind not in ("cuda", "npu"):
            raise ConfigError(f"verl trains on 'cuda' (NVIDIA) or 'npu' (Ascend) devices, not {kind!r}; "
                             "pass device='cuda' or device='npu'.")
        gpus = self.n_gpus_per_node
        if gpus is None:
            gpus = device_module.device_count(kind) if device_module.detect() == kind else 1
        return dataclasses.replace(self, device=kind, n_gpus_per_node=gpus,
                                   val_size=eval_size if self.val_size is None else self.val_size,
                                   experiment_name=self.experiment_name or f"grpo-{profile_name}")

    @property
    def total_devices(self) -> int:
        return self.n_gpus_per_node * self.nnodes


# --------------------------------------------------------------------------------------------------
# Data: course rows -> verl rows -> parquet
# --------------------------------------------------------------------------------------------------
def to_verl_row(row: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One course row in verl's RL format; ``extra_info`` keeps the columns the rewards read.

    >>> to_verl_row({"id": "eval-00000", "type": "average", "lang": "en", "answer": "7", "unit": "",
    ...              "prompt": [{"role": "user", "content": "Q?"}]}, "eval", 0)["reward_model"]
    {'style': 'rule', 'ground_truth': '7'}
    """
    if "prompt" not in row or "answer" not in row:
        raise ConfigError(f"row {index} of the {split} split needs 'prompt' and 'answer' (has {sorted(row)}); "
                         "see grpo_lab.data for the row format.")
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [
        {"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    extra = {"split": split, "index": index, "question": messages[-1]["content"]}
    extra.update({key: str(row.get(key, "")) for key in ("id", "type", "lang", "unit")})
    extra["answer"] = str(row["answer"])
    return {"data_source": DATA_SOURCE, "prompt": messages, "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": str(row["answer"])}, "extra_info": extra}


def verl_rows(rows: Sequence[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [to_verl_row(row, split, i) for i, row in enumerate(rows)]


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a parquet file as plain Python lists and dicts (what verl's dataset sees, column by column)."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(path)).to_pylist()


# --------------------------------------------------------------------------------------------------
# The GRPO config: TRL names -> verl Hydra overrides
# --------------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """One verl override, with where its value comes from (shown in the export's README)."""

    key: str
    value: Any
    source: str


def resolve_experiment(config: TrainConfig | None, device: str = "cuda") -> TrainConfig:
    """The experiment with every field filled for a verl target of kind ``device``: the profile's values, the
    model's training types, and vLLM's share (``"auto"`` becomes the export's default,
    ``memory.VLLM_MEMORY_FRACTION["verl"]``: verl frees the rollout's memory during the update). No machine facts of
    this machine are read: verl picks its own dtype on its own devices."""
    config = (config or TrainConfig()).with_profile()
    values: dict[str, Any] = {"device": device, "output_dir": None}
    if config.train_types is None:
        values["train_types"] = default_train_types(config.model) or ()
    if config.vllm_gpu_memory_utilization == AUTO:
        values["vllm_gpu_memory_utilization"] = VLLM_MEMORY_FRACTION["verl"]
    return dataclasses.replace(config, **values)


def grpo_settings(config: TrainConfig, target: VerlTarget, num_train_rows: int) -> list[Setting]:
    """verl's overrides for a resolved experiment on a resolved target; raises early on what verl would reject."""
    tp, devices = target.rollout_tensor_parallel_size, target.total_devices
    if target.n_gpus_per_node < 1 or target.nnodes < 1 or tp < 1:
        raise ConfigError("n_gpus_per_node, nnodes and rollout_tensor_parallel_size must be at least 1 "
                         f"(got {target.n_gpus_per_node}, {target.nnodes}, {tp}).")
    if target.n_gpus_per_node % tp:
        fits = [d for d in range(1, target.n_gpus_per_node + 1) if target.n_gpus_per_node % d == 0]
        raise ConfigError(f"rollout_tensor_parallel_size={tp} does not divide n_gpus_per_node={target.n_gpus_per_node}: "
                         f"each vLLM engine needs {tp} devices of one node. Use one of {fits}.")
    loss_agg = LOSS_AGG_MODE.get(config.loss_type)
    if loss_agg is None:
        raise ConfigError(f"loss_type={config.loss_type!r} has no verl equivalent here; use one of "
                         f"{sorted(LOSS_AGG_MODE)} (verl's loss_agg_mode {sorted(set(LOSS_AGG_MODE.values()))}).")
    norm_by_std = NORM_BY_STD.get(str(config.scale_rewards).lower())
    if norm_by_std is None:
        raise ConfigError(f"scale_rewards={config.scale_rewards!r}: verl's GRPO normalises by the group std or not at "
                         "all; use scale_rewards='group' or 'none'.")
    scheduler = LR_SCHEDULER.get(config.lr_scheduler_type)
    if scheduler is None:
        raise ConfigError(f"lr_scheduler_type={config.lr_scheduler_type!r}: verl schedules 'constant' or 'cosine' "
                         f"(with warmup); use one of {sorted(LR_SCHEDULER)}.")
    completions_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps * devices
    prompts_per_step = completions_per_step // config.num_generations
    steps_per_epoch = num_train_rows // prompts_per_step
    if steps_per_epoch < 1:
        raise ConfigError(f"{num_train_rows} training rows are fewer than one step's {prompts_per_step} prompts "
                         f"({devices} devices × {config.per_device_train_batch_size} completions / "
                         f"{config.num_generations}); lower per_device_train_batch_size or use more rows.")
    warmup = 0.0 if config.lr_scheduler_type == "constant" else float(config.warmup_steps or 0)  # HF ignores it there
    beta = float(config.beta)
    settings = [
        Setting("algorithm.adv_estimator", "grpo", "GRPO: advantages normalised within each prompt's group"),
        Setting("algorithm.norm_adv_by_std_in_grpo", norm_by_std, f"TRL scale_rewards={config.scale_rewards!r}"),
        Setting("algorithm.use_kl_in_reward", False, "TRL puts the KL in the loss, not in the reward"),
        Setting("data.train_files", TRAIN_FILE, f"{num_train_rows} rows: the experiment's training rows"),
        Setting("data.val_files", TEST_FILE, f"{target.val_size} rows of the course's eval split"),
        Setting("data.train_batch_size", prompts_per_step,
                f"prompts per step = per_device_train_batch_size {config.per_device_train_batch_size} × "
                f"gradient_accumulation_steps {config.gradient_accumulation_steps} × {devices} devices / "
                f"num_generations {config.num_generations}"),
        Setting("data.max_prompt_length", config.max_prompt_length, "max_prompt_length (grpo_lab checks prompts)"),
        Setting("data.max_response_length", config.max_completion_length, "TRL max_completion_length"),
        Setting("data.filter_overlong_prompts", True, "drop prompts longer than max_prompt_length"),
        Setting("data.truncation", "error", "never cut a prompt silently"),
        Setting("data.seed", config.seed, "TRL seed (data order)"),
        Setting(MODEL_KEY, config.model, f"TRL model (MODEL_PATH overrides it in {LAUNCH_FILE})"),
        Setting("actor_rollout_ref.model.enable_gradient_checkpointing", True, "TRL gradient_checkpointing"),
        Setting("actor_rollout_ref.actor.optim.lr", config.learning_rate, "TRL learning_rate"),
        Setting("actor_rollout_ref.actor.optim.lr_scheduler_type", scheduler,
                f"TRL lr_scheduler_type={config.lr_scheduler_type!r}"),
        (Setting("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", float(warmup), f"TRL warmup_steps={warmup}")
         if warmup < 1 else
         Setting("actor_rollout_ref.actor.optim.lr_warmup_steps", int(warmup), f"TRL warmup_steps={warmup}")),
        Setting("actor_rollout_ref.actor.optim.weight_decay", 0.0, "TRL weight_decay (verl's default is 0.01)"),
        Setting("actor_rollout_ref.actor.ppo_mini_batch_size", prompts_per_step,
                "one update per batch of rollouts, as TRL with num_iterations=1"),
        Setting("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", config.per_device_train_batch_size,
                "TRL per_device_train_batch_size (completions per forward pass)"),
        Setting("actor_rollout_ref.actor.loss_agg_mode", loss_agg, f"TRL loss_type={config.loss_type!r}"),
        Setting("actor_rollout_ref.actor.use_kl_loss", beta > 0, f"TRL beta={beta:g} > 0 loads a reference model"),
        Setting("actor_rollout_ref.actor.kl_loss_coef", beta, "TRL beta"),
        Setting("actor_rollout_ref.actor.kl_loss_type", "low_var_kl", "TRL's k3 estimator (verl clamps it)"),
        Setting("actor_rollout_ref.actor.entropy_coeff", 0, "TRL has no entropy bonus"),
        Setting("actor_rollout_ref.rollout.name", "vllm", "TRL use_vllm (colocated, as verl's hybrid engine)"),
        Setting("actor_rollout_ref.rollout.n", config.num_generations, "TRL num_generations (the group size)"),
        Setting("actor_rollout_ref.rollout.temperature", config.temperature, "TRL temperature"),
        Setting("actor_rollout_ref.rollout.top_p", config.top_p, "TRL top_p"),
        Setting("actor_rollout_ref.rollout.tensor_model_parallel_size", tp, "devices per vLLM engine"),
        Setting("actor_rollout_ref.rollout.gpu_memory_utilization", config.vllm_gpu_memory_utilization,
                "TRL vllm_gpu_memory_utilization (notebook 04)"),
        Setting("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", config.per_device_train_batch_size,
                "old log-probs, same micro batch as training"),
        Setting("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", config.per_device_train_batch_size,
                "reference log-probs, same micro batch as training"),
        Setting("reward.custom_reward_function.path", REWARD_FILE, f"TRL rewards {list(config.rewards)}"),
        Setting("reward.custom_reward_function.name", REWARD_FUNCTION, "verl's reward signature"),
        Setting("trainer.device", target.device, "cuda or npu"),
        Setting("trainer.n_gpus_per_node", target.n_gpus_per_node, "devices per node"),
        Setting("trainer.nnodes", target.nnodes, "nodes (more than 1: start a Ray cluster first)"),
        Setting("trainer.total_training_steps", config.max_steps, "TRL max_steps"),
        Setting("trainer.total_epochs", math.ceil(config.max_steps / steps_per_epoch),
                f"enough passes for max_steps ({steps_per_epoch} steps per epoch)"),
        Setting("trainer.save_freq", config.save_steps, "TRL save_steps"),
        Setting("trainer.test_freq", config.save_steps, "greedy accuracy on test.parquet, also before training"),
        Setting("trainer.critic_warmup", 0, "GRPO has no critic"),
        Setting("trainer.logger", ["console"], "add 'wandb' or 'tensorboard' as you like"),
        Setting("trainer.project_name", target.project_name, "experiment tracking"),
        Setting("trainer.experiment_name", target.experiment_name, "experiment tracking"),
    ]
    if target.device == "npu":
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
    try:
        float(text)
        plain = False
    except ValueError:
        pass
    return text if plain else _quote(text)


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override_args(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` strings for ``python3 -m verl.trainer.main_ppo`` (or Hydra's ``compose``)."""
    return [f"{key}={hydra_value(value)}" for key, value in overrides.items()]


# --------------------------------------------------------------------------------------------------
# Files of the export
# --------------------------------------------------------------------------------------------------
def reward_module_source(rewards: Sequence[str], weights: Sequence[float]) -> str:
    """``reward_fn.py``: verl's ``compute_score`` over the course's rewards, from the copy beside it."""
    return f'''"""verl reward for the grpo_lab GRPO experiment (generated by grpo_lab.verl_export).

verl loads this file by path (reward.custom_reward_function.path) in its reward workers, where grpo_lab is
usually not installed, so the scoring code is {REWARDS_SNAPSHOT} next to this file: a verbatim copy of
grpo_lab/rewards.py (standard library only; its sha256 is in {MANIFEST_FILE}).
"""

import hashlib
import importlib.util
import sys
from pathlib import Path

REWARDS = {list(rewards)!r}
WEIGHTS = {[float(w) for w in weights]!r}
"""TRL's reward_weights semantics: score = sum of weight * reward over the rewards that apply."""


def _load_rewards():
    path = Path(__file__).resolve().with_name("{REWARDS_SNAPSHOT}")
    name = "grpo_lab_rewards_" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


_rewards = _load_rewards()
{REWARD_FUNCTION} = _rewards.prepare(REWARDS, WEIGHTS).to_verl()
"""The weighted total as "score", each reward by name (and "acc" = correctness) for verl's logs."""
'''


def launch_script(overrides: dict[str, Any], target: VerlTarget) -> str:
    """``run_verl.sh``: device variables, then ``python3 -m verl.trainer.main_ppo`` with every override."""
    visible_var = device_module.visible_devices_var(target.device)
    alloc_var = next(iter(device_module.allocator_env(target.device)))
    devices = ",".join(str(i) for i in range(target.n_gpus_per_node))
    lines = [
        "#!/usr/bin/env bash",
        f"# GRPO with verl for grpo_lab's {target.experiment_name}, generated by grpo_lab.verl_export.",
        "# Run on the verl machine: bash run_verl.sh [more Hydra overrides]. MODEL_PATH replaces the model.",
        "set -eo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'MODEL_PATH="${{MODEL_PATH:-{overrides[MODEL_KEY]}}}"',
        "",
        "# vLLM's sleep mode (verl frees rollout memory during the update) refuses expandable segments.",
        f'if [[ "${{{alloc_var}:-}}" == *expandable_segments:True* ]]; then',
        f'  echo "run_verl.sh: unsetting {alloc_var}=${{{alloc_var}}} (vLLM sleep mode refuses it)" >&2',
        f"  unset {alloc_var}",
        "fi",
    ]
    if target.device == "npu":
        lines += ["# Ascend: CANN toolkit and ATB environment (verl's Ascend quick start).",
                  *[f'[ -f {script} ] && source {script}' for script in CANN_ENV_SCRIPTS],
                  "# HCCL connection timeout in seconds, as in verl's NPU example scripts."
                  " verl sets HCCL_*_SOCKET_PORT_RANGE=auto itself.",
                  'export HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1500}"']
    ray_env = device_module.ray_worker_env(target.device)
    if ray_env:
        lines.append(f"# Ray must not rewrite {visible_var} for each worker: verl places its workers itself"
                     " (verl's Ascend quick start and FAQ).")
        lines += [f'export {var}="${{{var}:-{value}}}"' for var, value in ray_env.items()]
    lines += [f'export {visible_var}="${{{visible_var}:-{devices}}}"', "",
              "python3 -m verl.trainer.main_ppo \\"]
    for key, value in overrides.items():
        if key in PATH_KEYS:
            lines.append(f"    \"{key}='${{HERE}}/{value}'\" \\")
        elif key == MODEL_KEY:
            lines.append(f"    \"{key}='${{MODEL_PATH}}'\" \\")
        else:
            lines.append(f"    {shlex.quote(f'{key}={hydra_value(value)}')} \\")
    lines.append('    "$@"')
    return "\n".join(lines) + "\n"


def parse_launch_overrides(script: str) -> dict[str, str]:
    """The ``key=value`` overrides of a ``run_verl.sh`` (values as Hydra text; shell variables left unexpanded)."""
    body = script.split("python3 -m verl.trainer.main_ppo", 1)[1]
    found = {}
    for word in shlex.split(body.replace("\\\n", " ")):
        if "=" in word:
            key, value = word.split("=", 1)
            found[key] = value
    return found


def _readme(export: VerlExport, settings: Sequence[Setting], check: SchemaCheck) -> str:
    config, target = export.train_config, export.target
    table = "\n".join(f"| `{s.key}` | `{hydra_value(s.value)}` | {s.source} |" for s in settings)
    rewards = f"rewards {list(config.rewards)} with weights {list(export.reward_weights)}"
    ray_env = " and ".join(f"`{k}={v}`" for k, v in device_module.ray_worker_env("npu").items())
    ascend = ("" if target.device != "npu" else f"""
Ascend: `{LAUNCH_FILE}` sources the CANN and ATB environment scripts, sets `ASCEND_RT_VISIBLE_DEVICES`,
`HCCL_CONNECT_TIMEOUT` and {ray_env} (so that Ray leaves the visible NPUs to verl), passes
`trainer.device=npu` (verl detects the NPU itself when torch_npu is installed) and
`rollout.enable_chunked_prefill=False`. It never sets `PYTORCH_NPU_ALLOC_CONF=expandable_segments:True`:
vllm-ascend's sleep-mode allocator refuses it. verl's Ascend docs list optional performance switches
(`TASK_QUEUE_ENABLE`, `CPU_AFFINITY_CONF`, jemalloc).
""")
    return f"""# grpo_lab → verl: GRPO for `{config.model}` ({config.profile} profile)

Generated by `grpo_lab.verl_export` from the same experiment definition `grpo-lab train` uses.
**grpo_lab has not run verl on this export**: the files were generated here, and
{check.summary()}.

| file | what |
|---|---|
| `{TRAIN_FILE}` | {export.num_train_rows} training rows: `data_source`, `prompt`, `ability`, `reward_model`, `extra_info` |
| `{TEST_FILE}` | {export.num_test_rows} rows of the course's eval split (verl's validation) |
| `{REWARD_FILE}` | `{REWARD_FUNCTION}(data_source, solution_str, ground_truth, extra_info=None)`: {rewards} |
| `{REWARDS_SNAPSHOT}` | a verbatim copy of `grpo_lab/rewards.py`, which `{REWARD_FILE}` scores with |
| `{OVERRIDES_FILE}` | the Hydra overrides of verl's `ppo_trainer` config (paths relative to this folder) |
| `{LAUNCH_FILE}` | the launch command with the device variables |
| `{MANIFEST_FILE}` | the experiment, the target, checksums, the schema check |

## Launch

Copy this folder to a machine with verl (keys checked against verl {', '.join(VERL_CHECKED)}) and vLLM
(or vllm-ascend), then:

```bash
bash {LAUNCH_FILE}          # {target.nnodes} node(s) × {target.n_gpus_per_node} {target.device} devices
MODEL_PATH=/models/Qwen2.5-0.5B-Instruct bash {LAUNCH_FILE} trainer.logger='["console","wandb"]'
```

More than one node: start a Ray cluster first (`ray start --head` on one node, `ray start --address=…` on the
others) and launch on the head node. Keys are verl ≥ 0.7 names (`reward.custom_reward_function.*`); verl 0.9
no longer reads the old top-level `custom_reward_function.*`.
{ascend}
## Settings (TRL name → verl key)

Per-device sizes stay as in the experiment, so the global batch grows with the device count, as TRL's does when
`accelerate` launches the same config on {target.total_devices} devices. To keep the single-device batch, export with
a smaller `per_device_train_batch_size`.

| verl key | value | from |
|---|---|---|
{table}
"""


# --------------------------------------------------------------------------------------------------
# Export and read back
# --------------------------------------------------------------------------------------------------
@dataclass
class VerlExport:
    """An export folder: the experiment it came from, the target, the overrides (relative paths) and counts."""

    folder: Path
    train_config: TrainConfig
    target: VerlTarget
    overrides: dict[str, Any]
    reward_weights: tuple[float, ...]
    num_train_rows: int
    num_test_rows: int
    schema_check: SchemaCheck | None = None
    files: dict[str, str] = field(default_factory=dict)
    """File name -> sha256."""

    @property
    def launch_command(self) -> str:
        return f"bash {self.folder / LAUNCH_FILE}"

    def absolute_overrides(self) -> dict[str, Any]:
        return absolute_overrides(self.overrides, self.folder)


def export_verl(out_dir: str | Path, config: TrainConfig | None = None, target: VerlTarget | None = None,
                overwrite: bool = False, validate: bool = True, deep: bool = False) -> VerlExport:
    """Write the verl export of ``config`` (default: the profile's experiment) for ``target`` into ``out_dir``.

    ``validate`` checks the overrides against verl's config schema when verl's config files are found
    (see :func:`validate_overrides`; ``deep`` adds verl's ``validate_config``); the result is in
    ``export.schema_check``, the README and the manifest.
    """
    profiled = (config or TrainConfig()).with_profile()
    target = (target or VerlTarget()).resolved(PROFILE_DEVICE[profiled.profile], profiled.profile, profiled.eval_size)
    config = resolve_experiment(profiled, target.device)
    weights = tuple(prepare(config.rewards, config.reward_weights).weights)  # unknown names, weight counts stop here
    train_rows = load_train_rows(config)
    test_rows = load_split("eval")[: target.val_size]
    settings = grpo_settings(config, target, len(train_rows))
    overrides = {s.key: s.value for s in settings}

    folder = Path(out_dir)
    if folder.exists() and any(folder.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{folder} is not empty; choose a new folder or pass overwrite=True "
                                  "(--overwrite) to replace its contents (nothing was written).")
        if not (folder / MANIFEST_FILE).is_file():
            raise FileExistsError(f"{folder} holds files that are not a verl export ({MANIFEST_FILE} is missing); "
                                  "refusing to overwrite it. Choose an empty folder.")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)

    write_parquet(verl_rows(train_rows, "train"), folder / TRAIN_FILE)
    write_parquet(verl_rows(test_rows, "eval"), folder / TEST_FILE)
    shutil.copyfile(Path(rewards_module.__file__), folder / REWARDS_SNAPSHOT)
    (folder / REWARD_FILE).write_text(reward_module_source(config.rewards, weights), encoding="utf-8")
    (folder / OVERRIDES_FILE).write_text(_overrides_yaml(overrides), encoding="utf-8")
    script = folder / LAUNCH_FILE
    script.write_text(launch_script(overrides, target), encoding="utf-8")
    script.chmod(0o755)

    export = VerlExport(folder, config, target, overrides, weights, len(train_rows), len(test_rows))
    check = (validate_overrides(export.absolute_overrides(), deep=deep) if validate
             else SchemaCheck(ok=None, skipped="validation not asked for"))
    export.schema_check = check
    (folder / README_FILE).write_text(_readme(export, settings, check), encoding="utf-8")
    export.files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
    manifest = {"experiment": config.to_dict(), "target": asdict(target), "reward_weights": list(weights),
                "num_train_rows": export.num_train_rows, "num_test_rows": export.num_test_rows,
                "verl_versions_checked_when_written": list(VERL_CHECKED), "schema_check": asdict(check),
                "files": export.files, "verl_run": "not run by grpo_lab"}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return export


def _overrides_yaml(overrides: dict[str, Any]) -> str:
    import yaml

    head = ("# Hydra overrides of verl's ppo_trainer config (python3 -m verl.trainer.main_ppo key=value ...).\n"
            f"# Paths of {', '.join(PATH_KEYS)} are relative to this folder; {LAUNCH_FILE} makes them absolute.\n")
    return head + yaml.safe_dump(overrides, sort_keys=False, allow_unicode=True, width=120)


@dataclass
class LoadedExport:
    """An export folder read back: the verl rows, the overrides (absolute paths), the reward function."""

    folder: Path
    train_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]]
    overrides: dict[str, Any]
    manifest: dict[str, Any]
    compute_score: Callable[..., Any]

    def reward_set(self) -> RewardSet:
        """grpo_lab's own rewards with the export's names and weights: what ``compute_score`` scores with."""
        return prepare(self.manifest["experiment"]["rewards"], self.manifest["reward_weights"])


def load_export(folder: str | Path) -> LoadedExport:
    """Read an export back as verl would: both parquet files, the overrides, ``compute_score`` loaded by path."""
    import yaml

    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{folder} is not a verl export ({MANIFEST_FILE} is missing); write one with "
                                "grpo_lab.verl_export.export_verl(folder, config).")
    overrides = yaml.safe_load((folder / OVERRIDES_FILE).read_text(encoding="utf-8"))
    absolute = absolute_overrides(overrides, folder)
    return LoadedExport(folder, read_parquet(absolute["data.train_files"]), read_parquet(absolute["data.val_files"]),
                        absolute, json.loads(manifest_path.read_text(encoding="utf-8")),
                        load_reward_function(absolute["reward.custom_reward_function.path"],
                                             absolute["reward.custom_reward_function.name"]))


def load_reward_function(path: str | Path, name: str = REWARD_FUNCTION) -> Callable[..., Any]:
    """Load ``name`` from the file at ``path`` the way verl does (a module built from the file location)."""
    path = Path(path)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"verl_reward_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


# --------------------------------------------------------------------------------------------------
# verl's own schema
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerlConfigSource:
    """verl's trainer config folder (``verl/trainer/config``), its version and where it was found."""

    config_dir: Path
    version: str
    origin: str


@dataclass
class SchemaCheck:
    """Whether verl's config accepts the overrides: ``ok`` None means skipped (``skipped`` says why)."""

    ok: bool | None
    skipped: str = ""
    verl_version: str = ""
    origin: str = ""
    methods: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.ok is None:
            return f"its keys were NOT checked against verl's schema ({self.skipped})"
        verdict = "accepted" if self.ok else f"REJECTED ({'; '.join(self.problems)})"
        return f"verl {self.verl_version}'s config schema ({', '.join(self.methods)}) {verdict} every override"


def find_verl_config(source: str | Path | None = None) -> VerlConfigSource | None:
    """verl's config folder from ``source`` (a wheel, checkout, package or config folder), else from
    ``$GRPO_LAB_VERL_SOURCE``, else from an installed ``verl`` (found without importing it); None if nowhere."""
    source = source or os.environ.get(VERL_SOURCE_ENV)
    if source:
        path = Path(source).expanduser()
        if path.is_file() and path.suffix == ".whl":
            path = _unpacked_wheel(str(path.resolve()))
        for package in (path, path / "verl", path.parent.parent):
            if (package / "trainer" / "config" / "ppo_trainer.yaml").is_file():
                return VerlConfigSource(package / "trainer" / "config", _verl_version(package), str(source))
        raise FileNotFoundError(f"{source} holds no verl config (verl/trainer/config/ppo_trainer.yaml); point "
                                f"{VERL_SOURCE_ENV} at a verl wheel (pip download verl --no-deps), a verl checkout "
                                "or an installed verl package folder.")
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(list(spec.submodule_search_locations)[0])
    config_dir = package / "trainer" / "config"
    if not (config_dir / "ppo_trainer.yaml").is_file():
        return None
    return VerlConfigSource(config_dir, _verl_version(package), f"installed verl at {package}")


@lru_cache(maxsize=None)
def _unpacked_wheel(wheel: str) -> Path:
    """The config files and version of a verl wheel, unpacked once per process into a temporary folder."""
    target = Path(tempfile.mkdtemp(prefix="grpo_lab_verl_"))
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist()
                   if n.startswith("verl/trainer/config/") or n == "verl/version/version"]
        archive.extractall(target, members)
    return target / "verl"


def _verl_version(package: Path) -> str:
    version_file = package / "version" / "version"
    return version_file.read_text(encoding="utf-8").strip() if version_file.is_file() else "unknown"


def validate_overrides(overrides: dict[str, Any], source: str | Path | None = None, deep: bool = False) -> SchemaCheck:
    """Check every override key against verl's own config, where verl's config files can be found.

    Always (PyYAML): each key exists in verl's ``_generated_ppo_trainer.yaml`` (the fully composed default config
    verl ships), so every missing key is listed. With ``hydra-core``: Hydra composes ``ppo_trainer`` with the
    overrides in struct mode, exactly as ``verl.trainer.main_ppo`` starts, and resolves every interpolation.
    ``deep=True`` and an importable verl: also ``verl.utils.config.validate_config`` (batch-size arithmetic).
    Returns a skipped :class:`SchemaCheck` when verl's config is nowhere to be found.
    """
    found = find_verl_config(source)
    if found is None:
        return SchemaCheck(ok=None, skipped=f"verl's config files not found: install verl or set {VERL_SOURCE_ENV} "
                                             "to a verl wheel (pip download verl --no-deps) or checkout")
    check = SchemaCheck(ok=True, verl_version=found.version, origin=found.origin)
    generated = found.config_dir / "_generated_ppo_trainer.yaml"
    if generated.is_file():
        import yaml

        defaults = yaml.safe_load(generated.read_text(encoding="utf-8"))
        check.methods.append("keys of _generated_ppo_trainer.yaml")
        check.problems += [f"{key} is not a verl config key" for key in overrides if not _has_key(defaults, key)]
    if importlib.util.find_spec("hydra") is not None:
        check.methods.append("Hydra compose of ppo_trainer (struct mode)")
        composed = _compose(found.config_dir, override_args(overrides), check)
        if composed is not None and deep and found.origin.startswith("installed"):
            _verl_validate_config(composed, check)
        elif deep:
            check.methods.append("verl validate_config skipped (needs hydra and the config of an importable verl)")
    if not check.methods:
        return SchemaCheck(ok=None, skipped=f"no _generated_ppo_trainer.yaml in {found.config_dir} and hydra-core is "
                                            "not installed", verl_version=found.version, origin=found.origin)
    check.ok = not check.problems
    return check


def _has_key(tree: Any, dotted: str) -> bool:
    for part in dotted.lstrip("+").split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _compose(config_dir: Path, args: list[str], check: SchemaCheck):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=args)
        OmegaConf.to_container(config, resolve=True)
    except Exception as error:  # noqa: BLE001 - Hydra raises several types; each is a rejection to report
        check.problems.append(f"Hydra: {str(error).splitlines()[0]}")
        return None
    return config


def _verl_validate_config(config: Any, check: SchemaCheck) -> None:
    try:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config
    except Exception as error:  # noqa: BLE001 - a partial verl install fails in many ways; report, don't crash
        check.methods.append(f"verl validate_config skipped (import failed: {type(error).__name__}: {error})")
        return
    check.methods.append("verl.utils.config.validate_config")
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as error:  # noqa: BLE001
        check.problems.append(f"validate_config: {type(error).__name__}: {error}")


# --------------------------------------------------------------------------------------------------
# `grpo-lab verl-export`
# --------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """``grpo-lab train``'s options (the experiment) plus where verl runs."""
    parser = train_parser()
    parser.prog = "grpo-lab verl-export"
    parser.description = ("Write verl's GRPO inputs (parquet, compute_score module, Hydra overrides, launch script) "
                          "from the same options `grpo-lab train` takes. verl itself is not run.")
    group = parser.add_argument_group("verl target")
    group.add_argument("--out", required=True, help="the export folder")
    group.add_argument("--gpus", type=int, default=None, help="devices per node (default: visible ones, else 1)")
    group.add_argument("--nodes", type=int, default=1)
    group.add_argument("--tp", type=int, default=1, help="rollout tensor parallel size")
    group.add_argument("--device", choices=("cuda", "npu"), default=None, help="default: the profile's")
    group.add_argument("--val-size", type=int, default=None, help="rows of test.parquet")
    group.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    group.add_argument("--deep", action="store_true", help="also run verl's validate_config (needs verl importable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab verl-export --out DIR [--profile gpu] [--gpus 8] [--tp 1] [--device npu] …``."""
    args = vars(build_parser().parse_args(argv))
    target = VerlTarget(device=args.pop("device"), n_gpus_per_node=args.pop("gpus"), nnodes=args.pop("nodes"),
                        rollout_tensor_parallel_size=args.pop("tp"), val_size=args.pop("val_size"))
    out, overwrite, deep = args.pop("out"), args.pop("overwrite"), args.pop("deep")
    experiment = {k: v for k, v in args.items() if v is not dataclasses.MISSING}
    try:
        export = export_verl(out, TrainConfig(**experiment), target, overwrite=overwrite, deep=deep)
    except (GrpoLabError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"grpo-lab verl-export: {error}")
        return 2
    o = export.overrides
    print(f"verl export in {export.folder}: {export.num_train_rows} train / {export.num_test_rows} test rows, "
          f"{REWARD_FILE}, {OVERRIDES_FILE}, {LAUNCH_FILE}")
    print(f"  {o[MODEL_KEY]}: {o['data.train_batch_size']} prompts × n={o['actor_rollout_ref.rollout.n']} per step, "
          f"{o['trainer.total_training_steps']} steps, kl_loss_coef={o['actor_rollout_ref.actor.kl_loss_coef']:g}, "
          f"{export.target.nnodes}×{export.target.n_gpus_per_node} {export.target.device}, "
          f"rollout TP={o['actor_rollout_ref.rollout.tensor_model_parallel_size']}")
    print(f"  schema: {export.schema_check.summary()}")
    print(f"  not run here; on the verl machine: {export.launch_command}")
    return 0 if export.schema_check.ok is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
