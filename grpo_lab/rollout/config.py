"""Rollout settings: what to sample and how the engine is sized. An engine setting left ``None`` is chosen by
:meth:`RolloutConfig.resolve` for the device and the workload, with the reason :meth:`RolloutConfig.explain` shows.

>>> from grpo_lab.rollout import RolloutConfig
>>> config = RolloutConfig(n=4, max_tokens=32).resolve(device_kind="cpu", longest_prompt_tokens=60)
>>> config.max_model_len          # context_window: 1.1 x (60 + 32) = 101.2, rounded up
102
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from grpo_lab import device
from grpo_lab.errors import ConfigError
from grpo_lab.memory import (
    CPU_KV_CACHE_GIB,
    VLLM_MEMORY_FRACTION,
    ModelShape,
    check_vllm_memory_fraction,
    context_window,
)

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_HF_BATCH_SIZE = 256
LOAD_FORMATS = ("auto", "dummy")
SAMPLING_REASONS = {
    "n": "completions per prompt: GRPO's group size (TRL's num_generations)",
    "max_tokens": "longest completion in tokens (TRL's max_completion_length)",
    "temperature": "1.0 samples the model's own distribution; 0 is greedy",
    "top_p": "1.0 keeps the whole distribution (nucleus sampling off)",
    "seed": "repeatable sampling: every prompt and sample gets its own stream (HF: seeded before each call)",
    "stop": "extra stop strings; the end-of-sequence token always stops",
    "min_tokens": "the end token is held back until this many new tokens (= max_tokens: fixed-length completions)",
}
# Arguments engine_arguments() sets from RolloutConfig fields: vllm_options may not override them.
VLLM_MANAGED_ARGUMENTS = ("model", "tokenizer", "dtype", "max_model_len", "enable_prefix_caching", "max_num_seqs",
                          "enforce_eager", "load_format", "trust_remote_code", "seed", "gpu_memory_utilization",
                          "kv_cache_memory_bytes", "enable_sleep_mode")
# Arguments HFEngine passes to model.generate itself: hf_generate_options may not override them.
HF_MANAGED_ARGUMENTS = ("input_ids", "attention_mask", "max_new_tokens", "min_new_tokens", "eos_token_id",
                        "pad_token_id", "do_sample", "temperature", "top_p", "top_k", "num_return_sequences",
                        "logits_processor", "stop_strings", "tokenizer")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Sampling:
    """What to sample for each prompt, in vLLM's ``SamplingParams`` names (:data:`SAMPLING_REASONS` says what each
    does); ``min_tokens=max_tokens`` makes every completion exactly ``max_tokens`` long."""

    n: int = 4
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = 0
    stop: tuple[str, ...] = ()
    min_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"n={self.n!r}: the number of completions per prompt must be an integer >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens={self.max_tokens!r}: must be an integer >= 1 (new tokens per completion)")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature}: must be >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p}: must be in (0, 1] (1 keeps the whole distribution)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop={self.stop!r}: stop conditions must be non-empty strings")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(f"min_tokens={self.min_tokens!r}: must be an integer from 0 to "
                              f"max_tokens={self.max_tokens} (max_tokens gives fixed-length completions)")


SAMPLING_FIELDS = tuple(item.name for item in fields(Sampling))
"""The sampling settings, declared once in :class:`Sampling`; a :class:`RolloutConfig` takes them too."""


def _takes_sampling_fields(cls: type) -> type:
    """``RolloutConfig(n=8)`` is ``RolloutConfig(sampling=Sampling(n=8))``; ``config.n`` reads ``config.sampling.n``."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self, **kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in SAMPLING_FIELDS if name in kwargs}
        if given:
            kwargs["sampling"] = replace(kwargs.get("sampling") or Sampling(), **given)
        generated(self, **kwargs)

    cls.__init__ = __init__
    for name in SAMPLING_FIELDS:
        setattr(cls, name, property(lambda self, name=name: getattr(self.sampling, name), doc=f"``sampling.{name}``"))
    return cls


