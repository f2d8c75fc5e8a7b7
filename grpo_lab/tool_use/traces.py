"""Tool-call traces from the course's own problems: a row's reference working (``"60 ÷ 2 = 30 km/h"``) gives the
call, the tool's answer and ``#### 30``; :func:`priming_rows` mixes them with direct answers.

>>> row = {"prompt": [{"role": "user", "content": "Q"}], "answer": "30", "completion": "60 ÷ 2 = 30 km/h\\n#### 30"}
>>> trace(row, call_tool=True)["completion"][0]["tool_calls"][0]["function"]["arguments"]
{'expression': '60 ÷ 2'}
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from grpo_lab.data import ANSWER_MARKER
from grpo_lab.errors import ConfigError, DataError
from grpo_lab.tools import calculator
from grpo_lab.tool_use.tasks import STATED_TYPE


def expression_of(row: dict[str, Any]) -> str:
    """The calculation of a row's reference working: ``"2 × (3 + 4) = 14 m"`` -> ``"2 × (3 + 4)"``; a problem whose
    answer the question states (``tasks.STATED_TYPE``) calls with the answer itself."""
    if row.get("type") == STATED_TYPE:
        return str(row["answer"])
    working = str(row.get("completion", "")).split("\n", 1)[0]
    if "=" not in working:
        raise DataError(f"row {row.get('id', '?')}: its reference working {working!r} has no '=': a trace needs the "
                        f"calculation (the course's rows have 'completion': '<calculation> = <result> ...').")
    return working.rsplit("=", 1)[0].strip()


def trace(row: dict[str, Any], call_tool: bool, tool_answer: str | None = None) -> dict[str, Any]:
    """One SFT example (TRL's conversational prompt-completion format): a calculator call, its answer (``tool_answer``,
    default the calculator's) and the reference answer, or the reference answer alone."""
    if not call_tool:
        return {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": row["completion"]}]}
    expression = expression_of(row)
    if tool_answer is None:
        tool_answer = calculator(expression)
    final = {"role": "assistant", "content": f"{ANSWER_MARKER}{row['answer']}"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]}
    return {"prompt": row["prompt"],
            "completion": [call, {"role": "tool", "name": "calculator", "content": tool_answer}, final]}


def priming_rows(rows: Sequence[dict[str, Any]], tool_share: float, plain_share: float = 0.0,
                 seed: int = 0) -> list[dict[str, Any]]:
    """A trace per row with a ``"tools"`` flag: ``plain_share`` without the tool offered, and of the others
    ``tool_share`` calling the calculator, the rest answering directly (drawn with ``seed``)."""
    for name, share in (("tool_share", tool_share), ("plain_share", plain_share)):
        if not 0 <= share <= 1:
            raise ConfigError(f"{name}={share}: a share of the traces, from 0 to 1")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    plain = round(plain_share * len(rows))
    without, calling = set(order[:plain]), set(order[plain:plain + round(tool_share * (len(rows) - plain))])
    return [{**trace(row, call_tool=index in calling), "tools": index not in without} for index, row in enumerate(rows)]
