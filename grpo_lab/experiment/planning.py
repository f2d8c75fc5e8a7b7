"""What the memory planner says of an experiment's step on a machine, one question each: the step's budget at a share
(:func:`step_budget`, :func:`planned_share`), the micro-batch a profile's step is split into (:func:`fit_micro_batch`), whether it needs
gradient checkpointing (:func:`needs_checkpointing`) and vLLM's share for ``"auto"`` (:func:`choose_vllm_memory`).

Each takes a config whose step shape is known (a :class:`~grpo_lab.experiment.TrainConfig` with its profile applied,
annotated by name: the config module imports this one) and calls the planner directly: none plans through another,
so resolving a config runs the planner a bounded number of times, in one straight line (``TrainConfig.resolve``).
"""

from __future__ import annotations

import dataclasses

from grpo_lab import device, memory
from grpo_lab.device import Machine


def step_budget(config: TrainConfig, machine: Machine, share: float | None) -> memory.MemoryBudget:
    """The planner's budget of ``config``'s step on ``machine`` with colocated vLLM at ``share`` (None: the planner's
    recommendation). ``bf16`` and ``gradient_checkpointing`` left open count as resolving would set them (bf16 where
    the machine trains in it; checkpointing on, TRL's default)."""
    bf16 = config.bf16 if config.bf16 is not None else machine.trains_in_bf16
    shaped = dataclasses.replace(config, bf16=bf16, gradient_checkpointing=config.gradient_checkpointing is not False)
    return memory.plan_memory(memory.model_config(config.model), precision=shaped.precision,
                              shape=shaped.training_shape(), device_memory_gib=machine.memory_gib,
                              device_kind=machine.kind, vllm_gpu_memory_utilization=share)


def planned_share(config: TrainConfig, machine: Machine) -> float | None:
    """The share a step is planned at: the config's number; for ``"auto"`` on the CPU or in server mode the share
    :func:`choose_vllm_memory` gives (not the planner's colocated one); else None (the planner's recommendation)."""
    share = config.vllm_gpu_memory_utilization
    if not isinstance(share, str):
        return share
    if device.VLLM_KV_CACHE_IN_BYTES[machine.kind] or config.vllm_mode == "server":
        return choose_vllm_memory(config, machine)[0]
    return None


def choose_vllm_memory(config: TrainConfig, machine: Machine) -> tuple[float, str]:
    """``(vllm_gpu_memory_utilization, why)`` for ``"auto"``: the one rule, in one place.

    * server mode: the rollout devices are vLLM's alone (:data:`memory.VLLM_MEMORY_FRACTION` ``"server"``);
    * the CPU: vLLM-CPU sizes its KV cache in bytes (``memory.CPU_KV_CACHE_GIB``) and only checks at start that this
      share of host memory is free, so the share is the least it needs (:func:`memory.cpu_vllm_fraction`);
    * an accelerator, colocated: the planner's recommendation, the largest share the trainer leaves; when nothing
      fits, :class:`memory.DoesNotFitError` says what would.
    """
    if config.vllm_mode == "server":
        return memory.VLLM_MEMORY_FRACTION["server"], "server mode: the rollout devices are vLLM's alone"
    if device.VLLM_KV_CACHE_IN_BYTES[machine.kind]:
        fraction = memory.cpu_vllm_fraction(memory.model_config(config.model), machine.memory_gib)
        return fraction, (f"vLLM-CPU: a KV cache of {memory.CPU_KV_CACHE_GIB:g} GiB plus the weights and runtime, "
                          f"as a share of {machine.memory_gib:.0f} GiB of host memory")
    budget = step_budget(config, machine, None)
    if budget.recommended is None:
        raise memory.DoesNotFitError(f"vllm_gpu_memory_utilization='auto': the memory planner finds no setting that "
                                     f"fits on {machine.memory_gib:.0f} GiB. {budget.advice} (Pass a number to try "
                                     f"anyway.)")
    return budget.recommended.vllm_gpu_memory_utilization, budget.summary().splitlines()[0]


def needs_checkpointing(config: TrainConfig, machine: Machine) -> bool:
    """Gradient checkpointing only where the step does not fit without it: the planner's verdict for the step without
    checkpointing, at the config's vLLM share (the best one when it is ``"auto"``). It costs a third more compute in
    the backward, so a step that fits without it runs without it."""
    try:
        budget = step_budget(dataclasses.replace(config, gradient_checkpointing=False), machine,
                             planned_share(config, machine))
    except memory.MemoryPlanError:  # the shape cannot be read: keep TRL's safe default
        return True
    return not budget.fits


def fit_micro_batch(config: TrainConfig, machine: Machine) -> tuple[int, int]:
    """``(per_device_train_batch_size, gradient_accumulation_steps)`` for a profile's step on ``machine``: the
    profile's completions per step (its ``per_device_train_batch_size``) in the fewest micro-batches that the planner
    says fit (with gradient checkpointing, the cheapest setting); the whole step when none does (then
    :func:`choose_vllm_memory` says what would fit). The CPU keeps the profile's micro-batch."""
    batch = config.per_device_train_batch_size
    if device.is_cpu(machine.kind):
        return batch, 1
    for accumulation in (n for n in range(1, batch + 1) if batch % n == 0):
        candidate = dataclasses.replace(config, per_device_train_batch_size=batch // accumulation,
                                        gradient_accumulation_steps=accumulation, gradient_checkpointing=True)
        try:
            if step_budget(candidate, machine, planned_share(config, machine)).recommended is not None:
                return batch // accumulation, accumulation
        except memory.MemoryPlanError:  # the model's shape cannot be read: keep the profile's step
            break
    return batch, 1
