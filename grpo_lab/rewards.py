"""Rule rewards in TRL's signature, a registry, weighted combination, verl adapters and validation.

Every reward is a callable ``f(prompts, completions, **kwargs) -> list[float | None]``, the form
``trl.GRPOTrainer(reward_funcs=[...])`` accepts: ``completions`` are strings or chat-message lists, dataset columns
(``answer``, ``unit``, ``lang`` …) arrive as keyword lists, one value per completion, and ``None`` means "does not apply
to this sample" (TRL leaves it out of the sum). :func:`prepare` turns names or functions into a :class:`RewardSet`.
Standard library only: the verl export copies this file verbatim into its reward module.

>>> reward = get_reward("correctness")
>>> reward(prompts=["q"], completions=["60 ÷ 2 = 30 km/h\\n#### 30"], answer=["30"])
[1.0]
>>> why("The answer is 25 km/h", "30")
'wrong value: found 25 (last number in the text), expected 30'
"""

from __future__ import annotations

__all__ = [
    "RewardSet", "RewardSignatureError", "RewardValidationError", "completion_text", "extract_answer", "from_verl",
    "get_reward", "is_correct", "list_rewards", "prepare", "register_reward", "score_all", "to_verl", "validate_reward",
    "weighted_sum", "why",
]

import functools
import inspect
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

try:  # inside grpo_lab; the verl export copies this file alone, where the package may be absent
    from grpo_lab.errors import ConfigError, DataError, GrpoLabError
except ImportError:  # pragma: no cover - only in a verl reward worker, where grpo_lab is not installed
    class GrpoLabError(Exception):
        """Stand-in for grpo_lab.errors.GrpoLabError."""

    class ConfigError(GrpoLabError, ValueError):
        """Stand-in for grpo_lab.errors.ConfigError and DataError."""

    DataError = ConfigError

logger = logging.getLogger(__name__)

ANSWER_MARKER = "####"  # the course's final-answer marker: completions end with ``#### <number>``

RewardFunc = Callable[..., list]
"""A reward function in TRL's signature ``f(prompts, completions, **kwargs) -> list[float | None]``."""


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
# The full-width comma "，" lists numbers in Chinese ("100，200，300"), never separates thousands.

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


def is_correct(completion: Any, answer: Any) -> bool:
    """The course's accuracy rule (the ``correctness`` reward with ``require_marker=True``): the number after the last
    ``####`` equals ``answer``.

    >>> is_correct("3 × 4 = 12 #### 12", "12"), is_correct("so it is 12", "12")
    (True, False)
    """
    return check_answer(completion, answer, require_marker=True).score == 1.0


def is_correct_lenient(completion: Any, answer: Any) -> bool:
    """The final number (:func:`extract_answer`) equals ``answer``, marker or not: beside :func:`is_correct` it tells
    learning the arithmetic from learning the format.

    >>> is_correct_lenient("so it is 12", "12"), is_correct("so it is 12", "12")
    (True, False)
    """
    return check_answer(completion, answer).score == 1.0


def why(completion: Any, answer: Any, **options: Any) -> str:
    """One sentence saying why ``completion`` scores what it scores against ``answer``.

    >>> why("I think it is about thirty", "30")
    'no number found in the completion'
    """
    return check_answer(completion, answer, **options).reason


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


@dataclass
class LengthWindowReward(_Named):
    """1.0 when the completion has ``min_chars`` to ``max_chars`` characters, else 0.0 (gamed by padding)."""

    min_chars: int = 10
    max_chars: int = 200
    name: str = "length_window"

    def __post_init__(self) -> None:
        if not 0 <= self.min_chars <= self.max_chars:
            raise ConfigError(f"Need 0 <= min_chars <= max_chars, got {self.min_chars} and {self.max_chars}.")

    def score(self, completion: Any) -> float:
        return 1.0 if self.min_chars <= len(completion_text(completion).strip()) <= self.max_chars else 0.0


