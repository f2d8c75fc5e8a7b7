"""Held-out accuracy, before and after training: greedy, sampled pass@1 and pass@k, per problem type.

Every completion is sampled through the rollout engine (:func:`grpo_lab.rollout.open_engine`, HF ``generate``
or vLLM) and graded by one rule, :func:`grpo_lab.rewards.is_correct` (the number after the last ``####`` equals
the row's answer): the rule the correctness reward trains with.
"""

from __future__ import annotations

__all__ = [
    "GREEDY_MEASURES", "Evaluation", "Gain", "SeedSpread", "compare", "describe_change", "describe_reward_gap",
    "evaluate", "greedy_followed", "greedy_gain", "greedy_gains", "interval_text", "side_by_side", "subset",
    "trained_conclusions", "verdict_counts",
]

import dataclasses
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.rewards import FormatReward, is_correct, is_correct_lenient
from grpo_lab.rollout import RolloutEngine, Sampling, open_engine
from grpo_lab.runs import EVALUATION_FILE

METRICS = ("greedy", "sampled_pass_at_1", "pass_at_k")
METRIC_LABELS = {"greedy": "greedy accuracy", "sampled_pass_at_1": "pass@1", "pass_at_k": "pass@k"}
STEADY_POINTS = 1.0  # a change smaller than this many percentage points is reported as 'did not move'


@dataclass
class AccuracyReport:
    """Exact-answer accuracy: greedy, sampled pass@1 (mean over k samples) and pass@k, overall and per type."""

    greedy: float
    sampled_pass_at_1: float
    pass_at_k: float
    k: int
    temperature: float
    count: int
    per_type: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """A plain-text table, one line per type and one for all."""
        head = f"{'type':<22}{'n':>5}{'greedy':>9}{'pass@1':>9}{f'pass@{self.k}':>9}"
        rows = [f"{name:<22}{int(m['count']):>5}{m['greedy']:>9.1%}{m['sampled_pass_at_1']:>9.1%}"
                f"{m['pass_at_k']:>9.1%}" for name, m in sorted(self.per_type.items())]
        rows.append(f"{'all':<22}{self.count:>5}{self.greedy:>9.1%}{self.sampled_pass_at_1:>9.1%}"
                    f"{self.pass_at_k:>9.1%}")
        return "\n".join([head, *rows])


def accuracy_report(rows: Sequence[dict[str, Any]], greedy_texts: Sequence[str],
                    sampled_texts: Sequence[Sequence[str]], temperature: float) -> AccuracyReport:
    """Greedy accuracy, pass@1 (mean over each row's samples) and pass@k, overall and per problem type."""
    scores: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for row, greedy_text, samples in zip(rows, greedy_texts, sampled_texts, strict=True):
        hits = [is_correct(text, row["answer"]) for text in samples]
        sampled = (sum(hits) / len(hits), float(any(hits))) if hits else (math.nan, math.nan)  # greedy only: no samples
        score = (float(is_correct(greedy_text, row["answer"])), *sampled)
        scores[row.get("type", "all")].append(score)

    def summary(values: list[tuple[float, float, float]]) -> dict[str, float]:
        return {"count": len(values), **{key: sum(v[i] for v in values) / len(values) for i, key in enumerate(METRICS)}}

    overall = summary([v for values in scores.values() for v in values])
    return AccuracyReport(**{key: overall[key] for key in METRICS}, k=len(sampled_texts[0]), temperature=temperature,
                          count=len(rows), per_type={name: summary(v) for name, v in scores.items()})


