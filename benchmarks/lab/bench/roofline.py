"""The roofline: the device's copy bandwidth and matmul rate measured with torch, a model's cost per token, the
shortest time a rollout could take from them, and the model FLOPs utilization (MFU) of a GRPO update."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from grpo_lab import device
from grpo_lab.errors import ConfigError
from grpo_lab.memory import ModelShape, dtype_bytes
from lab.bench.profiles import BenchProfile
from lab.bench.stats import median

@dataclass(frozen=True)
class DeviceRates:
    """What the device sustains, measured with torch: copy bandwidth (bytes read + written per second) and
    dense matmul rate (FLOP/s) in ``dtype``."""

    kind: str
    name: str
    dtype: str
    bandwidth_bytes_per_s: float
    matmul_flops_per_s: float
    copy_bytes: int = 0
    gemm_size: int = 0
    threads: int = 0

    def describe(self) -> str:
        return (f"{self.name} ({self.kind}): copy bandwidth {self.bandwidth_bytes_per_s / 1e9:,.1f} GB/s, "
                f"{self.dtype} matmul {self.matmul_flops_per_s / 1e12:,.2f} TFLOP/s"
                + (f", {self.threads} torch thread(s)" if device.is_cpu(self.kind) else ""))


def _timed(fn, kind: str, repeats: int) -> float:
    fn()  # warm-up: allocation, kernel selection
    times = []
    for _ in range(repeats):
        device.synchronize(kind)
        start = time.perf_counter()
        fn()
        device.synchronize(kind)
        times.append(time.perf_counter() - start)
    return median(times)


def measure_device(kind: str | None = None, dtype: str | None = None, copy_bytes: int | None = None,
                   gemm_size: int | None = None, repeats: int = 5) -> DeviceRates:
    """Copy bandwidth (one large ``copy_``: bytes read + written / time) and matmul rate (``n x n`` GEMM,
    2n^3 FLOPs / time), median of ``repeats``. Defaults: 2 GiB and n=8192 on accelerators, 256 MiB and n=1024
    on the CPU (beyond the caches, yet quick)."""
    import torch

    kind = device.check_kind(kind or device.detect())
    dtype = dtype or str(device.preferred_dtype(kind)).removeprefix("torch.")
    target = device.torch_device(kind=kind)
    copy_bytes = copy_bytes or (256 * 2**20 if device.is_cpu(kind) else 2 * 2**30)
    gemm_size = gemm_size or (1024 if device.is_cpu(kind) else 8192)
    source = torch.ones(copy_bytes // 4, dtype=torch.float32, device=target)
    destination = torch.empty_like(source)
    copy_s = _timed(functools.partial(destination.copy_, source), kind, repeats)
    del source, destination
    a = torch.randn(gemm_size, gemm_size, device=target).to(getattr(torch, dtype))
    b = torch.randn(gemm_size, gemm_size, device=target).to(getattr(torch, dtype))
    c = torch.empty_like(a)
    gemm_s = _timed(functools.partial(torch.mm, a, b, out=c), kind, repeats)
    del a, b, c
    device.empty_cache(kind)
    return DeviceRates(kind=kind, name=device.device_name(kind=kind), dtype=dtype,
                       bandwidth_bytes_per_s=2 * (copy_bytes // 4) * 4 / copy_s,
                       matmul_flops_per_s=2 * gemm_size**3 / gemm_s, copy_bytes=copy_bytes, gemm_size=gemm_size,
                       threads=torch.get_num_threads())


@dataclass(frozen=True)
class ModelCost:
    """What one token costs a decoder-only model: weights, their bytes, and KV-cache bytes per token."""

    params: int
    embedding_params: int
    tied_embeddings: bool
    bytes_per_param: int
    layers: int
    attention_width: int
    """Query heads x head dim: attention costs 4 x layers x this FLOPs per token of context."""
    kv_bytes_per_token: int

    @property
    def param_bytes(self) -> int:
        return self.params * self.bytes_per_param

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per generated token: all but the embedding lookup, plus the output layer (which is
        the embedding itself when tied)."""
        return self.params if self.tied_embeddings else self.params - self.embedding_params


