"""Repeated timings and the ratios between them: medians, the rotating order of configs, each measurement's spread
(min / median / max) and a ratio's range, whose conservative end decides a verdict.

>>> spread = Spread.of([2.0, 1.0, 4.0])
>>> (spread.min, spread.median, spread.max)
(1.0, 2.0, 4.0)
>>> r = speedup_range([10.0, 12.0, 11.0, 10.5, 11.5], [5.0, 6.0, 5.5, 5.2, 5.8], interleaved=True)
>>> f"{r.low:.2f}..{r.high:.2f}", r.verdict(1.5, ">="), r.verdict(2.0, ">=")
('1.67..2.40', 'met', 'not met (only the high end reaches 2.00x)')
>>> paired = paired_ratios([10.0, 12.0, 11.0, 10.5, 11.5], [5.0, 6.0, 5.5, 5.2, 5.8])
>>> f"{paired.min:.2f}..{paired.max:.2f}"
'1.98..2.02'
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.errors import DataError

MIN_RUNS = 5
"""Timed runs per side below which a ratio has no spread worth the name and is not a claim."""


def median(values: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count); NaN for no values."""
    return float(statistics.median(values)) if len(values) else float("nan")


def alternating_orders(configs: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the configs in each round: rotated by one per round, so none always runs first (after an
    idle device) or last (after the others warmed caches)."""
    configs = list(configs)
    if not configs:
        return [[] for _ in range(rounds)]
    return [configs[r % len(configs):] + configs[:r % len(configs)] for r in range(rounds)]


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one thing: their min, median and max."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(tuple(float(v) for v in values))

    @property
    def min(self) -> float:
        return min(self.values, default=float("nan"))

    @property
    def median(self) -> float:
        return median(self.values)

    @property
    def max(self) -> float:
        return max(self.values, default=float("nan"))

    def as_dict(self) -> dict[str, float]:
        return {"min": self.min, "median": self.median, "max": self.max}

    def describe(self, unit: str = " s") -> str:
        return f"{self.median:.2f}{unit} ({self.min:.2f}..{self.max:.2f}, {len(self.values)} runs)"


@dataclass(frozen=True)
class RatioRange:
    """How many times faster a contender is than a baseline, from repeated times of each: ``low`` pairs the
    contender's slowest run with the baseline's fastest (the conservative end), ``high`` the reverse."""

    low: float
    median: float
    high: float
    runs: tuple[int, int]
    """Timed runs of (baseline, contender)."""
    interleaved: bool
    """Whether the runs of the two alternated (otherwise a drift of the machine between them is in the ratio)."""

    @property
    def is_claim(self) -> bool:
        return min(self.runs) >= MIN_RUNS and self.interleaved

    def caveat(self) -> str:
        """Why the ratio is no claim ("2 steps each, not interleaved: no spread, not a claim"), or ""."""
        if self.is_claim:
            return ""
        runs = (f"{self.runs[0]} runs each" if self.runs[0] == self.runs[1] else
                f"{self.runs[0]} and {self.runs[1]} runs")
        return f"{runs}{'' if self.interleaved else ', not interleaved'}: no spread, not a claim"

    def describe(self) -> str:
        text = f"{self.median:.2f}x (range {self.low:.2f}x..{self.high:.2f}x)"
        return f"{text}; {self.caveat()}" if self.caveat() else text

    def verdict(self, threshold: float, how: str = ">=") -> str:
        """``met`` only when the conservative end meets ``threshold`` (``low`` for ``>=``, ``high`` for ``<=``);
        no verdict at all for a ratio that is no claim."""
        if not self.is_claim:
            return self.caveat()
        safe, bold = (self.low, self.high) if how == ">=" else (self.high, self.low)
        if (safe >= threshold) if how == ">=" else (safe <= threshold):
            return "met"
        if (bold >= threshold) if how == ">=" else (bold <= threshold):
            return f"not met (only the {'high' if how == '>=' else 'low'} end reaches {threshold:.2f}x)"
        return "missed"

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "median": self.median, "high": self.high, "runs": list(self.runs),
                "interleaved": self.interleaved, "claim": self.is_claim}


def speedup_range(baseline_s: Sequence[float], contender_s: Sequence[float], interleaved: bool) -> RatioRange:
    """Baseline time over contender time (per run: seconds, or seconds per token where token counts differ)."""
    base, other = Spread.of(baseline_s), Spread.of(contender_s)
    return RatioRange(low=base.min / other.max, median=base.median / other.median, high=base.max / other.min,
                      runs=(len(base.values), len(other.values)), interleaved=interleaved)


def paired_ratios(baseline_s: Sequence[float], contender_s: Sequence[float]) -> Spread:
    """Each round's baseline time over the contender's time in the same round, for interleaved runs (round i of each
    ran back to back). A drift of the machine across the rounds, which slows or speeds both sides alike, cancels here;
    :func:`speedup_range` pairs runs minutes apart and keeps it. So this spread says how much the ratio itself
    varied, and is narrower; verdicts stay on :class:`RatioRange`'s conservative end."""
    if len(baseline_s) != len(contender_s) or not baseline_s:
        raise DataError(f"paired ratios need the same number of rounds on both sides, got {len(baseline_s)} and "
                         f"{len(contender_s)}")
    return Spread.of([b / c for b, c in zip(baseline_s, contender_s)])