@dataclass
class Evaluation:
    """Held-out accuracy of one model (greedy, sampled pass@1, pass@k), with its greedy and sampled completions."""

    model: str
    report: AccuracyReport
    greedy_texts: list[str]
    seconds: float
    backend: str
    sampled_texts: list[list[str]]
    """Each row's samples at the evaluation temperature (re-score a subset with :func:`accuracy_report`)."""
    engine_start_seconds: float = 0.0
    """The part of ``seconds`` spent starting the engine (about 0 for an engine that was already running)."""

    def timing(self) -> str:
        """``"vllm: engine start 41 s, sampling 12 s"``."""
        return (f"{self.backend}: engine start {self.engine_start_seconds:.0f} s, sampling "
                f"{self.seconds - self.engine_start_seconds:.0f} s")

    def save(self, path: str | Path) -> Path:
        """Write the evaluation, completions included, as JSON (:meth:`load` reads it back)."""
        path = Path(path)
        path.write_text(json.dumps(asdict(self), ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Evaluation:
        """An evaluation :meth:`save` wrote; a run folder: its ``evaluation.json`` (``grpo-lab train --evaluate``)."""
        path = Path(path) / EVALUATION_FILE if Path(path).is_dir() else Path(path)
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no evaluation at {path}: grpo-lab train --evaluate N writes one") from None
        return cls(**{**values, "report": AccuracyReport(**values["report"])})


def evaluate(model: str | Path, rows: Sequence[dict[str, Any]], num_samples: int = 8, temperature: float = 1.0,
             max_tokens: int = 48, backend: str = "auto", seed: int = 0, engine: RolloutEngine | None = None,
             **engine_settings: Any) -> Evaluation:
    """Greedy accuracy plus pass@1 (mean over ``num_samples`` samples at ``temperature``; 0: greedy only) and pass@k,
    sampled with :func:`grpo_lab.rollout.open_engine` (``engine_settings``: more RolloutConfig fields) or ``engine``,
    one already running with ``model``'s weights (``TrainResult.rollout_engine()``), stopped at the end."""
    if not rows:
        raise ConfigError("no rows to evaluate")
    if num_samples < 0:
        raise ConfigError(f"num_samples={num_samples}: use 0 (greedy only) or more samples per problem")
    if num_samples and temperature <= 0:
        raise ConfigError(f"temperature={temperature}: greedy decoding gives one completion per prompt, so pass@k "
                          f"needs sampling (temperature > 0); the greedy accuracy is measured anyway.")
    started = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    if engine is None:
        engine = open_engine(str(model), backend=backend, n=max(num_samples, 1), max_tokens=max_tokens,
                             temperature=temperature, seed=seed, prompts=prompts, **engine_settings)
    with engine:
        greedy = [texts[0] for texts in engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens, temperature=0.0,
                                                                          seed=seed)).texts]
        sampled = engine.generate(prompts, Sampling(n=num_samples, max_tokens=max_tokens, temperature=temperature,
                                                    seed=seed)).texts if num_samples else [[] for _ in prompts]
        used, load_s = engine.name, engine.load_s
    return Evaluation(str(model), accuracy_report(rows, greedy, sampled, temperature), greedy,
                      time.perf_counter() - started, used, sampled, engine_start_seconds=load_s)


def compare(before: Evaluation, after: Evaluation, types: Sequence[str] | None = None) -> str:
    """A text table: per type (and over ``types`` together), greedy / pass@1 / pass@k before → after."""
    k = before.report.k
    names = sorted(set(before.report.per_type) | set(after.report.per_type))
    head = f"{'type':<22}{'n':>4}  {'greedy':>15}  {'pass@1 (T=1)':>15}  {f'pass@{k}':>15}"
    lines = [head, "-" * len(head)]

    def cell(old: float, new: float) -> str:
        return f"{old:5.1%} → {new:5.1%}".rjust(15)

    def row(name: str, old: dict, new: dict) -> str:
        return (f"{name:<22}{int(old['count']):>4}  {cell(old['greedy'], new['greedy'])}  "
                f"{cell(old['sampled_pass_at_1'], new['sampled_pass_at_1'])}  "
                f"{cell(old['pass_at_k'], new['pass_at_k'])}")

    for name in names:
        marker = "*" if types and name in types else ""
        lines.append(row(name + marker, before.report.per_type[name], after.report.per_type[name]))
    evaluated = [t for t in types or () if t in before.report.per_type and t in after.report.per_type]
    if evaluated:  # a small evaluation (GRPO_LAB_EVAL_SIZE) may hold none of them
        lines.append(row("trained types*", _pooled(before.report.per_type, evaluated),
                         _pooled(after.report.per_type, evaluated)))
    lines.append(row("all", before.report.to_dict(), after.report.to_dict()))
    return "\n".join(lines)


