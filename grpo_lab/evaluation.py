"""Held-out accuracy, before and after training: greedy, sampled pass@1 and pass@k, per problem type.

Every completion is sampled through the rollout engine (:func:`grpo_lab.rollout.open_engine`, HF ``generate``
or vLLM) and graded by one rule, :func:`grpo_lab.rewards.is_correct` (the number after the last ``####`` equals
the row's answer): the rule the correctness reward trains with.

>>> from grpo_lab.data import load_split
>>> from grpo_lab.evaluation import evaluate
>>> result = evaluate("data/models/tiny-qwen2", load_split("eval")[:8], num_samples=2)   # doctest: +SKIP
>>> print(result.report.table())                                                        # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.rewards import is_correct
from grpo_lab.rollout import Sampling, open_engine


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
        score = (float(is_correct(greedy_text, row["answer"])), sum(hits) / len(hits), float(any(hits)))
        scores[row.get("type", "all")].append(score)

    def summary(values: list[tuple[float, float, float]]) -> dict[str, float]:
        n = len(values)
        return {"count": n, "greedy": sum(v[0] for v in values) / n,
                "sampled_pass_at_1": sum(v[1] for v in values) / n, "pass_at_k": sum(v[2] for v in values) / n}

    overall = summary([v for values in scores.values() for v in values])
    return AccuracyReport(greedy=overall["greedy"], sampled_pass_at_1=overall["sampled_pass_at_1"],
                          pass_at_k=overall["pass_at_k"], k=len(sampled_texts[0]), temperature=temperature,
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


def evaluate(model: str | Path, rows: Sequence[dict[str, Any]], num_samples: int = 8, temperature: float = 1.0,
             max_tokens: int = 48, backend: str = "hf", seed: int = 0, **engine_settings: Any) -> Evaluation:
    """Greedy accuracy plus pass@1 (mean over ``num_samples`` samples at ``temperature``) and pass@k.

    Sampling goes through :func:`grpo_lab.rollout.open_engine` (``backend="hf"``, ``"vllm"`` or ``"auto"``);
    ``engine_settings`` are more RolloutConfig fields (e.g. ``gpu_memory_utilization``).
    """
    if not rows:
        raise ConfigError("no rows to evaluate")
    if temperature <= 0:
        raise ConfigError(f"temperature={temperature}: greedy decoding gives one completion per prompt, so pass@k "
                          f"needs sampling (temperature > 0); the greedy accuracy is measured anyway.")
    started = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    with open_engine(str(model), backend=backend, n=num_samples, max_tokens=max_tokens, temperature=temperature,
                     seed=seed, prompts=prompts, **engine_settings) as engine:
        greedy = engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens, temperature=0.0, seed=seed)).texts
        sampled = engine.generate(prompts).texts
        used = engine.name
    report = accuracy_report(rows, [g[0] for g in greedy], sampled, temperature)
    return Evaluation(str(model), report, [g[0] for g in greedy], time.perf_counter() - started, used, sampled)


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
    if types:
        lines.append(row("trained types*", pooled(before, types), pooled(after, types)))
    lines.append(row("all", before.report.to_dict(), after.report.to_dict()))
    return "\n".join(lines)


def pooled(evaluation: Evaluation, types: Sequence[str]) -> dict[str, float]:
    """Greedy / pass@1 / pass@k over several types together (weighted by their number of problems)."""
    parts = [evaluation.report.per_type[t] for t in types if t in evaluation.report.per_type]
    count = sum(p["count"] for p in parts)
    if not count:
        raise ConfigError(f"none of the types {list(types)} was evaluated")
    return {"count": count, **{key: sum(p[key] * p["count"] for p in parts) / count
                               for key in ("greedy", "sampled_pass_at_1", "pass_at_k")}}


def side_by_side(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation, limit: int = 6,
                 only_changed: bool = True) -> list[dict[str, str]]:
    """Greedy completions before and after training for a few problems. With ``only_changed``, the problems whose
    verdict changed, in both directions (wrong → right and right → wrong, alternating, so neither hides)."""
    items = []
    for row, old, new in zip(rows, before.greedy_texts, after.greedy_texts):
        right = [is_correct(text, row["answer"]) for text in (old, new)]
        items.append({"type": row.get("type", ""), "question": row["prompt"][-1]["content"].splitlines()[0],
                      "answer": row["answer"], "before": old.strip(), "after": new.strip(),
                      "verdict": f"{'right' if right[0] else 'wrong'} → {'right' if right[1] else 'wrong'}"})
    if not only_changed:
        return items[:limit]
    gained = [item for item in items if item["verdict"] == "wrong → right"]
    lost = [item for item in items if item["verdict"] == "right → wrong"]
    mixed = [item for pair in zip(gained, lost) for item in pair]
    longer = gained if len(gained) > len(lost) else lost
    return (mixed + longer[min(len(gained), len(lost)):])[:limit]
