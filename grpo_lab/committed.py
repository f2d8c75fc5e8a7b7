"""Committed results: how a benchmark's JSON file under ``benchmarks/`` is read, and the provenance its records carry.

Each benchmark's file has one reader beside the benchmark's module (``scale.results``, ``verl_parity``), which turns
the JSON into a small typed record; notebooks print records and never open the files themselves.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import GrpoLabError


class CommittedResultError(GrpoLabError, FileNotFoundError):
    """A committed result file is missing or is not the JSON its reader expects; the message names the file."""


@dataclass(frozen=True)
class Provenance:
    """Where a committed number came from: the command that measured it, when, and on what device."""

    command: str
    date: str
    """The day it was measured, ``YYYY-MM-DD`` (a file's full timestamp is cut to its day)."""
    device: str
    path: Path

    def __post_init__(self) -> None:
        day = re.match(r"\d{4}-\d{2}-\d{2}", self.date)
        if day:
            object.__setattr__(self, "date", day.group(0))

    @property
    def file(self) -> str:
        """The committed file's name."""
        return self.path.name

    def line(self) -> str:
        """``measured on DEVICE, DATE: COMMAND``, for a notebook's printout."""
        return f"measured on {self.device}, {self.date}: {self.command}"


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
