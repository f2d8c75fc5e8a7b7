"""Committed results: where they live (:data:`BENCHMARKS_DIR`), how a benchmark's JSON file is read
(:func:`read_committed`), and the provenance its records carry (:class:`Provenance`).

Each results file has one reader in this package, which turns the JSON into a small typed record; notebooks print
records and their provenance line, and never open the files themselves.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import GrpoLabError

BENCHMARKS_DIR = Path(__file__).resolve().parent.parent
"""The ``benchmarks/`` folder this package lives in: every committed result is under it."""
RESULTS_DIR = BENCHMARKS_DIR / "results"
"""The bench's committed runs and their catalogue (:func:`lab.bench.read_catalogue`)."""


class CommittedResultError(GrpoLabError, FileNotFoundError):
    """A committed result file is missing or is not the JSON its reader expects; the message names the file."""


@dataclass(frozen=True)
class Provenance:
    """Where a committed number came from, as its file records it: the command that measured it, when, on what
    device, at which commit (empty where the file does not say)."""

    command: str
    date: str
    """The day it was measured, ``YYYY-MM-DD`` (a file's full timestamp is cut to its day)."""
    device: str
    path: Path
    commit: str = ""

    def __post_init__(self) -> None:
        day = re.match(r"\d{4}-\d{2}-\d{2}", self.date)
        if day:
            object.__setattr__(self, "date", day.group(0))

    @property
    def file(self) -> str:
        """The committed file's name."""
        return self.path.name

    @property
    def where(self) -> str:
        """The committed file's path from the repository (``benchmarks/...``); a file elsewhere, as given."""
        path = Path(self.path).resolve()
        return f"benchmarks/{path.relative_to(BENCHMARKS_DIR)}" if path.is_relative_to(BENCHMARKS_DIR) else str(path)

    def line(self) -> str:
        """``measured on DEVICE, DATE, commit C: COMMAND (benchmarks/FILE)``, each part as the file records it (or
        "not recorded"), for a notebook's printout."""
        facts = [self.device or "device not recorded", self.date or "date not recorded"]
        if self.commit:
            facts.append(f"commit {self.commit}")
        return f"measured on {', '.join(facts)}: {self.command or 'command not recorded'} ({self.where})"


def read_committed(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; a missing or malformed file is an error that names it."""
    path = Path(path)
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CommittedResultError(f"{path} is missing: it is a committed result (git checkout it, or re-run the "
                                   "benchmark its folder's README names).") from error
    except json.JSONDecodeError as error:
        raise CommittedResultError(f"{path} is not valid JSON ({error}); restore it with git checkout.") from error
    if not isinstance(body, dict):
        raise CommittedResultError(f"{path} holds a {type(body).__name__}, not the JSON object its reader expects.")
    return body
