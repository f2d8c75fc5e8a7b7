"""What grpo_lab relies on in TRL, transformers and vLLM beyond their documented API, and how a module lists it.

A module that overrides, reads, sets or replaces such a name lists it in a module-level tuple whose name ends in
``_INTERNALS``, of :class:`UpstreamName` (``grpo_lab.trainer.TRL_INTERNALS``, ``grpo_lab.speedups.TRL_INTERNALS``,
``grpo_lab.weight_sync.UPSTREAM_INTERNALS`` ...). ``tests/test_upstream_api.py`` finds every such tuple in the package
and checks each name against the installed versions, so that an upstream rename fails a test instead of making an
override that is never called or a ``getattr`` that quietly takes its default.

Standard library only: :class:`grpo_lab.experiment.TrainConfig` reads :data:`SHARED_TRL_FIELDS` without loading TRL.
"""

from __future__ import annotations

from typing import NamedTuple


class UpstreamName(NamedTuple):
    """One name of TRL, transformers or vLLM that grpo_lab relies on."""

    kind: str
    """``method`` (a method of ``owner``, overridden or called), ``property`` (a property or class attribute of
    ``owner``, read or set), ``attribute`` (an attribute that ``owner``'s code sets, ``self.name = ...``, read here),
    ``module`` (a module-level name, replaced or called), ``batch`` (a key of the batch ``owner`` returns, read or
    written here), ``sample`` (a field of TRL's rollout sample), ``config`` (a field of the config dataclass ``owner``
    that grpo_lab sets or reads), ``not_config`` (a :class:`~grpo_lab.experiment.TrainConfig` field under a TRL-style
    name that TRL's config does *not* have)."""
    owner: str
    """The dotted path of the module, class or function the name belongs to."""
    name: str
    why: str
    """What grpo_lab does with it."""


KINDS = ("method", "property", "attribute", "module", "batch", "sample", "config", "not_config")

SHARED_TRL_FIELDS = ("output_dir", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "num_generations", "max_completion_length", "learning_rate", "lr_scheduler_type", "warmup_steps",
                     "temperature", "top_p", "gradient_checkpointing", "bf16", "use_cpu", "logging_steps",
                     "save_strategy", "save_steps", "save_total_limit", "seed", "data_seed", "report_to",
                     "log_completions", "vllm_server_timeout", "project", "run_name")
"""The fields of TRL's ``GRPOConfig`` and ``AsyncGRPOConfig`` that both trainers get from one experiment
(:meth:`grpo_lab.experiment.TrainConfig.trl_kwargs`); each trainer module lists them with its own fields."""
