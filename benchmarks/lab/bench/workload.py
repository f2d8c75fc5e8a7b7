"""The workload every part of the bench samples: prompts shaped as the write-up's, the ragged lengths (drawn, or
ended by a stated share of the vocabulary for random weights), and model folders of a public model's shape with random
weights (:data:`SHAPES`), which the lab's speed runs load."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

from grpo_lab.data import load_split
from grpo_lab.errors import ConfigError
from grpo_lab.models import resolve_model
from grpo_lab.rollout import encode_prompts

# Architectures of public models (their config.json values), for speed runs with random weights.
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def shaped_model_dir(shape: str, out_dir: str | Path, tokenizer_from: str | Path | None = None,
                     random_weights: bool = False) -> Path:
    """Write ``config.json`` of a known architecture plus a tokenizer into ``out_dir`` (no weights).

    Load it with ``load_format="dummy"``. The vocabulary keeps the real size, so the embedding and output
    layer cost what they cost in the real model; sampled ids beyond the small tokenizer decode to nothing.
    ``random_weights=True`` also saves randomly initialised bf16 weights (``model.safetensors``) for loaders
    without a dummy mode, such as TRL's trainer (about 1 GB for 0.5B, 3 GB for 1.5B).
    """
    from transformers import Qwen2Config

    if shape not in SHAPES:
        raise ConfigError(f"unknown shape {shape!r}: use one of {', '.join(SHAPES)}")
    source = Path(resolve_model(tokenizer_from))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    tokenizer_config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1_000_000.0,
                         rms_norm_eps=1e-6, torch_dtype="bfloat16",
                         bos_token_id=tokenizer_config.get("bos_token_id"),
                         eos_token_id=tokenizer_config.get("eos_token_id"),
                         pad_token_id=tokenizer_config.get("pad_token_id"))
    config.save_pretrained(out)
    if random_weights:
        import torch
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    return out


RAGGED_STOP_PROBABILITY = 1 / 160
"""The ragged GRPO workload on random weights: the share of the vocabulary that ends a completion, so that each
sampled token ends it with about this probability (lengths roughly geometric, mean ~0.5 x 256 tokens)."""


def seed_workload(tokenizer, count: int, prompt_tokens: int) -> list[dict[str, Any]]:
    """``count`` course problems as chat prompts of about ``prompt_tokens`` tokens (chat template included).

    Each eval question follows its *own* solved train examples (same language), cut to the token budget, so
    no two prompts share a header: what prefix caching can share is a prompt among its ``n`` samples, as in
    GRPO. Rows keep ``answer``/``type``/``lang``/``unit``, so the GRPO step can score them.
    """
    questions = load_split("eval")
    pools: dict[str, list[dict]] = {}
    for row in load_split("train"):
        pools.setdefault(row["lang"], []).append(row)
    cursors = {lang: 0 for lang in pools}
    rows = []
    for index in range(count):
        row = questions[index % len(questions)]
        question = row["prompt"][-1]["content"]
        budget = prompt_tokens - len(encode_prompts(tokenizer, [[{"role": "user", "content": question}]])[0].token_ids)
        header = ""
        if budget > 2:
            pool, parts, ids = pools[row["lang"]], [], []
            while len(ids) < budget:
                example = pool[cursors[row["lang"]] % len(pool)]
                cursors[row["lang"]] += 1
                parts.append(f"{example['prompt'][-1]['content']}\n{example['completion']}")
                ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            header = tokenizer.decode(ids[:budget - 2], skip_special_tokens=True).rstrip() + "\n\n"
        rows.append({**{key: row.get(key) for key in ("id", "type", "lang", "answer", "unit")},
                     "prompt": [{"role": "user", "content": header + question}]})
    return rows


def draw_lengths(num_prompts: int, n: int, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Completion lengths for the ragged variant with random weights: uniform integers from
    ``max(1, max_tokens // 16)`` to ``max_tokens`` (mean about 0.53 x max_tokens), fixed seed."""
    low = max(1, max_tokens // 16)
    rng = random.Random(seed)
    return [[rng.randint(low, max_tokens) for _ in range(n)] for _ in range(num_prompts)]


def ragged_description(mode: str, max_tokens: int) -> str:
    """What the ragged variant's lengths are, in words, for the results file."""
    if mode == "eos":
        return "each completion ends at the model's end token (or max_tokens), as GRPO rollouts do"
    return (f"lengths drawn uniformly from {max(1, max_tokens // 16)}..{max_tokens} tokens (fixed seed; the same "
            f"lengths for every config); random weights almost never sample the end token")


def ragged_model_dir(model: str | Path, out_dir: str | Path,
                     stop_probability: float = RAGGED_STOP_PROBABILITY) -> tuple[Path, dict[str, Any]]:
    """A view of a model folder (its files linked) whose ``generation_config.json`` ends a completion at any of
    ``round(stop_probability x vocab)`` token ids besides the end token: HF ``generate``, vLLM and TRL's completion
    masks all read that list, so random weights (which practically never sample the end token) give GRPO-like ragged
    completions, the same way for both backends. Returns the folder and what was set."""
    source, out = Path(model), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "generation_config.json":
            (out / path.name).symlink_to(path.resolve())
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    vocab = int(config["vocab_size"])
    end = config.get("eos_token_id")
    ends = [end] if isinstance(end, int) else list(end or [])
    count = max(1, round(stop_probability * vocab))
    stride = vocab // count
    stops = [i for i in range(stride // 2, vocab, stride)][:count]
    generation = {"eos_token_id": sorted(set(ends) | set(stops)), "pad_token_id": config.get("pad_token_id"),
                  "bos_token_id": config.get("bos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1), encoding="utf-8")
    mean = (1 - (1 - count / vocab) ** 256) / (count / vocab)  # geometric, cut at 256, if sampling were uniform
    return out, {"stop_token_ids": len(generation["eos_token_id"]), "vocab_size": vocab,
                 "stop_probability": count / vocab,
                 "lengths": f"each sampled token ends the completion with probability ~{count / vocab:.4f} "
                            f"({count} of {vocab} ids, plus the end token): roughly geometric lengths (mean ~"
                            f"{mean:.0f} of 256 if sampling were uniform; the measured mean is reported per step)"}
