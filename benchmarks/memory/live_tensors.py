"""Peak of live tensor bytes on any device, phase by phase — the CPU's stand-in for ``torch.cuda.max_memory_allocated``.

A ``TorchDispatchMode`` sees every tensor an operator returns; each new storage is counted until it is freed.
Tensors that exist before the context (weights, optimizer states) are registered with :meth:`LiveTensorBytes.track`.
``mark(name)`` closes a phase: it records the phase's peak and starts the next one from the current total.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Count live storage bytes; ``phases`` maps phase name → peak bytes."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[int, StorageWeakRef]] = {}
        self.current = 0
        self.peak = 0
        self.phases: dict[str, int] = {}

    def _add(self, tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._live:
            self._live[key] = (storage.nbytes(), StorageWeakRef(storage))
            self.current += storage.nbytes()

    def _sweep(self) -> None:
        dead = [key for key, (_, ref) in self._live.items() if ref.expired()]
        for key in dead:
            self.current -= self._live.pop(key)[0]

    def track(self, *objects) -> None:
        """Count tensors created before the context: modules (parameters, buffers), optimizers, tensors."""
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                for tensor in [*obj.parameters(), *obj.buffers()]:
                    self._add(tensor)
            elif isinstance(obj, torch.optim.Optimizer):
                for state in obj.state.values():
                    for value in state.values():
                        self._add(value)
            else:
                self._add(obj)
        self.peak = max(self.peak, self.current)

    def mark(self, phase: str) -> None:
        self._sweep()
        self.phases[phase] = self.peak
        self.peak = self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for tensor in tree_flatten(out)[0]:
            self._add(tensor)
        self.peak = max(self.peak, self.current)
        return out
