"""Runs are first-class: where they live, what a run folder holds, finding one, and its checkpoints.

Every run and every notebook output lives under one root, ``$GRPO_LAB_RUN_DIR`` (``make course`` points it at
``runs/course``), else ``runs/`` in the repository. A training run is a folder ``grpo-<profile>-<time>``::

    config.json       the resolved experiment, the rollout backend, the memory plan, versions
    metrics.jsonl     one record per logged step
    curves.png        the training curves
    checkpoints/      checkpoint-N (safetensors, optimizer, scheduler, state), written under .partial/ first
    final/            the trained model with a manifest of checksums: what deployment serves (a LoRA run:
                      the adapter merged into plain weights)
    adapter/          a LoRA run (use_peft=True) only: PEFT's adapter folder, for serving it on the base model

:func:`find_run` finds one (``"latest"``, by name, by profile); :func:`workspace` is a notebook's own output folder.
"""

from __future__ import annotations

__all__ = ["FINAL", "Run", "find_run", "latest_run", "list_checkpoints", "record_use", "root", "workspace"]

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from grpo_lab.errors import ExistingFileError, GrpoLabError
from grpo_lab.paths import REPO_ROOT

RUN_DIR_ENV = "GRPO_LAB_RUN_DIR"
NOTEBOOK_ENV = "GRPO_LAB_NOTEBOOK"
"""Set by ``grpo_lab.course`` for each notebook it runs, so the runs a notebook trains or uses are recorded."""
USES_FILE = "course_runs.jsonl"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
CHECKPOINTS = "checkpoints"
FINAL = "final"
"""The folder of a run that holds its final model."""
ADAPTER = "adapter"
EVALUATION_FILE = "evaluation.json"
"""A run's final model evaluated on held-out problems (``grpo-lab train --evaluate N``; ``Evaluation.load``)."""
SEEDS = "seeds"
"""The folder of a run that holds the same run trained again with other seeds (``TrainResult.train_again``)."""
PARTIAL = ".partial"  # folder of a run where checkpoints and ``final/`` are written before they are renamed into place
CHECKPOINT_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


class RunNotFoundError(GrpoLabError, FileNotFoundError):
    """No run matches; the message lists what exists."""


class CheckpointError(GrpoLabError, FileNotFoundError):
    """A checkpoint to resume from is missing or incomplete."""


def root() -> Path:
    """The runs root: ``$GRPO_LAB_RUN_DIR``, else ``runs/`` in the repository."""
    return Path(os.environ.get(RUN_DIR_ENV) or REPO_ROOT / "runs")


def workspace(name: str) -> Path:
    """A notebook's or tool's output folder, ``<root>/<name>`` (created)."""
    path = root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(profile: str, now: datetime) -> Path:
    """A fresh run folder name ``<root>/grpo-<profile>-<YYYYmmdd-HHMMSS>`` (not created; ``-2``… if taken)."""
    base = root() / f"grpo-{profile}-{now:%Y%m%d-%H%M%S}"
    path, number = base, 1
    while path.exists():
        number += 1
        path = base.with_name(f"{base.name}-{number}")
    return path


@dataclass(frozen=True)
class RunRecord:
    """A run's ``config.json`` as a record: the experiment it ran and how, when and with what."""

    config: dict[str, Any]  # the resolved experiment (``TrainConfig`` fields)
    created: str
    backend: str
    device: str
    versions: dict[str, str]
    resumed_from: str | None


@dataclass(frozen=True)
class Run:
    """A training run folder and what it holds."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def record(self) -> dict[str, Any]:
        """``config.json``: the experiment (``["config"]``), backend, memory plan, versions."""
        return json.loads((self.path / CONFIG_FILE).read_text(encoding="utf-8"))

    @property
    def recorded(self) -> RunRecord:
        record = self.record
        config = record.get("config", {})
        return RunRecord(config=config, created=str(record.get("created", "")), backend=str(record.get("backend", "")),
                         device=str(config.get("device", "")), versions=dict(record.get("versions", {})),
                         resumed_from=record.get("resumed_from"))

    @property
    def profile(self) -> str | None:
        return self.record.get("config", {}).get("profile")

    @property
    def final_dir(self) -> Path | None:
        """The trained model (``final/``), or None while the run has not finished."""
        final = self.path / FINAL
        return final if final.is_dir() else None

    @property
    def adapter_dir(self) -> Path | None:
        """A LoRA run's adapter (``adapter/``), or None (full fine-tuning, or not finished)."""
        adapter = self.path / ADAPTER
        return adapter if adapter.is_dir() else None

    @property
    def global_step(self) -> int | None:
        """The step ``final/`` was saved at (from its manifest), else None."""
        if self.final_dir is None or not (self.final_dir / "manifest.json").is_file():
            return None
        return json.loads((self.final_dir / "manifest.json").read_text(encoding="utf-8")).get("global_step")

    def describe(self) -> str:
        step = self.global_step
        state = f"finished at step {step}" if step is not None else "not finished (no final/)"
        lora = ", LoRA" if self.record.get("config", {}).get("use_peft") else ""
        return f"run {self.name} ({self.profile} profile{lora}), {state}: {self.path}"


