"""Planning: a budget for a model, a step and a device, the recommended settings, or which knob to turn."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from grpo_lab import device
from grpo_lab.memory.budget import BudgetRow, MemoryBudget, Recommendation
from grpo_lab.memory.components import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_THREADS,
    KV_BLOCK_TOKENS,
    MARGIN_FRACTION,
    MARGIN_MIN_BYTES,
    default_margin_bytes,
    kv_cache_sequences,
    training_phases,
    vllm_non_kv_bytes,
)
from grpo_lab.memory.shapes import (
    FOUR_BIT_BYTES_PER_PARAMETER,
    GIB,
    PRECISIONS,
    VLLM_RUNTIME_BYTES,
    MemoryPlanError,
    ModelShape,
    Precision,
    TrainingShape,
    check_vllm_memory_fraction,
    dtype_bytes,
    get_precision,
)

UTILIZATION_STEP = 0.05
VLLM_ASLEEP_BYTES = VLLM_RUNTIME_BYTES
"""What a sleeping vLLM keeps on the device: its runtime allowance (non-torch memory, the CUDA-graph pool)."""
LORA_R_TRIAL = 16
"""The LoRA rank the advice tries (TRL's default)."""
KNOBS_IN_ORDER = (
    "vLLM's share: leave vllm_gpu_memory_utilization='auto' (the planner's)",
    "gradient_checkpointing=True",
    "a smaller per_device_train_batch_size (steps_per_generation keeps whole groups)",
    "LoRA (use_peft=True: no gradients or AdamW states for the base)",
    "QLoRA (use_peft=True, load_in_4bit=True: the frozen base in 4-bit NF4; CUDA)",
    "vllm_enable_sleep_mode=True (CUDA: vLLM's weights and KV cache released during the update)",
    "beta=0 (no reference model) or bf16 weights",
    "vLLM in server mode on another device (grpo_lab.scale)",
    "a larger device",
)
"""The knobs in the order the planner's advice turns them (the doctor's "out of memory at step N" row lists them)."""


def plan_memory(model: Any, *, precision: str | Precision = "bf16", optimizer: str = "adamw",
                shape: TrainingShape | None = None, device_memory_gib: float | None = None,
                device_kind: str | None = None, vllm_gpu_memory_utilization: float | None = None,
                vllm_dtype: str = "bf16", margin_gib: float | None = None, **shape_fields: Any) -> MemoryBudget:
    """Budget one GRPO step with colocated vLLM and recommend settings, or say which knob to turn. ``model``: a
    config.json path, model folder, dict or transformers config; the step: a :class:`TrainingShape` or its fields; the
    device detected and vLLM's share recommended unless given."""
    shape_obj = _shape(shape, shape_fields)
    model_shape = ModelShape.from_config(model)
    prec = get_precision(precision)
    if str(optimizer).lower() not in ("adamw", "adamw_torch", "adamw_torch_fused"):
        raise MemoryPlanError(f"Only AdamW is modelled (two states per parameter), got optimizer={optimizer!r}.")
    device_bytes, kind = _device(device_memory_gib, device_kind)
    check_vllm_memory_fraction(vllm_gpu_memory_utilization)
    if margin_gib is not None and margin_gib < 0:
        raise MemoryPlanError(f"margin_gib must be >= 0, got {margin_gib!r}.")
    margin = default_margin_bytes(device_bytes) if margin_gib is None else int(margin_gib * GIB)
    setting = _Setting(model_shape, prec, device_bytes, kind, dtype_bytes(vllm_dtype), margin)
    return _budget(setting, shape_obj, vllm_gpu_memory_utilization)


def largest_fitting_batch(model: Any, *, candidates: tuple[int, ...] = (64, 32, 16, 8, 4, 2, 1),
                          **plan_kwargs: Any) -> MemoryBudget:
    """The plan with the largest of ``candidates`` that fits a generation batch in its KV cache, else the smallest's."""
    plan_kwargs.pop("per_device_train_batch_size", None)
    plan_kwargs.pop("steps_per_generation", None)
    budget = None
    for batch in sorted(candidates, reverse=True):
        budget = plan_memory(model, per_device_train_batch_size=batch, **plan_kwargs)
        if budget.fits and budget.sequences_in_kv_cache >= budget.shape.generation_batch_size:
            return budget
    return budget


def _shape(shape: TrainingShape | None, shape_fields: dict[str, Any]) -> TrainingShape:
    known = {f.name for f in fields(TrainingShape)}
    unknown = set(shape_fields) - known
    if unknown:
        raise MemoryPlanError(f"Unknown training field(s) {sorted(unknown)}; known: {sorted(known)}.")
    return replace(shape, **shape_fields) if shape else TrainingShape(**shape_fields)


def _device(memory_gib: float | None, kind: str | None) -> tuple[int, str]:
    if memory_gib is None or kind is None:
        machine = device.Machine.detect()
        kind = kind or machine.kind
        if memory_gib is None:
            return int(machine.memory_gib * GIB), kind
    if not isinstance(memory_gib, (int, float)) or memory_gib <= 0:
        raise MemoryPlanError(f"device_memory_gib must be a positive number of GiB, got {memory_gib!r}.")
    if kind not in device.KINDS:
        raise MemoryPlanError(f"device_kind must be one of {', '.join(device.KINDS)}, got {kind!r}.")
    return int(memory_gib * GIB), kind


@dataclass(frozen=True)
class _Setting:
    """Everything a plan depends on besides the training shape and the utilization."""

    model: ModelShape
    precision: Precision
    device_bytes: int
    kind: str
    vllm_bytes_per_element: int
    margin: int

    def training_peak(self, shape: TrainingShape) -> tuple[str, int, dict[str, dict[str, int]]]:
        phases = training_phases(self.model, self.precision, shape, self.kind)
        totals = {name: sum(parts.values()) for name, parts in phases.items()}
        peak_phase = max(totals, key=totals.get)
        return peak_phase, totals[peak_phase], phases

    def vllm_fixed(self, shape: TrainingShape) -> dict[str, int]:
        return vllm_non_kv_bytes(self.model, self.vllm_bytes_per_element, shape.generation_batch_size,
                                 load_in_4bit=shape.load_in_4bit)

    def kv_for_one_group(self, shape: TrainingShape) -> int:
        tokens = math.ceil(shape.sequence_length / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
        return shape.num_generations * tokens * self.model.kv_cache_bytes_per_token(self.vllm_bytes_per_element)

    def held_beside_vllm(self, shape: TrainingShape) -> int:
        """What the trainer holds beside vLLM's whole share: its peak; with sleep mode its weights and states."""
        _, peak, phases = self.training_peak(shape)
        if not shape.vllm_enable_sleep_mode:
            return peak
        return sum(size for name, size in phases["optimizer step"].items() if name != "gradients")

    def update_fits(self, shape: TrainingShape) -> bool:
        """Sleep mode: the training peak next to what vLLM keeps asleep (its runtime allowance) fits."""
        _, peak, _ = self.training_peak(shape)
        return not shape.vllm_enable_sleep_mode or peak + VLLM_ASLEEP_BYTES + self.margin <= self.device_bytes

    def utilization_range(self, shape: TrainingShape) -> tuple[float, float]:
        """(least vLLM needs for one group of sequences, most the trainer leaves), in steps of 0.01."""
        room = self.device_bytes - self.held_beside_vllm(shape) - self.margin
        need = sum(self.vllm_fixed(shape).values()) + self.kv_for_one_group(shape)
        return math.ceil(need / self.device_bytes * 100) / 100, math.floor(room / self.device_bytes * 100) / 100

    def fits(self, shape: TrainingShape) -> bool:
        low, high = self.utilization_range(shape)
        return low <= high and self.update_fits(shape)


def _budget(setting: _Setting, shape: TrainingShape, utilization: float | None) -> MemoryBudget:
    model, device_bytes = setting.model, setting.device_bytes
    peak_phase, training_peak, phases = setting.training_peak(shape)
    vllm_fixed = setting.vllm_fixed(shape)
    non_kv = sum(vllm_fixed.values())
    low, high = setting.utilization_range(shape)
    chosen = utilization
    if chosen is None:  # the largest fraction the trainer leaves, rounded down to a step of 0.05
        stepped = round(math.floor(high / UTILIZATION_STEP) * UTILIZATION_STEP, 2)
        chosen = min(max(stepped if stepped >= low else high, 0.01), 1.0)
    vllm_total = math.ceil(device_bytes * chosen)
    kv_bytes = max(vllm_total - non_kv, 0)
    kv_per_token = model.kv_cache_bytes_per_token(setting.vllm_bytes_per_element)
    sequences = kv_cache_sequences(kv_bytes, kv_per_token, shape.sequence_length)
    held = setting.held_beside_vllm(shape)
    fits = (held + vllm_total + setting.margin <= device_bytes and setting.update_fits(shape)
            and sequences >= shape.num_generations)
    recommended = None
    if fits:
        recommended = Recommendation(vllm_gpu_memory_utilization=chosen, vllm_max_model_length=shape.context_window,
                                     max_num_seqs=min(shape.generation_batch_size, sequences),
                                     per_device_train_batch_size=shape.per_device_train_batch_size,
                                     gradient_checkpointing=shape.gradient_checkpointing)
        advice = _fitting_advice(shape, sequences, high)
    else:
        advice = _advice(setting, shape, chosen, peak_phase, training_peak, low, high)

    rows = [BudgetRow(name, "training", size, _TRAINING_NOTES.get(name, ""))
            for name, size in phases[peak_phase].items() if size]
    if shape.vllm_enable_sleep_mode:  # the update's picture: vLLM asleep; its awake share is `rollout_bytes`
        rows.append(BudgetRow("vLLM asleep (runtime, CUDA graphs)", "vllm", VLLM_ASLEEP_BYTES,
                              f"weights and KV cache released; awake it takes {vllm_total / GIB:.1f} GiB "
                              f"(KV cache for {sequences} sequences of {shape.sequence_length} tokens)"))
    else:
        rows += [BudgetRow(name, "vllm", size, _VLLM_NOTES[name]) for name, size in vllm_fixed.items()]
        rows.append(BudgetRow("vLLM KV cache", "vllm", kv_bytes, f"{kv_per_token / 1024:.1f} KiB/token; holds "
                              f"{sequences} sequences of {shape.sequence_length} tokens"))
    rows.append(BudgetRow("runtime margin", "runtime", setting.margin,
                          "device context, fragmentation, collective buffers"))
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    return MemoryBudget(model=model, precision=setting.precision, shape=shape, device_bytes=device_bytes,
                        device_kind=setting.kind, vllm_gpu_memory_utilization=chosen, rows=rows, phases=totals,
                        peak_phase=peak_phase, kv_cache_bytes=kv_bytes, kv_bytes_per_token=kv_per_token,
                        sequences_in_kv_cache=sequences, fits=fits, recommended=recommended, advice=advice,
                        assumptions=_assumptions(setting, shape),
                        rollout_bytes=held + vllm_total if shape.vllm_enable_sleep_mode else 0)


_TRAINING_NOTES = {
    "policy weights": "the model being trained",
    "AdamW states": "exp_avg + exp_avg_sq (LoRA: of the adapters only)",
    "4-bit weight dequantized": "QLoRA: the largest frozen linear weight, dequantized for its backward matmul",
    "LoRA adapters": "A and B of each adapted linear layer; they alone get gradients",
    "reference model": "beta > 0: a frozen copy for the KL term",
    "cuBLAS workspaces": "cuBLAS + cuBLASLt workspace of the forward and of the backward thread",
    "activations saved for backward": "kept from forward until backward",
    "autocast weight copies": "mixed precision: bf16 copies of the linear weights kept for backward",
    "LM-head backward buffers": "TRL's chunked LM head: fp32 gradient accumulators + projection tiles",
    "recomputed layer": "gradient checkpointing recomputes one layer at a time",
    "layer backward buffers": "gradients of the MLP's gate, up and product, and the gradient flowing in",
    "embedding backward buffers": "gradient of the embedding output and the embedding kernel's buffers",
    "gradients": "one per parameter (those made so far)",
}
_VLLM_NOTES = {
    "vLLM weights": "vLLM's own copy of the policy",
    "vLLM activations": "peak of vLLM's profiling pass (max_num_batched_tokens) + sampler logits",
    "vLLM runtime (non-torch, CUDA graphs)": "a stated allowance: non-torch memory and the CUDA-graph pool",
}


def _assumptions(setting: _Setting, shape: TrainingShape) -> list[str]:
    kernel = "Triton" if device.has_triton(setting.kind) else "torch ops, no Triton"
    return [
        f"precision {setting.precision.name}: {setting.precision.description}",
        "optimizer: fused AdamW (no temporaries in the step)",
        f"LM head: TRL's chunked log-prob kernel ({kernel})",
        *([f"CUDA: {CUBLAS_WORKSPACE_THREADS} cuBLAS workspaces of {CUBLAS_WORKSPACE_BYTES / 2**20:.0f} MiB "
           "(Hopper's default; smaller on older GPUs)"] if device.is_cuda(setting.kind) else []),
        "activations: HF Qwen2/Llama layers, SDPA, batches padded to the longest prompt + completion",
        f"vLLM: requested = utilization × total memory; runtime allowance {VLLM_RUNTIME_BYTES / GIB:.1f} GiB",
        f"runtime margin {setting.margin / GIB:.2f} GiB = max({MARGIN_MIN_BYTES / GIB:.0f} GiB, "
        f"{MARGIN_FRACTION:.0%} of the device)",
        *([f"LoRA r={shape.lora_r} on {', '.join(shape.lora_target_modules)}: frozen base (no gradients or AdamW "
           "states), adapters train; the reference is the base with the adapter off (no copy)"]
          if shape.lora else []),
        *([f"QLoRA: the base's linear weights in 4-bit NF4 ({FOUR_BIT_BYTES_PER_PARAMETER:.4g} bytes per weight with "
           "the blocks' scales), the embedding, norms and biases in the compute dtype, in the trainer and in vLLM "
           "(quantization='bitsandbytes'); each frozen weight dequantized once at a time in the backward"]
          if shape.load_in_4bit else []),
        *([f"sleep mode (TRL: level 2): vLLM's weights and KV cache are released after each rollout and "
           f"{VLLM_ASLEEP_BYTES / GIB:.1f} GiB (runtime, CUDA graphs) stays; waking re-allocates vLLM's whole share "
           "next to the trainer's weights and optimizer states (gradients freed) and the sync sends the weights "
           "again"]
          if shape.vllm_enable_sleep_mode else []),
    ]


def _fitting_advice(shape: TrainingShape, sequences: int, high: float) -> str:
    if sequences >= shape.generation_batch_size:
        return ""
    return (f"The KV cache holds {sequences} of the {shape.generation_batch_size} sequences of a generation batch: "
            f"vLLM will run them in waves (max_num_seqs={sequences}); raise vllm_gpu_memory_utilization toward "
            f"{high:.2f} or shorten max_completion_length to hold them all.")


def _smaller_batches(shape: TrainingShape) -> list[int]:
    """Micro-batches below the current one that keep whole groups: multiples or divisors of num_generations."""
    n = shape.num_generations
    return [b for b in range(shape.per_device_train_batch_size - 1, 0, -1) if b % n == 0 or n % b == 0]


def _advice(setting: _Setting, shape: TrainingShape, utilization: float, peak_phase: str, training_peak: int,
            low: float, high: float) -> str:
    """Which knob to turn first, and by how much; or, when nothing fits, what would."""
    device_gib = setting.device_bytes / GIB
    if setting.fits(shape):  # the fraction alone is the problem
        return (f"Turn vllm_gpu_memory_utilization down first: {utilization:.2f} leaves the trainer "
                f"{(1 - utilization) * device_gib:.1f} GiB but its peak ({peak_phase}) is {training_peak / GIB:.1f} "
                f"GiB + {setting.margin / GIB:.1f} GiB margin; use at most {high:.2f} (vLLM needs at least {low:.2f} "
                f"for one group of {shape.num_generations} sequences).")
    if not shape.gradient_checkpointing:
        checkpointed = replace(shape, gradient_checkpointing=True)
        if setting.fits(checkpointed):
            _, peak, _ = setting.training_peak(checkpointed)
            return (f"Turn on gradient_checkpointing first: the training peak drops from {training_peak / GIB:.1f} "
                    f"to {peak / GIB:.1f} GiB and the plan fits.")
    batch = shape.per_device_train_batch_size
    for smaller in _smaller_batches(shape):
        trial = replace(shape, per_device_train_batch_size=smaller, steps_per_generation=None)
        if setting.fits(trial):
            _, peak, _ = setting.training_peak(trial)
            return (f"Lower per_device_train_batch_size first: {batch} → {smaller} fits (training peak "
                    f"{training_peak / GIB:.1f} → {peak / GIB:.1f} GiB); TRL's steps_per_generation keeps whole "
                    f"groups of {shape.num_generations} in each generation batch.")
    return _what_would_fit(setting, shape)


def _what_would_fit(setting: _Setting, shape: TrainingShape) -> str:
    model, prec = setting.model, setting.precision
    smallest = replace(shape, per_device_train_batch_size=1, steps_per_generation=None, gradient_checkpointing=True)
    phases = training_phases(model, prec, smallest, setting.kind)
    static = sum(v for k, v in phases["optimizer step"].items()
                 if k in ("policy weights", "LoRA adapters", "AdamW states", "reference model"))
    _, peak, _ = setting.training_peak(smallest)
    vllm_least = sum(setting.vllm_fixed(smallest).values()) + setting.kv_for_one_group(smallest)
    needed = peak + vllm_least
    if shape.vllm_enable_sleep_mode:  # the update beside a sleeping vLLM, or the rollout beside the trainer's states
        needed = max(peak + VLLM_ASLEEP_BYTES, setting.held_beside_vllm(smallest) + vllm_least)
    device_needed = math.ceil(max(needed + MARGIN_MIN_BYTES, needed / (1 - MARGIN_FRACTION)) / GIB)
    options = [f"a device with at least {device_needed} GiB"]
    # each further option where it alone makes micro-batch 1 with checkpointing fit, in the order of KNOBS_IN_ORDER
    if not shape.lora and setting.fits(replace(smallest, lora_r=LORA_R_TRIAL)):
        options.append(f"LoRA (use_peft=True, lora_r={LORA_R_TRIAL}: no gradients or AdamW states for the base)")
    qlora = replace(smallest, lora_r=shape.lora_r or LORA_R_TRIAL, load_in_4bit=True)
    if (not shape.load_in_4bit and device.four_bit_missing(setting.kind) is None
            and replace(setting, precision=PRECISIONS["bf16"]).fits(qlora)):
        options.append("QLoRA (use_peft=True, load_in_4bit=True: the frozen base in 4 bits)")
    if (not shape.vllm_enable_sleep_mode and device.vllm_sleep_mode_missing(setting.kind) is None
            and setting.fits(replace(smallest, vllm_enable_sleep_mode=True))):
        options.append("vllm_enable_sleep_mode=True (vLLM's weights and KV cache released during the update)")
    if shape.beta > 0 and not shape.lora and setting.fits(replace(smallest, beta=0.0)):
        reference = phases["optimizer step"]["reference model"] / GIB
        options.append(f"beta=0 (drops the {reference:.1f} GiB reference model)")
    if prec.name != "bf16" and replace(setting, precision=PRECISIONS["bf16"]).fits(smallest):
        per_param = prec.weight_bytes + prec.grad_bytes + prec.adamw_bytes
        options.append(f"bf16 training (8 instead of {per_param} bytes per parameter)")
    trainer_alone_fits = peak + setting.margin <= setting.device_bytes
    if trainer_alone_fits:
        options.append(f"vLLM in server mode on another device (frees at least {vllm_least / GIB:.1f} GiB here)")
    not_enough = "" if trainer_alone_fits else (
        f" vLLM in server mode alone would not be enough: the trainer by itself peaks at {peak / GIB:.1f} GiB.")
    options.append("an 8-bit optimizer (fewer bytes of optimizer state; not modelled here)")
    reference = " and the reference model" if shape.beta > 0 else ""
    return (f"Cannot fit at any batch size on {setting.device_bytes / GIB:.0f} GiB: weights, AdamW states{reference} "
            f"alone take {static / GIB:.1f} GiB, the step at micro-batch 1 with checkpointing peaks at "
            f"{peak / GIB:.1f} GiB, vLLM needs at least {vllm_least / GIB:.1f} GiB and the margin "
            f"{setting.margin / GIB:.1f} GiB. It would fit with: " + "; or ".join(options) + "." + not_enough)