def model_cost(model, dtype: str = "bfloat16") -> ModelCost:
    """:class:`ModelCost` of a model folder (its ``config.json``), a dict or a transformers config, read through the
    memory planner's :class:`~grpo_lab.memory.ModelShape` (the one reader of a model's shape)."""
    shape = ModelShape.from_config(model)
    size = dtype_bytes(dtype)
    return ModelCost(params=shape.num_parameters, embedding_params=shape.embedding_parameters,
                     tied_embeddings=shape.tie_word_embeddings, bytes_per_param=size,
                     layers=shape.num_hidden_layers, attention_width=shape.q_dim,
                     kv_bytes_per_token=shape.kv_cache_bytes_per_token(size))


@dataclass(frozen=True)
class Roofline:
    """The shortest time a rollout could take on a device, and whether memory or arithmetic bounds it."""

    seconds: float
    prefill_s: float
    decode_s: float
    memory_s: float
    """Time the bytes alone need (weights every decode step, KV cache reads) at the measured bandwidth."""
    compute_s: float
    """Time the FLOPs alone need at the measured matmul rate."""
    decode_steps: int
    new_tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "bound": self.bound}


def roofline(cost: ModelCost, rates: DeviceRates, prompt_lengths: Sequence[int],
             completion_lengths: Sequence[Sequence[int]]) -> Roofline:
    """Lower bound on the time to generate ``completion_lengths[i]`` (one entry per sample) after prompt ``i``.

    Best case in every respect: each prompt is prefilled once (shared by its samples), all sequences decode
    together (one step per token position, weights read once per step), nothing is recomputed, and each step
    takes max(bytes / bandwidth, FLOPs / matmul rate). Per step: bytes = all weights + the KV cache of every
    live sequence (context x ``kv_bytes_per_token``); FLOPs = 2 x ``matmul_params`` per live sequence + attention
    (4 x layers x ``attention_width`` per token of context). The first new token comes from the prefill.
    """
    if len(prompt_lengths) != len(completion_lengths):
        raise ConfigError(f"{len(prompt_lengths)} prompt lengths but completion lengths for "
                         f"{len(completion_lengths)} prompts")
    bandwidth, rate = rates.bandwidth_bytes_per_s, rates.matmul_flops_per_s
    prompt_tokens = sum(prompt_lengths)
    attention_per_context_token = 4 * cost.layers * cost.attention_width
    prefill_bytes = cost.param_bytes + cost.kv_bytes_per_token * prompt_tokens
    prefill_flops = (2 * (cost.params - cost.embedding_params) * prompt_tokens
                     + attention_per_context_token * sum(p * (p + 1) // 2 for p in prompt_lengths))
    memory_s, compute_s = prefill_bytes / bandwidth, prefill_flops / rate
    prefill_s = max(memory_s, compute_s)
    sequences = [(p, length) for p, lengths in zip(prompt_lengths, completion_lengths) for length in lengths]
    steps = max((length for _, length in sequences), default=1) - 1
    decode_s = 0.0
    for step in range(steps):  # step t produces token t + 1 of every sequence still running
        live = [p + step + 1 for p, length in sequences if length > step + 1]
        context = sum(live)
        step_bytes = cost.param_bytes + cost.kv_bytes_per_token * context
        step_flops = 2 * cost.matmul_params * len(live) + attention_per_context_token * context
        memory_s += step_bytes / bandwidth
        compute_s += step_flops / rate
        decode_s += max(step_bytes / bandwidth, step_flops / rate)
    return Roofline(seconds=prefill_s + decode_s, prefill_s=prefill_s, decode_s=decode_s, memory_s=memory_s,
                    compute_s=compute_s, decode_steps=steps, new_tokens=sum(length for _, length in sequences))


# Vendor figures, for reasoning before a device is measured (measure_device gives the real, lower numbers).
DATASHEET_RATES = {
    "NVIDIA H200": DeviceRates(kind="cuda", name="NVIDIA H200 (datasheet: 4.8 TB/s HBM3e, 989 TFLOP/s dense bf16)",
                               dtype="bfloat16", bandwidth_bytes_per_s=4.8e12, matmul_flops_per_s=989e12),
}


def workload_roofline(cost: ModelCost, rates: DeviceRates, profile: BenchProfile,
                      lengths: Sequence[Sequence[int]] | None = None) -> Roofline:
    """The roofline of a profile's workload: every prompt ``prompt_tokens`` long, every completion
    ``max_tokens`` long (or ``lengths``, e.g. :func:`draw_lengths` for the ragged variant)."""
    lengths = lengths or [[profile.step.max_completion_length] * profile.step.num_generations for _ in range(profile.num_prompts)]
    return roofline(cost, rates, [profile.prompt_tokens] * profile.num_prompts, lengths)


def add_roofline(rollout: dict[str, Any], cost: ModelCost, rates: DeviceRates) -> None:
    """Annotate every config of every variant with its roofline time (from that config's own completion
    lengths) and how far the measurement is from it."""
    for block in rollout["variants"].values():
        for name, result in block["configs"].items():
            lengths = block["_lengths"][name]
            if not lengths:
                continue
            bound = roofline(cost, rates, rollout["_prompt_lengths"], lengths)
            result["roofline"] = bound.as_dict()
            result["x_roofline_time"] = result["median_s"] / bound.seconds
            result["of_roofline_tokens_per_s"] = result["tokens_per_s"] / bound.tokens_per_s



def sequence_flops(cost: ModelCost, prompt_tokens: float, completion_tokens: float) -> float:
    """Model FLOPs of one forward pass over one prompt + completion: every matmul weight once per token (the LM head
    only on completion positions, as TRL's fused head computes it) plus causal attention."""
    head = cost.embedding_params  # the output layer: the tied embedding, or a separate matrix of the same size
    backbone = cost.matmul_params - head
    tokens = prompt_tokens + completion_tokens
    return 2 * backbone * tokens + 2 * head * completion_tokens + 2 * cost.layers * cost.attention_width * tokens ** 2


def update_mfu(step: dict[str, Any], cost: ModelCost, prompt_tokens: float, completions: int, peak_flops: float,
               extra_forwards: int) -> dict[str, float]:
    """Model FLOPs utilization of one backend's update (median step): the FLOPs the update needs (forward + backward
    = 3 forwards of every sequence, plus ``extra_forwards`` no-grad forwards: old log-probs, reference) over the
    update's time at ``peak_flops``. Recomputation (gradient checkpointing) is not model FLOPs."""
    m = step["median"]
    flops = completions * sequence_flops(cost, prompt_tokens, m["mean_completion_tokens"]) * (3 + extra_forwards)
    return {"update_tflop": flops / 1e12, "update_tflop_per_s": flops / m["update_s"] / 1e12,
            "mfu": flops / m["update_s"] / peak_flops, "peak_tflop_per_s": peak_flops / 1e12,
            "extra_forwards": extra_forwards}


def extra_forwards(backend: str, beta: float, deferred_correction: bool = False,
                   importance_sampling_correction: bool = True) -> int:
    """No-grad forwards TRL adds before the update when one generation feeds one optimizer step (every bench step):
    old log-probs when vLLM samples with its importance-sampling correction on (TRL skips them with the correction
    off, and HF generate needs none; neither does a trainer that takes the correction from the loss's own forward,
    ``deferred_correction``) and the reference (beta > 0)."""
    old = backend == "vllm" and importance_sampling_correction and not deferred_correction
    return int(old) + int(beta > 0)
