"""Tables over many models and devices: recommendations, the levers' plans, the largest model that fits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lab.memory.planner import largest_fitting_batch, plan_memory
from grpo_lab.memory.shapes import GIB, ModelShape


@dataclass(frozen=True)
class DevicePreset:
    """A device's memory (GiB, as the driver reports it) and kind (which decides the LM-head kernel)."""

    name: str
    memory_gib: float
    kind: str


COMMON_DEVICES = (
    DevicePreset("Ascend 910B 32 GB", 32, "npu"),
    DevicePreset("Ascend 910B 64 GB", 64, "npu"),
    DevicePreset("24 GB GPU (RTX 4090, A10)", 24, "cuda"),
    DevicePreset("A100 40 GB", 40, "cuda"),
    DevicePreset("A100 80 GB", 80, "cuda"),
    DevicePreset("H200 141 GB", 140, "cuda"),
)

def recommendation_table(models: Mapping[str, Any], devices: tuple[DevicePreset, ...] = COMMON_DEVICES,
                         **plan_kwargs: Any) -> list[dict[str, Any]]:
    """Recommended settings for every device × model (one row each), computed with :func:`largest_fitting_batch`."""
    rows = []
    for dev in devices:
        for label, config in models.items():
            budget = largest_fitting_batch(config, device_memory_gib=dev.memory_gib, device_kind=dev.kind,
                                           **plan_kwargs)
            rec = budget.recommended
            rows.append({"device": dev.name, "model": label,
                         "parameters (B)": round(budget.model.num_parameters / 1e9, 2), "fits": budget.fits,
                         "vllm_gpu_memory_utilization": rec.vllm_gpu_memory_utilization if rec else None,
                         "per_device_train_batch_size": rec.per_device_train_batch_size if rec else None,
                         "max_num_seqs": rec.max_num_seqs if rec else None,
                         "training peak (GiB)": round(budget.training_peak_bytes / GIB, 1),
                         "advice": budget.advice})
    return rows


LEVERS: dict[str, dict[str, Any]] = {
    "full fine-tuning at 0.6": {"vllm_gpu_memory_utilization": 0.6},
    "full fine-tuning at the planner's share": {},
    "LoRA (r=16)": {"lora_r": 16},
    "LoRA (r=16) + sleep mode": {"lora_r": 16, "vllm_enable_sleep_mode": True},
}
"""The levers the memory lesson compares, as planner overrides, in the order the plan suggests turning them."""


@dataclass(frozen=True)
class LeverPlan:
    """One lever's plan on one device: does it fit, at which vLLM share, and with how much to spare."""

    setting: str
    fits: bool
    vllm_gpu_memory_utilization: float | None
    """The share given, or the planner's where it fits; None where the planner found none."""
    training_peak_gib: float
    headroom_gib: float
    """Memory left at the tightest moment of the step (the update, or with sleep mode the rollout); < 0: short."""
    advice: str

    def line(self) -> str:
        verdict = "fits" if self.fits else "OOM"
        share = "none" if self.vllm_gpu_memory_utilization is None else f"{self.vllm_gpu_memory_utilization:.2f}"
        return (f"{self.setting:<42} {verdict:<5} vLLM {share:>4}  training peak "
                f"{self.training_peak_gib:5.1f} GiB  headroom {self.headroom_gib:+6.1f} GiB")


def lever_plans(model: Any, levers: Mapping[str, Mapping[str, Any]] = LEVERS, **plan_kwargs: Any) -> list[LeverPlan]:
    """Each lever's plan of one model and step (``plan_kwargs`` as for :func:`plan_memory`)."""
    plans = []
    for setting, overrides in levers.items():
        kwargs = {**plan_kwargs, **overrides}
        budget = plan_memory(model, **kwargs)
        tightest = max(budget.used_bytes, budget.rollout_bytes + budget.side_bytes("runtime"))
        given = kwargs.get("vllm_gpu_memory_utilization") is not None
        plans.append(LeverPlan(setting=setting, fits=budget.fits,
                               vllm_gpu_memory_utilization=budget.vllm_gpu_memory_utilization
                               if budget.fits or given else None,
                               training_peak_gib=round(budget.training_peak_bytes / GIB, 2),
                               headroom_gib=round((budget.device_bytes - tightest) / GIB, 2), advice=budget.advice))
    return plans


def largest_models(models: Mapping[str, Any], device_gibs: tuple[float, ...] = (32, 64, 80),
                   levers: Mapping[str, Mapping[str, Any]] = LEVERS, **plan_kwargs: Any) -> list[dict[str, Any]]:
    """For each lever, the largest of ``models`` whose step fits at some micro-batch (:func:`largest_fitting_batch`)
    on a device of each size: one row per lever, a column per size (``"-"`` where none fits)."""
    by_size = sorted(models.items(), key=lambda item: ModelShape.from_config(item[1]).num_parameters, reverse=True)
    rows = []
    for setting, overrides in levers.items():
        row: dict[str, Any] = {"setting": setting}
        for gib in device_gibs:
            row[f"{gib:g} GiB"] = next(
                (name for name, config in by_size
                 if largest_fitting_batch(config, device_memory_gib=gib, **{**plan_kwargs, **overrides}).fits), "-")
        rows.append(row)
    return rows
