"""The rollout interface every backend implements (:class:`RolloutEngine`) and what ``generate`` returns; prompts are
encoded once here and checked against ``max_model_len`` before any backend sees them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_lab import device
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.rollout.config import RolloutConfig, Sampling
from grpo_lab.rollout.prompts import EncodedPrompt, Prompt, encode_prompts


class RolloutError(GrpoLabError, RuntimeError):
    """The engine cannot do what was asked (e.g. sleep on a platform without sleep mode, use after stop)."""


class BackendUnavailableError(RolloutError):
    """An explicitly requested backend cannot run here; the message says why and what to install."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its text, token ids and why it ended (``"stop"``: the end token or a stop string;
    ``"length"``: ``max_tokens`` ran out)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True)
class PromptRollout:
    """The ``n`` completions of one prompt, with the prompt as the model saw it."""

    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    completions: tuple[Completion, ...]

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.completions]


@dataclass(frozen=True)
class RolloutResult:
    """Everything one ``generate`` call produced, per prompt, plus its timings."""

    backend: str
    outputs: tuple[PromptRollout, ...]
    sampling: Sampling
    load_s: float
    generate_s: float

    @property
    def new_tokens(self) -> int:
        """Generated tokens, all prompts and samples together (prompt tokens not counted)."""
        return sum(len(c.token_ids) for o in self.outputs for c in o.completions)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.generate_s if self.generate_s > 0 else float("nan")

    @property
    def texts(self) -> list[list[str]]:
        """``texts[i][j]``: sample ``j`` of prompt ``i``."""
        return [o.texts for o in self.outputs]

    def summary(self) -> str:
        sequences = sum(len(o.completions) for o in self.outputs)
        return (f"{self.backend}: {len(self.outputs)} prompts x n={self.sampling.n} = {sequences} completions, "
                f"{self.new_tokens} new tokens in {self.generate_s:.2f} s = {self.tokens_per_s:,.0f} tokens/s "
                f"(engine load {self.load_s:.1f} s)")


@dataclass
class BackendChoice:
    """Which backend was picked and why (shown to the user)."""

    name: str
    reason: str


class RolloutEngine:
    """Base class: prompts, checks, timing and lifecycle (a context manager); backends implement ``_start``,
    ``_generate``, ``_stop`` and, where they can, ``_sleep``/``_wake_up``."""

    name = "base"

    def __init__(self, model_path: str, tokenizer, config: RolloutConfig, choice: BackendChoice):
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.config = config
        self.choice = choice
        self.load_s = float("nan")
        self.asleep = False
        self.stopped = False

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> RolloutEngine:
        started = time.perf_counter()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.load_s = time.perf_counter() - started
        return self

    def stop(self) -> None:
        """Free the model and end every process the engine started. Safe to call twice."""
        if not self.stopped:
            self.stopped = True
            self._stop()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def supports_sleep(self) -> bool:
        """Whether :meth:`sleep` can free device memory on this platform with these settings."""
        return False

    def sleep(self, level: int = 1) -> None:
        """Free device memory between rollouts (level 1: weights offloaded, KV cache dropped)."""
        self._check_usable()
        if not self.supports_sleep:
            raise RolloutError(self._no_sleep_reason())
        self._sleep(level)
        self.asleep = True

    def wake_up(self) -> None:
        self._check_usable(allow_asleep=True)
        if self.asleep:
            self._wake_up()
            self.asleep = False

    # ---- generation -----------------------------------------------------------------------------------
    def encode(self, prompts: Sequence[Prompt], max_tokens: int | None = None) -> list[EncodedPrompt]:
        """Prompts as token ids (chat template applied once), checked to fit in ``max_model_len``."""
        encoded = encode_prompts(self.tokenizer, prompts)
        check_prompt_lengths(encoded, self.config.max_model_len, max_tokens or self.config.max_tokens)
        return encoded

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling | None = None,
                 progress: bool = False, lengths: Sequence[Sequence[int]] | None = None) -> RolloutResult:
        """Sample ``sampling.n`` completions per prompt; ``lengths[i][j]``: sample ``j`` of prompt ``i``'s length."""
        self._check_usable()
        sampling = sampling or self.config.sampling
        encoded = self.encode(prompts, sampling.max_tokens)
        lengths = check_completion_lengths(lengths, len(encoded), sampling)
        device.synchronize(self.config.device_kind)
        started = time.perf_counter()
        outputs = self._generate(encoded, sampling, progress, lengths)
        device.synchronize(self.config.device_kind)
        elapsed = time.perf_counter() - started
        return RolloutResult(self.name, tuple(outputs), sampling, self.load_s, elapsed)

    def _check_usable(self, allow_asleep: bool = False) -> None:
        if self.stopped:
            raise RolloutError(f"the {self.name} engine was stopped; open a new one with open_engine(...)")
        if self.asleep and not allow_asleep:
            raise RolloutError(f"the {self.name} engine is asleep; call wake_up() first")

    def describe(self) -> str:
        """Backend, why it was chosen, the model and the settings table."""
        return (f"backend: {self.name} ({self.choice.reason})\nmodel:   {self.model_path}\n"
                f"device:  {self.config.device_kind}\n\n{self.config.explain()}")

    # ---- for backends ---------------------------------------------------------------------------------
    def check_settings(self) -> None:
        """Backend-specific checks of the resolved settings, run before the engine starts."""

    def _start(self) -> None:
        raise NotImplementedError

    def _generate(self, prompts: list[EncodedPrompt], sampling: Sampling, progress: bool,
                  lengths: tuple[tuple[int, ...], ...] | None = None) -> list[PromptRollout]:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def _sleep(self, level: int) -> None:
        raise NotImplementedError

    def _wake_up(self) -> None:
        raise NotImplementedError

    def _no_sleep_reason(self) -> str:
        return f"the {self.name} backend has no sleep mode here; stop() the engine to free its memory"


