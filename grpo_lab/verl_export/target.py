"""Where verl runs: device kind, devices per node, nodes, rollout tensor parallelism (:class:`VerlTarget`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_lab import device as device_module
from grpo_lab.errors import ConfigError


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
        kind = (self.device or ("cuda" if device_module.is_cpu(profile_device) else profile_device)).strip().lower()
        if not device_module.is_accelerator(kind):
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
