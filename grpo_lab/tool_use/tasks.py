"""The tool lesson's problems: training on some problem types, evaluation on types whose calculation it never saw, and
problems whose answer the question states, where no call is needed.

A problem's *calculation form* is its reference working with the numbers taken out (``"60 ÷ 2 = 30 km/h"`` ->
``"N ÷ N"``). The types in :data:`UNSEEN_TYPES` have forms no other type shares, so a model that learned to call the
calculator on them learned the habit, not the copying of a form it was shown. The *stated* problems ask for a number
the question gives ("Tom has 7 pens and 3 cups. How many pens does Tom have?"): the calculator cannot help, so their
call share says whether the model learned *when* to call.

>>> expression_form({"completion": "2 × (3 + 4) = 14 m\\n#### 14"})
'N × (N + N)'
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.data import LANGS, load_split, stated_problem
from grpo_lab.errors import ConfigError

UNSEEN_TYPES: tuple[str, ...] = ("work_rate", "average", "change_money", "age_difference")
"""Problem types the lesson never trains on: their calculation forms (``(N + N) × N``, ``(N + N + N) ÷ N``,
``N - N``) belong to no trained type."""
STATED_TYPE = "stated"
"""The ``type`` of a problem whose answer the question states (``data.stated_problem``)."""


def expression_form(row: dict[str, Any]) -> str:
    """The calculation of a row's reference working with its numbers replaced by ``N`` (a stated problem's: ``N``,
    the number it calls with)."""
    if row.get("type") == STATED_TYPE:
        return "N"
    working = str(row.get("completion", "")).split("\n", 1)[0]
    return re.sub(r"\d+(?:\.\d+)?", "N", working.rsplit("=", 1)[0].strip())


def stated_rows(count: int, seed: int, languages: Sequence[str] = LANGS, id_prefix: str = "stated") -> list[dict]:
    """``count`` problems whose answer the question states beside a second number, in the shipped rows' format
    (their working is the number itself: ``"7 pens\\n#### 7"``), deterministic in ``seed``."""
    languages = tuple(languages) or LANGS
    unknown = [lang for lang in languages if lang not in LANGS]
    if unknown or count < 0:
        raise ConfigError(f"stated_rows: count must be >= 0 and languages from {list(LANGS)}, got {count}, {unknown}")
    rng = random.Random(seed)
    return [stated_problem(rng, languages[index % len(languages)]).to_row(f"{id_prefix}-{index:05d}")
            for index in range(count)]


@dataclass(frozen=True)
class LessonProblems:
    """The lesson's three sets of problems, every one in the trained languages."""

    train: list[dict[str, Any]]
    """Training problems (priming and GRPO): the shipped train split without :data:`UNSEEN_TYPES`, and stated ones."""
    unseen: list[dict[str, Any]]
    """Problems of :data:`UNSEEN_TYPES` (the eval split's first, then the train split's, which the lesson never
    trains on): calculation forms the training never shows."""
    stated: list[dict[str, Any]]
    """Held-out stated problems: no call is needed."""

    @property
    def evaluation(self) -> list[dict[str, Any]]:
        """What each evaluation answers: the unseen problems, then the stated ones."""
        return self.unseen + self.stated

    def unseen_forms_in_training(self) -> set[str]:
        """Calculation forms of the unseen problems that training shows (empty, or the lesson is not what it says)."""
        return {expression_form(row) for row in self.unseen} & {expression_form(row) for row in self.train}


def lesson_problems(languages: Sequence[str], eval_size: int, stated_share: float = 0.2) -> LessonProblems:
    """The lesson's problems in ``languages`` (empty: all): ``eval_size`` unseen problems from the shipped splits,
    ``stated_share`` of that again in stated ones, and training problems of the other types with stated ones mixed
    in at the same share."""
    if not 0 <= stated_share < 1:
        raise ConfigError(f"stated_share={stated_share}: a share of the problems, from 0 to below 1")
    keep = set(languages) or set(LANGS)
    shipped = [row for split in ("eval", "train") for row in load_split(split) if row["lang"] in keep]
    train = [row for row in shipped if row["type"] not in UNSEEN_TYPES and row["id"].startswith("train")]
    unseen = [row for row in shipped if row["type"] in UNSEEN_TYPES][:eval_size]
    if len(unseen) < eval_size:
        raise ConfigError(f"eval_size={eval_size}: the shipped splits have {len(unseen)} problems of the unseen types "
                          f"in {sorted(keep)}")
    ordered = sorted(keep, key=LANGS.index)
    stated = stated_rows(round(stated_share * eval_size), seed=2, languages=ordered, id_prefix="stated-eval")
    asked = {row["prompt"][0]["content"] for row in stated}
    mixed = train + [row for row in stated_rows(round(stated_share * len(train)), seed=1, languages=ordered,
                                                id_prefix="stated-train") if row["prompt"][0]["content"] not in asked]
    random.Random(0).shuffle(mixed)
    return LessonProblems(mixed, unseen, stated)
