"""What the memory planner says of an experiment on a machine: its budget (:func:`memory_budget`), vLLM's share for
``"auto"`` (:func:`choose_vllm_memory`), gradient checkpointing (:func:`needs_checkpointing`), the micro-batch a
profile's step is split into (:func:`fit_micro_batch`) and what a run's own completion lengths left free of its plan
(:func:`length_margin`). Each takes a :class:`~grpo_lab.experiment.TrainConfig` (annotated by name: the config module
imports this one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_lab import device, memory
from grpo_lab.device import Machine
from grpo_lab.experiment.profiles import AUTO


def memory_budget(config: TrainConfig, machine: Machine) -> memory.MemoryBudget:
    """The memory planner's budget (:func:`grpo_lab.memory.plan_memory`) of this experiment's step on ``machine``
    (colocated vLLM), with the config's
    ``vllm_gpu_memory_utilization`` when it is a number, and for ``"auto"`` the share :meth:`TrainConfig.resolve` would
    choose (:func:`choose_vllm_memory`: on an accelerator, colocated, the planner's recommendation)."""
    config = config.with_profile(machine)
    if config.gradient_checkpointing is None:  # as resolve() decides it
        config = dataclasses.replace(config, gradient_checkpointing=needs_checkpointing(config, machine))
    fraction = config.vllm_gpu_memory_utilization
    if fraction == AUTO and (device.is_cpu(machine.kind) or config.vllm_mode == "server"):
        fraction = choose_vllm_memory(config, machine)[0]  # the share resolve() gives: not the planner's colocate one
    return memory.plan_memory(memory.model_config(config.model), precision=_precision(config, machine),
                              shape=config.training_shape(), device_memory_gib=machine.memory_gib,
                              device_kind=machine.kind,
                              vllm_gpu_memory_utilization=None if fraction == AUTO else fraction)


def _precision(config: TrainConfig, machine: Machine) -> str:
    """:attr:`TrainConfig.precision`, with ``bf16`` as :meth:`TrainConfig.resolve` would decide it."""
    bf16 = config.bf16 if config.bf16 is not None else machine.trains_in_bf16
    return dataclasses.replace(config, bf16=bf16).precision


def choose_vllm_memory(config: TrainConfig, machine: Machine) -> tuple[float, str]:
    """``(vllm_gpu_memory_utilization, why)`` for ``"auto"``: the one rule, in one place.

    * server mode: the rollout devices are vLLM's alone (:data:`memory.VLLM_MEMORY_FRACTION` ``"server"``);
    * the CPU: vLLM-CPU sizes its KV cache in bytes (``memory.CPU_KV_CACHE_GIB``) and only checks at start that
      this share of host memory is free, so the fraction is the least it needs (:func:`memory.cpu_vllm_fraction`);
    * an accelerator, colocated: the planner's recommendation, the largest share the trainer leaves
      (:func:`memory_budget`); when nothing fits, :class:`memory.DoesNotFitError` says what would.
    """
    if config.vllm_mode == "server":
        return memory.VLLM_MEMORY_FRACTION["server"], "server mode: the rollout devices are vLLM's alone"
    if device.VLLM_KV_CACHE_IN_BYTES[machine.kind]:
        fraction = memory.cpu_vllm_fraction(memory.model_config(config.model), machine.memory_gib)
        return fraction, (f"vLLM-CPU: a KV cache of {memory.CPU_KV_CACHE_GIB:g} GiB plus the weights and runtime, "
                          f"as a share of {machine.memory_gib:.0f} GiB of host memory")
    budget = memory_budget(dataclasses.replace(config, vllm_gpu_memory_utilization=AUTO), machine)
    if budget.recommended is None:
        raise memory.DoesNotFitError(f"vllm_gpu_memory_utilization='auto': the memory planner finds no setting that "
                                     f"fits on {machine.memory_gib:.0f} GiB. {budget.advice} (Pass a number to try "
                                     f"anyway.)")
    return budget.recommended.vllm_gpu_memory_utilization, budget.summary().splitlines()[0]


def needs_checkpointing(config: TrainConfig, machine: Machine) -> bool:
    """Gradient checkpointing only where the step does not fit without it: the memory planner's verdict for the step
    without checkpointing (at the config's vLLM share, or the best one when that is ``"auto"``). It costs a third
    more compute in the backward, so a step that fits without it runs without it."""
    try:
        budget = memory_budget(dataclasses.replace(config, gradient_checkpointing=False), machine)
    except memory.MemoryPlanError:  # the shape cannot be read: keep TRL's safe default
        return True
    return not budget.fits


def fit_micro_batch(config: TrainConfig, machine: Machine) -> tuple[int, int]:
    """``(per_device_train_batch_size, gradient_accumulation_steps)`` for a profile's step on ``machine``: the
    profile's completions per step (its ``per_device_train_batch_size``) in the fewest micro-batches that the memory
    planner says fit (with gradient checkpointing, the cheapest setting); the whole step when none does (then
    :func:`choose_vllm_memory` says what would fit). The CPU keeps the profile's micro-batch."""
    batch = config.per_device_train_batch_size
    if device.is_cpu(machine.kind):
        return batch, 1
    for accumulation in (n for n in range(1, batch + 1) if batch % n == 0):
        candidate = dataclasses.replace(config, per_device_train_batch_size=batch // accumulation,
                                        gradient_accumulation_steps=accumulation, gradient_checkpointing=True)
        try:
            if memory_budget(candidate, machine).recommended is not None:
                return batch // accumulation, accumulation
        except memory.MemoryPlanError:  # the model's shape cannot be read: keep the profile's step
            break
    return batch, 1




@dataclass(frozen=True)
class LengthMargin:
    """A run's step planned at the lengths the planner assumes (every completion ``max_completion_length`` tokens)
    beside the same step at the lengths its model wrote (the mean completion over the run): the safety margin, and
    what it costs in micro-batches (:func:`fit_micro_batch` at each length, at the run's vLLM share). Prompts are
    planned at ``max_prompt_length`` in both."""

    run: str
    memory_gib: float
    max_completion_length: int
    mean_completion: float
    longest_completion: int
    """The longest completion of any step: a micro-batch pads to its longest, so a step with one long completion
    still reaches the planned activations."""
    planned_peak_gib: float
    own_peak_gib: float
    micro_batches_planned: tuple[int, int]
    micro_batches_own: tuple[int, int]

    @property
    def left_free_gib(self) -> float:
        """What the model's own (mean) completion length leaves of the training peak planned at the maximum."""
        return self.planned_peak_gib - self.own_peak_gib

    def summary(self) -> str:
        def split(pair: tuple[int, int]) -> str:
            micro, accumulation = pair
            return f"one micro-batch of {micro}" if accumulation == 1 else f"{accumulation} micro-batches of {micro}"

        return (f"{self.run} on {self.memory_gib:g} GiB: at {self.max_completion_length}-token completions (the plan) "
                f"the training peak is {self.planned_peak_gib:.1f} GiB in {split(self.micro_batches_planned)}; at the "
                f"model's own {self.mean_completion:.0f} tokens (mean; longest {self.longest_completion}) "
                f"{self.own_peak_gib:.1f} GiB in {split(self.micro_batches_own)}: {self.left_free_gib:.1f} GiB of "
                f"margin.")


def length_margin(config: TrainConfig, machine: Machine, metrics: list[dict], run: str = "run") -> LengthMargin:
    """The plan of an experiment resolved for ``machine`` at its ``max_completion_length`` and at the mean completion
    length a run of it logged (TRL's ``completions/mean_length`` per step in ``metrics.jsonl``)."""
    means = [m["completions/mean_length"] for m in metrics if "completions/mean_length" in m]
    if not means:
        raise memory.MemoryPlanError(f"{run}: its metrics hold no completions/mean_length to compare the plan with.")
    mean = sum(means) / len(means)
    longest = int(max((m.get("completions/max_length", 0) for m in metrics), default=0))

    def at(length: int) -> tuple[float, tuple[int, int]]:
        step = dataclasses.replace(config, max_completion_length=max(1, length))
        whole = dataclasses.replace(step, gradient_accumulation_steps=1,
                                    per_device_train_batch_size=config.generation_batch_size)
        return round(memory_budget(step, machine).training_peak_bytes / memory.GIB, 2), fit_micro_batch(whole, machine)

    (planned, planned_split), (own, own_split) = at(config.max_completion_length), at(round(mean))
    return LengthMargin(run, machine.memory_gib, config.max_completion_length, round(mean, 1), longest, planned, own,
                        planned_split, own_split)