@dataclass
class KeywordReward(_Named):
    """The fraction of ``keywords`` present in the completion (0.0 … 1.0)."""

    keywords: tuple[str, ...] = (ANSWER_MARKER,)
    case_sensitive: bool = False
    name: str = "keyword"

    def __post_init__(self) -> None:
        if isinstance(self.keywords, str) or not self.keywords:
            raise ConfigError("`keywords` must be a non-empty tuple of strings, e.g. ('####', '=').")
        self.keywords = tuple(self.keywords)

    def score(self, completion: Any) -> float:
        fold = (lambda s: s) if self.case_sensitive else str.casefold
        text = fold(completion_text(completion))
        return sum(fold(k) in text for k in self.keywords) / len(self.keywords)


@dataclass
class ContainsAnswerReward(_Named):
    """1.0 when the reference answer appears anywhere in the text as a number (gameable: list many numbers)."""

    answer_column: str = "answer"
    name: str = "contains_answer"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        expected = [reference_value(a) for a in _column(kwargs, self.answer_column, self.name, len(completions))]
        return [float(any(math.isclose(float(v), e, abs_tol=1e-6) for _, v in find_numbers(completion_text(c))))
                for c, e in zip(completions, expected)]


_TOKEN = re.compile(r"[\u3400-\u9fff]|[^\W_]+|[^\w\s]+")


def tokenize_for_repetition(text: str) -> list[str]:
    """Words, numbers and punctuation runs; each CJK character is its own token.

    >>> tokenize_for_repetition("速度 is 30 km/h")
    ['速', '度', 'is', '30', 'km', '/', 'h']
    """
    return _TOKEN.findall(text)


@dataclass
class RepetitionPenalty(_Named):
    """``max_penalty * (1 - distinct n-grams / all n-grams)``, in [max_penalty, 0]; 0.0 without n-grams."""

    ngram_size: int = 3
    max_penalty: float = -1.0
    name: str = "repetition_penalty"

    def __post_init__(self) -> None:
        if self.ngram_size < 1:
            raise ConfigError(f"ngram_size must be at least 1, got {self.ngram_size}.")
        if self.max_penalty > 0:
            raise ConfigError(f"max_penalty must be <= 0 (it is a penalty), got {self.max_penalty}.")

    def score(self, completion: Any) -> float:
        tokens = tokenize_for_repetition(completion_text(completion))
        ngrams = [tuple(tokens[i : i + self.ngram_size]) for i in range(len(tokens) - self.ngram_size + 1)]
        return self.max_penalty * (1 - len(set(ngrams)) / len(ngrams)) + 0.0 if ngrams else 0.0  # + 0.0: -0.0 -> 0.0


@dataclass
class ToolCallCost(_Named):
    """``-cost`` for each tool call the answer's assistant turns made (0.0 for a text answer): beside correctness, a
    call pays only where it makes the answer right."""

    cost: float = 0.1
    name: str = "tool_call_cost"

    def __post_init__(self) -> None:
        if self.cost < 0:
            raise ConfigError(f"cost must be >= 0 (it is taken off per call), got {self.cost}.")

    def score(self, completion: Any) -> float:
        if isinstance(completion, str):
            return 0.0
        calls = sum(len(message.get("tool_calls") or []) for message in completion
                    if isinstance(message, dict) and message.get("role") == "assistant")
        return -self.cost * calls + 0.0  # + 0.0: -0.0 -> 0.0