def is_run(path: Path) -> bool:
    """A training run folder: it has the ``config.json`` that ``grpo_lab.train`` writes first."""
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def _started(run: Run) -> str:
    try:
        return str(run.record.get("created", ""))
    except (OSError, json.JSONDecodeError):
        return ""


def list_runs(profile: str | None = None, finished: bool = False) -> list[Run]:
    """Training runs under the root, oldest first; only ``profile``'s, only finished ones if asked."""
    folder = root()
    found = [Run(p) for p in sorted(folder.iterdir()) if is_run(p)] if folder.is_dir() else []
    found = [r for r in found if (profile is None or r.profile == profile) and (not finished or r.final_dir)]
    return sorted(found, key=lambda r: (_started(r), r.name))


def latest_run(profile: str | None = None, finished: bool = True) -> Run | None:
    """The newest (finished, by default) run, or None when there is none."""
    found = list_runs(profile, finished)
    return found[-1] if found else None


def find_run(which: str | Path = "latest", profile: str | None = None, finished: bool = True) -> Run:
    """A run by ``"latest"`` (of ``profile``), by folder name under the root, or by path."""
    if str(which) == "latest":
        run = latest_run(profile, finished)
        if run is None:
            existing = ", ".join(r.name for r in list_runs()) or "none"
            what = f"finished {profile + ' ' if profile else ''}run" if finished else "run"
            raise RunNotFoundError(f"no {what} under {root()} (runs there: {existing}). Train one first "
                                   f"(`grpo-lab train`), or point {RUN_DIR_ENV} at where yours are.")
        return run
    path = Path(which)
    path = path if path.is_dir() else root() / str(which)
    if not is_run(path):
        existing = ", ".join(r.name for r in list_runs()) or "none"
        raise RunNotFoundError(f"{which} is not a run folder (no {CONFIG_FILE}); runs under {root()}: {existing}")
    return Run(path)


def record_use(run: Run | Path, how: str) -> None:
    """Note in ``<root>/course_runs.jsonl`` that the notebook running now ``how``-ed this run."""
    notebook = os.environ.get(NOTEBOOK_ENV)
    if not notebook:
        return
    path = run.path if isinstance(run, Run) else Path(run)
    with (root() / USES_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"notebook": notebook, "run": path.name, "how": how}) + "\n")


def recorded_uses(folder: Path | None = None) -> list[dict[str, str]]:
    """What :func:`record_use` wrote under ``folder`` (default the root)."""
    path = (folder or root()) / USES_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The per-step records of a run's ``metrics.jsonl`` (or of the run folder holding it); a last line cut short by
    a kill is left out (a resumed run logs that step again)."""
    path = Path(path)
    path = path / METRICS_FILE if path.is_dir() else path
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise
    return records


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """``checkpoint-N`` folders of a run, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def check_checkpoint(path: str | Path) -> Path:
    """Raise :class:`CheckpointError` unless ``path`` is a complete checkpoint (weights, optimizer, state)."""
    path = Path(path)
    if path.parent.name == PARTIAL:
        raise CheckpointError(
            f"{path} is a save that was interrupted: checkpoints are written under {PARTIAL}/ and renamed into "
            f"{CHECKPOINTS}/ only once complete, so it is never loaded. Resume with resume_from_checkpoint=True "
            f"(the newest complete checkpoint in {CHECKPOINTS}/).")
    if not path.is_dir():
        siblings = list_checkpoints(path.parent.parent) if path.parent.name == CHECKPOINTS else []
        hint = (f"available: {', '.join(p.name for p in siblings)}" if siblings
                else "no checkpoints there; start a fresh run (resume_from_checkpoint=None)")
        raise CheckpointError(f"no checkpoint at {path} ({hint}).")
    missing = [name for name in CHECKPOINT_FILES if not (path / name).is_file()]
    if not any(path.glob("model*.safetensors")) and not (path / "adapter_model.safetensors").is_file():
        missing.append("model.safetensors (or a LoRA run's adapter_model.safetensors)")
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete (missing {', '.join(missing)}); it was probably interrupted while "
            f"saving. Delete that folder and resume from the previous checkpoint, or start a fresh run.")
    return path


