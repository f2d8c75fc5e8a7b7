"""verl's metrics as curves, validation scores and step timings, side by side with a TRL run, under the course's
metric names."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from grpo_lab.errors import DataError

TIMING_PREFIX = "timing_s/"
SCORE_KEY = "critic/score/mean"
"""The mean reward of a step's completions, before any KL term (verl's ``critic/`` keys exist without a critic)."""


def training_records(metrics: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of training steps (those with a score); step 0's validation-only record is left out."""
    return [m for m in metrics if m.get("step", 0) >= 1 and SCORE_KEY in m]


def reward_curve(metrics: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(step, mean reward)`` per training step."""
    return [(int(m["step"]), float(m[SCORE_KEY])) for m in training_records(metrics)]


def validation_scores(metrics: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> verl's validation metrics (``val-core/...``, ``val-aux/...``) logged then (0: before training)."""
    found = {}
    for m in metrics:
        values = {k: float(v) for k, v in m.items() if k.startswith(("val-core/", "val-aux/"))
                  and isinstance(v, (int, float))}
        if values:
            found[int(m["step"])] = values
    return found


def step_timings(metrics: Sequence[dict[str, Any]], skip_first: int = 2) -> dict[str, Any]:
    """verl's per-step timings (``timing_s/*``): per step, and each one's median after ``skip_first`` warm-up steps.

    ``update_like`` = step − gen − reward − save_checkpoint − testing − dump_rollout_generations: everything after
    the rollout that a TRL step's "update" also holds (old log-probs, advantages, the actor update, the weight sync
    into vLLM), so it compares with ``timing/update_s`` of a grpo_lab run.
    """
    rows = []
    for m in training_records(metrics):
        row: dict[str, Any] = {"step": int(m["step"])}
        for key, value in m.items():
            if key.startswith(TIMING_PREFIX) and isinstance(value, (int, float)):
                name = key[len(TIMING_PREFIX):]
                row["step_s" if name == "step" else name] = float(value)
        if "step_s" in row:
            outside = sum(row.get(k, 0.0) for k in ("gen", "reward", "save_checkpoint", "testing",
                                                     "dump_rollout_generations"))
            row["update_like"] = max(0.0, row["step_s"] - outside)
        rows.append(row)
    timed = rows[skip_first:] if len(rows) > skip_first else rows
    keys = sorted({k for r in timed for k in r if k != "step"})
    medians = {k: statistics.median(r[k] for r in timed if k in r) for k in keys}
    return {"per_step": rows, "median": medians, "steps_in_median": [r["step"] for r in timed],
            "skipped_warmup_steps": skip_first if len(rows) > skip_first else 0}


def validation_metric(validation: dict[int, dict[str, float]], name: str = "acc") -> dict[int, float]:
    """step -> one validation mean from :func:`validation_scores`: ``acc`` (verl's greedy accuracy) or a reward's
    name (its mean, e.g. ``format``); keys ``val-core|val-aux/<data source>/<name>/mean@1``."""
    return {step: value for step, scores in validation.items() for key, value in scores.items()
            if key.startswith(("val-core/", "val-aux/")) and key.endswith(f"/{name}/mean@1")}


STEP_PARTS = {"step": ("step_s", "step_time"), "generation": ("gen", "timing/generation_s"),
              "update": ("update_like", "timing/update_s"), "reward": ("reward", "timing/reward_s")}
"""A step's parts: verl's name (:func:`step_timings`) and a grpo_lab (TRL) run's metric name for each."""


def side_by_side(verl_metrics: Sequence[dict[str, Any]], trl_records: Sequence[dict[str, Any]],
                 skip_first: int = 2) -> dict[str, Any]:
    """Median seconds per step part of a verl run and a grpo_lab (TRL) run of the same experiment, over the steps
    both logged after ``skip_first`` warm-up steps. ``update`` is everything after the rollout in both."""
    timings = step_timings(verl_metrics, skip_first)
    verl_rows = {row["step"]: row for row in timings["per_step"]}
    trl_rows = {int(r["step"]): r for r in trl_records}
    steps = [step for step in timings["steps_in_median"] if step in trl_rows]
    if not steps:
        raise DataError("the two runs share no step after the warm-up steps; nothing to compare")

    def median(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
        return statistics.median(values) if values else None

    parts = {part: {"verl_s": median([verl_rows[s] for s in steps], verl_key),
                    "trl_s": median([trl_rows[s] for s in steps], trl_key)}
             for part, (verl_key, trl_key) in STEP_PARTS.items()}
    return {"steps": steps, "parts": parts}


def side_by_side_table(comparison: dict[str, Any]) -> str:
    """:func:`side_by_side` as a Markdown table (seconds, and verl's time as a multiple of TRL's)."""
    steps = comparison["steps"]
    lines = [f"| median of steps {steps[0]}–{steps[-1]} | verl | TRL colocate | verl ÷ TRL |", "|---|---|---|---|"]
    for part, value in comparison["parts"].items():
        verl, trl = value["verl_s"], value["trl_s"]
        cells = [f"{x:.2f} s" if x is not None else "not logged" for x in (verl, trl)]
        ratio = f"{verl / trl:.1f}×" if verl is not None and trl else "–"
        lines.append(f"| {part} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# verl's names, the course's names
# --------------------------------------------------------------------------------------------------
COURSE_METRIC_NAMES = {
    "critic/score/mean": "reward", "actor/entropy": "entropy", "actor/kl_loss": "kl",
    "response_length/mean": "completions/mean_length", "response_length/clip_ratio": "completions/clipped_ratio",
    "actor/pg_clipfrac": "clip_ratio/region_mean", "actor/pg_loss": "loss", "timing_s/gen": "timing/generation_s",
    "timing_s/reward": "timing/reward_s", "timing_s/step": "timing/step_s",
}
"""verl's metric -> the name a course run logs it under (``grpo_lab.runs.read_metrics``)."""


def as_course_records(metrics: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """verl's training records under the course's metric names, so :func:`grpo_lab.plots.plot_training_curves` draws
    a verl run as it draws a TRL one; ``timing/update_s`` is :func:`step_timings`' ``update_like``."""
    update = {row["step"]: row["update_like"] for row in step_timings(metrics, skip_first=0)["per_step"]
              if "update_like" in row}
    records = []
    for m in training_records(metrics):
        record: dict[str, Any] = {"step": int(m["step"])}
        record.update({ours: float(m[theirs]) for theirs, ours in COURSE_METRIC_NAMES.items() if theirs in m})
        if record["step"] in update:
            record["timing/update_s"] = update[record["step"]]
        records.append(record)
    return records