def _pooled(per_type: dict[str, dict[str, float]], types: Iterable[str]) -> dict[str, float] | None:
    """Greedy / pass@1 / pass@k over ``types`` together, weighted by their number of problems (None: no problems)."""
    parts = [per_type[t] for t in types if t in per_type]
    count = sum(p["count"] for p in parts)
    if not count:
        return None
    return {"count": count, **{key: sum(p[key] * p["count"] for p in parts) / count for key in METRICS}}


def _verdicts(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation) -> list[str]:
    """Each problem's greedy verdict before and after, ``"wrong → right"`` …"""
    return [" → ".join("right" if is_correct(text, row["answer"]) else "wrong" for text in (old, new))
            for row, old, new in zip(rows, before.greedy_texts, after.greedy_texts)]


def side_by_side(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation, limit: int = 6,
                 only_changed: bool = True) -> list[dict[str, str]]:
    """Greedy completions before and after training for a few problems. With ``only_changed``, the problems whose
    verdict changed, in both directions (wrong → right and right → wrong, alternating, so neither hides)."""
    items = [{"type": row.get("type", ""), "question": row["prompt"][-1]["content"].splitlines()[0],
              "answer": row["answer"], "before": old.strip(), "after": new.strip(), "verdict": verdict}
             for row, old, new, verdict in zip(rows, before.greedy_texts, after.greedy_texts,
                                               _verdicts(rows, before, after))]
    if not only_changed:
        return items[:limit]
    gained = [item for item in items if item["verdict"] == "wrong → right"]
    lost = [item for item in items if item["verdict"] == "right → wrong"]
    mixed = [item for pair in zip(gained, lost) for item in pair]
    longer = gained if len(gained) > len(lost) else lost
    return (mixed + longer[min(len(gained), len(lost)):])[:limit]


