"""A verl run's files read back (rollout dumps, metrics), and its rewards and GRPO advantages recomputed the course's
way (:func:`reward_parity`, :func:`advantage_parity`)."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import struct
import zipfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from grpo_lab.advantages import VERL_EPSILON, group_advantages
from grpo_lab.rewards import RewardSet

ADVANTAGE_RANGE_KEYS = ("critic/advantages/max", "critic/advantages/min")


def read_rollouts(folder: str | Path) -> dict[int, list[dict[str, Any]]]:
    """The rollout dumps of ``trainer.rollout_data_dir``: step -> that step's completions, in file order."""
    folder = Path(folder)
    steps = {}
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit()
                                                                else 0, p.name)):
        if not path.stem.isdigit():
            continue
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        steps[int(path.stem)] = [json.loads(line) for line in lines]
    return steps


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """verl's file-logger JSONL as flat records ``{"step": N, key: value, ...}`` (several lines of one step merged;
    a last line cut short by a killed run is left out)."""
    merged: dict[int, dict[str, Any]] = {}
    path = Path(path)
    if not path.is_file():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = int(entry.get("step", 0))
        merged.setdefault(step, {"step": step}).update(entry.get("data", {}))
    return [merged[step] for step in sorted(merged)]


def group_key(record: dict[str, Any]) -> str | None:
    """The GRPO group of a dumped completion: the prompt uid in front of ``_{session}_{index}`` (V1 trainer)."""
    uid = record.get("uid")
    if not uid:
        return None
    parts = str(uid).rsplit("_", 2)
    return parts[0] if len(parts) == 3 else str(uid)


