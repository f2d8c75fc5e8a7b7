"""Where a process's time went, from ``py-spy record --format raw``: one line per distinct stack (its frames from the
root down, ``function (file:line)``, joined by ``;``) and the samples taken in it: :meth:`Stacks.under` keeps what ran
inside one call (vLLM's ``LLM.generate`` in the trainer), small enough to commit, and :meth:`Stacks.shares` says which
functions took what share of it. The committed profile is the catalogue's ``engine_profile``
(``benchmarks/results/h200/README.md`` has the command).

>>> s = Stacks({("main (a.py:1)", "generate (llm.py:9)", "schedule (s.py:3)"): 3,
...             ("main (a.py:1)", "generate (llm.py:9)", "forward (m.py:5)"): 1, ("main (a.py:1)",): 4})
>>> inside = s.under("generate (llm.py")
>>> inside.total, inside.shares()
(4, [('schedule (s.py)', 0.75), ('forward (m.py)', 0.25)])
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def function_of(frame: str) -> str:
    """A frame without its line number: ``"schedule (vllm/v1/core/sched/scheduler.py:412)"`` ->
    ``"schedule (vllm/v1/core/sched/scheduler.py)"``."""
    match = _FRAME.match(frame)
    return f"{match['function']} ({match['file']})" if match else frame


@dataclass(frozen=True)
class Stacks:
    """Sample counts by stack (frames from the root down)."""

    counts: dict[tuple[str, ...], int]

    @classmethod
    def read(cls, path: str | Path) -> Stacks:
        """py-spy's raw (collapsed) output, or a file :meth:`write` made."""
        counts: Counter[tuple[str, ...]] = Counter()
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                counts[tuple(stack.split(";"))] += int(count)
        return cls(dict(counts))

    def write(self, path: str | Path) -> Path:
        """The same raw format, most samples first (flame-graph tools read it)."""
        lines = [f"{';'.join(stack)} {n}" for stack, n in sorted(self.counts.items(), key=lambda item: -item[1])]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return Path(path)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def under(self, frame: str, depth: int | None = None) -> Stacks:
        """The samples taken inside a call of ``frame`` (a frame's start: ``"generate (vllm/entrypoints/llm.py"``),
        each stack cut to the frames below that call's outermost frame (and to ``depth`` frames, when given); line
        numbers dropped so that the same function merges."""
        counts: Counter[tuple[str, ...]] = Counter()
        for stack, n in self.counts.items():
            start = next((i for i, f in enumerate(stack) if f.startswith(frame)), None)
            if start is None or start == len(stack) - 1:
                continue  # not inside the call, or in its own body (no frame below it)
            below = tuple(function_of(f) for f in stack[start + 1:])
            counts[below[:depth] if depth else below] += n
        return Stacks(dict(counts))

    def shares(self, top: int | None = None) -> list[tuple[str, float]]:
        """Each function's inclusive share of the samples (a stack counts once per function in it), largest first."""
        inclusive: Counter[str] = Counter()
        for stack, n in self.counts.items():
            for function in set(stack):
                inclusive[function] += n
        total = self.total or 1
        return [(function, n / total) for function, n in inclusive.most_common(top)]

    def share(self, function: str) -> float:
        """The inclusive share of the functions whose name starts with ``function`` (``"Scheduler.schedule ("``)."""
        total = self.total or 1
        return sum(n for stack, n in self.counts.items() if any(f.startswith(function) for f in stack)) / total
