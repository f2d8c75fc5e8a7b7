"""Time per GRPO step with GRPOLabTrainer's one speed-up, ``sampling_logprobs`` (vLLM returns each sampled token's
log-prob; off only where nothing reads it, :func:`grpo_lab.upstream.trainer.reads_sampling_logprobs`), switched on
and off step by step in one trainer. Both modes alternate after warm-up steps, so they see the same machine load.

    PYTHONPATH=$PWD:$PWD/benchmarks OMP_NUM_THREADS=1 python benchmarks/trainer_switches/run.py --switch sampling_logprobs \\
        --steps 16 --set vllm_importance_sampling_correction=false [--profile tiny] [--set KEY=VALUE ...]

Prints min / median / max per mode of the step, the update (the step less generation and rewards), TRL's no-grad
forwards (``timing/old_ref_logps_s``) and Python's garbage-collection pauses, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from transformers import TrainerCallback

from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig, plan
from grpo_lab.train import StepClock, build_trainer
from grpo_lab.upstream.trainer import reads_sampling_logprobs
from lab.bench import HostCounters, ragged_model_dir
from lab.bench.cli import key_value
from lab.bench.workload import shaped_model_dir


def nothing_reads_sampling_logprobs(args) -> bool:
    """``sampling_logprobs`` may be off: nothing reads them (``--set vllm_importance_sampling_correction=false``)."""
    return not reads_sampling_logprobs(args)


SWITCHES = {"sampling_logprobs": nothing_reads_sampling_logprobs}
"""Each switch (a GRPOLabTrainer attribute) and the condition under which the trainer turns it off by itself."""


class Alternate(TrainerCallback):
    """Odd steps switch on, even steps off; remembers which step ran which."""

    def __init__(self, switch: str) -> None:
        self.switch, self.trainer = switch, None
        self.on: list[bool] = []

    def on_step_begin(self, args, state, control, **kwargs):
        setattr(self.trainer, self.switch, state.global_step % 2 == 1)
        self.on.append(getattr(self.trainer, self.switch))


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="sampling_logprobs")
    parser.add_argument("--steps", type=int, default=16, help="measured steps, half each mode")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--shape", help="random weights of this architecture (the bench's qwen2.5-0.5b, ...) "
                                        "instead of the profile's model")
    parser.add_argument("--ragged", action="store_true",
                        help="with --shape: completions end early, as in the bench's ragged workload "
                             "(lab.bench.ragged_model_dir), instead of all at max_completion_length")
    parser.add_argument("--set", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="a TrainConfig field (e.g. vllm_importance_sampling_correction=false)")
    args = parser.parse_args()
    machine = Machine.detect()
    with tempfile.TemporaryDirectory() as run_dir:
        fields = {"use_vllm": True, **dict(args.set)}  # vLLM colocate unless --set use_vllm=false
        if args.ragged and not args.shape:
            parser.error("--ragged needs --shape: a pretrained model ends its completions itself")
        if args.shape:
            model = shaped_model_dir(args.shape, f"{run_dir}/model", random_weights=True)
            if args.ragged:
                model, _ = ragged_model_dir(model, f"{run_dir}/ragged-model")
            fields["model"] = str(model)
        step = plan(TrainConfig(profile=args.profile, max_steps=args.warmup + args.steps, output_dir=f"{run_dir}/run",
                                save_steps=10**6, live_plot=False, **fields), machine)
        config = step.config
        clock, alternate = StepClock(machine.kind, keep_checkpoints=False), Alternate(args.switch)
        host = HostCounters(machine.kind)
        trainer = build_trainer(step, callbacks=[clock, alternate, host])
        alternate.trainer = trainer
        if not SWITCHES[args.switch](trainer.args):
            parser.error(f"{args.switch} cannot be switched off for this configuration "
                         f"({SWITCHES[args.switch].__name__} is False): nothing to compare")
        print(f"{config.step_summary()}; {trainer.backend_reason}")
        trainer.train()
        logged = {r["step"]: r for r in trainer.state.log_history if "step" in r and "reward" in r}
    rows = [(on, seconds, {**logged.get(i + 1, {}), "gc_pause_s": pause}) for i, (on, seconds, pause)
            in enumerate(zip(alternate.on, clock.seconds, host.steps["gc_pause_s"]))]
    medians = {}
    for on in (False, True):
        measured = [row for row in rows[args.warmup:] if row[0] == on]
        medians[on] = statistics.median(seconds for _, seconds, _ in measured)
        updates = [s - r.get("timing/generation_s", 0.0) - r.get("timing/reward_s", 0.0) for _, s, r in measured]
        print(f"{args.switch} {'on ' if on else 'off'}: {len(measured)} steps: step s min/median/max "
              f"{spread([s for _, s, _ in measured])}; update s {spread(updates)}; no-grad forwards s "
              f"{spread([r.get('timing/old_ref_logps_s', 0.0) for _, _, r in measured])}; garbage-collection "
              f"pauses s {spread([r['gc_pause_s'] for _, _, r in measured])}")
    print(f"median step, off / on: {medians[False] / medians[True]:.3f}x")


if __name__ == "__main__":
    main()