def reward_name(fn: Callable) -> str:
    """The name TRL logs a reward under (``rewards/<name>/mean``): ``__name__``, else the class name."""
    while isinstance(fn, functools.partial):  # as trl.trainer.utils.get_callable_name does
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def weighted_sum(values: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """TRL's per-completion combination: ``nansum(reward_i * weight_i)``, None counting as NaN; None when every
    reward is None (TRL gives such a completion advantage 0).

    >>> weighted_sum([1.0, None, 0.5], [2.0, 1.0, 1.0])
    2.5
    """
    if len(values) != len(weights):
        raise ConfigError(f"Got {len(values)} rewards but {len(weights)} weights; give one weight per reward function.")
    present = [v * w for v, w in zip(values, weights) if v is not None and not math.isnan(v)]
    return sum(present) if present else None


def _weights(weights: Sequence[float] | None, count: int, error: type[Exception]) -> list[float]:
    resolved = [1.0] * count if weights is None else [float(w) for w in weights]
    if len(resolved) != count:
        raise error(f"Number of reward weights ({len(resolved)}) must match number of reward functions ({count}); "
                    "give one weight per function, in the same order.")
    return resolved


@dataclass
class RewardTable:
    """Every reward function's values for a batch of completions, and their TRL-weighted total."""

    names: list[str]
    weights: list[float]
    values: list[list[float | None]]
    """``values[i][j]``: reward function ``j`` on completion ``i`` (the layout of TRL's ``rewards_per_func``)."""
    totals: list[float | None]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per completion: each reward by name, then ``total``."""
        return [dict(zip(self.names, row), total=total) for row, total in zip(self.values, self.totals)]

    def to_frame(self):
        import pandas as pd  # a dependency of ``datasets``

        return pd.DataFrame(self.rows())


def score_all(reward_funcs: Sequence[Callable], prompts: Sequence[Any], completions: Sequence[Any],
              reward_weights: Sequence[float] | None = None, **columns: Any) -> RewardTable:
    """Each reward function once on the batch, combined as ``GRPOTrainer`` does with ``reward_weights``."""
    weights = _weights(reward_weights, len(reward_funcs), RewardValidationError)
    per_func = [list(fn(prompts=prompts, completions=completions, **columns)) for fn in reward_funcs]
    for fn, out in zip(reward_funcs, per_func):
        if len(out) != len(completions):
            raise RewardValidationError(f"Reward '{reward_name(fn)}' returned {len(out)} values for {len(completions)} "
                                        "completions. Wrap it with validate_reward() to see which sample went wrong.")
    values = [[None if out[i] is None else float(out[i]) for out in per_func] for i in range(len(completions))]
    totals = [weighted_sum(v, weights) for v in values]
    return RewardTable([reward_name(f) for f in reward_funcs], weights, values, totals)


@dataclass
class WeightedReward(_Named):
    """Several rewards folded into one function: the total TRL computes from ``reward_funcs=[a, b]`` with
    ``reward_weights`` (which logs each reward separately); use it where one callable is needed."""

    reward_funcs: Sequence[Callable]
    weights: Sequence[float] | None = None
    name: str = "weighted"

    def __post_init__(self) -> None:
        if not self.reward_funcs:
            raise ConfigError("WeightedReward needs at least one reward function.")
        self.weights = _weights(self.weights, len(self.reward_funcs), ConfigError)

    def table(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> RewardTable:
        return score_all(self.reward_funcs, prompts, completions, self.weights, **kwargs)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return self.table(prompts, completions, **kwargs).totals


_REGISTRY: dict[str, Callable[..., RewardFunc]] = {
    "correctness": CorrectnessReward, "format": FormatReward, "length_window": LengthWindowReward,
    "keyword": KeywordReward, "contains_answer": ContainsAnswerReward, "repetition_penalty": RepetitionPenalty,
    "tool_call_cost": ToolCallCost}


def register_reward(name: str, factory: Callable[..., RewardFunc], *, overwrite: bool = False) -> None:
    """Make ``get_reward(name, **options)`` build rewards with ``factory(**options)``."""
    if name in _REGISTRY and not overwrite:
        raise ConfigError(f"A reward named '{name}' is already registered; pass overwrite=True to replace it.")
    _REGISTRY[name] = factory


def list_rewards() -> list[str]:
    """Names accepted by ``get_reward``."""
    return sorted(_REGISTRY)


def get_reward(name: str, /, **options: Any) -> RewardFunc:
    """Build a registered reward by name, e.g. ``get_reward("length_window", min_chars=5, max_chars=80)``."""
    if name not in _REGISTRY:
        raise ConfigError(f"Unknown reward '{name}'. Known rewards: {', '.join(list_rewards())}. Use one of "
                          f"these names, or add yours with register_reward('{name}', factory).")
    return _REGISTRY[name](**options)


_TRL_INTERNAL_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"})


def from_verl(compute_score: Callable[..., Any], *, answer_column: str = "answer",
              default_data_source: str = "grpo_lab", name: str | None = None) -> RewardFunc:
    """A verl ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` (a number or ``{"score"}``)
    as a TRL reward: ``ground_truth`` from ``answer_column``, ``data_source`` from its column, others in extra_info."""

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        answers = _column(kwargs, answer_column, reward.__name__, n)
        sources = kwargs.get("data_source") or [default_data_source] * n
        columns = {k: v for k, v in kwargs.items() if k not in _TRL_INTERNAL_KWARGS
                   and k not in (answer_column, "data_source") and isinstance(v, Sequence) and not isinstance(v, str)
                   and len(v) == n}
        scores = []
        for i, completion in enumerate(completions):
            extra_info = {"prompt": prompts[i], **{k: v[i] for k, v in columns.items()}}
            out = compute_score(data_source=sources[i], solution_str=completion_text(completion),
                                ground_truth=answers[i], extra_info=extra_info)
            if isinstance(out, Mapping):
                if "score" not in out:
                    raise RewardValidationError(f"verl compute_score '{reward.__name__}' returned a dict without a "
                                                f"'score' key (keys: {sorted(out)}). verl expects a float or a dict "
                                                "with 'score'.")
                out = out["score"]
            scores.append(None if out is None else float(out))
        return scores

    reward.__name__ = name or reward_name(compute_score)
    reward.__doc__ = f"TRL reward adapted from the verl compute_score {reward_name(compute_score)!r}."
    return reward


def _verl_columns(data_source: str, ground_truth: Any, extra_info: Mapping | None,
                  answer_column: str) -> tuple[Any, dict[str, list]]:
    """verl's arguments as TRL's: the prompt (``extra_info["prompt"]``, else ``["question"]``) and one-row columns
    (every other ``extra_info`` entry, ``answer_column`` = ``ground_truth``, ``data_source``)."""
    extra = dict(extra_info or {})
    prompt = extra.pop("prompt", extra.get("question", ""))
    columns = {key: [value] for key, value in extra.items()}
    columns.update({answer_column: [ground_truth], "data_source": [data_source]})
    return prompt, columns


def to_verl(trl_reward: RewardFunc, *, answer_column: str = "answer", none_score: float = 0.0) -> Callable[..., float]:
    """A TRL reward as verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``."""

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None,
                      **_: Any) -> float:
        prompt, columns = _verl_columns(data_source, ground_truth, extra_info, answer_column)
        out = list(trl_reward(prompts=[prompt], completions=[solution_str], **columns))
        if len(out) != 1:
            raise RewardValidationError(f"Reward '{reward_name(trl_reward)}' returned {len(out)} values for one "
                                        "completion.")
        return none_score if out[0] is None else float(out[0])

    compute_score.__name__ = reward_name(trl_reward)
    compute_score.__doc__ = f"verl compute_score adapted from the TRL reward {reward_name(trl_reward)!r}."
    return compute_score


class RewardValidationError(GrpoLabError, ValueError):
    """A reward function broke TRL's contract; the message names the function, the sample and the fix."""


class RewardSignatureError(GrpoLabError, TypeError):
    """A reward function cannot be called the way TRL calls it."""


@dataclass(frozen=True)
class RewardIssue:
    """One problem found while validating a reward function's output."""

    function: str
    index: int | None  # the sample index, or None when the problem concerns the whole batch
    problem: str
    fix: str

    @property
    def message(self) -> str:
        where = "the batch" if self.index is None else f"sample {self.index}"
        return f"Reward function '{self.function}' failed on {where}: it {self.problem}. Fix: {self.fix}."


def check_reward_signature(fn: Callable) -> None:
    """Raise ``RewardSignatureError`` unless ``fn`` accepts TRL's keywords (prompts, completions, **kwargs)."""
    name = reward_name(fn)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature to inspect
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    raise RewardSignatureError(
        f"Reward function '{name}' does not accept **kwargs. TRL calls it as {name}(prompts=..., completions=..., "
        "completion_ids=..., trainer_state=..., <every dataset column>=...). "
        f"Fix: define it as `def {name}(prompts, completions, **kwargs)` and read columns from kwargs.")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_FIX_TYPE = "return a float per completion (e.g. 1.0 or 0.0), or None for samples the function cannot score"
_FIX_FINITE = "guard divisions and logs (NaN/inf poison the group mean); return None for samples it cannot score"
_FIX_RAISE = "handle this input inside the function, or return None for samples it cannot score (TRL ignores None)"


REWARD_ERROR_MODES = ("raise", "skip")


def check_error_mode(mode: str) -> str:
    if mode not in REWARD_ERROR_MODES:
        raise RewardValidationError(f"reward_errors={mode!r}: use 'raise' (stop at a broken reward with a message "
                                    f"saying what to fix) or 'skip' (record None for that sample and go on).")
    return mode


class ValidatedReward:
    """A reward function behind :func:`validate_reward`'s checks (``check_values=False``: the call's only)."""

    def __init__(self, fn: Callable, mode: Literal["raise", "skip"] = "raise", check_values: bool = True) -> None:
        check_error_mode(mode)
        check_reward_signature(fn)
        self.fn, self.mode, self.check_values = fn, mode, check_values
        self.__name__ = reward_name(fn)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn
        self.issues: list[RewardIssue] = []

    def __repr__(self) -> str:
        return f"validate_reward({self.__name__}, mode={self.mode!r})"

    def _report(self, index: int | None, problem: str, fix: str, cause: BaseException | None = None) -> None:
        """Record the problem; raise it in "raise" mode, else warn (the sample, or the batch, gets None)."""
        issue = RewardIssue(self.__name__, index, problem, fix)
        self.issues.append(issue)
        if self.mode == "raise":
            raise RewardValidationError(issue.message) from cause
        logger.warning("%s Recorded None for it and went on.", issue.message)

    def _check_value(self, index: int, value: Any) -> float | None:
        if value is None or not self.check_values:
            return value
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            return self._report(index, f"returned {_describe(value)} ({type(value).__name__}), not a number", _FIX_TYPE)
        try:
            number = float(value)
        except (TypeError, ValueError) as error:
            return self._report(index, f"returned {_describe(value)} ({type(value).__name__}), which float() rejects "
                                       f"({error})", _FIX_TYPE)
        if not math.isfinite(number):
            return self._report(index, f"returned {number}", _FIX_FINITE)
        return number

    def _call_one(self, index: int, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict) -> float | None:
        """Re-run the function on sample ``index`` alone, to find which sample makes it raise."""
        n = len(completions)

        def one(v: Any) -> Any:
            return [v[index]] if isinstance(v, Sequence) and not isinstance(v, str) and len(v) == n else v

        try:
            columns = {k: one(v) for k, v in kwargs.items()}
            out = self.fn(prompts=[prompts[index]], completions=[completions[index]], **columns)
        except Exception as error:  # noqa: BLE001 - a user function may raise anything; we report it
            text = completion_text(completions[index])
            return self._report(index, f"raised {type(error).__name__}: {error} (completion: {_describe(text)})",
                                _FIX_RAISE, error)
        out = list(out) if isinstance(out, Iterable) and not isinstance(out, (str, bytes, Mapping)) else [out]
        if len(out) != 1:
            return self._report(index, f"returned {len(out)} values for a single completion",
                                "return exactly one value per completion")
        return self._check_value(index, out[0])

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        try:
            out = self.fn(prompts=prompts, completions=completions, **kwargs)
        except RewardValidationError:
            raise
        except Exception as error:  # noqa: BLE001
            issues_before = len(self.issues)
            results = [self._call_one(i, prompts, completions, kwargs) for i in range(n)]
            if len(self.issues) == issues_before:  # each sample alone was fine: the batch as a whole fails
                self._report(None, f"raised {type(error).__name__}: {error}, although each sample alone works",
                             _FIX_RAISE, error)
                return [None] * n
            return results
        if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Iterable):
            self._report(None, f"returned {_describe(out)} ({type(out).__name__}) instead of a list",
                         "return a list of floats, one per completion, in the order of `completions`")
            return [None] * n
        out = list(out)
        if len(out) != n:
            self._report(None, f"returned {len(out)} values for {n} completions",
                         "return exactly one float (or None) per completion, in the order of `completions`")
            return [None] * n
        return [self._check_value(i, value) for i, value in enumerate(out)]


def validate_reward(fn: Callable, mode: Literal["raise", "skip"] = "raise") -> ValidatedReward:
    """Wrap a reward function so that a broken output stops with a message a person can act on: the signature now;
    on each call exceptions (re-run per sample to find the culprit), a non-list, the wrong count, non-numbers, NaN and
    ±inf. ``"raise"`` stops at the first (:class:`RewardValidationError`); ``"skip"`` warns and records None for the
    sample. Problems are kept in ``.issues``; ``__name__`` is kept, so TRL's metric names stay the same.

    >>> safe = validate_reward(lambda prompts, completions, **kw: [1 / len(c) for c in completions], mode="skip")
    >>> safe(prompts=["a", "b"], completions=["ok", ""])
    [0.5, None]
    """
    return ValidatedReward(fn, mode)


def _is_reward_model(fn: Any) -> bool:
    """A ``torch.nn.Module`` reward model (TRL scores with it itself), detected without importing torch."""
    return any(cls.__module__.startswith("torch.nn") and cls.__name__ == "Module" for cls in type(fn).__mro__)


@dataclass
class RewardSet:
    """Reward functions ready for ``GRPOTrainer(reward_funcs=...)`` with ``GRPOConfig(reward_weights=...)``."""

    funcs: list[Callable]
    weights: list[float]

    @property
    def names(self) -> list[str]:
        """The names TRL logs them under (``rewards/<name>/mean``)."""
        return [reward_name(fn) for fn in self.funcs]

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> RewardTable:
        """Each reward on a batch and the weighted totals, as ``GRPOTrainer`` combines them."""
        return score_all(self.funcs, prompts, completions, self.weights, **columns)

    def to_verl(self) -> Callable[..., dict[str, float]]:
        """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``: ``"score"`` is the
        weighted total (0.0 when no reward applies: verl has no "not applicable"), plus each reward by name and
        ``"acc"`` (= correctness, when present) for verl's logs. Columns come as :func:`to_verl` passes them."""

        def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None,
                          **_: Any) -> dict[str, float]:
            prompt, columns = _verl_columns(data_source, ground_truth, extra_info, "answer")
            table = self.score([prompt], [solution_str], **columns)
            result = {name: 0.0 if value is None else float(value) for name, value in zip(table.names, table.values[0])}
            if "correctness" in result:
                result["acc"] = result["correctness"]
            total = table.totals[0]
            return {"score": 0.0 if total is None else float(total), **result}

        compute_score.__name__ = "compute_score"
        return compute_score


def prepare(rewards: Sequence[str | Callable], weights: Sequence[float] | None = None,
            errors: Literal["raise", "skip"] = "raise") -> RewardSet:
    """Reward functions for training from registry names and/or your own functions, each guarded as ``errors`` says
    (:func:`validate_reward`; registry rewards' values are always checked, yours with ``"skip"`` only). One already
    wrapped keeps its mode; reward models (``torch.nn.Module``) are left to TRL. ``weights``: TRL's ``reward_weights``.

    >>> prepare(["correctness", "format"], [1.0, 0.2]).names
    ['correctness', 'format']
    """
    check_error_mode(errors)
    if isinstance(rewards, (str, bytes)) or not rewards:
        raise RewardValidationError(f"rewards={rewards!r}: give a list of reward names ({', '.join(list_rewards())}) "
                                    f"or functions f(prompts, completions, **kwargs).")
    funcs: list[Callable] = []
    for reward in rewards:
        if isinstance(reward, str):
            funcs.append(ValidatedReward(get_reward(reward), mode=errors))
        elif isinstance(reward, ValidatedReward) or _is_reward_model(reward):
            funcs.append(reward)
        else:
            funcs.append(ValidatedReward(reward, mode=errors, check_values=errors == "skip"))
    resolved = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
    if len(resolved) != len(funcs):
        raise RewardValidationError(f"{len(resolved)} reward_weights for {len(funcs)} rewards "
                                    f"{[reward_name(f) for f in funcs]}: give one weight per reward, in the same "
                                    "order.")
    return RewardSet(funcs, resolved)
