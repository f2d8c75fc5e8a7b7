"""Runs under a device memory cap, measured: the committed rows of ``benchmarks/capped/`` (one JSON file per row) read
back as :class:`CappedRow` records.

A row is one run under a cap (``GRPO_LAB_DEVICE_MEMORY_GIB``: a large card standing in for a smaller one): the cap,
the plan (micro-batch, vLLM's share of the capped device, the planner's training peak), what was measured (torch's
peak allocated and the driver's count of the run's own processes), step times, tokens per second, and where it ran
out of memory, if it did; the card, date and commit it ran on (:attr:`CappedRow.provenance`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lab.committed import BENCHMARKS_DIR, Provenance, read_committed

CAPPED_RESULTS_DIR = BENCHMARKS_DIR / "capped" / "results"
PLANNER_TARGET = 0.10
"""How far a plan may be from the measured peak: 10 %."""


@dataclass(frozen=True)
class OutOfMemory:
    """Where a run ran out of memory: the step (1-based) and the phase of the step (or the trainer's start)."""

    step: int | None
    phase: str
    message: str = ""


@dataclass(frozen=True)
class NotebookPeak:
    """One course notebook under a cap: its status, seconds, torch's peak in its kernel and its processes' device
    memory (the driver's count, sampled)."""

    notebook: str
    status: str
    seconds: float
    max_allocated_gib: float | None = None
    device_used_gib: float | None = None


ACCURACY_KEYS = {"greedy_accuracy": " on the trainer's engine", "greedy_accuracy_hf": " on HF generate"}
"""A capped row's held-out accuracy before and after its run (``extra``), and where it was measured."""


@dataclass(frozen=True)
class CappedRow:
    """One committed run under a device memory cap (a file of ``benchmarks/capped/results/``)."""

    job: str
    name: str
    cap_gib: float
    model: str
    recipe: str
    planned: dict[str, Any] = field(default_factory=dict)
    """``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``vllm_gpu_memory_utilization`` (a share of
    the cap), ``device_share`` (of the real device), ``fits``, ``training_peak_gib``."""
    measured: dict[str, Any] = field(default_factory=dict)
    """``training_peak_gib`` (torch's peak during the steps less what vLLM holds), ``max_allocated_gib``,
    ``device_used_gib`` (the driver's count of this run's processes)."""
    steps: int = 0
    step_seconds: tuple[float, ...] = ()
    tokens_per_second: float | None = None
    oom: OutOfMemory | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Job-specific facts: the held-out accuracy of a QLoRA run, what serving answered, notebook 03's total."""
    notebooks: tuple[NotebookPeak, ...] = ()
    date: str = ""
    commit: str = ""
    device: str = ""
    path: Path | None = None
    """The committed file (None for a row built in memory)."""

    @classmethod
    def from_dict(cls, values: dict[str, Any], path: Path | None = None) -> CappedRow:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values["oom"] = OutOfMemory(**values["oom"]) if values.get("oom") else None
        values["notebooks"] = tuple(NotebookPeak(**row) for row in values.get("notebooks", ()))
        values["step_seconds"] = tuple(values.get("step_seconds", ()))
        return cls(**values, path=path)

    @property
    def provenance(self) -> Provenance:
        """The card (the driver's name, without its memory and driver version), date and commit the row records."""
        return Provenance("", self.date, self.device.split(", ")[0], self.path or Path(self.name), self.commit)

    @property
    def median_step_seconds(self) -> float | None:
        """The median step after the first (which compiles and warms up)."""
        timed = self.step_seconds[1:] or self.step_seconds
        return statistics.median(timed) if timed else None

    @property
    def planner_error(self) -> float | None:
        """(planned − measured) / measured of the training peak; None where either is missing."""
        planned, measured = self.planned.get("training_peak_gib"), self.measured.get("training_peak_gib")
        return None if not planned or not measured else (planned - measured) / measured

    @property
    def within_target(self) -> bool | None:
        return None if self.planner_error is None else abs(self.planner_error) <= PLANNER_TARGET

    @property
    def outcome(self) -> str:
        """How the row ended: out of memory (its step and phase), failed, served (how, what it answered), or steps."""
        if self.oom:
            return f"OOM at step {self.oom.step} ({self.oom.phase})"
        if self.error:
            return f"failed: {self.error}"
        served = {how: reply for how, reply in self.extra.get("served", {}).items() if isinstance(reply, dict)}
        if served:
            return "served " + "; ".join(
                f"{how} (failed: {reply['error']})" if "error" in reply else
                f"{how} (started in {reply['start_seconds']:.0f} s, {round(reply['accuracy'] * reply['problems'])} "
                f"of {reply['problems']} held-out problems right)" for how, reply in served.items())
        if not self.steps and self.notebooks:  # a course row of notebooks that train nothing (04, 05)
            return ", ".join(f"{nb.notebook.split('_')[0]} {nb.status} in {nb.seconds:.0f} s" for nb in self.notebooks)
        return f"{self.steps} steps"

    def line(self) -> str:
        """One line: the row, its plan against what it measured, its speed."""
        planned, measured = self.planned.get("training_peak_gib"), self.measured.get("training_peak_gib")
        peaks = (f"; training peak planned {planned:.2f} GiB, measured {measured:.2f} GiB ({self.planner_error:+.1%})"
                 if self.planner_error is not None else f"; training peak planned {planned:.2f} GiB" if planned else "")
        speed = (f", {self.median_step_seconds:.2f} s/step" if self.median_step_seconds else "") + (
            f", {self.tokens_per_second:,.0f} tok/s" if self.tokens_per_second else "")
        share, used = self.planned.get("vllm_gpu_memory_utilization"), self.measured.get("device_used_gib")
        return (f"{self.cap_gib:g} GiB · {self.name}: " + (f"vLLM {share} of the cap, " if share else "")
                + f"{self.outcome}{peaks}" + (f"; device used {used} GiB" if used is not None else "") + speed
                + "".join(f"; greedy accuracy{where} {gain['before']:.1%} → {gain['after']:.1%} "
                          f"({gain['standard_errors']:+.1f} standard errors)"
                          for key, where in ACCURACY_KEYS.items() if (gain := self.extra.get(key))))


def capped_rows(results_dir: str | Path = CAPPED_RESULTS_DIR, job: str | None = None) -> list[CappedRow]:
    """The committed rows (every ``*.json`` of ``results_dir``, ordered by job, cap and name), of one ``job`` when
    given; none before any run is committed."""
    rows = [CappedRow.from_dict(read_committed(path), path) for path in sorted(Path(results_dir).glob("*.json"))]
    rows = [row for row in rows if job is None or row.job == job]
    return sorted(rows, key=lambda row: (row.job, row.cap_gib, row.name))


def speed_table(rows: list[CappedRow]) -> list[dict[str, Any]]:
    """Per cap and row with timed steps: the step's median seconds, tokens per second and, for the course, notebook
    03's seconds: what a learner's device of that size gets (at the speed of the card each row ran on)."""
    table = []
    for row in rows:
        if row.median_step_seconds is None and not row.notebooks:
            continue
        notebook_03 = next((nb.seconds for nb in row.notebooks if nb.notebook.startswith("03_")), None)
        table.append({"cap (GiB)": row.cap_gib, "run": row.name, "s per step": row.median_step_seconds,
                      "tokens/s": row.tokens_per_second, "notebook 03 (s)": notebook_03})
    return table


def expectation(memory_gib: float, rows: list[CappedRow] | None = None) -> str:
    """What the course's recipe takes on a device of ``memory_gib``, from the committed course run under the largest
    cap that is not larger and that timed steps where one did (its step time and notebook 03's seconds); says so when
    none is committed."""
    rows = capped_rows(job="course") if rows is None else [row for row in rows if row.job == "course"]
    fitting = [row for row in rows if row.cap_gib <= memory_gib and not row.error]
    if not fitting:
        return (f"no course run under a cap of at most {memory_gib:.0f} GiB is committed yet "
                f"(benchmarks/capped/README.md says how to make one)")
    timed = [row for row in fitting if row.median_step_seconds]  # a row of notebooks 04-05 alone times no step
    row = max(timed or fitting, key=lambda r: r.cap_gib)
    notebook_03 = next((nb.seconds for nb in row.notebooks if nb.notebook.startswith("03_")), None)
    step = f"about {row.median_step_seconds:.1f} s per step" if row.median_step_seconds else "an unrecorded step time"
    total = f", notebook 03 about {notebook_03 / 60:.0f} minutes in all" if notebook_03 else ""
    return (f"on your {memory_gib:.0f} GiB device this recipe takes {step}{total}: measured with the device capped at "
            f"{row.cap_gib:g} GiB ({row.provenance.line()}), a card whose bandwidth and compute a smaller one does "
            f"not have")
