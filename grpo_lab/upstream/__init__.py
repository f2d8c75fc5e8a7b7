"""grpo_lab's one boundary with TRL, vLLM and transformers.

Every name of theirs that grpo_lab relies on beyond their documented API is declared here, each with the version it
was checked against and the condition under which it can go, and the code that touches those names lives here too.
Modules outside this package use the upstream projects' public API and what this package exports.

* :mod:`grpo_lab.upstream.trl`: :data:`~grpo_lab.upstream.trl.TRL_FIELDS` (the public ``GRPOConfig`` and
  ``AsyncGRPOConfig`` fields grpo_lab sets or reads), :data:`~grpo_lab.upstream.trl.TRL_INTERNALS`, and the file
  weight transport of TRL's server-mode and asynchronous clients;
* :mod:`grpo_lab.upstream.vllm`: :data:`~grpo_lab.upstream.vllm.VLLM_INTERNALS`, the weight reload of a vLLM-CPU
  engine (with the tied ``lm_head`` re-packed), the LoRA adapter handed to an engine, the reload extension of a vLLM
  server, and an engine's shutdown;
* :mod:`grpo_lab.upstream.transformers`: :data:`~grpo_lab.upstream.transformers.TRANSFORMERS_INTERNALS` and trackio
  without its dashboard;
* :mod:`grpo_lab.upstream.trainer`: :class:`~grpo_lab.upstream.trainer.GRPOLabTrainer`, the one subclass of TRL's
  ``GRPOTrainer`` (imports TRL, which loads vLLM: seconds);
* :mod:`grpo_lab.upstream.async_trainer`: the subclass of TRL's ``AsyncGRPOTrainer`` with its staleness gate and the
  workarounds it runs with (imports TRL's experimental trainer).

The declarations import none of the upstream projects: ``tests/test_upstream_api.py`` reads every ``*_FIELDS`` and
``*_INTERNALS`` list of this package, checks each name against the installed versions, and scans grpo_lab for private
upstream names read and upstream attributes replaced outside this package.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["KINDS", "UpstreamName"]


class UpstreamName(NamedTuple):
    """One name of TRL, vLLM or transformers that grpo_lab relies on."""

    kind: str
    """One of :data:`KINDS`."""
    owner: str
    """The dotted path of the module, class or function the name belongs to."""
    name: str
    why: str
    """What grpo_lab does with it."""
    checked: str
    """The upstream version it was checked against (``"trl 1.16.0"``)."""
    goes_when: str = ""
    """The condition under which grpo_lab can stop relying on it; empty for a public field (``*_FIELDS``)."""


KINDS: dict[str, str] = {
    "method": "a method of ``owner``, overridden or called",
    "attribute": "an attribute that ``owner``'s code sets (``self.name = ...``), read here",
    "module": "a module-level name of ``owner``, called or read",
    "patch": "a module-level name of ``owner`` that grpo_lab replaces while it runs, then restores: a patch site",
    "batch": "a key of the batch ``owner`` builds, read here",
    "sample": "a field of the rollout sample ``owner`` (a dataclass), read here",
    "config": "a field of the config dataclass ``owner`` that grpo_lab sets or reads",
    "not_config": "a field under a TRL-style name that grpo_lab's TrainConfig has and ``owner`` does not",
}
"""What each :attr:`UpstreamName.kind` means."""
