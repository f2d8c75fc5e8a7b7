"""Test-only fault injection for ``tests/test_faults.py``: ``grpo-lab train`` whose trainer SIGKILLs its own process at
one point of one step.

``python tests/fault_injection.py POINT:STEP train [grpo-lab train options]`` kills at ``generation`` (inside step
STEP's HF ``generate``, at its first forward pass), ``update`` (step STEP's gradients computed, the optimizer step not yet
applied) or ``checkpoint`` (checkpoint-STEP's weights written, its optimizer state not yet). SIGKILL cannot be caught,
so nothing gets to clean up: what is on disk then is what a crash leaves. The production trainer has no such hooks;
this script installs a subclass in its place.
"""

from __future__ import annotations

import os
import signal
import sys

from grpo_lab import cli
from grpo_lab.upstream import trainer


class FaultInjectingTrainer(trainer.GRPOLabTrainer):
    """:class:`grpo_lab.upstream.trainer.GRPOLabTrainer` that kills its process at ``fault`` (``(point, step)``)."""

    fault: tuple[str, int] = ("", 0)

    def _kill_at(self, point: str, step: int) -> None:
        if (point, step) == self.fault:
            print(f"fault_injection: SIGKILL at {point} of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def _generate(self, prompts):
        step = self.state.global_step + 1
        hook = self.model.register_forward_hook(lambda *_: self._kill_at("generation", step))
        try:
            return super()._generate(prompts)
        finally:
            hook.remove()

    def training_step(self, model, inputs, num_items_in_batch):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._kill_at("update", self.state.global_step + 1)
        return loss

    def _save_optimizer_and_scheduler(self, output_dir):
        self._kill_at("checkpoint", self.state.global_step)
        super()._save_optimizer_and_scheduler(output_dir)


if __name__ == "__main__":
    point, step = sys.argv[1].split(":")
    FaultInjectingTrainer.fault = (point, int(step))
    trainer.GRPOLabTrainer = FaultInjectingTrainer  # grpo_lab.train builds the trainer it finds here
    raise SystemExit(cli.main(sys.argv[2:]))
