"""Notebook 10's lesson: its settings for each profile, the whole lesson in one call (for the GPU benchmark), the
changes it reports, and the reader of its committed GPU run."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_lab import runs
from grpo_lab.committed import Provenance, read_committed
from grpo_lab.data import load_split
from grpo_lab.device import Machine
from grpo_lab.env import installed_versions
from grpo_lab.evaluation import Gain
from grpo_lab.experiment import TrainConfig, model_languages
from grpo_lab.paths import BENCHMARKS_DIR
from grpo_lab.tool_use.loop import ToolUseReport, evaluate_tool_use, paired_gain
from grpo_lab.tool_use.priming import PrimedModel, PrimingConfig, prime
from grpo_lab.tools import CALL_KINDS, calculator
from grpo_lab.train import VERSIONS, TrainResult, train


@dataclass(frozen=True)
class ToolLesson:
    """What notebook 10 runs on one profile: the priming, the GRPO run's TrainConfig fields beyond the profile's, and
    how many held-out problems (of the model's languages) each evaluation answers."""

    priming: PrimingConfig
    train: dict[str, Any]
    eval_size: int

    def config(self, model: str | Path, **overrides: Any) -> TrainConfig:
        """The GRPO run: the profile (``GRPO_LAB_PROFILE``, else the machine's), the primed ``model``, the
        calculator, and this lesson's fields (``overrides`` win). It goes to a new folder under the runs root's
        ``tools/``, apart from the course's own runs (notebooks 04, 05 and 09 use the newest of those)."""
        fields = {"output_dir": str(runs.workspace("tools") / f"grpo-{datetime.now():%Y%m%d-%H%M%S}"),
                  **self.train, **overrides}
        return TrainConfig(model=str(model), tools=("calculator",), **fields)


# 24 GRPO steps: in the committed 40-step SmolLM2 run (benchmarks/tools_smollm2) the rollouts' tool-call share passed
# 95 % at step 11 and the reward reached 1.0 at step 16; the 16 steps after that bought nothing but 23 s of the course.
_ACCELERATOR_LESSON = ToolLesson(
    PrimingConfig(num_train_rows=600, num_train_epochs=2, per_device_train_batch_size=16, learning_rate=1e-4,
                  max_length=512, add_tool_tokens=False),
    dict(max_steps=24, max_tool_calling_iterations=2, rewards=("correctness",), reward_weights=(1.0,), save_steps=1000,
         live_plot=False), eval_size=200)
LESSONS: dict[str, ToolLesson] = {
    # 2 CPU cores in CI, within notebook 10's 90 s: 150 priming steps teach the tiny model the format (its byte-level
    # vocabulary spells JSON out one character at a time); a GRPO run of 10 steps at the tiny profile's safe
    # learning rate (2e-4 and up collapsed it within 16 steps) shows the mechanics.
    "tiny": ToolLesson(
        PrimingConfig(num_train_rows=300, num_train_epochs=2, per_device_train_batch_size=4, learning_rate=5e-4),
        dict(max_prompt_length=160, max_completion_length=96, num_generations=8, per_device_train_batch_size=16,
             max_steps=10, learning_rate=5e-5, temperature=0.7, max_tool_calling_iterations=2, save_steps=1000,
             live_plot=False),
        eval_size=80),
    "gpu": _ACCELERATOR_LESSON,
    "npu": _ACCELERATOR_LESSON,
}
"""Notebook 10's lesson by profile (``experiment.PROFILES`` names)."""


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


RECORDED_TRAIN_FIELDS = ("model", "profile", "max_steps", "learning_rate", "temperature", "num_generations",
                         "per_device_train_batch_size", "beta", "rewards", "max_prompt_length", "max_completion_length",
                         "tools", "max_tool_calling_iterations", "use_vllm", "vllm_mode")
"""The GRPO run's TrainConfig fields a committed lesson record keeps (:meth:`LessonRun.record`)."""


def gain_record(gain: Gain) -> dict[str, Any]:
    """A :class:`~grpo_lab.evaluation.Gain` as the JSON a committed run keeps."""
    return {"what": gain.what, "before": gain.before, "after": gain.after, "count": gain.count,
            "points": round(gain.points, 2), "standard_error_points": round(gain.standard_error_points, 2),
            "standard_errors": round(gain.standard_errors, 2)}


def model_rows(model: str | Path, split: str, size: int | None = None) -> list[dict[str, Any]]:
    """The first ``size`` rows of a shipped split (``"train"``, ``"eval"``) in the languages the model's manifest
    says it reads (every row without one)."""
    languages = model_languages(str(model))
    return [row for row in load_split(split) if not languages or row["lang"] in languages][:size]


@dataclass
class LessonRun:
    """The whole lesson run once (:func:`run_lesson`): every evaluation, the priming, the GRPO run, the seconds of
    each part."""

    reports: dict[str, ToolUseReport]
    primed: PrimedModel
    result: TrainResult
    seconds: dict[str, float]

    def record(self, command: str, device_name: str) -> dict[str, Any]:
        """The run as the JSON its benchmark commits (:func:`committed_tool_run` reads it)."""
        metrics = self.result.metrics
        totals = {kind: sum(m.get(f"tools/{kind}", 0.0) for m in metrics) for kind in CALL_KINDS}
        return {"command": command, "date": datetime.now().isoformat(timespec="seconds"), "device": device_name,
                "model": Path(self.result.config.model).name, "versions": installed_versions(list(VERSIONS)),
                "settings": {"train": {k: v for k, v in self.result.config.to_dict().items()
                                       if k in RECORDED_TRAIN_FIELDS},
                             "priming": self.primed.config},
                "reports": {stage: report.to_dict() for stage, report in self.reports.items()},
                "gains": {name: gain_record(gain) for name, gain in lesson_gains(self.reports).items()},
                "train": {"steps": self.result.global_step, "backend": self.result.backend,
                          "call_frequency_first_5": self.result.mean("tools/call_frequency", first=5),
                          "call_frequency_last_5": self.result.mean("tools/call_frequency", last=5),
                          "reward_first_5": self.result.mean("reward", first=5),
                          "reward_last_5": self.result.mean("reward", last=5), "calls_by_kind": totals},
                "priming": {"steps": self.primed.steps, "train_loss": self.primed.train_loss,
                            "traces": self.primed.traces, "calling_traces": self.primed.calling_traces},
                "seconds": {name: round(value, 1) for name, value in self.seconds.items()}}


def run_lesson(base_model: str | Path, lesson: ToolLesson, machine: Machine, work_dir: str | Path,
               **train_overrides: Any) -> LessonRun:
    """Notebook 10 in one call, as its GPU benchmark runs it: evaluate the base model with and without the calculator,
    prime it, evaluate, train it with GRPO and the calculator, evaluate with and without (HF ``generate`` for every
    evaluation). ``train_overrides``: more TrainConfig fields for the GRPO run."""
    work_dir, seconds, started = Path(work_dir), {}, time.perf_counter()
    config = lesson.config(base_model, output_dir=str(work_dir / "grpo"), **train_overrides).with_profile(machine)
    rows = model_rows(base_model, "eval", lesson.eval_size)
    reports: dict[str, ToolUseReport] = {}

    def evaluate(stage: str, model: str | Path) -> None:
        label, offered = STAGES[stage]
        clock = time.perf_counter()
        reports[stage] = evaluate_tool_use(model, rows, [calculator] if offered else None, config.max_completion_length,
                                           config.max_tool_calling_iterations, label=label, backend="hf")
        seconds[f"evaluate {stage}"] = time.perf_counter() - clock
        print(reports[stage].summary(), flush=True)

    evaluate("base", base_model)
    evaluate("base_without_tool", base_model)
    primed = prime(base_model, model_rows(base_model, "train"), work_dir / "primed", lesson.priming)
    seconds["priming"] = primed.seconds
    evaluate("primed", primed.path)
    result = train(dataclasses.replace(config, model=str(primed.path)), machine=machine)
    seconds["grpo"] = result.seconds
    evaluate("trained", result.final_model_dir)
    evaluate("trained_without_tool", result.final_model_dir)
    seconds["total"] = time.perf_counter() - started
    return LessonRun(reports, primed, result, seconds)


TOOLS_SMOLLM2_FILE = BENCHMARKS_DIR / "tools_smollm2" / "results.json"


@dataclass(frozen=True)
class ToolRun:
    """A committed tool lesson (``benchmarks/tools_smollm2/run.py``): tool use and accuracy at each stage."""

    provenance: Provenance
    model: str
    reports: dict[str, dict[str, Any]]
    """``{stage: ToolUseReport.to_dict()}`` for ``base``, ``primed``, ``trained`` (tool offered) and
    ``trained_without_tool``."""
    gains: dict[str, Gain]
    """``{name: Gain}``, each paired over the same problems (``gain.describe()`` says it in words)."""
    seconds: dict[str, Any]


def committed_tool_run(path: str | Path = TOOLS_SMOLLM2_FILE) -> ToolRun:
    """The committed GPU run of the tool lesson on SmolLM2-135M (its benchmark's ``results.json``)."""
    data = read_committed(path)
    gains = {name: Gain(g["what"], g["before"], g["after"], g["count"], g["standard_error_points"])
             for name, g in data["gains"].items()}
    return ToolRun(Provenance(data["command"], data["date"], data["device"], Path(path)), data["model"],
                   data["reports"], gains, data["seconds"])
