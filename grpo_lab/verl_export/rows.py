"""The data: course rows -> verl rows (one per prompt) -> parquet, and back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError

DATA_SOURCE = "grpo_lab/arithmetic"
ABILITY = "math"


def to_verl_row(row: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """One course row in verl's RL format; ``extra_info`` keeps the columns the rewards read.

    >>> to_verl_row({"id": "eval-00000", "type": "average", "lang": "en", "answer": "7", "unit": "",
    ...              "prompt": [{"role": "user", "content": "Q?"}]}, "eval", 0)["reward_model"]
    {'style': 'rule', 'ground_truth': '7'}
    """
    if "prompt" not in row or "answer" not in row:
        raise ConfigError(f"row {index} of the {split} split needs 'prompt' and 'answer' (has {sorted(row)}); "
                         "see grpo_lab.data for the row format.")
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [
        {"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    extra = {"split": split, "index": index, "question": messages[-1]["content"],
             **{key: str(row.get(key, "")) for key in ("id", "type", "lang", "unit")}, "answer": str(row["answer"])}
    return {"data_source": DATA_SOURCE, "prompt": messages, "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": str(row["answer"])}, "extra_info": extra}


def verl_rows(rows: Sequence[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [to_verl_row(row, split, i) for i, row in enumerate(rows)]


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return Path(path)


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a parquet file as plain Python lists and dicts (what verl's dataset sees, column by column)."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(path)).to_pylist()
