"""An experiment's training rows, the defaults a model's manifest gives, and length checks. Each takes a
:class:`~grpo_lab.experiment.TrainConfig` (annotated by name: the config module imports this one)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_lab import memory, models
from grpo_lab.data import SplitConfig, load_jsonl, load_split
from grpo_lab.errors import ConfigError
from grpo_lab.rollout import encode_prompts


def model_languages(model: str) -> tuple[str, ...] | None:
    """The languages the model's manifest says it reads (``"languages"``), else None (all)."""
    manifest = models.read_manifest(model)
    return manifest.languages if manifest and manifest.languages else None


def default_train_types(model: str) -> tuple[str, ...] | None:
    """The types with a deliberate slip in the model's manifest (the shipped tiny model), else None (all)."""
    manifest = models.read_manifest(model)
    return manifest.slip_types if manifest and manifest.slip_types else None


def fine_tuned_on_training_rows(config: TrainConfig) -> bool:
    """Whether the model's manifest records fine-tuning on this very training file."""
    manifest = models.read_manifest(config.model or "")
    recorded = manifest.train_sha256 if manifest else None
    dataset = Path(config.dataset) if config.dataset else SplitConfig().path("train")
    return bool(recorded) and dataset.is_file() and models.file_sha256(dataset) == recorded


def load_train_rows(config: TrainConfig) -> list[dict[str, Any]]:
    """The dataset's rows (default the shipped split) in the run's languages and types, at most ``train_size``."""
    rows = load_jsonl(config.dataset, answer_column=config.answer_column) if config.dataset else load_split("train")
    if config.train_languages:
        known = {row.get("lang") for row in rows}
        if not known & set(config.train_languages):
            raise ConfigError(f"train_languages {list(config.train_languages)} do not occur in the dataset; its "
                              f"languages are {sorted(map(str, known))}")
        rows = [row for row in rows if row.get("lang") in config.train_languages]
    if config.train_types:
        known = {row.get("type") for row in rows}
        unknown = [t for t in config.train_types if t not in known]
        if unknown:
            raise ConfigError(f"train_types {unknown} do not occur in the dataset; its types are "
                              f"{sorted(map(str, known))}")
        rows = [row for row in rows if row.get("type") in config.train_types]
    if config.train_size is not None:
        rows = rows[:config.train_size]
    return rows


def check_lengths(config: TrainConfig, max_model_len: int | None) -> None:
    """Raise unless the experiment's context window fits in the model's (``max_position_embeddings``)."""
    if max_model_len is not None and config.max_model_len > max_model_len:
        longest = math.floor(round(max_model_len / memory.CONTEXT_MARGIN, 6)) - config.max_prompt_length
        raise ConfigError(
            f"the context window for max_prompt_length {config.max_prompt_length} + max_completion_length "
            f"{config.max_completion_length} (memory.context_window: 10 % spare) = {config.max_model_len} exceeds the "
            f"model's max_model_len ({max_model_len}). Lower max_completion_length to at most {max(1, longest)}, or "
            f"shorten the prompts.")


def check_prompt_lengths(rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int,
                         tools: Sequence[Any] = ()) -> int:
    """The longest prompt in tokens, as the trainer sees it (``tools`` listed in it); raise above
    ``max_prompt_length`` (TRL would not truncate)."""
    if tools:
        lengths = [len(tokenizer.apply_chat_template(row["prompt"], tools=list(tools), add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)) for row in rows]
    else:
        lengths = [len(p.token_ids) for p in encode_prompts(tokenizer, [row["prompt"] for row in rows])]
    longest = max(lengths, default=0)
    longest_row = lengths.index(longest) if lengths else 0
    if longest > max_prompt_length:
        raise ConfigError(f"row {longest_row} has a {longest}-token prompt, longer than max_prompt_length="
                          f"{max_prompt_length}. Raise max_prompt_length (and keep it + max_completion_length within "
                          f"the model's max length) or drop the long rows.")
    return longest
