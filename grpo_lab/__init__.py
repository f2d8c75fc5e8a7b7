"""grpo-lab: learn and run GRPO fine-tuning with TRL and vLLM on an Ascend NPU, an NVIDIA GPU or a CPU.

One experiment (``experiment.TrainConfig``, TRL's names) flows from the memory plan (``memory``) through training
(``train``) to deployment (``deploy``); README.md's "Architecture" lists every module and what it owns.

**What user code may import** is :data:`__all__`: the names below at the top level and the modules listed there
(with their public, documented names). Anything else is the course's own plumbing and may change without notice.
The measurement lab lives beside the package, not in it. A public name that moves keeps
a shim for one minor version that warns (``grpo_lab.deprecation.GrpoLabDeprecationWarning``, a
``DeprecationWarning``) and names its new place; CHANGELOG.md says what changed in each version.

``import grpo_lab`` is cheap: the names load on first use (torch, transformers, TRL and vLLM are not imported).

>>> import grpo_lab
>>> config = grpo_lab.TrainConfig(profile="tiny", max_steps=4)      # doctest: +SKIP
>>> result = grpo_lab.train.train(config)                           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from grpo_lab.deprecation import resolve_target, warn_moved

__version__ = "0.2.0"  # kept equal to pyproject.toml's version by tests/test_public_api.py

# The course runs offline: TRL's trainers send the Hub a telemetry request each time one is built
# (trl.trainer.base_trainer._send_telemetry), unless this is set before huggingface_hub is imported, i.e. here.
# tests/test_tracking.py trains with the network refused and HF_HUB_OFFLINE unset. Set it to 0 to allow the pings.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# Top-level names: the calls a notebook of your own makes (README "Use grpo_lab in your own notebook"; notebook 08).
_NAMES: dict[str, str] = {
    # the experiment and the machine it runs on
    "TrainConfig": "grpo_lab.experiment",
    "get_profile": "grpo_lab.experiment",
    "memory_budget": "grpo_lab.experiment",  # the experiment's budget; memory.plan_memory is the planner beneath it
    "Machine": "grpo_lab.device",
    # training and evaluating (the function ``train`` lives in the module ``grpo_lab.train``)
    "TrainResult": "grpo_lab.train",
    "evaluate": "grpo_lab.evaluation",
    # your data and your rewards
    "load_jsonl": "grpo_lab.data",
    "write_jsonl": "grpo_lab.data",
    "load_split": "grpo_lab.data",
    "register_reward": "grpo_lab.rewards",
    "list_rewards": "grpo_lab.rewards",
    "get_reward": "grpo_lab.rewards",
    # runs, notebooks, errors
    "find_run": "grpo_lab.runs",
    "workspace": "grpo_lab.runs",
    "quiet_notebook": "grpo_lab.env",
    "GrpoLabError": "grpo_lab.errors",
    "ConfigError": "grpo_lab.errors",
}

# Public modules: what the notebooks import (`from grpo_lab import data, rewards, ...`).
_MODULES: tuple[str, ...] = (
    "advantages", "async_grpo", "cli", "course", "data", "deploy", "device", "doctor", "env", "errors",
    "evaluation", "experiment", "load_test", "lora", "memory", "models", "paths", "plots", "recipe", "rewards",
    "rollout", "runs", "scale", "tool_use", "tools", "tracking", "train", "verl_export", "widgets",
)

__all__ = ["__version__", *_NAMES, *_MODULES]

# Top-level names that moved: old name -> "module:new name" (they warn, for one minor version; CHANGELOG.md).
_MOVED: dict[str, str] = {"plan_memory": "grpo_lab.experiment:memory_budget"}


def __getattr__(name: str) -> Any:
    """Load a public name or module on first access (PEP 562), so ``import grpo_lab`` imports nothing heavy."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _MOVED:
        warn_moved(f"{__name__}.{name}", _MOVED[name].replace(":", "."), since="0.2.0")
        return resolve_target(_MOVED[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
