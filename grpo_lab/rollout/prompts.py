"""Prompts to token ids, once, with one tokenizer (both backends get these ids); and :func:`check_tokenizers`, which
lists every difference between two tokenizers (objects or folders) that must be the same."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from grpo_lab.errors import ConfigError, DataError

Message = Mapping[str, str]
Prompt = Union[str, Sequence[Message]]


class TokenizerMismatchError(ConfigError):
    """Two tokenizers that must be identical (rollout engine vs trainer) differ."""


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt as the model sees it: the rendered text and its token ids."""

    text: str
    token_ids: tuple[int, ...]


def is_chat(prompt: Any) -> bool:
    """True for a list of ``{"role": ..., "content": ...}`` messages (TRL's conversational format)."""
    return isinstance(prompt, Sequence) and not isinstance(prompt, str)


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[EncodedPrompt]:
    """Render and tokenize prompts: chat messages through the chat template (assistant turn opened), strings as they
    are (with the tokenizer's usual special tokens)."""
    if isinstance(prompts, str) or (is_chat(prompts) and prompts and isinstance(prompts[0], Mapping)):
        raise DataError("pass a list of prompts: wrap a single prompt in a list, e.g. generate([prompt])")
    if len(prompts) == 0:
        raise DataError("no prompts given: pass at least one prompt (text or chat messages)")
    encoded = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not prompt:
                raise DataError(f"prompt {index} is an empty string")
            ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
            encoded.append(EncodedPrompt(prompt, tuple(ids)))
        elif is_chat(prompt):
            _check_messages(index, prompt)
            if not getattr(tokenizer, "chat_template", None):
                raise DataError(f"prompt {index} is a chat, but the tokenizer has no chat template: "
                                "pass plain text prompts or use a model folder with chat_template.jinja")
            text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds the special tokens
            encoded.append(EncodedPrompt(text, tuple(ids)))
        else:
            raise DataError(f"prompt {index} is a {type(prompt).__name__}: use a string or a list of "
                            "{'role': ..., 'content': ...} messages")
    return encoded


def _check_messages(index: int, messages: Sequence[Any]) -> None:
    if len(messages) == 0:
        raise DataError(f"prompt {index} is an empty list of messages")
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise DataError(f"prompt {index}: every message needs 'role' and 'content', got {message!r}")


def _load(tokenizer_or_path):
    if isinstance(tokenizer_or_path, (str, os.PathLike)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer_or_path), trust_remote_code=False)
    return tokenizer_or_path


def tokenizer_differences(first, second, names: tuple[str, str] = ("first", "second"),
                          max_listed: int = 5) -> list[str]:
    """Every way two tokenizers (objects or folders) differ: vocabulary, special tokens, chat template."""
    a, b = _load(first), _load(second)
    one, two = names
    problems = []
    vocab_a, vocab_b = a.get_vocab(), b.get_vocab()
    if len(vocab_a) != len(vocab_b):
        problems.append(f"vocabulary size differs: {len(vocab_a)} ({one}) vs {len(vocab_b)} ({two})")
    for owner, tokens in ((one, sorted(set(vocab_a) - set(vocab_b))), (two, sorted(set(vocab_b) - set(vocab_a)))):
        if tokens:
            problems.append(f"{len(tokens)} tokens only in the {owner} tokenizer, e.g. {tokens[:max_listed]}")
    moved = sorted(t for t in set(vocab_a) & set(vocab_b) if vocab_a[t] != vocab_b[t])
    if moved:
        examples = [f"{t!r}: {vocab_a[t]} vs {vocab_b[t]}" for t in moved[:max_listed]]
        problems.append(f"{len(moved)} tokens have different ids, e.g. {', '.join(examples)}")
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if getattr(a, name, None) != getattr(b, name, None):
            problems.append(f"{name} differs: {getattr(a, name, None)!r} ({one}) vs {getattr(b, name, None)!r} ({two})")
    template_a, template_b = getattr(a, "chat_template", None), getattr(b, "chat_template", None)
    if template_a != template_b:
        if template_a is None or template_b is None:
            problems.append(f"only the {one if template_a else two} tokenizer has a chat template")
        else:
            at = next((i for i, (x, y) in enumerate(zip(template_a, template_b)) if x != y),
                      min(len(template_a), len(template_b)))
            start = max(0, at - 20)
            problems.append(f"chat template differs from character {at}: ...{template_a[start:at + 30]!r} ({one}) "
                            f"vs ...{template_b[start:at + 30]!r} ({two})")
    return problems


def check_tokenizers(first, second, names: tuple[str, str] = ("rollout", "trainer")) -> None:
    """Raise :class:`TokenizerMismatchError` listing every difference; return quietly when they match."""
    problems = tokenizer_differences(first, second, names)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise TokenizerMismatchError(
            f"the {names[0]} and {names[1]} tokenizers differ, so completions would be decoded with the wrong "
            f"vocabulary (garbled text, wrong rewards):\n{listed}\n"
            f"Fix: load both from the same model folder (the rollout engine uses the model's own folder).")
