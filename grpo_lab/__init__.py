"""grpo-lab: learn and run GRPO fine-tuning with TRL and vLLM on an Ascend NPU, an NVIDIA GPU or a CPU.

One experiment (``experiment.TrainConfig``, TRL's names) is planned for a machine (``experiment.plan``, the memory
budget from ``memory``), trained (``train``) and deployed (``deploy``); README.md's "Architecture" lists every module
and what it owns.

**What user code may import** is :data:`__all__`: the public modules listed there, each with its own ``__all__`` of
documented names, and at the top level :class:`TrainConfig` and :class:`Machine`. Every other module
(``grpo_lab.upstream``, ``carry``, ``servers``, ``callbacks``, ``tiny_model``, the submodules of a package such as
``grpo_lab.deploy.server``) and every name left out of an ``__all__`` is the package's own plumbing: importable, but
it may change in any release without notice. The measurement lab (``lab``) lives beside the package, not in it.
CHANGELOG.md says what changed in each version.

``import grpo_lab`` is cheap: modules load on first use (torch, transformers, TRL and vLLM are not imported).

>>> import grpo_lab
>>> config = grpo_lab.TrainConfig(profile="tiny", max_steps=4)      # doctest: +SKIP
>>> result = grpo_lab.train.train(config)                           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.3.0"  # kept equal to pyproject.toml's version by tests/test_public_api.py

# The course runs offline: TRL's trainers send the Hub a telemetry request each time one is built
# (trl.trainer.base_trainer._send_telemetry), unless this is set before huggingface_hub is imported, i.e. here.
# tests/test_tracking.py trains with the network refused and HF_HUB_OFFLINE unset. Set it to 0 to allow the pings.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# Top-level names: the experiment and the machine it runs on (the function ``train`` lives in the module ``train``).
_NAMES: dict[str, str] = {"TrainConfig": "grpo_lab.experiment", "Machine": "grpo_lab.device"}

# Public modules: what the notebooks, README's example and the command line use.
_MODULES: tuple[str, ...] = (
    "advantages", "async_grpo", "cli", "course", "data", "deploy", "device", "doctor", "env", "errors",
    "evaluation", "experiment", "load_test", "lora", "memory", "models", "paths", "plots", "recipe", "rewards",
    "rollout", "runs", "scale", "tool_use", "tools", "tracking", "train", "verl_export", "widgets",
)

__all__ = [*_NAMES, *_MODULES]


def __getattr__(name: str) -> Any:
    """Load a public name or a module on first access (PEP 562), so ``import grpo_lab`` imports nothing heavy."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
