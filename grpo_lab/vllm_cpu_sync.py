"""Deprecated since grpo-lab 0.2.0, removed in 0.3.0: renamed :mod:`grpo_lab.weight_sync` (same functions).

Each name below still works, warns, and is ``grpo_lab.weight_sync``'s.
"""

from __future__ import annotations

from grpo_lab.deprecation import moved_names, warn_moved

warn_moved("grpo_lab.vllm_cpu_sync", "grpo_lab.weight_sync", stacklevel=3, since="0.2.0")

__getattr__ = moved_names(__name__, moved={
    name: f"grpo_lab.weight_sync:{name}" for name in (
        "install", "logprob_gap", "needs_cpu_sync", "repack_tied_lm_head", "sync_weights_via_reload",
        "trainer_logprobs", "vllm_logprobs", "vllm_runs_on_cpu")}, since="0.2.0")
