"""A smaller device: ``GRPO_LAB_DEVICE_MEMORY_GIB=N`` (or ``Machine(memory_gib=N)``) makes the package treat device 0 as
an N GiB card: the planner, the profile's micro-batch, vLLM's ``"auto"`` share and the doctor size for N GiB, and on
CUDA the cap is enforced (torch's per-process fraction in the trainer's process, every vLLM share converted to one of
the real device). What a cap does not emulate: :data:`MEMORY_CAP_LIMITS`.

Part of :mod:`grpo_lab.device`, which re-exports every name: use ``device.apply_memory_cap`` and the rest. The device's
own queries are read through the package at call time (``hw.memory_info``), the per-device table
``MEMORY_CAP_ENFORCED`` lives there with the others.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import grpo_lab.device as hw
from grpo_lab.device import DeviceError

MEMORY_CAP_ENV = "GRPO_LAB_DEVICE_MEMORY_GIB"
"""``GRPO_LAB_DEVICE_MEMORY_GIB=N``: device 0 as an N GiB card, for its memory only (:data:`MEMORY_CAP_LIMITS`)."""
SLEEP_MODE_UNDER_CAP = (
    "vLLM's sleep mode: a sleeping colocated engine hands its memory back to the device, but torch still counts its "
    "memory pool's blocks against the cap, so under a cap sleep mode frees nothing for the update (measured on an "
    "H100: 17.5 GiB still allocated while asleep, 77.97 of 79.18 GiB free on the device, a 15.9 GiB allocation "
    "refused under a 32 GiB cap; benchmarks/capped/results/probes/sleep_probe.json); a device with only N GiB free "
    "gets it back (measured on an H200 that another process left 32 GiB free: the write-up's 2B recipe, vLLM at 0.55 "
    "of 32 GiB, ran its steps asleep in the update, 30.8 GiB used, and ran out of memory awake; "
    "benchmarks/capped/results/seed-2b-sleep__*.json)"
)
"""Why a plan that counts on sleep mode runs out of memory under a cap and not on a real card of that size."""
MEMORY_CAP_LIMITS = (
    "memory bandwidth and compute: the steps run at the real device's speed, not a smaller card's",
    "other processes: memory another process holds on the device is not inside the cap",
    "memory outside torch's allocator (the CUDA context, about 0.5 GiB, NCCL and vLLM's non-torch buffers) is not "
    "counted against the cap; a real card of N GiB holds it too",
    SLEEP_MODE_UNDER_CAP,
)
"""What a cap does not emulate."""
CAP_ROUNDING_GIB = 0.01
"""A cap this close above the device's total is the whole device (sizes written with two decimals)."""
_APPLIED: dict[tuple[str, int], MemoryCap] = {}


class MemoryCapError(DeviceError):
    """A device memory cap that cannot stand for a smaller device (not a positive number, or larger than the device)."""


@dataclass(frozen=True)
class MemoryCap:
    """A device of ``memory_gib`` stood in for by a real one of ``device_gib``."""

    memory_gib: float
    device_gib: float
    kind: str

    @property
    def fraction(self) -> float:
        """The cap as a share of the real device (torch's per-process fraction)."""
        return self.memory_gib / self.device_gib

    @property
    def enforced(self) -> bool:
        """Whether the package enforces the cap on this device kind (:data:`MEMORY_CAP_ENFORCED`)."""
        return hw.MEMORY_CAP_ENFORCED[self.kind]

    def device_share(self, share: float) -> float:
        """A vLLM share of N GiB as one of the real device, rounded down to 1e-4 (unchanged where not enforced).

        >>> MemoryCap(24, 139.8, "cuda").device_share(0.3)
        0.0515
        """
        if not self.enforced:
            return share
        return math.floor(share * self.fraction * 10_000) / 10_000

    def describe(self) -> str:
        how = "enforced (torch's per-process fraction, vLLM shares converted)" if self.enforced else "the plan only"
        return (f"treated as {self.memory_gib:g} GiB ({MEMORY_CAP_ENV}) of its {self.device_gib:.1f} GiB; {how}. "
                f"Not emulated: " + "; ".join(MEMORY_CAP_LIMITS))


