"""The tool lesson (``grpo_lab.tool_use``) in one call, as its GPU benchmark runs it (:func:`run_lesson`), the record
that benchmark commits (:meth:`LessonRun.record`), and its reader (:func:`committed_tool_run`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_lab.device import Machine
from grpo_lab.env import installed_versions
from grpo_lab.evaluation import Gain, describe_change, wilson_interval
from grpo_lab.data import write_jsonl
from grpo_lab.tool_use import (
    PARTS,
    STAGES,
    PrimedModel,
    ToolLesson,
    ToolUseReport,
    evaluate_tool_use,
    grpo_learned,
    lesson_gains,
    part,
    prime,
)
from grpo_lab.tools import CALL_KINDS, calculator
from grpo_lab.experiment import TrainConfig
from grpo_lab.train import VERSIONS, TrainResult, train
from lab.committed import BENCHMARKS_DIR, Provenance, read_committed

RECORDED_TRAIN_FIELDS = ("model", "profile", "max_steps", "learning_rate", "temperature", "num_generations",
                         "per_device_train_batch_size", "beta", "rewards", "max_prompt_length", "max_completion_length",
                         "tools", "max_tool_calling_iterations", "use_vllm", "vllm_mode")
"""The GRPO run's TrainConfig fields a committed lesson record keeps (:meth:`LessonRun.record`)."""


def gain_record(gain: Gain) -> dict[str, Any]:
    """A :class:`~grpo_lab.evaluation.Gain` as the JSON a committed run keeps, with its paired counts."""
    return {"what": gain.what, "before": gain.before, "after": gain.after, "count": gain.count, "up": gain.up,
            "down": gain.down, "points": round(gain.points, 2), "standard_errors": round(gain.standard_errors, 2)}


@dataclass(frozen=True)
class RecordedGain:
    """A gain as a committed record holds it. Records written before the paired counts were kept hold only the shares
    (their normal-approximation error is zero at 0 % and 100 %, so it is not read back): those describe each share
    with its Wilson interval and weigh nothing."""

    what: str
    before: float
    after: float
    count: int
    up: int | None = None
    down: int | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RecordedGain:
        return cls(record["what"], record["before"], record["after"], record["count"], record.get("up"),
                   record.get("down"))

    @property
    def gain(self) -> Gain | None:
        """The gain with its paired counts, where the record kept them."""
        if self.up is None or self.down is None:
            return None
        return Gain(self.what, self.before, self.after, self.count, self.up, self.down)

    def describe(self) -> str:
        if self.gain is not None:
            return self.gain.describe()
        (b_low, b_high), (a_low, a_high) = (wilson_interval(self.before, self.count),
                                            wilson_interval(self.after, self.count))
        return (f"{describe_change(self.what, self.before, self.after)} over {self.count} problems (recorded without "
                f"its paired counts; 95 % intervals: before {b_low:.1%}..{b_high:.1%}, after {a_low:.1%}..{a_high:.1%})")


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
        metrics, gains = self.result.metrics, lesson_gains(self.reports)
        totals = {kind: sum(m.get(f"tools/{kind}", 0.0) for m in metrics) for kind in CALL_KINDS}
        return {"command": command, "date": datetime.now().isoformat(timespec="seconds"), "device": device_name,
                "model": Path(self.result.config.model).name, "versions": installed_versions(list(VERSIONS)),
                "settings": {"train": {k: v for k, v in self.result.config.to_dict().items()
                                       if k in RECORDED_TRAIN_FIELDS},
                             "priming": self.primed.config},
                "reports": {stage: report.to_dict() for stage, report in self.reports.items()},
                "parts": {stage: {name: part(report, name).to_dict() for name in PARTS}
                          for stage, report in self.reports.items()},
                "gains": {name: gain_record(gain) for name, gain in gains.items()},
                "grpo_learned": grpo_learned(gains),
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
    languages = TrainConfig(model=str(base_model)).with_profile(machine).train_languages
    problems = lesson.problems(languages)
    work_dir.mkdir(parents=True, exist_ok=True)
    train_file = write_jsonl(problems.train, work_dir / "train.jsonl")
    config = lesson.config(base_model, train_file, output_dir=str(work_dir / "grpo"),
                           **train_overrides).with_profile(machine)
    rows = problems.evaluation
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
    primed = prime(base_model, problems.train, work_dir / "primed", lesson.priming)
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
    gains: dict[str, RecordedGain]
    """``{name: RecordedGain}``, each over the same problems (``describe()`` says it in words)."""
    seconds: dict[str, Any]
    unseen: bool
    """Whether its evaluations asked problem types the run never trained on (records of the lesson before it held
    types out asked the types it trained on: their gains say nothing of problems it never saw)."""
    learned: bool | None
    """Whether GRPO beat priming on the unseen problems (``tool_use.grpo_learned``); None where not recorded."""


def committed_tool_run(path: str | Path = TOOLS_SMOLLM2_FILE) -> ToolRun:
    """The committed GPU run of the tool lesson on SmolLM2-135M (its benchmark's ``results.json``)."""
    data = read_committed(path)
    gains = {name: RecordedGain.from_record(g) for name, g in data["gains"].items()}
    return ToolRun(Provenance(data["command"], data["date"], data["device"], Path(path), data.get("commit", "")),
                   data["model"], data["reports"], gains, data["seconds"], "parts" in data, data.get("grpo_learned"))
