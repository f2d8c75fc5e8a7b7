"""Choosing a backend and opening an engine: :func:`open_engine` checks everything, then starts one. ``"auto"``
picks vLLM where it runs and says why; an explicit backend that cannot run is an error, never a silent fallback."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from grpo_lab import device
from grpo_lab.errors import ConfigError, MissingFileError
from grpo_lab.models import MANIFEST_NAME, adapter_model, require_safetensors, resolve_model, verify_model_dir
from grpo_lab.rollout.config import RolloutConfig, setting_names
from grpo_lab.rollout.engine import BackendChoice, BackendUnavailableError, RolloutEngine, check_prompt_lengths
from grpo_lab.rollout.hf_backend import HFEngine
from grpo_lab.rollout.prompts import Prompt, encode_prompts
from grpo_lab.rollout.vllm_backend import BorrowedVLLMEngine, VLLMEngine, vllm_usable
from grpo_lab.upstream.vllm import engine_context_length

BACKENDS = ("auto", "vllm", "hf")


def choose_backend(backend: str = "auto", device_kind: str | None = None) -> BackendChoice:
    """The backend asked for (an error where it cannot run), or for ``"auto"`` vLLM where it runs, else HF, and why."""
    wanted = str(backend).strip().lower()
    if wanted not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    kind = device_kind or device.detect()
    if wanted == "hf":
        return BackendChoice("hf", "asked for: transformers' model.generate")
    usable, why = vllm_usable(kind)
    if wanted == "vllm":
        if not usable:
            raise BackendUnavailableError(f"backend='vllm' was asked for but {why}")
        return BackendChoice("vllm", f"asked for: {why}")
    if usable:
        return BackendChoice("vllm", f"auto: {why}")
    return BackendChoice("hf", f"auto: HF generate, because {why}")


def open_engine(model: str | os.PathLike[str] | None = None, config: RolloutConfig | None = None,
                backend: str = "auto", prompts: Sequence[Prompt] | None = None, **overrides) -> RolloutEngine:
    """Check everything, then start a rollout engine. ``model``: a folder or hub id (default: ``GRPO_LAB_MODEL`` or the
    tiny model); ``overrides``: RolloutConfig fields; ``prompts`` size ``max_model_len`` and are checked first.

    >>> with open_engine(backend="hf", n=2, max_tokens=8) as engine:          # doctest: +SKIP
    ...     result = engine.generate([[{"role": "user", "content": "2 + 3 = ?"}]])
    >>> len(result.outputs[0].completions)                                      # doctest: +SKIP
    2
    """
    if str(backend).strip().lower() not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    known = set(setting_names())
    if set(overrides) - known:
        raise ConfigError(f"unknown setting(s) {sorted(set(overrides) - known)}; RolloutConfig has: {sorted(known)}")
    config = replace(config or RolloutConfig(), **overrides)
    model_path = resolve_model(model)
    adapter = adapter_model(model_path) if Path(model_path).is_dir() else None
    if adapter is not None and str(backend).strip().lower() == "vllm":
        raise ConfigError(f"{model_path} is {adapter.describe()}: the rollout engine samples it with HF generate "
                          f"(backend='hf' or 'auto'); vLLM serves it as an adapter (grpo_lab.deploy.served_weights).")
    if Path(model_path).is_dir():
        if adapter is None and not (Path(model_path) / "config.json").is_file():
            raise MissingFileError(f"{model_path} has no config.json: pass the folder that holds the model")
        if (Path(model_path) / MANIFEST_NAME).is_file():
            verify_model_dir(model_path)
        if config.load_format != "dummy":
            require_safetensors(model_path)
    kind = device.check_kind(config.device_kind) if config.device_kind else device.detect()
    choice = (BackendChoice("hf", f"{adapter.describe()}: HF generate, PEFT applying the adapter") if adapter
              else choose_backend(backend, kind))
    tokenizer = load_tokenizer(model_path)
    encoded = encode_prompts(tokenizer, prompts) if prompts is not None else []
    config = config.resolve(kind, max((len(p.token_ids) for p in encoded), default=None),
                            resolve_model(adapter.base) if adapter else model_path)
    check_prompt_lengths(encoded, config.max_model_len, config.max_tokens)
    engine_class = VLLMEngine if choice.name == "vllm" else HFEngine
    engine: RolloutEngine = engine_class(model_path, tokenizer, config, choice)
    engine.check_settings()
    return engine.start()


def borrow_engine(llm, model_path: str | os.PathLike[str], config: RolloutConfig | None = None,
                  release: Callable[[], None] | None = None, **overrides) -> RolloutEngine:
    """The rollout interface over a running ``vllm.LLM`` another owns (a trainer's colocated engine); ``stop()`` leaves
    it running and calls ``release``. ``config`` / ``overrides`` set the sampling."""
    config = replace(config or RolloutConfig(), **overrides)
    model_path = str(model_path)
    kind = device.check_kind(config.device_kind) if config.device_kind else device.detect()
    config = replace(config, max_model_len=engine_context_length(llm)).resolve(kind, None, model_path)
    choice = BackendChoice("vllm", "the trainer's own colocated vLLM engine, with the policy's current weights")
    return BorrowedVLLMEngine(llm, model_path, load_tokenizer(model_path), config, choice, release).start()


def load_tokenizer(model_path: str):
    """The one tokenizer both backends and the trainer use, from the model's own folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path, trust_remote_code=False)