def memory_cap_gib(environ: dict[str, str] | None = None) -> float | None:
    """The size ``GRPO_LAB_DEVICE_MEMORY_GIB`` gives the device, GiB (None when unset or empty)."""
    text = (os.environ if environ is None else environ).get(MEMORY_CAP_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise MemoryCapError(f"{MEMORY_CAP_ENV}={text!r} is not a number: give the device's size in GiB "
                             f"(e.g. {MEMORY_CAP_ENV}=24 for a 24 GiB card), or unset it.") from None
    return check_memory_cap(value, None, "cpu").memory_gib


def check_memory_cap(memory_gib: float, device_gib: float | None, kind: str) -> MemoryCap:
    """A cap of ``memory_gib`` on a ``kind`` device of ``device_gib`` (host memory on the CPU): positive, not larger."""
    if isinstance(memory_gib, bool) or not isinstance(memory_gib, (int, float)) or not memory_gib > 0:
        raise MemoryCapError(f"a device memory cap of {memory_gib!r} GiB: it must be a positive number of GiB (the "
                             f"size of the device to stand for, e.g. {MEMORY_CAP_ENV}=24), or unset.")
    if device_gib is not None and memory_gib > device_gib + CAP_ROUNDING_GIB:
        where = "host memory" if hw.is_cpu(kind) else f"{kind} device 0"
        raise MemoryCapError(f"a device memory cap of {memory_gib:g} GiB is larger than the {where} it runs on "
                             f"({device_gib:.1f} GiB): a cap stands for a smaller device. Use at most "
                             f"{math.floor(device_gib * 10) / 10:g}, or unset {MEMORY_CAP_ENV}.")
    device_gib = float(memory_gib if device_gib is None else device_gib)
    return MemoryCap(min(float(memory_gib), device_gib), device_gib, kind)


def memory_cap(index: int = 0, kind: str | None = None) -> MemoryCap | None:
    """The cap in force here: the one :func:`apply_memory_cap` set, else ``GRPO_LAB_DEVICE_MEMORY_GIB``'s, or None."""
    kind = kind or hw.detect()
    if (kind, index) in _APPLIED:
        return _APPLIED[kind, index]
    cap = memory_cap_gib()
    return None if cap is None else check_memory_cap(cap, hw.memory_info(index, kind).total_gib, kind)


def device_memory_gib(index: int = 0, kind: str | None = None) -> float:
    """The device's size as the package treats it, GiB: the cap in force (:func:`memory_cap`), else its total."""
    kind = kind or hw.detect()
    cap = memory_cap(index, kind)
    return cap.memory_gib if cap is not None else hw.memory_info(index, kind).total_gib


def apply_memory_cap(memory_gib: float, index: int = 0, kind: str | None = None) -> MemoryCap | None:
    """Make this process treat device ``index`` as ``memory_gib`` GiB (a :class:`Machine`'s): on CUDA
    ``torch.cuda.set_per_process_memory_fraction(memory_gib / total)`` (an allocation past it raises torch's
    ``OutOfMemoryError``, as on such a card) and vLLM shares converted from then on (:func:`device_share`). None for
    the whole device, and on the CPU and the NPU (:data:`MEMORY_CAP_ENFORCED`); larger than the device is refused. Not
    emulated: :data:`MEMORY_CAP_LIMITS`."""
    kind = kind or hw.detect()
    if not hw.MEMORY_CAP_ENFORCED[kind]:  # nothing to enforce: the plan was sized for memory_gib already
        check_memory_cap(memory_gib, None, kind)
        return None
    total = hw.memory_info(index, kind).total_gib
    cap = check_memory_cap(memory_gib, total, kind)
    if cap.memory_gib >= total:
        _APPLIED.pop((kind, index), None)
        return None
    hw.torch.cuda.set_per_process_memory_fraction(cap.fraction, index)
    _APPLIED[kind, index] = cap
    return cap


def cap_caveats(cap: MemoryCap | None, sleep_mode: bool) -> list[str]:
    """What a run with ``sleep_mode`` under an enforced ``cap`` should be told before it starts (none otherwise)."""
    if cap is None or not cap.enforced or not sleep_mode:
        return []
    return [f"{MEMORY_CAP_ENV}={cap.memory_gib:g} with vllm_enable_sleep_mode=True: the plan counts on sleep mode, "
            f"which the cap does not emulate ({SLEEP_MODE_UNDER_CAP}). Expect an out-of-memory error in the update "
            f"that a real {cap.memory_gib:g} GiB card would not have; to run under the cap, plan without sleep mode, "
            f"or stand in for the card by holding the rest of the device in another process instead of a cap "
            f"(benchmarks/capped/ballast.py)."]


def enforce_memory_cap(index: int = 0, kind: str | None = None) -> MemoryCap | None:
    """Enforce the cap in force (:func:`memory_cap`): a trainer's process does, given a Machine or not."""
    cap = memory_cap(index, kind)
    return None if cap is None else apply_memory_cap(cap.memory_gib, index, kind)


def device_memory_of(pids: set[int], kind: str | None = None) -> int | None:
    """Bytes the driver counts for these processes (``nvidia-smi --query-compute-apps``); None off CUDA or unlisted."""
    if not hw.is_cuda(kind):
        return None
    import subprocess

    listing = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    used = [int(mib) * 2**20 for pid, mib in (line.split(",") for line in listing.splitlines() if line.count(",") == 1)
            if pid.strip().isdigit() and int(pid) in pids and mib.strip().isdigit()]
    return sum(used) if used else None


def capped_memory_info(index: int = 0, kind: str | None = None) -> hw.MemoryInfo:
    """:func:`memory_info` of the capped device (total: the cap; free: what it leaves beside this process's torch
    memory), what a vLLM start from this process is checked against as vLLM checks a real card."""
    kind = kind or hw.detect()
    real, cap = hw.memory_info(index, kind), memory_cap(index, kind)
    if cap is None or not cap.enforced:
        return real
    total = int(cap.memory_gib * 2**30)
    return hw.MemoryInfo(total, min(real.free_bytes, total - hw.reserved_bytes(index, kind)))


def device_share(share: float, index: int = 0, kind: str | None = None) -> float:
    """vLLM's ``gpu_memory_utilization`` for a share of the device as the package treats it: under a cap in force
    (:func:`memory_cap`), ``share × cap / total`` of the real device, which vLLM divides; else ``share``."""
    cap = memory_cap(index, kind or hw.detect())
    return share if cap is None else cap.device_share(share)


