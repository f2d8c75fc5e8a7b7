"""The tool lesson: its settings for each profile, its problems, the evaluations it runs, the changes it reports and
the verdict on GRPO's own part."""

from __future__ import annotations

import warnings
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
from grpo_lab.tool_use.tasks import STATED_TYPE, LessonProblems, lesson_problems


@dataclass(frozen=True)
class ToolLesson:
    """The tool lesson on one profile: the priming, the GRPO run's fields beyond the profile's, how many unseen
    held-out problems each evaluation answers and the share of stated problems (no call needed) beside them."""

    priming: PrimingConfig
    train: dict[str, Any]
    eval_size: int
    stated_share: float = 0.2

    def problems(self, languages: tuple[str, ...] | None) -> LessonProblems:
        """The lesson's training and evaluation problems in ``languages`` (the profile's ``train_languages``)."""
        return lesson_problems(languages or (), self.eval_size, self.stated_share)

    def config(self, model: str | Path, dataset: str | Path | None = None, **overrides: Any) -> TrainConfig:
        """The GRPO run of the primed ``model`` with the calculator on ``dataset`` (the lesson's training problems
        written as JSON lines) and this lesson's fields (``overrides`` win), in a new folder under the runs root's
        ``tools/``, apart from the course's own runs."""
        fields = {"output_dir": str(runs.workspace("tools") / f"grpo-{datetime.now():%Y%m%d-%H%M%S}"),
                  **self.train, **overrides}
        return TrainConfig(model=str(model), tools=("calculator",), dataset=None if dataset is None else str(dataset),
                           **fields)


# Correctness, less a tenth for each call: a call pays where it makes the answer right, and costs where it cannot.
_REWARDS = dict(rewards=("correctness", "tool_call_cost"), reward_weights=(1.0, 1.0))
_ACCELERATOR_LESSON = ToolLesson(
    PrimingConfig(num_train_rows=600, num_train_epochs=2, per_device_train_batch_size=16, learning_rate=1e-4,
                  max_length=512, add_tool_tokens=False),
    dict(max_steps=24, max_tool_calling_iterations=2, save_steps=1000, live_plot=False, **_REWARDS), eval_size=200)
LESSONS: dict[str, ToolLesson] = {
    # CPU-sized: the priming teaches the tiny model the format; a short GRPO run at a safe learning rate shows the
    # mechanics.
    "tiny": ToolLesson(
        PrimingConfig(num_train_rows=300, num_train_epochs=2, per_device_train_batch_size=4, learning_rate=5e-4),
        dict(max_prompt_length=160, max_completion_length=96, num_generations=8, per_device_train_batch_size=16,
             max_steps=10, learning_rate=5e-5, temperature=0.7, max_tool_calling_iterations=2, save_steps=1000,
             live_plot=False, **_REWARDS),
        eval_size=64),
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
PARTS = ("unseen", "stated")
"""The parts of each evaluation: problems of types never trained on, and problems whose answer the question states."""
CHECKED = "accuracy with the tool on unseen problems (primed → after GRPO)"
"""GRPO's own part, the change the lesson's check weighs: priming alone makes the model call, so a gain from the
base model would pass without any GRPO."""
GAINS: dict[str, tuple[str, str, str, str]] = {
    CHECKED: ("primed", "trained", "correct", "unseen"),
    "tool-call share on unseen problems (primed → after GRPO)": ("primed", "trained", "called", "unseen"),
    "tool-call share where no call is needed (primed → after GRPO)": ("primed", "trained", "called", "stated"),
    "accuracy with the tool on unseen problems (base model → after GRPO)": ("base", "trained", "correct", "unseen"),
    "accuracy without the tool on unseen problems (base model → after GRPO)":
        ("base_without_tool", "trained_without_tool", "correct", "unseen"),
    "accuracy on unseen problems after GRPO (without the tool → with it)":
        ("trained_without_tool", "trained", "correct", "unseen"),
}
"""The paired changes the lesson reports: ``{what: (stage before, stage after, per-problem measure, part)}``."""


def part(report: ToolUseReport, name: str) -> ToolUseReport:
    """The problems of one of :data:`PARTS` in ``report``."""
    stated = name == "stated"
    return report.where(lambda conversation: (conversation.kind == STATED_TYPE) == stated, f"{report.label}, {name}")


def lesson_gains(reports: dict[str, ToolUseReport]) -> dict[str, Gain]:
    """Every change of :data:`GAINS` whose two stages were evaluated on problems of its part, paired over the same
    problems."""
    gains = {}
    for what, (old, new, measure, name) in GAINS.items():
        if old in reports and new in reports:
            before, after = part(reports[old], name), part(reports[new], name)
            if before.count:
                gains[what] = paired_gain(what, before, after, measure)
    return gains


def grpo_learned(gains: dict[str, Gain], standard_errors: float = 2.0) -> bool:
    """Whether GRPO beat priming: accuracy with the tool on the unseen problems rose by at least ``standard_errors``
    of its paired counts (a run that only primed, or one where GRPO made it worse, does not)."""
    checked = gains[CHECKED]
    return checked.up > checked.down and checked.standard_errors >= standard_errors


def model_rows(model: str | Path, split: str, size: int | None = None) -> list[dict[str, Any]]:
    """Deprecated: the lesson's problems are ``LESSONS[profile].problems(languages)``. The first ``size`` rows of a
    shipped split in the languages the model's manifest names (all without one), as before."""
    warnings.warn("tool_use.model_rows is deprecated: the lesson's problems are "
                  "tool_use.LESSONS[profile].problems(languages); a split's rows are data.load_split(split)",
                  DeprecationWarning, stacklevel=2)
    languages = model_languages(str(model))
    return [row for row in load_split(split) if not languages or row["lang"] in languages][:size]
