"""Where and how server mode runs (:class:`ServerModeConfig`), the names of its files, and its error."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_lab import device as device_module
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.memory import CPU_KV_CACHE_GIB
from grpo_lab.servers import require_free_port

SERVER_LOG = "rollout_server.log"
TRAINER_LOG = "trainer.log"
RESULT_FILE = "server_mode.json"
WEIGHT_SYNC_MODES = ("nccl", "file")
# Variables a parent (a notebook that ran colocate, a test) may hold, which accelerate sets for the launched trainer.
DISTRIBUTED_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "VLLM_ENABLE_V1_MULTIPROCESSING")


class ScaleOutError(GrpoLabError, RuntimeError):
    """The rollout server or the trainer did not start, stopped early or timed out; the message names the log."""


@dataclass
class ServerModeConfig:
    """Where and how the rollout server and the trainer run (the GRPO run itself is a ``TrainConfig``)."""

    rollout_devices: tuple[int, ...] | None = None
    """Device indices for vLLM (tensor parallel over all of them); None: :func:`plan_devices` decides."""
    train_devices: tuple[int, ...] | None = None
    """Device indices for the trainer; None: the devices not serving rollouts."""
    device: str | None = None
    """``cuda`` / ``npu`` / ``cpu``; default the detected device."""
    host: str = "127.0.0.1"
    port: int | None = None
    """The server's HTTP port; None: a free one."""
    group_port: int | None = None
    """The NCCL weight-transfer port (CUDA); None: a free one."""
    weight_sync: str | None = None
    """``nccl`` (TRL's own, CUDA only) or ``file`` (safetensors + vLLM reload); default nccl on CUDA, else file."""
    cpu_kvcache_gib: float = CPU_KV_CACHE_GIB
    """KV cache in host RAM when vLLM runs on the CPU."""
    startup_timeout_s: float = 600.0
    """How long to wait for ``/health`` (a vLLM engine takes minutes to start on a small CPU)."""
    train_timeout_s: float | None = None
    """Stop the trainer (and say so) after this long; None: no limit."""
    shutdown_timeout_s: float = 30.0
    extra_server_args: tuple[str, ...] = ()
    """More ``vllm serve`` flags, e.g. ``("--enable-prefix-caching",)``."""

    def resolved(self) -> ServerModeConfig:
        """A copy with ``device`` and ``weight_sync`` filled in, after checking every value."""
        kind = (self.device or device_module.detect()).strip().lower()
        if kind not in device_module.KINDS:
            raise ConfigError(f"device={self.device!r}: use one of {', '.join(device_module.KINDS)}")
        sync = self.weight_sync or ("nccl" if device_module.is_cuda(kind) else "file")
        if sync not in WEIGHT_SYNC_MODES:
            raise ConfigError(f"weight_sync={sync!r}: use 'nccl' (TRL's transfer, CUDA only) or 'file' "
                              f"(safetensors + vLLM reload_weights)")
        if sync == "nccl" and not device_module.is_cuda(kind):
            raise ConfigError(f"weight_sync='nccl' needs CUDA (TRL's transfer is vLLM's NCCL engine); on {kind} use "
                              f"weight_sync='file'.")
        for name in ("startup_timeout_s", "shutdown_timeout_s", "cpu_kvcache_gib"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.train_timeout_s is not None and self.train_timeout_s <= 0:
            raise ConfigError(f"train_timeout_s must be positive or None, got {self.train_timeout_s}")
        require_free_port(self.port, self.host, "port")
        require_free_port(self.group_port, self.host, "group_port")
        return dataclasses.replace(self, device=kind, weight_sync=sync)