def resolve_resume(run_dir: Path, resume: str | bool | None) -> Path | None:
    """The checkpoint to resume from (None for a fresh run), checked for completeness."""
    if resume in (None, False, ""):
        return None
    if resume is True or str(resume).lower() in ("true", "latest"):
        found = list_checkpoints(run_dir)
        if not found:
            interrupted = sorted(p.name for p in (Path(run_dir) / PARTIAL).glob("checkpoint-*"))
            note = f" (only {PARTIAL}/{interrupted[0]}, a save that was interrupted)" if interrupted else ""
            raise CheckpointError(f"resume_from_checkpoint=True but {run_dir / CHECKPOINTS} holds no checkpoint"
                                  f"{note}: nothing was saved before it stopped, so there is nothing to resume; start "
                                  f"a fresh run in a new output_dir (or delete {run_dir} first), or pass a checkpoint "
                                  f"path.")
        return check_checkpoint(found[-1])
    return check_checkpoint(resume)


def publish_folder(staged: Path, target: Path) -> Path:
    """Move a completely written folder to ``target`` with a rename, so ``target`` is absent or complete; an existing
    ``target`` (a resumed run saving that step again) is renamed aside, then deleted; an emptied ``.partial/`` goes."""
    staged, target = Path(staged), Path(target)
    if target.exists():
        aside = staged.parent / f"replaced-{target.name}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(target, aside)
        os.rename(staged, target)
        shutil.rmtree(aside)
    else:
        os.rename(staged, target)
    with contextlib.suppress(OSError):  # not empty: another save is staged there
        staged.parent.rmdir()
    return target


def discard_interrupted_saves(run_dir: Path) -> None:
    """Delete ``<run>/.partial/`` (saves that never completed), saying so; nothing there is ever loaded."""
    folder = Path(run_dir) / PARTIAL
    if folder.is_dir():
        names = sorted(p.name for p in folder.iterdir())
        if names:
            print(f"Deleting {folder} ({', '.join(names)}): a save interrupted when the run stopped; never loaded.")
        shutil.rmtree(folder)


@dataclass(frozen=True)
class OpenedRun:
    """A run folder ready to train into (:func:`open_run`)."""

    path: Path
    resume: Path | None  # the checkpoint training continues from (None: a fresh run)
    resume_step: int | None
    metrics: list[dict[str, Any]]  # the log up to that checkpoint (the steps after it are trained again)


def open_run(output_dir: str | Path | None, resume_from_checkpoint: str | bool | None = None,
             profile: str = "run") -> OpenedRun:
    """Open the folder a training run writes (a new ``grpo-<profile>-<time>`` one when ``output_dir`` is None): the
    checkpoint to resume from checked, a folder holding a run refused unless it resumes, interrupted saves discarded."""
    run_dir = Path(output_dir) if output_dir is not None else new_run_dir(profile, datetime.now())
    resume = resolve_resume(run_dir, resume_from_checkpoint)
    if resume is None and (run_dir / CONFIG_FILE).exists():
        raise ExistingFileError(f"{run_dir} already holds a run. Continue it with resume_from_checkpoint=True, or "
                                f"choose another output_dir (nothing was changed).")
    run_dir.mkdir(parents=True, exist_ok=True)
    discard_interrupted_saves(run_dir)
    step = int(json.loads((resume / "trainer_state.json").read_text())["global_step"]) if resume else None
    metrics = [r for r in read_metrics(run_dir / METRICS_FILE) if r.get("step", 0) <= step] if resume else []
    record_use(run_dir, "trained")
    return OpenedRun(run_dir, resume, step, metrics)