def changes(before: AccuracyReport, after: AccuracyReport, trained_types: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{group: {metric: {"before", "after", "points"}}}`` over the trained types, the untrained ones and all problems
    (pooled by their number of problems; a group with none is left out; ``points``: after − before)."""
    def pooled(report: AccuracyReport) -> dict[str, dict[str, float]]:
        groups = {"trained": _pooled(report.per_type, [t for t in report.per_type if t in trained_types]),
                  "untrained": _pooled(report.per_type, [t for t in report.per_type if t not in trained_types]),
                  "all": report.to_dict()}
        return {name: found for name, found in groups.items() if found}

    old, new = pooled(before), pooled(after)
    return {group: {key: {"before": old[group][key], "after": new[group][key],
                          "points": round(100 * (new[group][key] - old[group][key]), 1)} for key in METRICS}
            for group in old if group in new}


def describe_change(what: str, old: float, new: float, percent: bool = True, steady: float | None = None) -> str:
    """One sentence whose direction word is computed from the numbers it quotes. ``percent=True`` (accuracies as
    fractions): a change below ``steady`` points (default :data:`STEADY_POINTS`) "did not move"; ``percent=False`` (any
    other quantity): within ``steady`` (a relative change, default 5 %) it "stayed near" the old value.

    >>> describe_change("greedy accuracy", 0.234, 0.138)
    'greedy accuracy fell 9.6 points (23.4% → 13.8%)'
    >>> describe_change("entropy", 0.137, 0.228, percent=False)
    'entropy rose from 0.137 to 0.228'
    """
    if percent:
        points = round(100 * new - 100 * old, 1)
        if abs(points) < (STEADY_POINTS if steady is None else steady):
            return f"{what} did not move ({old:.1%} → {new:.1%})"
        return f"{what} {'rose' if points > 0 else 'fell'} {abs(points):.1f} points ({old:.1%} → {new:.1%})"
    limit = 0.05 if steady is None else steady
    if abs(new - old) <= limit * max(abs(old), 1e-12):
        return f"{what} stayed near {old:.3g} ({old:.3g} → {new:.3g})"
    return f"{what} {'rose' if new > old else 'fell'} from {old:.3g} to {new:.3g}"


def subset(rows: Sequence[dict[str, Any]], evaluation: Evaluation, keep: Sequence[bool]) -> Evaluation:
    """The part of ``evaluation`` (of ``rows``) over the rows where ``keep`` is true, re-scored from its completions."""
    chosen = [index for index, kept in enumerate(keep) if kept]
    if len(keep) != len(rows) or not chosen:
        raise ConfigError(f"keep needs one flag per evaluated row ({len(rows)}, got {len(keep)}) and at least one true")
    greedy = [evaluation.greedy_texts[i] for i in chosen]
    sampled = [evaluation.sampled_texts[i] for i in chosen]
    report = accuracy_report([rows[i] for i in chosen], greedy, sampled, evaluation.report.temperature)
    return dataclasses.replace(evaluation, report=report, greedy_texts=greedy, sampled_texts=sampled)


def trained_conclusions(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation, trained: Sequence[bool],
                        scope: str) -> list[str]:
    """What training did to held-out accuracy on the problems of the kind it trained on (``trained[i]``; ``scope``:
    which, in words), on the others and on all; then on each trained type (up to four) or the two that moved most."""
    labels = {**METRIC_LABELS, "pass_at_k": f"pass@{before.report.k}"}
    count = sum(map(bool, trained))
    groups = [(f"the {count} problems of the kind it trained on ({scope})", list(trained)),
              (f"the {len(rows) - count} problems it did not train on", [not flag for flag in trained])]
    if 0 < count < len(rows):
        groups.append((f"all {len(rows)} problems", [True] * len(rows)))
    parts = [(label, subset(rows, before, keep).report, subset(rows, after, keep).report)
             for label, keep in groups if any(keep)]
    lines = [describe_change(f"{labels[key]} on {label}", getattr(old, key), getattr(new, key))
             for label, old, new in parts for key in METRICS]
    if not count:
        return lines
    _, old, new = parts[0]
    types = sorted(set(old.per_type) & set(new.per_type))
    for key in ("greedy", "sampled_pass_at_1") if len(types) <= 4 else ("greedy", "pass_at_k"):
        moves = {name: new.per_type[name][key] - old.per_type[name][key] for name in types}
        shown = types if len(types) <= 4 else dict.fromkeys((max(moves, key=moves.get), min(moves, key=moves.get)))
        lines += [describe_change(f"{labels[key]} on their {name} problems", old.per_type[name][key],
                                  new.per_type[name][key]) for name in shown]
    return lines


def wilson_interval(share: float, count: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95 % by default) of a share of ``count`` yes/no outcomes: it stays honest at 0 % and
    100 %, where the normal approximation's standard error is zero.

    >>> [round(x, 3) for x in wilson_interval(0.0, 200)]
    [0.0, 0.019]
    """
    if count <= 0:
        return 0.0, 1.0
    centre = share + z * z / (2 * count)
    spread = z * math.sqrt(share * (1 - share) / count + z * z / (4 * count * count))
    scale = 1 + z * z / count
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def interval_text(share: float, count: int) -> str:
    """``"(95 %: 2.1..9.8 %)"``: the :func:`wilson_interval` of a share of ``count``, as a page prints it.

    >>> interval_text(0.0, 200)
    '(95 %: 0.0..1.9 %)'
    """
    low, high = wilson_interval(share, count)
    return f"(95 %: {100 * low:.1f}..{100 * high:.1f} %)"


@dataclass(frozen=True)
class Gain:
    """A paired change over the same problems: before, after, how many went each way (:meth:`from_pairs`)."""

    what: str
    before: float
    after: float
    count: int
    up: int  # problems that went from no to yes (wrong to right)
    down: int  # from yes to no

    @classmethod
    def from_pairs(cls, what: str, pairs: Sequence[tuple[float, float]]) -> Gain:
        """The gain of per-problem yes/no outcomes (1.0 or 0.0), before and after, over the same problems."""
        if not pairs:
            raise ConfigError(f"{what}: no problems to compare")
        n = len(pairs)
        return cls(what, sum(old for old, _ in pairs) / n, sum(new for _, new in pairs) / n, n,
                   sum(new > old for old, new in pairs), sum(new < old for old, new in pairs))

    @property
    def points(self) -> float:
        return 100 * (self.after - self.before)

    @property
    def standard_errors(self) -> float:
        """The change in paired-count standard errors (McNemar's z, ``(up - down) / sqrt(up + down)``; 0: none)."""
        changed = self.up + self.down
        return (self.up - self.down) / math.sqrt(changed) if changed else 0.0

    def describe(self) -> str:
        low, high = wilson_interval(self.after, self.count)
        return (describe_change(self.what, self.before, self.after)
                + f" over {self.count} problems ({self.up} up, {self.down} down: {self.standard_errors:+.1f} standard "
                  f"errors of the paired counts; after: 95 % interval {low:.1%}..{high:.1%})")


GREEDY_MEASURES = {"accuracy": is_correct, "lenient": is_correct_lenient,
                   "format": lambda text, _answer: FormatReward().score(text) == 1.0}
"""What :func:`greedy_gain` can count per greedy answer (in words: ``GREEDY_LABELS``)."""
GREEDY_LABELS = {"accuracy": "greedy accuracy (strict: #### N)", "lenient": "greedy accuracy (lenient: final number)",
                 "format": "greedy answers with one '#### N' line"}


def greedy_gain(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation, measure: str = "accuracy",
                types: Sequence[str] | None = None) -> Gain:
    """The change of the greedy answers' ``measure`` (:data:`GREEDY_MEASURES`), of ``types`` if given."""
    if measure not in GREEDY_MEASURES:
        raise ConfigError(f"measure={measure!r}: use one of {', '.join(GREEDY_MEASURES)}")
    check = GREEDY_MEASURES[measure]
    pairs = [(float(check(old, row["answer"])), float(check(new, row["answer"])))
             for row, old, new in zip(rows, before.greedy_texts, after.greedy_texts, strict=True)
             if not types or row.get("type") in types]
    if not pairs:
        raise ConfigError(f"no evaluated problem is of the types {list(types or [])}")
    return Gain.from_pairs(GREEDY_LABELS[measure], pairs)


def greedy_gains(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation,
                 keep: Sequence[bool] | None = None) -> dict[str, Gain]:
    """Every :data:`GREEDY_MEASURES` gain (strict, lenient, format) over the rows where ``keep`` is true (all if None):
    the same problems before and after, so learning the format alone cannot pass for learning the arithmetic."""
    keep = list(keep) if keep is not None else [True] * len(rows)
    chosen = [row for row, kept in zip(rows, keep, strict=True) if kept]
    pair = [subset(rows, evaluation, keep) for evaluation in (before, after)]
    return {measure: greedy_gain(chosen, *pair, measure) for measure in GREEDY_MEASURES}


@dataclass(frozen=True)
class SeedSpread:
    """One measure's paired gain in runs that differ only by their seed, each against the same "before": how far
    chance alone moves a run's result, and whether the gain holds in every seed."""

    gains: dict[int, Gain]
    """Each seed's gain, by seed."""

    def __post_init__(self) -> None:
        if not self.gains:
            raise ConfigError("SeedSpread needs the gain of at least one seed")

    @property
    def min_standard_errors(self) -> float:
        """The smallest gain in standard errors of the paired counts: the one the seeds all reach."""
        return min(gain.standard_errors for gain in self.gains.values())

    def lines(self) -> list[str]:
        """Each seed's gain, then the headline over them (one seed: no spread measured)."""
        lines = [f"seed {seed}: {gain.describe()}" for seed, gain in sorted(self.gains.items())]
        gains = list(self.gains.values())
        if len(gains) == 1:
            return [*lines, "one seed: how far another draw would land is not measured here (GRPO_LAB_SEEDS=2 trains "
                            "a second)"]
        points = [gain.points for gain in gains]
        afters = [gain.after for gain in gains]
        errors = [gain.standard_errors for gain in gains]
        holds = sum(e >= 2 for e in errors)
        return [*lines, f"over {len(gains)} seeds: {gains[0].what} {gains[0].before:.1%} → "
                        f"{', '.join(f'{a:.1%}' for a in afters)}; gains {min(points):+.1f} to {max(points):+.1f} "
                        f"points ({min(errors):+.1f} to {max(errors):+.1f} standard errors), up by two standard errors "
                        f"in {holds} of {len(gains)}; the seeds land {100 * (max(afters) - min(afters)):.1f} points "
                        f"apart"]


def greedy_followed(before: AccuracyReport, after: AccuracyReport, trained_types: Sequence[str]) -> list[str]:
    """Whether greedy accuracy went the way pass@1 went (same direction, a change within :data:`STEADY_POINTS` being
    none), on each trained type: greedy can stay wrong while the share of right samples rises."""
    def direction(name: str, key: str) -> int:
        points = 100 * (after.per_type[name][key] - before.per_type[name][key])
        return 0 if abs(points) < STEADY_POINTS else (1 if points > 0 else -1)

    types = [name for name in trained_types if name in before.per_type and name in after.per_type]
    parted = [name for name in types if direction(name, "greedy") != direction(name, "sampled_pass_at_1")]
    followed = [name for name in types if name not in parted]
    lines = [f"greedy accuracy followed pass@1 on {len(followed)} of {len(followed) + len(parted)} trained types"
             + (f" ({', '.join(followed)})" if followed else "")]
    lines += [describe_change(f"on {name} it did not: pass@1", before.per_type[name]["sampled_pass_at_1"],
                              after.per_type[name]["sampled_pass_at_1"])
              + ", " + describe_change("greedy accuracy", before.per_type[name]["greedy"], after.per_type[name]["greedy"])
              for name in parted]
    return lines


def describe_reward_gap(first_reward: float, held_out_pass_at_1: float, fine_tuned_on_rows: bool, binary: bool,
                        train_temperature: float, eval_temperature: float) -> str:
    """Why the training reward at the start differs from held-out pass@1 on the same types, as a sentence (``binary``:
    the reward is correctness alone, a share of right answers).

    >>> print(describe_reward_gap(0.602, 0.228, True, True, 1.0, 1.0))  # doctest: +NORMALIZE_WHITESPACE
    training reward at the start 0.602 (a share of right answers on the training rows) vs held-out pass@1 on the same
    types 22.8% before training: the model was fine-tuned on exactly these training rows (its manifest records the
    file's checksum), so it recalls many of their answers; the held-out problems are new to it.
    """
    what = "a share of right answers on the training rows" if binary else "every reward of the set, on the training rows"
    head = (f"training reward at the start {first_reward:.3f} ({what}) vs held-out pass@1 on the same types "
            f"{held_out_pass_at_1:.1%} before training")
    reasons = []
    if fine_tuned_on_rows:
        reasons.append("the model was fine-tuned on exactly these training rows (its manifest records the file's "
                       "checksum), so it recalls many of their answers; the held-out problems are new to it")
    if not binary:
        reasons.append("the reward adds more than correctness, so it is not a share of right answers")
    if train_temperature != eval_temperature:
        reasons.append(f"the trainer samples at T={train_temperature:g}, the evaluation at T={eval_temperature:g}")
    if not reasons:
        reasons.append("the same measure on different problems of the same types, so they should be close; a large "
                       "gap means the training rows are easier or harder for this model than the held-out ones")
    return head + ": " + "; ".join(reasons) + "."


def verdict_counts(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation) -> dict[str, int]:
    """How many problems' greedy answers went wrong → right, right → wrong, stayed right, stayed wrong."""
    counts = dict.fromkeys(("wrong → right", "right → wrong", "right → right", "wrong → wrong"), 0)
    for verdict in _verdicts(rows, before, after):
        counts[verdict] += 1
    return counts