def group_records(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Completions grouped by prompt, in order of first appearance: by uid where the dump has one, else by runs of
    the same ``input`` (the legacy trainer dumps no uid; it keeps a prompt's completions together)."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    previous, run = object(), -1
    for record in records:
        key = group_key(record)
        if key is None:  # legacy dump: a new group where the prompt text changes
            if record.get("input") != previous:
                run += 1
                previous = record.get("input")
            key = ("input-run", run)
        groups.setdefault(key, []).append(record)
    return list(groups.values())


# --------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------
def as_float32(value: float) -> float:
    """``value`` rounded to float32, as verl stores a reward (its ``rm_scores`` tensor is float32)."""
    return struct.unpack("f", struct.pack("f", value))[0]


@dataclass
class RewardParity:
    """verl's logged ``score`` vs grpo_lab's reward on the same completions."""

    completions: int
    steps: list[int]
    max_abs_diff: float
    """max |verl score − grpo_lab total rounded to float32| (verl keeps rewards in a float32 tensor)."""
    max_abs_diff_float64: float
    """The same without the rounding (differs from ``max_abs_diff`` only for totals that float32 cannot hold)."""
    unscorable: int
    """Completions where no reward applied: grpo_lab says None (TRL leaves them out), the export scores 0.0."""
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    """The first few completions whose scores differ (step, uid, output, gts, verl, grpo_lab)."""

    @property
    def equal(self) -> bool:
        return self.completions > 0 and self.max_abs_diff == 0.0


def reward_parity(records: Sequence[dict[str, Any]], reward_set: RewardSet, keep: int = 5) -> RewardParity:
    """Re-score every dumped completion with ``reward_set`` (grpo_lab's rewards, the export's names and weights)
    and compare with the score verl logged for it.

    The ground truth goes in as the ``answer`` column and the prompt text as the prompt, as the export's
    ``compute_score`` passes them; a completion no reward applies to counts as 0.0, as the export scores it.
    """
    if not records:
        return RewardParity(0, [], math.nan, math.nan, 0)
    table = reward_set.score([r.get("input", "") for r in records], [r["output"] for r in records],
                             answer=[r["gts"] for r in records])
    worst = worst64 = 0.0
    mismatches = []
    unscorable = 0
    for record, total in zip(records, table.totals):
        unscorable += total is None
        ours = 0.0 if total is None else float(total)
        logged = float(record["score"])
        diff, diff64 = abs(logged - as_float32(ours)), abs(logged - ours)
        worst, worst64 = max(worst, diff), max(worst64, diff64)
        if diff and len(mismatches) < keep:
            mismatches.append({"step": record.get("step"), "uid": record.get("uid"), "output": record["output"],
                               "gts": record["gts"], "verl": logged, "grpo_lab": ours})
    steps = sorted({int(r["step"]) for r in records if r.get("step") is not None})
    return RewardParity(len(records), steps, worst, worst64, unscorable, mismatches)


# --------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------
@dataclass
class AdvantageParity:
    """One logged batch's GRPO advantages: grpo_lab's, verl's function's, and the range verl logged."""

    step: int | None
    completions: int
    group_sizes: list[int]
    epsilon: float
    norm_by_std: bool
    advantages: list[float]
    """grpo_lab's advantages (``group_advantages(..., epsilon)`` per group), in the dump's order."""
    max_abs_diff_vs_verl_function: float | None = None
    """max |grpo_lab − verl's ``compute_grpo_outcome_advantage``| on the same scores and groups (None: not given)."""
    logged_range: dict[str, float] = field(default_factory=dict)
    """verl's logged ``critic/advantages/max`` and ``/min`` for the step (over response tokens)."""
    max_abs_diff_vs_logged_range: float | None = None
    max_abs_diff_course_epsilon: float | None = None
    """The same grpo_lab computation with TRL's epsilon 1e-4 instead: the documented, expected difference."""

    def agrees(self, atol: float = 1e-5) -> bool:
        """True when every available comparison is within ``atol`` (float32 rounding of a different summation)."""
        checks = [d for d in (self.max_abs_diff_vs_verl_function, self.max_abs_diff_vs_logged_range) if d is not None]
        return bool(checks) and all(d <= atol for d in checks)


def _per_group(groups: Sequence[Sequence[float]], epsilon: float, norm_by_std: bool) -> list[float]:
    scale = "group" if norm_by_std else "none"
    return [a for scores in groups for a in group_advantages(list(scores), scale_rewards=scale,
                                                             epsilon=epsilon).advantages]


def advantage_parity(records: Sequence[dict[str, Any]], verl_advantage: Callable[..., Any] | None = None,
                     metrics: dict[str, Any] | None = None, norm_by_std: bool = True,
                     epsilon: float = VERL_EPSILON) -> AdvantageParity:
    """GRPO advantages of one logged batch (one step's dump), three ways.

    grpo_lab: :func:`grpo_lab.advantages.group_advantages` on each prompt's scores with verl's ``epsilon`` (1e-6;
    TRL and the course use 1e-4). ``verl_advantage``: verl's ``compute_grpo_outcome_advantage`` (from
    ``verl.trainer.ppo.core_algos``) on the same scores as one-token responses, grouped by the prompt uid.
    ``metrics``: the step's logged record; its ``critic/advantages/max`` and ``/min`` must equal the extremes of the
    recomputed advantages (verl takes them over response tokens, and every token of a response carries the same
    advantage).
    """
    grouped = group_records(records)
    ordered = [r for group in grouped for r in group]
    ours = _per_group([[float(r["score"]) for r in g] for g in grouped], epsilon, norm_by_std)
    result = AdvantageParity(step=ordered[0].get("step") if ordered else None, completions=len(ordered),
                             group_sizes=[len(g) for g in grouped], epsilon=epsilon, norm_by_std=norm_by_std,
                             advantages=ours)
    if not ordered:
        return result
    course = _per_group([[float(r["score"]) for r in g] for g in grouped], 1e-4, norm_by_std)
    result.max_abs_diff_course_epsilon = max(abs(a - b) for a, b in zip(ours, course))
    if verl_advantage is not None:
        import numpy as np
        import torch

        scores = torch.tensor([float(r["score"]) for r in ordered], dtype=torch.float32).unsqueeze(-1)
        index = np.array([f"group-{i}" for i, g in enumerate(grouped) for _ in g], dtype=object)
        theirs, _ = verl_advantage(token_level_rewards=scores, response_mask=torch.ones_like(scores), index=index,
                                   epsilon=epsilon, norm_adv_by_std_in_grpo=norm_by_std)
        result.max_abs_diff_vs_verl_function = max(abs(a - b) for a, b in zip(ours, theirs[:, 0].tolist()))
    if metrics and all(key in metrics for key in ADVANTAGE_RANGE_KEYS):
        result.logged_range = {key: float(metrics[key]) for key in ADVANTAGE_RANGE_KEYS}
        result.max_abs_diff_vs_logged_range = max(abs(result.logged_range[ADVANTAGE_RANGE_KEYS[0]] - max(ours)),
                                                  abs(result.logged_range[ADVANTAGE_RANGE_KEYS[1]] - min(ours)))
    return result


VERL_ADVANTAGE_FUNCTION = "compute_grpo_outcome_advantage"
CORE_ALGOS = "verl/trainer/ppo/core_algos.py"


def load_verl_grpo_advantage(source: str | Path | None = None) -> tuple[Callable[..., Any] | None, str]:
    """verl's ``compute_grpo_outcome_advantage`` and where it came from, or ``(None, why not)``.

    First ``import verl.trainer.ppo.core_algos`` (on a verl machine). Where verl does not import (this course's CPU
    environment lacks Ray and tensordict), the function's own source is compiled alone, unchanged except for its
    registry decorator: from ``source`` (a verl wheel, checkout or package folder), else from the installed verl's
    files. It needs only torch and numpy.
    """
    try:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        return compute_grpo_outcome_advantage, "import verl.trainer.ppo.core_algos"
    except Exception as error:  # noqa: BLE001 - verl or one of its many imports is missing: read its source instead
        why = f"verl does not import here ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    text, origin = _core_algos_source(source)
    if text is None:
        return None, f"{why}; {origin}"
    tree = ast.parse(text)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == VERL_ADVANTAGE_FUNCTION), None)
    if node is None:
        return None, f"{why}; {origin} has no {VERL_ADVANTAGE_FUNCTION}"
    import numpy as np
    import torch

    node.decorator_list = []  # @register_adv_est belongs to verl's estimator registry
    namespace = {"torch": torch, "np": np, "defaultdict": defaultdict, "Optional": Optional, "AlgoConfig": Any}
    exec(compile(ast.Module(body=[node], type_ignores=[]), origin, "exec"), namespace)  # noqa: S102 - verl's own code
    return namespace[VERL_ADVANTAGE_FUNCTION], f"{VERL_ADVANTAGE_FUNCTION} compiled from {origin}"


def _core_algos_source(source: str | Path | None) -> tuple[str | None, str]:
    if source is None:
        try:
            spec = importlib.util.find_spec("verl")
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:  # None: absent, or a folder named verl (a namespace), not the package
            return None, "no verl source given and no verl installed"
        source = Path(list(spec.submodule_search_locations)[0]).parent
    path = Path(source)
    if path.is_file():
        with zipfile.ZipFile(path) as wheel:
            if CORE_ALGOS not in wheel.namelist():
                return None, f"{path} holds no {CORE_ALGOS}"
            return wheel.read(CORE_ALGOS).decode("utf-8"), f"{path}:{CORE_ALGOS}"
    for candidate in (path / CORE_ALGOS, path / "trainer" / "ppo" / "core_algos.py"):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8"), str(candidate)
    return None, f"{path} holds no {CORE_ALGOS}"
