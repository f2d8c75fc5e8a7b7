"""The device memory a process tree holds, sampled: the trainer, vLLM's engine process, a server it started."""

from __future__ import annotations

import threading
from typing import Any

import psutil

from grpo_lab import device
from grpo_lab.memory.shapes import GIB


class DeviceMemorySampler:
    """The peak device memory the driver counts for a process and its descendants, sampled every ``interval_s`` in a
    thread; ``peak_bytes`` stays None where the driver says nothing (CPU, NPU)."""

    def __init__(self, pid: int | None = None, kind: str | None = None, interval_s: float = 1.0) -> None:
        self.pid, self.kind, self.interval_s = pid, kind, interval_s
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int | None:
        """The tree's device memory now (bytes), and the peak updated."""
        try:
            root = psutil.Process(self.pid)
            pids = {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.Error:  # the process ended
            return None
        used = device.device_memory_of(pids, self.kind)
        if used is not None:
            self.peak_bytes = max(self.peak_bytes or 0, used)
        return used

    def start(self, pid: int | None = None) -> DeviceMemorySampler:
        self.pid = pid if pid is not None else self.pid
        if self.pid is None or not device.is_cuda(self.kind):
            return self
        self._thread = threading.Thread(target=self._run, name="device-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # nvidia-smi missing or slow: no number, never a failed run
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> int | None:
        """Stop sampling; the peak in bytes (None when nothing was counted)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.peak_bytes

    def __enter__(self) -> DeviceMemorySampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def gib(value: int | float | None) -> float | None:
    """Bytes as GiB, rounded to 3 places (None stays None)."""
    return None if value is None else round(value / GIB, 3)
