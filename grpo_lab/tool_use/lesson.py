"""The tool lesson: its settings for each profile, the evaluations it runs and the changes it reports."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_lab import runs
from grpo_lab.data import load_split
from grpo_lab.evaluation import Gain
from grpo_lab.experiment import TrainConfig, model_languages
from grpo_lab.tool_use.loop import ToolUseReport, paired_gain
from grpo_lab.tool_use.priming import PrimingConfig


@dataclass(frozen=True)
class ToolLesson:
    """The tool lesson on one profile: the priming, the GRPO run's fields beyond the profile's, and how many held-out
    problems (of the model's languages) each evaluation answers."""

    priming: PrimingConfig
    train: dict[str, Any]
    eval_size: int

    def config(self, model: str | Path, **overrides: Any) -> TrainConfig:
        """The GRPO run of the primed ``model`` with the calculator and this lesson's fields (``overrides`` win), in a
        new folder under the runs root's ``tools/``, apart from the course's own runs."""
        fields = {"output_dir": str(runs.workspace("tools") / f"grpo-{datetime.now():%Y%m%d-%H%M%S}"),
                  **self.train, **overrides}
        return TrainConfig(model=str(model), tools=("calculator",), **fields)


# GRPO steps past the one at which the lab's tool-lesson run called the tool in nearly every answer.
_ACCELERATOR_LESSON = ToolLesson(
    PrimingConfig(num_train_rows=600, num_train_epochs=2, per_device_train_batch_size=16, learning_rate=1e-4,
                  max_length=512, add_tool_tokens=False),
    dict(max_steps=24, max_tool_calling_iterations=2, rewards=("correctness",), reward_weights=(1.0,), save_steps=1000,
         live_plot=False), eval_size=200)
LESSONS: dict[str, ToolLesson] = {
    # CPU-sized: the priming teaches the tiny model the format; a short GRPO run at a safe learning rate shows the
    # mechanics.
    "tiny": ToolLesson(
        PrimingConfig(num_train_rows=300, num_train_epochs=2, per_device_train_batch_size=4, learning_rate=5e-4),
        dict(max_prompt_length=160, max_completion_length=96, num_generations=8, per_device_train_batch_size=16,
             max_steps=10, learning_rate=5e-5, temperature=0.7, max_tool_calling_iterations=2, save_steps=1000,
             live_plot=False),
        eval_size=80),
    "gpu": _ACCELERATOR_LESSON,
    "npu": _ACCELERATOR_LESSON,
}
"""The tool lesson by profile (``experiment.PROFILES`` names)."""


STAGES: dict[str, tuple[str, bool]] = {
    "base": ("base model", True),
    "base_without_tool": ("base model", False),
    "primed": ("primed", True),
    "trained": ("after GRPO", True),
    "trained_without_tool": ("after GRPO", False),
}
"""The lesson's evaluations: ``{stage: (label, tool offered)}``."""
GAINS: dict[str, tuple[str, str, str]] = {
    "tool-call share (base model → after GRPO)": ("base", "trained", "called"),
    "tool-call share (primed → after GRPO)": ("primed", "trained", "called"),
    "accuracy with the tool (base model → after GRPO)": ("base", "trained", "correct"),
    "accuracy with the tool (primed → after GRPO)": ("primed", "trained", "correct"),
    "accuracy after GRPO (without the tool → with it)": ("trained_without_tool", "trained", "correct"),
    "accuracy (the base model without the tool → after GRPO with it)": ("base_without_tool", "trained", "correct"),
}
"""The paired changes the lesson reports: ``{what: (stage before, stage after, per-problem measure)}``."""


def lesson_gains(reports: dict[str, ToolUseReport]) -> dict[str, Gain]:
    """Every change of :data:`GAINS` whose two stages were evaluated, paired over the same problems."""
    return {what: paired_gain(what, reports[old], reports[new], measure)
            for what, (old, new, measure) in GAINS.items() if old in reports and new in reports}


def model_rows(model: str | Path, split: str, size: int | None = None) -> list[dict[str, Any]]:
    """The first ``size`` rows of a shipped split in the languages the model's manifest names (all without one)."""
    languages = model_languages(str(model))
    return [row for row in load_split(split) if not languages or row["lang"] in languages][:size]
