"""What the memory planner says of an experiment's step on a machine, one question each. Each takes a
:class:`~grpo_lab.experiment.TrainConfig` with its profile applied (annotated by name: the config module imports this
one) and calls the planner directly, so resolving a config plans a bounded number of times."""

from __future__ import annotations

import dataclasses

from grpo_lab import device, memory
from grpo_lab.device import Machine


def step_budget(config: TrainConfig, machine: Machine, share: float | None) -> memory.MemoryBudget:
    """The planner's budget of ``config``'s step on ``machine`` at ``share`` (None: the planner's recommendation);
    open ``bf16`` and ``gradient_checkpointing`` count as the machine's bf16 and on."""
    bf16 = config.bf16 if config.bf16 is not None else machine.trains_in_bf16
    shaped = dataclasses.replace(config, bf16=bf16, gradient_checkpointing=config.gradient_checkpointing is not False)
    return memory.plan_memory(memory.model_config(config.model), precision=shaped.precision,
                              shape=shaped.training_shape(), device_memory_gib=machine.memory_gib,
                              device_kind=machine.kind, vllm_gpu_memory_utilization=share)


def planned_share(config: TrainConfig, machine: Machine) -> float | None:
    """The share a step is planned at: the config's, :func:`choose_vllm_memory`'s (CPU, server), or None."""
    share = config.vllm_gpu_memory_utilization
    if not isinstance(share, str):
        return share
    if device.VLLM_KV_CACHE_IN_BYTES[machine.kind] or config.vllm_mode == "server":
        return choose_vllm_memory(config, machine)[0]
    return None


def choose_vllm_memory(config: TrainConfig, machine: Machine) -> tuple[float, str]:
    """``(vllm_gpu_memory_utilization, why)`` for ``"auto"``: server mode's fixed share; on the CPU the least vLLM-CPU
    needs (:func:`memory.cpu_vllm_fraction`); colocated on an accelerator the planner's recommendation, or
    :class:`memory.DoesNotFitError` saying what would fit."""
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
    """Whether the step needs gradient checkpointing (a third more compute): only where it does not fit without."""
    try:
        budget = step_budget(dataclasses.replace(config, gradient_checkpointing=False), machine,
                             planned_share(config, machine))
    except memory.MemoryPlanError:  # the shape cannot be read: keep TRL's safe default
        return True
    return not budget.fits


def fit_micro_batch(config: TrainConfig, machine: Machine) -> tuple[int, int]:
    """``(per_device_train_batch_size, gradient_accumulation_steps)``: the profile's completions per step in the
    fewest micro-batches that fit with checkpointing; the whole step where none does, and always on the CPU."""
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