def decode_completion(tokenizer, token_ids: Sequence[int], stop: Sequence[str], finish_reason: str) -> Completion:
    """Text from token ids, alike for every backend: decoded in one piece, cut before the first stop string."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    if cut >= 0:
        return Completion(text[:cut], tuple(token_ids), "stop")
    return Completion(text, tuple(token_ids), finish_reason)


def check_completion_lengths(lengths: Sequence[Sequence[int]] | None, num_prompts: int,
                             sampling: Sampling) -> tuple[tuple[int, ...], ...] | None:
    """Validate per-sample completion lengths: one row per prompt of ``n`` integers from 1 to ``max_tokens``."""
    if lengths is None:
        return None
    rows = tuple(tuple(row) for row in lengths)
    if len(rows) != num_prompts:
        raise ConfigError(f"lengths has {len(rows)} rows for {num_prompts} prompts: give one row per prompt")
    for index, row in enumerate(rows):
        if len(row) != sampling.n or any(not isinstance(v, int) or not 1 <= v <= sampling.max_tokens for v in row):
            raise ConfigError(f"lengths[{index}]={list(row)}: need n={sampling.n} integers from 1 to "
                              f"max_tokens={sampling.max_tokens}")
    if sampling.temperature == 0 and any(len(set(row)) > 1 for row in rows):
        raise ConfigError("lengths that differ within a prompt need sampling (temperature > 0): greedy samples of "
                          "a prompt are one and the same completion")
    return rows


def check_prompt_lengths(prompts: Sequence[EncodedPrompt], max_model_len: int, max_tokens: int) -> None:
    """Raise when a prompt plus ``max_tokens`` does not fit in ``max_model_len``."""
    for index, prompt in enumerate(prompts):
        length = len(prompt.token_ids)
        if length + max_tokens > max_model_len:
            what = ("is longer than" if length >= max_model_len
                    else f"leaves no room for max_tokens={max_tokens} within")
            raise ConfigError(
                f"prompt {index} has {length} tokens and {what} max_model_len={max_model_len}. "
                f"Shorten the prompt, lower max_tokens, or open the engine with max_model_len >= "
                f"{length + max_tokens} (or pass the prompts to open_engine so it sizes the window itself).")
