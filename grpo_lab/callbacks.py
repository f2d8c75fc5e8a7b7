"""The callbacks a GRPO run is watched with: metrics written to ``metrics.jsonl`` and drawn live (with the NaN guard),
a wall-time budget, a device-synchronised step clock, and a quiet progress bar. :mod:`grpo_lab.train` adds them to
every run it builds."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_lab import device, env, runs
from grpo_lab.errors import NAN_ADVICE, TrainingDivergedError
from grpo_lab.plots import plot_training_curves


class MetricsLogger(TrainerCallback):
    """Records TRL's per-step metrics to ``metrics.jsonl``, keeps them in ``records`` and draws the live plot: TRL's
    own plus ``step_time`` and its split (``timing/generation_s``, ``timing/reward_s``, ``timing/update_s``, and
    inside them ``timing/vllm_generate_s``, ``timing/weight_sync_s``, ``timing/old_ref_logps_s``, ...)."""

    def __init__(self, run_dir: Path, live_plot: bool = True, plot_every: int = 10,
                 previous: Sequence[dict[str, Any]] = ()):
        self.path = Path(run_dir) / runs.METRICS_FILE
        self.figure_path = Path(run_dir) / runs.CURVES_FILE
        self.live_plot = live_plot
        self.plot_every = max(1, plot_every)
        self.records: list[dict[str, Any]] = list(previous)  # a resumed run's log up to its checkpoint
        self._handle = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rewritten = self.path.with_name(self.path.name + ".tmp")  # then renamed: a kill never leaves half a log
        with rewritten.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in self.records)
        os.replace(rewritten, self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:  # the end-of-training summary has no reward
            return
        record = {"step": state.global_step, **{k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}}
        if "step_time" in record:
            other = record.get("timing/generation_s", 0.0) + record.get("timing/reward_s", 0.0)
            record["timing/update_s"] = max(0.0, record["step_time"] - other)
            record["timing/backward_optimizer_s"] = max(0.0, record["timing/update_s"]
                                                        - record.get("timing/old_ref_logps_s", 0.0))
        if "timing/vllm_generate_s" in record:  # what _generate spent outside the engine: log-probs, tokenizing
            record["timing/generation_other_s"] = max(0.0, record.get("timing/generation_s", 0.0)
                                                      - record["timing/vllm_generate_s"]
                                                      - record.get("timing/weight_sync_s", 0.0))
        self.records.append(record)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        # reward_errors="skip" that skipped every sample of a step logs a NaN reward: nothing diverged
        all_skipped = any(key.endswith("/skipped") and value > 0 for key, value in record.items())
        for key in ("loss", "reward") if not all_skipped else ("loss",):
            if key in record and not math.isfinite(record[key]):
                raise TrainingDivergedError(f"the {key} is {record[key]} at step {state.global_step}. {NAN_ADVICE}")
        if self.live_plot and len(self.records) % self.plot_every == 0:
            self.draw()

    def on_train_end(self, args, state, control, **kwargs):
        if self.records:
            self.draw(final=True)

    def draw(self, final: bool = False):
        """Redraw the curves: in place in a notebook, and to ``curves.png`` in the run folder (at the end, or at every
        redraw when no notebook shows them: writing the PNG costs about a second on a small CPU)."""
        figure = plot_training_curves(self.records)
        shown = self.live_plot and env.in_notebook()
        if final or (self.live_plot and not shown):
            figure.savefig(self.figure_path, dpi=100)
        if shown:
            from IPython.display import display

            if self._handle is None:
                self._handle = display(figure, display_id=True)
            else:
                self._handle.update(figure)
        return figure


class TimeBudget(TrainerCallback):
    """Stop training after ``minutes`` of wall time, with a checkpoint at that step (resume continues it)."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.start = None
        self.stopped_at: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.start is not None and time.perf_counter() - self.start > self.seconds \
                and state.global_step < state.max_steps:
            control.should_training_stop = control.should_save = True
            self.stopped_at = state.global_step
        return control


class StepClock(TrainerCallback):
    """Wall time of each optimizer step, device synchronised: generation, rewards, every micro-batch, the optimizer;
    ``keep_checkpoints=False`` keeps the Trainer from saving at the last step."""

    def __init__(self, kind: str, keep_checkpoints: bool = True):
        self.kind = kind
        self.keep_checkpoints = keep_checkpoints
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        device.synchronize(self.kind)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        device.synchronize(self.kind)
        self.seconds.append(time.perf_counter() - self._start)
        if not self.keep_checkpoints:
            control.should_save = False
        return control
