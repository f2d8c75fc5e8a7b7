"""Time per GRPO step (vLLM colocate) with vLLM's importance-sampling correction from TRL's separate no-grad forward
against the same correction from the loss's own forward (:func:`grpo_lab.trainer.defers_correction`): one trainer, the
two alternating step by step after warm-up steps, so both see the same machine load.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/deferred_correction/run.py --steps 16 [--profile tiny]

Prints min / median / max of the step time and of TRL's no-grad forward (``timing/old_ref_logps_s``) per mode, and
the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from transformers import TrainerCallback

from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig
from grpo_lab.train import StepClock, build_trainer

MODES = {False: "TRL (no-grad forward)", True: "from the loss forward"}


class Alternate(TrainerCallback):
    """Odd steps defer the correction, even steps run TRL's path; remembers which step ran which."""

    def __init__(self) -> None:
        self.trainer = None
        self.deferred: list[bool] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.deferred_correction = state.global_step % 2 == 1
        self.deferred.append(self.trainer.deferred_correction)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="measured steps, half each mode")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", default="tiny")
    args = parser.parse_args()
    machine = Machine.detect()
    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(profile=args.profile, use_vllm=True, max_steps=args.warmup + args.steps,
                             output_dir=run_dir, save_steps=10**6, live_plot=False).resolve(machine)
        clock, alternate = StepClock(machine.kind, keep_checkpoints=False), Alternate()
        trainer = build_trainer(config, callbacks=[clock, alternate])
        alternate.trainer = trainer
        print(f"{config.step_summary()}; {trainer.backend_reason}")
        trainer.train()
        no_grad = {r["step"]: r.get("timing/old_ref_logps_s", 0.0) for r in trainer.state.log_history if "step" in r
                   and "reward" in r}
    rows = list(zip(alternate.deferred, clock.seconds, [no_grad.get(i + 1, 0.0) for i in range(len(clock.seconds))]))
    measured = rows[args.warmup:]
    medians = {}
    for deferred, label in MODES.items():
        steps = [s for d, s, _ in measured if d == deferred]
        forwards = [f for d, _, f in measured if d == deferred]
        medians[deferred] = statistics.median(steps)
        print(f"{label:24s} {len(steps)} steps: step s min/median/max {spread(steps)}; no-grad forward s "
              f"{spread(forwards)}")
    print(f"median step, TRL / deferred: {medians[False] / medians[True]:.3f}x")


if __name__ == "__main__":
    main()