@_takes_sampling_fields
@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Sampling settings (``sampling``'s fields are keywords and attributes here too) plus engine settings under vLLM's
    names; ``None``: chosen for the device, with the reason. ``vllm_options`` / ``hf_generate_options``: more
    arguments for ``vllm.LLM`` / ``model.generate``, never one that has its own field."""

    sampling: Sampling = field(default_factory=Sampling)
    max_prompt_tokens: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    cpu_kvcache_gib: float | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = None
    enforce_eager: bool | None = None
    dtype: str | None = None
    enable_sleep_mode: bool = False
    load_format: str = "auto"
    hf_batch_size: int | None = None
    vllm_options: dict[str, Any] = field(default_factory=dict, hash=False)
    hf_generate_options: dict[str, Any] = field(default_factory=dict, hash=False)
    device_kind: str | None = None
    reasons: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, Sampling):
            raise ConfigError(f"sampling={self.sampling!r}: pass a grpo_lab.rollout.Sampling (or its fields as "
                              f"keywords: n=..., max_tokens=...)")
        check_vllm_memory_fraction(self.gpu_memory_utilization, "gpu_memory_utilization")
        for name in ("max_prompt_tokens", "max_model_len", "max_num_seqs", "hf_batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r}: must be a positive integer (or None to choose automatically)")
        if self.cpu_kvcache_gib is not None and self.cpu_kvcache_gib <= 0:
            raise ConfigError(f"cpu_kvcache_gib={self.cpu_kvcache_gib}: must be > 0 GiB "
                              "(1 is plenty for the tiny model)")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format={self.load_format!r}: use one of {', '.join(LOAD_FORMATS)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)} (or None for the device's choice)")
        if self.device_kind is not None:
            device.check_kind(self.device_kind)
        for name, managed in (("vllm_options", VLLM_MANAGED_ARGUMENTS), ("hf_generate_options", HF_MANAGED_ARGUMENTS)):
            clash = sorted(set(getattr(self, name)) & set(managed))
            if "trust_remote_code" in clash:
                raise ConfigError(f"{name} sets trust_remote_code: the engine never runs code shipped with a model "
                                  "folder; pick a model whose architecture transformers and vLLM support natively "
                                  "(Qwen2, Llama, ...)")
            if clash:
                raise ConfigError(f"{name} sets {clash}, which the engine sets itself: use the RolloutConfig field "
                                  f"of that name (or, for generate's own arguments, Sampling) instead")

    @property
    def resolved(self) -> bool:
        return self.device_kind is not None and self.max_model_len is not None and self.dtype is not None

    def resolve(self, device_kind: str | None = None, longest_prompt_tokens: int | None = None,
                model_path: str | None = None) -> RolloutConfig:
        """A copy with every ``None`` filled in for ``device_kind`` and the workload, each with its reason."""
        kind = device.check_kind(device_kind or self.device_kind or device.detect())
        model = _model_facts(model_path)
        reasons = dict(self.reasons)
        chosen: dict[str, Any] = {"device_kind": kind}
        reasons["device_kind"] = "given" if self.device_kind else "detected (grpo_lab.device.detect)"

        prompt_tokens = longest_prompt_tokens or self.max_prompt_tokens
        if prompt_tokens is not None:
            chosen["max_prompt_tokens"] = prompt_tokens
            reasons["max_prompt_tokens"] = ("measured: the longest prompt after the chat template"
                                            if longest_prompt_tokens else "given: the longest prompt planned")
        if self.max_model_len is None:
            if prompt_tokens is not None:
                value = context_window(prompt_tokens, self.max_tokens)
                reasons["max_model_len"] = (f"the write-up's rule (memory.context_window): ceil(1.1 x (longest prompt "
                                            f"{prompt_tokens} + max_tokens {self.max_tokens})), 10 % spare for a "
                                            f"prompt the engine counts a few tokens longer")
            elif model.get("max_position_embeddings"):
                value = int(model["max_position_embeddings"])
                reasons["max_model_len"] = ("the model's own context length (no prompt length known; pass "
                                            "prompts or max_prompt_tokens to size it to the workload)")
            else:
                raise ConfigError("max_model_len cannot be chosen: pass prompts, max_prompt_tokens or max_model_len")
            chosen["max_model_len"] = value
        else:
            reasons.setdefault("max_model_len", "given")
        max_model_len = chosen.get("max_model_len", self.max_model_len)
        if model.get("max_position_embeddings") and max_model_len > model["max_position_embeddings"]:
            raise ConfigError(f"max_model_len={max_model_len} exceeds the model's context length "
                              f"{model['max_position_embeddings']}: shorten the prompts or max_tokens")

        if self.dtype is None:
            chosen["dtype"] = str(device.preferred_dtype(kind)).removeprefix("torch.")
            reasons["dtype"] = device.PREFERRED_DTYPE_REASON[kind]
        else:
            reasons.setdefault("dtype", "given")

        if device.VLLM_KV_CACHE_IN_BYTES[kind]:
            reasons.setdefault("gpu_memory_utilization", "not used on the CPU: cpu_kvcache_gib sizes the KV cache")
            if self.cpu_kvcache_gib is None:
                chosen["cpu_kvcache_gib"] = CPU_KV_CACHE_GIB
            gib = chosen.get("cpu_kvcache_gib", self.cpu_kvcache_gib)
            capacity = _kv_capacity(model, gib, chosen.get("dtype", self.dtype))
            reasons["cpu_kvcache_gib"] = (("given" if self.cpu_kvcache_gib is not None else "course default")
                                          + f": host RAM reserved for the KV cache{capacity}")
        else:
            if self.gpu_memory_utilization is None:
                chosen["gpu_memory_utilization"] = VLLM_MEMORY_FRACTION["engine"]
                reasons["gpu_memory_utilization"] = (f"course default {VLLM_MEMORY_FRACTION['engine']} for a "
                                                     "standalone engine: other work (a trainer, a second engine) "
                                                     "still fits beside it; an experiment passes its own")
            else:
                reasons.setdefault("gpu_memory_utilization", "given")
            reasons.setdefault("cpu_kvcache_gib", "not used on accelerators")

        reasons.setdefault("enable_prefix_caching",
                           "GRPO sends every prompt n times: with the cache its KV is computed once and shared"
                           if self.enable_prefix_caching else "given: off (every sample recomputes its prompt)")
        if self.max_num_seqs is None:
            chosen["max_num_seqs"] = DEFAULT_MAX_NUM_SEQS
            reasons["max_num_seqs"] = ("vLLM's default: up to 256 sequences decode together (continuous "
                                       "batching); prompts x n beyond that wait for a free slot")
        if self.enforce_eager is None:
            chosen["enforce_eager"] = device.VLLM_EAGER_BY_DEFAULT[kind]
            reasons["enforce_eager"] = device.VLLM_EAGER_REASON[kind]
        reasons.setdefault("enable_sleep_mode", "on: sleep()/wake_up() free device memory between rollouts"
                           if self.enable_sleep_mode else "off (turn on to use sleep()/wake_up() on CUDA or Ascend)")
        reasons.setdefault("load_format", "random weights of the right shape: speed only, outputs are noise"
                           if self.load_format == "dummy" else "the model's own weights, from safetensors only")
        reasons.setdefault("vllm_options", "given: more vllm.LLM arguments" if self.vllm_options
                           else "none: vLLM's defaults for everything without a field here")
        reasons.setdefault("hf_generate_options", "given: more model.generate arguments" if self.hf_generate_options
                           else "none: transformers' defaults (dynamic KV cache)")
        if self.hf_batch_size is None:
            chosen["hf_batch_size"] = DEFAULT_HF_BATCH_SIZE
            reasons["hf_batch_size"] = ("HF backend: sequences per generate call; each call runs as long as "
                                        "its longest member, padding the rest")
        for name, why in SAMPLING_REASONS.items():
            reasons.setdefault(name, why)
        if not device.VLLM_PER_REQUEST_SEEDS[kind]:
            reasons["seed"] = ("repeatable sampling: the engine is seeded at start (vLLM-CPU cannot seed single "
                               "requests), HF generate before each call")
        return replace(self, **chosen, reasons=reasons)

    def explain(self) -> str:
        """A table: each setting, its value and why (resolving first for the detected device if needed)."""
        config = self if self.resolved else self.resolve()
        rows = [(name, _show(getattr(config, name)), config.reasons.get(name, "")) for name in setting_names()]
        width = max(len(r[0]) for r in rows)
        value_width = max(len(r[1]) for r in rows)
        lines = [f"{'setting':<{width}}  {'value':<{value_width}}  why", "-" * (width + value_width + 40)]
        lines += [f"{name:<{width}}  {value:<{value_width}}  {why}" for name, value, why in rows]
        return "\n".join(lines)


def setting_names() -> tuple[str, ...]:
    """Every setting of a :class:`RolloutConfig` by its constructor name: the sampling fields, then the engine's."""
    engine = (item.name for item in fields(RolloutConfig) if item.name not in ("sampling", "reasons"))
    return (*SAMPLING_FIELDS, *engine)


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value) if value else "{}"
    if isinstance(value, tuple):
        return repr(list(value)) if value else "[]"
    return str(value)


def _model_facts(model_path: str | None) -> dict[str, Any]:
    """Context length and KV-cache values per token of a local model folder (empty where unknown)."""
    if not model_path or not (Path(model_path) / "config.json").is_file():
        return {}
    try:
        shape = ModelShape.from_config(model_path)
    except ConfigError:
        return {}
    return {"max_position_embeddings": shape.max_position_embeddings,
            "kv_values_per_token": shape.kv_cache_bytes_per_token(1)}  # K and V, every layer


def _kv_capacity(model: dict[str, Any], gib: float, dtype: str | None) -> str:
    values = model.get("kv_values_per_token")
    if not values:
        return ""
    bytes_per_value = 4 if dtype in (None, "float32") else 2
    tokens = int(gib * 2**30 // (values * bytes_per_value))
    return f" ({tokens:,} tokens at {values * bytes_per_value:,} bytes per token for this model)"

