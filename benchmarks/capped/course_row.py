"""The course run under a cap (``benchmarks/course_gpu/run.sh`` with ``COURSE_CAP_GIB``) as one capped row: every
notebook's status, seconds and peaks (``summary.json``: torch's peak in its kernel, its processes' device memory),
and notebook 03's run: its plan (``config.json``), step times and tokens per second (``metrics.jsonl``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from jobs import Row, row_id
from measure import base_record, write

from grpo_lab import runs

NOTEBOOK_03 = "03_grpo_training.ipynb"
WHOLE_COURSE = len(list((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb")))


def notebook_03_run(course: Path, summary: list[dict[str, Any]]) -> Path | None:
    """The run folder notebook 03 trained (its summary row names it: ``"trained grpo-gpu-..."``)."""
    row = next((r for r in summary if r["notebook"] == NOTEBOOK_03), None)
    trained = [use.split(" ", 1)[1] for use in (row or {}).get("runs", []) if use.startswith("trained ")]
    return course / trained[-1] if trained and (course / trained[-1]).is_dir() else None


def course_name(summary: list[dict[str, Any]]) -> str:
    """"the whole course", or the subset that ran ("notebooks 03-05"): a subset's row must not read as the whole."""
    numbers = [row["notebook"][:2] for row in summary]
    if len(numbers) >= WHOLE_COURSE:
        return "the whole course"
    return f"notebooks {numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else f"notebook {numbers[0]}"


def summary_of(course: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The course's ``summary.json``; for a run cut short (the machine went back before ``run.sh`` wrote it), the
    notebooks that finished, rebuilt from ``course.log`` ("running X ...", "ok in N s") and ``course_runs.jsonl``,
    without their peaks; and the notebooks that started and did not finish."""
    if (course / "summary.json").is_file():
        return json.loads((course / "summary.json").read_text()), []
    runs_file = course / "course_runs.jsonl"
    uses = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()] if runs_file.is_file() else []
    summary, started = [], None
    for line in (course / "course.log").read_text().splitlines():
        if line.startswith("running ") and line.endswith(" ..."):
            started = line.split()[1]
        elif started and (done := re.match(r"\s+(\w+) in (\d+) s", line)):
            summary.append({"notebook": started, "status": done.group(1), "seconds": float(done.group(2)),
                            "runs": [f"{u['how']} {u['run']}" for u in uses if u["notebook"] == started]})
            started = None
    return summary, [started] if started else []


def course_record(course: Path, cap_gib: float) -> dict[str, Any]:
    summary, unfinished = summary_of(course)
    meta = json.loads((course / "run.json").read_text()) if (course / "run.json").is_file() else {}
    record = base_record("course", Row(f"{course_name(summary)} under {cap_gib:g} GiB", "course", {}, 0), cap_gib,
                         Path(meta.get("model", "")).name)
    record["commit"], record["device"] = meta.get("commit", record["commit"]), meta.get("device", record["device"])
    record["notebooks"] = [{key: row.get(key) for key in ("notebook", "status", "seconds", "max_allocated_gib",
                                                          "device_used_gib")} for row in summary]
    failed = [row["notebook"] for row in summary if row["status"] != "ok"]
    record["error"] = f"not ok: {', '.join(failed)}" if failed else None
    peaks = [row.get("max_allocated_gib") for row in summary if row.get("max_allocated_gib") is not None]
    used = [row.get("device_used_gib") for row in summary if row.get("device_used_gib") is not None]
    record["measured"] = {"max_allocated_gib": max(peaks, default=None), "device_used_gib": max(used, default=None)}
    record["extra"] = {"notebook_seconds": round(sum(row["seconds"] for row in summary), 1)}
    if unfinished:
        record["extra"]["did_not_finish"] = unfinished  # cut short: the machine went back, not a failure
    run_dir = notebook_03_run(course, summary)
    if run_dir is None:
        return record
    trained = runs.Run(run_dir).record
    config, plan = trained["config"], trained.get("memory_plan", {})
    record["planned"] = {"per_device_train_batch_size": config["per_device_train_batch_size"],
                         "gradient_accumulation_steps": config["gradient_accumulation_steps"],
                         "vllm_gpu_memory_utilization": config["vllm_gpu_memory_utilization"],
                         "fits": plan.get("fits"), "training_peak_gib": plan.get("training_peak_gib"),
                         "gradient_checkpointing": config["gradient_checkpointing"]}
    metrics = runs.read_metrics(run_dir)
    record["step_seconds"] = [round(m["step_time"], 3) for m in metrics if "step_time" in m]
    record["steps"] = len(record["step_seconds"])
    batch = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    timed = [m for m in metrics[1:] if "step_time" in m and "completions/mean_length" in m]
    seconds = sum(m["step_time"] for m in timed)
    record["tokens_per_second"] = round(sum(m["completions/mean_length"] * batch for m in timed) / seconds, 1) \
        if seconds else None
    record["extra"]["notebook_03_run"] = run_dir.name
    record["extra"]["memory_cap"] = trained.get("memory_cap")
    return record


def write_course_row(course: Path, cap_gib: float, rows_dir: Path) -> Path:
    record = course_record(course, cap_gib)
    return write(record, rows_dir / f"{row_id('course', Row(record['name'], 'course', {}, 0))}.json")
