"""A smaller device: a :class:`MemoryCap` stands a card of ``memory_gib`` in for a real device of ``device_gib``.

``GRPO_LAB_DEVICE_MEMORY_GIB=N`` (read by :meth:`grpo_lab.device.Machine.detect`) makes the package plan for an N GiB
card; on CUDA the cap is also enforced (torch's per-process fraction, vLLM shares converted). What a cap does not
emulate: :data:`MEMORY_CAP_LIMITS`. Values only: nothing here reads the environment or the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_lab.errors import DeviceError

MEMORY_CAP_ENV = "GRPO_LAB_DEVICE_MEMORY_GIB"
MEMORY_CAP_ENFORCED = {"cuda": True, "npu": False, "cpu": False}
"""Where a cap is enforced; elsewhere it sizes the plan only."""
SLEEP_MODE_UNDER_CAP = (
    "vLLM's sleep mode: a sleeping colocated engine hands its memory back to the device, but torch's per-process "
    "fraction still counts its memory pool against the cap, so under a cap sleep mode frees nothing for the update; "
    "a device that has only N GiB free gets it back")
MEMORY_CAP_LIMITS = (
    "memory bandwidth and compute: the steps run at the real device's speed, not a smaller card's",
    "other processes: memory another process holds on the device is not inside the cap",
    "memory outside torch's allocator (the CUDA context, NCCL and vLLM's non-torch buffers) is not counted against "
    "the cap; a real card of N GiB holds it too",
    SLEEP_MODE_UNDER_CAP,
)
"""What a cap does not emulate."""
CAP_ROUNDING_GIB = 0.01
"""A cap this close above the device's total is the whole device (sizes written with two decimals)."""


class MemoryCapError(DeviceError):
    """A device memory cap that cannot stand for a smaller device (not a positive number, or larger than the device)."""


@dataclass(frozen=True)
class MemoryCap:
    """A card of ``memory_gib`` stood in for by a real ``kind`` device of ``device_gib``."""

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
        return MEMORY_CAP_ENFORCED[self.kind]

    def device_share(self, share: float) -> float:
        """A vLLM share of the capped card as one of the real device (rounded down to 1e-4); unchanged where the cap is
        not enforced.

        >>> MemoryCap(24, 120, "cuda").device_share(0.5)
        0.1
        """
        if not self.enforced:
            return share
        return math.floor(share * self.fraction * 10_000 + 1e-9) / 10_000

    def card_share(self, device_share: float) -> float:
        """The inverse of :meth:`device_share` (rounded to 1e-4)."""
        if not self.enforced:
            return device_share
        return round(device_share / self.fraction, 4)

    def describe(self) -> str:
        how = "enforced (torch's per-process fraction, vLLM shares converted)" if self.enforced else "the plan only"
        return (f"treated as {self.memory_gib:g} GiB ({MEMORY_CAP_ENV}) of its {self.device_gib:.1f} GiB; {how}. "
                f"Not emulated: " + "; ".join(MEMORY_CAP_LIMITS))


def parse_memory_cap(text: str | None) -> float | None:
    """The size ``GRPO_LAB_DEVICE_MEMORY_GIB``'s text gives the device, GiB (None when unset or empty)."""
    text = (text or "").strip()
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
        where = "host memory" if kind == "cpu" else f"{kind} device 0"
        raise MemoryCapError(f"a device memory cap of {memory_gib:g} GiB is larger than the {where} it runs on "
                             f"({device_gib:.1f} GiB): a cap stands for a smaller device. Use at most "
                             f"{math.floor(device_gib * 10) / 10:g}, or unset {MEMORY_CAP_ENV}.")
    device_gib = float(memory_gib if device_gib is None else device_gib)
    return MemoryCap(min(float(memory_gib), device_gib), device_gib, kind)


def cap_caveats(cap: MemoryCap | None, sleep_mode: bool) -> list[str]:
    """What a run with ``sleep_mode`` under an enforced ``cap`` should be told before it starts."""
    if cap is None or not cap.enforced or not sleep_mode:
        return []
    return [f"{MEMORY_CAP_ENV}={cap.memory_gib:g} with vllm_enable_sleep_mode=True: the plan counts on sleep mode, "
            f"which the cap does not emulate ({SLEEP_MODE_UNDER_CAP}). Expect an out-of-memory error in the update "
            f"that a real {cap.memory_gib:g} GiB card would not have; to run under the cap, plan without sleep mode, "
            f"or stand in for the card by holding the rest of the device in another process instead of a cap."]
