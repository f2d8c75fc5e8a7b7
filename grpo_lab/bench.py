"""Performance: rollouts (HF generate vs vLLM vs vLLM + prefix caching), the GRPO step, and the roofline.

Three measurements in one process, written to one results file:

1. **Rollouts** (:func:`rollout_bench`): the seed's workload (128 prompts x n=4, prompts of about 128 tokens, up
   to 256 new tokens) through the three configurations *alternately* (round 1: hf, vllm, vllm+prefix; round 2:
   vllm, vllm+prefix, hf; ...), after warm-up rounds, median of the repeats. Two variants: ``fixed`` (every
   completion exactly ``max_tokens`` long) and ``ragged`` (lengths as GRPO produces them: ending at the end
   token, or, for random weights that never end, drawn from a stated distribution). HF ``generate`` pads a
   batch to its longest member; vLLM's continuous batching does not, so the ragged variant is where it gains.
2. **GRPO step** (:func:`grpo_step_bench`): TRL's ``GRPOTrainer`` step time with HF generate and with vLLM
   colocate, split into generation, reward and update (the rest of the step) from :mod:`grpo_lab.train`'s
   metrics callback.
3. **Roofline** (:func:`measure_device`, :func:`roofline`): the device's copy bandwidth and matmul rate measured
   with torch, and from them the shortest time the workload could take (every decode step reads all weights
   and each sequence's KV cache; every token costs 2 FLOPs per weight), against which tokens/s are reported.

From a shell (``--help`` lists every option)::

    python -m grpo_lab.bench --profile tiny                       # CPU: shipped tiny model, ~3 minutes
    python -m grpo_lab.bench --shape qwen2.5-1.5b --parts rollout,roofline    # GPU: random weights

>>> from grpo_lab.bench import alternating_orders
>>> alternating_orders(("hf", "vllm", "vllm+prefix"), 2)
[['hf', 'vllm', 'vllm+prefix'], ['vllm', 'vllm+prefix', 'hf']]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from grpo_lab import device, env, runs
from grpo_lab.data import load_split, write_jsonl
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import DEFAULT_FOR_DEVICE, TrainConfig
from grpo_lab.memory import CPU_KV_CACHE_GIB, ModelShape, dtype_bytes
from grpo_lab.models import resolve_model
from grpo_lab.plots import plot_bench
from grpo_lab.rollout import (
    RolloutConfig,
    Sampling,
    encode_prompts,
    load_tokenizer,
    open_engine,
)
from grpo_lab.rollout.compare import SHAPES, shaped_model_dir
from grpo_lab.servers import free_port, run_process_group
from grpo_lab.train import MetricsLogger, StepClock, build_trainer

SCHEMA = "grpo-lab.bench/1"
CONFIGS = ("hf", "vllm", "vllm+prefix")
VARIANTS = ("fixed", "ragged")
PARTS = ("rollout", "grpo", "roofline", "engine")
GRPO_WORKLOADS = ("fixed", "ragged")
OWN_LENGTHS = "the model's own lengths"
"""The GRPO step's workload with real weights: neither fixed nor drawn, whatever the model samples."""
RAGGED_STOP_PROBABILITY = 1 / 160
"""The ragged GRPO workload on random weights: the share of the vocabulary that ends a completion, so that each
sampled token ends it with about this probability (lengths roughly geometric, mean ~0.5 x 256 tokens)."""
STEP_SPLIT = ("generation_s", "vllm_generate_s", "weight_sync_s", "generation_other_s", "reward_s", "update_s",
              "old_ref_logps_s", "backward_optimizer_s")
"""The parts of a GRPO step the trainer times (grpo_lab.train.MetricsLogger's ``timing/*``)."""
RAGGED_MODES = ("eos", "uniform")
PREFIX_OFF_MODES = ("salt", "engine")
CONFIG_MEANING = {
    "hf": "transformers' model.generate, one padded batch of all sequences (TRL without vLLM)",
    "vllm": "vLLM with no prefix reuse: every sample computes its own prompt",
    "vllm+prefix": "vLLM with prefix caching: the n samples of a prompt share its KV blocks",
}
PREFIX_OFF_MEANING = {
    "salt": ("the same vLLM engine, its prefix cache reset and every sample given its own cache salt, so no "
             "block is reused (one engine start; the cache's hashing cost stays in)"),
    "engine": "a second vLLM engine opened with enable_prefix_caching=False",
}
SEED_REFERENCE = ("the write-up: one Ascend NPU, 2B model, 128 prompts x n=4 x 256 tokens: HF generate 16 s -> vLLM + "
                  "prefix caching 3.9 s (4.1x); GRPO step 22 s -> 6.7 s (3.3x). Qwen2.5-0.5B on an A100: 312 -> "
                  "1280 tok/s at batch 32 (4.1x)")


@dataclass(frozen=True)
class BenchProfile:
    """One benchmark run: the GRPO step measured (a :class:`~grpo_lab.experiment.TrainConfig` under TRL's names)
    and how it is timed. The rollout part samples the same workload: ``num_prompts`` prompts × ``num_generations``
    completions of up to ``max_completion_length`` tokens."""

    name: str
    step: TrainConfig
    """The step's shape: ``num_generations``, ``max_completion_length``, the micro-batch
    (``per_device_train_batch_size``) and ``gradient_accumulation_steps`` (TRL generates all micro-batches at once)."""
    prompt_tokens: int
    """Target prompt length after the chat template (each prompt lands within a few tokens of it)."""
    warmup: int
    """Rounds run and thrown away first (engine warm-up, allocator, CUDA graphs)."""
    repeats: int
    """Timed rounds; the median is reported."""
    grpo_backends: tuple[str, ...]
    grpo_steps: int
    grpo_warmup_steps: int
    why: str = ""

    @property
    def num_prompts(self) -> int:
        """Prompts per step (= the rollout workload's prompts)."""
        return self.step.num_prompts_per_step

    @property
    def sequences(self) -> int:
        """Completions per step."""
        return self.step.generation_batch_size

    def as_dict(self) -> dict[str, Any]:
        shape = ("num_generations", "max_completion_length", "per_device_train_batch_size",
                 "gradient_accumulation_steps")
        return {"name": self.name, "num_prompts": self.num_prompts, **{k: getattr(self.step, k) for k in shape},
                **{k: v for k, v in asdict(self).items() if k not in ("name", "step")}}


def _step(num_prompts: int, num_generations: int, max_completion_length: int, micro_batch: int) -> TrainConfig:
    """A step of ``num_prompts`` × ``num_generations`` completions in micro-batches of ``micro_batch`` (at most the
    whole step)."""
    completions = num_prompts * num_generations
    micro_batch = min(micro_batch, completions)
    if completions % micro_batch:
        raise ConfigError(f"per_device_train_batch_size={micro_batch} must divide the completions per step "
                          f"({num_prompts} prompts x num_generations={num_generations} = {completions})")
    return TrainConfig(num_generations=num_generations, max_completion_length=max_completion_length,
                       per_device_train_batch_size=micro_batch, gradient_accumulation_steps=completions // micro_batch)


BENCH_PROFILES = {
    "tiny": BenchProfile(
        name="tiny", step=_step(16, 4, 64, 16), prompt_tokens=128, warmup=1, repeats=3,
        grpo_backends=("hf",), grpo_steps=2, grpo_warmup_steps=1,
        why=("CPU CI on 2 cores in ~3 minutes with one vLLM engine start: fewer prompts and shorter completions "
             "than the write-up's workload (the seed profile); the GRPO step runs with HF generate only (vLLM "
             "colocate would start a second engine, ~40 s more; pass --grpo-backends hf,vllm to run it)")),
    "seed": BenchProfile(
        name="seed", step=_step(128, 4, 256, 32), prompt_tokens=128, warmup=1, repeats=3,
        grpo_backends=("hf", "vllm"), grpo_steps=3, grpo_warmup_steps=1,
        why="the source write-up's workload: 128 prompts x 4 completions, prompts of ~128 tokens, up to 256 new "
            "tokens"),
}
DEFAULT_PROFILE = {"cpu": "tiny", "cuda": "seed", "npu": "seed"}
STEP_FIELDS = ("num_prompts", "num_generations", "max_completion_length", "per_device_train_batch_size")
"""What shapes a bench profile's step (``num_prompts`` sets ``gradient_accumulation_steps``)."""


def get_bench_profile(name: str | None = None, **overrides) -> BenchProfile:
    """A profile by name (default: ``tiny`` on the CPU, ``seed`` on accelerators) with fields replaced; the step's
    fields (:data:`STEP_FIELDS`) are given by their TRL names."""
    key = (name or DEFAULT_PROFILE[device.detect()]).strip().lower()
    if key not in BENCH_PROFILES:
        raise ConfigError(f"unknown bench profile {name!r}: use one of {', '.join(BENCH_PROFILES)}")
    profile = BENCH_PROFILES[key]
    known = set(STEP_FIELDS) | {f.name for f in fields(BenchProfile)} - {"name", "step"}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown bench profile field(s) {sorted(unknown)}; known: {sorted(known)}")
    for field_name, value in overrides.items():
        if field_name != "grpo_backends" and (not isinstance(value, int) or value < (0 if field_name in (
                "warmup", "grpo_warmup_steps") else 1)):
            raise ConfigError(f"{field_name}={value!r}: must be an integer of at least "
                              f"{0 if field_name in ('warmup', 'grpo_warmup_steps') else 1}")
    shape = {"num_prompts": profile.num_prompts, **{k: getattr(profile.step, k) for k in STEP_FIELDS[1:]}}
    shape.update({k: v for k, v in overrides.items() if k in STEP_FIELDS})
    step = _step(shape["num_prompts"], shape["num_generations"], shape["max_completion_length"],
                 shape["per_device_train_batch_size"])
    return replace(profile, step=step, **{k: v for k, v in overrides.items() if k not in STEP_FIELDS})


class BenchError(GrpoLabError, RuntimeError):
    """A part of the benchmark failed to run; the message holds the failing process's output."""


# --------------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------------
def seed_workload(tokenizer, count: int, prompt_tokens: int) -> list[dict[str, Any]]:
    """``count`` course problems as chat prompts of about ``prompt_tokens`` tokens (chat template included).

    Each eval question follows its *own* solved train examples (same language), cut to the token budget, so
    no two prompts share a header: what prefix caching can share is a prompt among its ``n`` samples, as in
    GRPO. Rows keep ``answer``/``type``/``lang``/``unit``, so the GRPO step can score them.
    """
    questions = load_split("eval")
    pools: dict[str, list[dict]] = {}
    for row in load_split("train"):
        pools.setdefault(row["lang"], []).append(row)
    cursors = {lang: 0 for lang in pools}
    rows = []
    for index in range(count):
        row = questions[index % len(questions)]
        question = row["prompt"][-1]["content"]
        budget = prompt_tokens - len(encode_prompts(tokenizer, [[{"role": "user", "content": question}]])[0].token_ids)
        header = ""
        if budget > 2:
            pool, parts, ids = pools[row["lang"]], [], []
            while len(ids) < budget:
                example = pool[cursors[row["lang"]] % len(pool)]
                cursors[row["lang"]] += 1
                parts.append(f"{example['prompt'][-1]['content']}\n{example['completion']}")
                ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
            header = tokenizer.decode(ids[:budget - 2], skip_special_tokens=True).rstrip() + "\n\n"
        rows.append({**{key: row.get(key) for key in ("id", "type", "lang", "answer", "unit")},
                     "prompt": [{"role": "user", "content": header + question}]})
    return rows


def draw_lengths(num_prompts: int, n: int, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Completion lengths for the ragged variant with random weights: uniform integers from
    ``max(1, max_tokens // 16)`` to ``max_tokens`` (mean about 0.53 x max_tokens), fixed seed."""
    low = max(1, max_tokens // 16)
    rng = random.Random(seed)
    return [[rng.randint(low, max_tokens) for _ in range(n)] for _ in range(num_prompts)]


def ragged_description(mode: str, max_tokens: int) -> str:
    if mode == "eos":
        return "each completion ends at the model's end token (or max_tokens), as GRPO rollouts do"
    return (f"lengths drawn uniformly from {max(1, max_tokens // 16)}..{max_tokens} tokens (fixed seed; the same "
            f"lengths for every config); random weights almost never sample the end token")


# --------------------------------------------------------------------------------------------------
# Timing helpers
# --------------------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count); NaN for no values."""
    return float(statistics.median(values)) if len(values) else float("nan")


def alternating_orders(configs: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the configs in each round: rotated by one per round, so none always runs first (after an
    idle device) or last (after the others warmed caches)."""
    configs = list(configs)
    if not configs:
        return [[] for _ in range(rounds)]
    return [configs[r % len(configs):] + configs[:r % len(configs)] for r in range(rounds)]


@dataclass
class Measurement:
    """The timed repeats of one config on one variant."""

    times_s: list[float] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    completion_lengths: list[list[int]] = field(default_factory=list, repr=False)
    """Lengths of the last timed repeat, per prompt (for the roofline)."""
    stopped_share: float = float("nan")
    """Share of completions of the last repeat that ended at the end token."""

    def add(self, result) -> None:
        self.times_s.append(result.generate_s)
        self.new_tokens.append(result.new_tokens)
        self.completion_lengths = [[len(c.token_ids) for c in o.completions] for o in result.outputs]
        finished = [c.finish_reason == "stop" for o in result.outputs for c in o.completions]
        self.stopped_share = sum(finished) / len(finished)

    @property
    def median_s(self) -> float:
        return median(self.times_s)

    @property
    def tokens_per_s(self) -> float:
        """Median over repeats of new tokens / time (robust when token counts differ between repeats)."""
        return median([tokens / seconds for tokens, seconds in zip(self.new_tokens, self.times_s)])

    def as_dict(self) -> dict[str, Any]:
        sequences = sum(len(lengths) for lengths in self.completion_lengths)
        return {"times_s": self.times_s, "median_s": self.median_s, "new_tokens": self.new_tokens,
                "tokens_per_s": self.tokens_per_s, "stopped_share": self.stopped_share,
                "mean_completion_tokens": (sum(map(sum, self.completion_lengths)) / sequences) if sequences else None}


# --------------------------------------------------------------------------------------------------
# Rollout benchmark
# --------------------------------------------------------------------------------------------------
class _Contenders:
    """The engines of one rollout benchmark, opened once, and how each config calls them."""

    def __init__(self, model: str, config, prompts, configs: Sequence[str], prefix_off: str):
        self.engines: dict[str, Any] = {}
        self.prefix_off = prefix_off
        self.load_s: dict[str, float] = {}
        try:
            if "hf" in configs:
                self.engines["hf"] = open_engine(model, config, backend="hf", prompts=prompts)
            if "vllm+prefix" in configs or ("vllm" in configs and prefix_off == "salt"):
                self.engines["vllm+prefix"] = open_engine(model, config, backend="vllm", prompts=prompts,
                                                          enable_prefix_caching=True)
            if "vllm" in configs:
                self.engines["vllm"] = (self.engines["vllm+prefix"] if prefix_off == "salt" else
                                        open_engine(model, config, backend="vllm", prompts=prompts,
                                                    enable_prefix_caching=False))
        except BaseException:
            self.stop()
            raise
        self.load_s = {name: engine.load_s for name, engine in self.engines.items()}

    def run(self, name: str, prompts, sampling, lengths):
        engine = self.engines[name]
        if name == "hf":
            return engine.generate(prompts, sampling, lengths=lengths)
        if name == "vllm" and self.prefix_off == "salt":
            with engine.isolated_prefixes():
                return engine.generate(prompts, sampling, lengths=lengths)
        if engine.config.enable_prefix_caching:
            engine.reset_prefix_cache()  # new prompts every GRPO step: no cache carried over between repeats
        return engine.generate(prompts, sampling, lengths=lengths)

    def settings(self) -> dict[str, Any]:
        keep = ("dtype", "max_model_len", "max_num_seqs", "enforce_eager", "gpu_memory_utilization",
                "cpu_kvcache_gib", "enable_prefix_caching", "load_format", "hf_batch_size", "vllm_options",
                "hf_generate_options")
        out = {}
        for name, engine in self.engines.items():
            out[name] = {key: getattr(engine.config, key) for key in keep}
            out[name]["backend"] = engine.choice.reason
        return out

    def stop(self) -> None:
        for engine in {id(e): e for e in self.engines.values()}.values():
            engine.stop()


def rollout_bench(model: str, rows: Sequence[dict], profile: BenchProfile, config, configs: Sequence[str] = CONFIGS,
                  variants: Sequence[str] = VARIANTS, ragged: str = "uniform", prefix_off: str = "salt",
                  progress: bool | None = None) -> dict[str, Any]:
    """Time each config on each variant, alternating, ``profile.warmup`` rounds thrown away, then
    ``profile.repeats`` timed rounds. ``config`` is the :class:`~grpo_lab.rollout.RolloutConfig` for every engine.

    Returns the ``rollout`` block of the results (see :func:`check_results`); each vLLM call starts with an
    empty prefix cache, so prefix caching only shares a prompt among its own ``n`` samples, as in a GRPO step.
    """
    _check_choice("configs", configs, CONFIGS)
    _check_choice("variants", variants, VARIANTS)
    _check_choice("ragged", [ragged], RAGGED_MODES)
    _check_choice("prefix_off", [prefix_off], PREFIX_OFF_MODES)
    prompts = [row["prompt"] for row in rows]
    drawn = draw_lengths(len(prompts), profile.step.num_generations, profile.step.max_completion_length) if ragged == "uniform" else None
    plans = {
        "fixed": (Sampling(n=profile.step.num_generations, max_tokens=profile.step.max_completion_length, temperature=config.temperature,
                           seed=config.seed, min_tokens=profile.step.max_completion_length), None),
        "ragged": (Sampling(n=profile.step.num_generations, max_tokens=profile.step.max_completion_length, temperature=config.temperature,
                            seed=config.seed), drawn),
    }
    measurements = {variant: {name: Measurement() for name in configs} for variant in variants}
    rounds = profile.warmup + profile.repeats
    contenders = _Contenders(model, config, prompts, configs, prefix_off)
    try:
        prompt_lengths = [len(p.token_ids) for p in next(iter(contenders.engines.values())).encode(prompts)]
        calls = [(r, variant, name) for r, order in enumerate(alternating_orders(configs, rounds))
                 for variant in variants for name in order]
        show = env.show_progress() if progress is None else progress  # a bar in a terminal, none in a notebook
        for r, variant, name in tqdm(calls, desc="rollout bench", disable=not show):
            sampling, lengths = plans[variant]
            result = contenders.run(name, prompts, sampling, lengths)
            if r >= profile.warmup:
                measurements[variant][name].add(result)
        settings, load_s = contenders.settings(), contenders.load_s
    finally:
        contenders.stop()

    out_variants = {}
    for variant in variants:
        sampling, lengths = plans[variant]
        results = {name: m.as_dict() for name, m in measurements[variant].items()}
        base = results.get("hf", {}).get("tokens_per_s")
        out_variants[variant] = {
            "lengths": (f"every completion exactly {profile.step.max_completion_length} tokens (min_tokens = max_tokens)"
                        if variant == "fixed" else ragged_description(ragged, profile.step.max_completion_length)),
            "sampling": asdict(sampling),
            "configs": results,
            "speedup_vs_hf": ({name: r["tokens_per_s"] / base for name, r in results.items() if name != "hf"}
                              if base else {}),
            "_lengths": {name: m.completion_lengths for name, m in measurements[variant].items()},
        }
    return {
        "workload": {"num_prompts": len(prompts), "n": profile.step.num_generations, "max_tokens": profile.step.max_completion_length,
                     "prompt_tokens_target": profile.prompt_tokens, "prompt_tokens_min": min(prompt_lengths),
                     "prompt_tokens_mean": sum(prompt_lengths) / len(prompt_lengths),
                     "prompt_tokens_max": max(prompt_lengths), "temperature": config.temperature,
                     "ragged": ragged},
        "method": (f"{profile.warmup} warm-up round(s) thrown away, then {profile.repeats} timed rounds; in each "
                   f"round every variant runs every config, the config order rotating by one per round; median "
                   f"reported; the prefix cache is emptied before every vLLM call"),
        "configs": {name: CONFIG_MEANING[name] for name in configs},
        "prefix_off": PREFIX_OFF_MEANING[prefix_off] if "vllm" in configs else None,
        "settings": settings,
        "load_s": load_s,
        "variants": out_variants,
        "_prompt_lengths": prompt_lengths,
    }


def _check_choice(name: str, given: Sequence[str], allowed: Sequence[str]) -> None:
    unknown = [g for g in given if g not in allowed]
    if unknown or not given:
        raise ConfigError(f"{name}={list(given)!r}: choose from {', '.join(allowed)}")


# --------------------------------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------------------------------
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
                + (f", {self.threads} torch thread(s)" if self.kind == "cpu" else ""))


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
    copy_bytes = copy_bytes or (2 * 2**30 if kind != "cpu" else 256 * 2**20)
    gemm_size = gemm_size or (8192 if kind != "cpu" else 1024)
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


# --------------------------------------------------------------------------------------------------
# GRPO step benchmark
# --------------------------------------------------------------------------------------------------
def grpo_step_config(profile: BenchProfile, model: str, dataset: str | Path, max_prompt_length: int, kind: str,
                     **train_overrides) -> TrainConfig:
    """The experiment a bench step runs: the profile's step shape on ``dataset`` (every row, no type filter), the
    device's profile for the rest of the recipe, no checkpoints (server mode in ``benchmarks/scale_out`` runs the
    same one)."""
    return dataclasses.replace(
        profile.step, profile=DEFAULT_FOR_DEVICE[kind], model=model, dataset=str(dataset), train_types=(), train_languages=(),
        max_prompt_length=max_prompt_length, max_steps=profile.grpo_warmup_steps + profile.grpo_steps,
        save_steps=10**9, save_total_limit=None, live_plot=False, logging_steps=1, **train_overrides)


def ragged_model_dir(model: str | Path, out_dir: str | Path,
                     stop_probability: float = RAGGED_STOP_PROBABILITY) -> tuple[Path, dict[str, Any]]:
    """A view of a model folder (its files linked) whose ``generation_config.json`` ends a completion at any of
    ``round(stop_probability x vocab)`` token ids besides the end token: HF ``generate``, vLLM and TRL's completion
    masks all read that list, so random weights (which practically never sample the end token) give GRPO-like ragged
    completions, the same way for both backends. Returns the folder and what was set."""
    source, out = Path(model), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "generation_config.json":
            (out / path.name).symlink_to(path.resolve())
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    vocab = int(config["vocab_size"])
    end = config.get("eos_token_id")
    ends = [end] if isinstance(end, int) else list(end or [])
    count = max(1, round(stop_probability * vocab))
    stride = vocab // count
    stops = [i for i in range(stride // 2, vocab, stride)][:count]
    generation = {"eos_token_id": sorted(set(ends) | set(stops)), "pad_token_id": config.get("pad_token_id"),
                  "bos_token_id": config.get("bos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1), encoding="utf-8")
    mean = (1 - (1 - count / vocab) ** 256) / (count / vocab)  # geometric, cut at 256, if sampling were uniform
    return out, {"stop_token_ids": len(generation["eos_token_id"]), "vocab_size": vocab,
                 "stop_probability": count / vocab,
                 "lengths": f"each sampled token ends the completion with probability ~{count / vocab:.4f} "
                            f"({count} of {vocab} ids, plus the end token): roughly geometric lengths (mean ~"
                            f"{mean:.0f} of 256 if sampling were uniform; the measured mean is reported per step)"}


def grpo_step_bench(model: str, rows: Sequence[dict], profile: BenchProfile, backends: Sequence[str] | None = None,
                    workdir: str | Path | None = None, workload: str = "fixed", stop_ids: bool = True,
                    **train_overrides) -> dict[str, Any]:
    """Run ``grpo_warmup_steps + grpo_steps`` GRPO steps per backend (``"hf"`` generate, ``"vllm"`` colocate)
    with :func:`grpo_lab.train.build_trainer`, one backend after the other; report the median step and its split.

    Each step samples ``n`` completions for all ``num_prompts`` prompts at once (TRL's generation batch) and
    accumulates gradients over micro-batches of ``grpo_batch_size``. ``update`` is the step minus generation
    and rewards: log-probabilities (policy and reference), loss, backward and the optimizer step; the trainer splits
    both further (:data:`STEP_SPLIT`). ``workload="ragged"`` ends completions early: with random weights
    (``stop_ids``) through :func:`ragged_model_dir`, with a real model at its own end token.
    ``train_overrides`` go to :class:`grpo_lab.train.TrainConfig` (e.g. ``beta=0.0``).
    """
    backends = tuple(backends or profile.grpo_backends)
    _check_choice("grpo backends", backends, ("hf", "vllm"))
    _check_choice("grpo workload", [workload], GRPO_WORKLOADS)
    machine = Machine.detect()
    kind = machine.kind
    longest = max(len(p.token_ids) for p in encode_prompts(load_tokenizer(model), [r["prompt"] for r in rows]))
    if not stop_ids:  # real weights: the bench sets no lengths, so "fixed" and "ragged" are the same workload
        workload, lengths = OWN_LENGTHS, ("each completion ends where the model samples its end token, or at "
                                          "max_completion_length: the lengths are the model's, not set by the bench")
    else:
        lengths = "every completion exactly max_completion_length tokens (random weights never sample the end token)"
    out: dict[str, Any] = {"backends": {}, "steps_timed": profile.grpo_steps, "workload": workload,
                           "warmup_steps": profile.grpo_warmup_steps,
                           "completions_per_step": profile.sequences,
                           "method": ("backends one after the other (one trainer at a time); per backend the first "
                                      f"{profile.grpo_warmup_steps} step(s) are thrown away and the median of the "
                                      f"next {profile.grpo_steps} reported")}
    with _scratch(workdir) as scratch:
        if workload == "ragged" and stop_ids:
            model, out["ragged"] = ragged_model_dir(model, Path(scratch) / "ragged-model")
            lengths = out["ragged"]["lengths"]
        out["lengths"] = lengths
        dataset = Path(scratch) / "seed_workload.jsonl"
        write_jsonl(rows, dataset)
        step = grpo_step_config(profile, model, dataset, longest, kind, **train_overrides)
        for backend in backends:
            config = dataclasses.replace(step, output_dir=str(Path(scratch) / f"run-{backend}"),
                                         use_vllm=backend == "vllm").resolve(machine)
            logger = MetricsLogger(Path(config.output_dir), live_plot=False)
            timer = StepClock(kind, keep_checkpoints=False)
            trainer = build_trainer(config, callbacks=[logger, timer])
            try:
                trainer.train()
                reason = trainer.backend_reason
            finally:
                _release_trainer(trainer, kind)
                del trainer
            out["backends"][backend] = _step_summary(timer.seconds, logger.records, profile, reason)
            out["backends"][backend]["settings"] = {key: getattr(config, key) for key in (
                "gradient_checkpointing", "use_liger_kernel", "bf16", "vllm_gpu_memory_utilization", "beta")}
        out["model_dir"] = str(model)
        out["max_prompt_length"] = longest
    if "hf" in out["backends"] and "vllm" in out["backends"]:
        out["speedup_vs_hf"] = out["backends"]["hf"]["median"]["step_s"] / out["backends"]["vllm"]["median"]["step_s"]
    return out


def _step_summary(seconds: list[float], records: list[dict], profile: BenchProfile, reason: str) -> dict[str, Any]:
    skip = profile.grpo_warmup_steps
    steps = seconds[skip:]
    logged = records[skip:skip + len(steps)]
    split = {name: [r.get(f"timing/{name}", float("nan")) for r in logged] for name in STEP_SPLIT}
    # the update is the step (this clock) less generation and rewards; its own split is the trainer's
    split["update_s"] = [s - g - w for s, g, w in zip(steps, split["generation_s"], split["reward_s"])]
    split["backward_optimizer_s"] = [u - o if o == o else u for u, o in zip(split["update_s"],
                                                                             split["old_ref_logps_s"])]
    split = {name: values for name, values in split.items() if any(v == v for v in values)}  # drop absent (NaN)
    lengths = [r.get("completions/mean_length", float("nan")) for r in logged]
    return {"backend": reason, "step_s": steps, **split, "mean_completion_tokens": lengths, "all_steps_s": seconds,
            "median": {"step_s": median(steps), **{name: median(values) for name, values in split.items()},
                       "mean_completion_tokens": median(lengths)}}


def _release_trainer(trainer, kind: str) -> None:
    """Free a trainer's model, optimizer and colocated vLLM engine before the next backend starts."""
    engine = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if engine is not None:
        with contextlib.suppress(Exception):
            engine.llm_engine.engine_core.shutdown()
    trainer.model = trainer.optimizer = trainer.ref_model = None
    gc.collect()
    device.empty_cache(kind)


@contextlib.contextmanager
def _scratch(folder: str | Path | None) -> Iterator[str]:
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        yield str(folder)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-lab-bench-") as scratch:
            yield scratch


def bottleneck(step: dict[str, Any]) -> dict[str, float | str]:
    """The seed's method on one backend's step: generation tokens/s vs training samples/s, and which one the
    step waits on. ``step`` is ``results["grpo_step"]["backends"][name]``."""
    m = step["median"]
    completions = step.get("completions_per_step") or 0
    tokens = completions * m["mean_completion_tokens"]
    generation_share = m["generation_s"] / m["step_s"]
    return {"generation_tokens_per_s": tokens / m["generation_s"],
            "training_samples_per_s": completions / m["update_s"] if m["update_s"] > 0 else float("nan"),
            "generation_share": generation_share,
            "verdict": "generation-bound" if generation_share > 0.5 else "update-bound"}


# --------------------------------------------------------------------------------------------------
# Model FLOPs utilization of the update
# --------------------------------------------------------------------------------------------------
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


def extra_forwards(backend: str, beta: float) -> int:
    """No-grad forwards TRL adds before the update: old log-probs when vLLM samples (its importance-sampling
    correction; HF generate with steps_per_generation = accumulation steps needs none) and the reference (beta > 0)."""
    return int(backend == "vllm") + int(beta > 0)


# --------------------------------------------------------------------------------------------------
# The same engine in a fresh process: vLLM with TRL's colocate settings, outside the trainer
# --------------------------------------------------------------------------------------------------
def trl_engine_settings(config: TrainConfig, model: str) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments as TRL 1.16 builds its colocated engine (trl/generation/vllm_generation.py)."""
    return dict(model=model, tensor_parallel_size=1, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                max_model_len=config.max_model_len, max_num_seqs=config.generation_batch_size,
                enable_sleep_mode=False, model_impl="vllm", distributed_executor_backend="external_launcher",
                seed=0, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", trust_remote_code=False)


def engine_probe(config: TrainConfig, model: str, rows: Sequence[dict], repeats: int = 3) -> dict[str, Any]:
    """Time ``LLM.generate`` of one step's requests (each prompt ``num_generations`` times, n=1, log-probs, no
    detokenizing: what the trainer sends) on TRL's engine settings in a fresh process: the baseline for the
    in-trainer ``timing/vllm_generate_s``. Median of ``repeats`` after one warm-up, prefix cache reset each time."""
    tokenizer = load_tokenizer(model)
    prompts = [list(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows])]
    spec = {"engine": trl_engine_settings(config, model), "repeats": repeats,
            "prompts": [ids for ids in prompts for _ in range(config.num_generations)],
            "sampling": dict(n=1, temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_completion_length,
                             logprobs=0, detokenize=False)}
    with tempfile.TemporaryDirectory(prefix="grpo-lab-probe-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        environment = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}
        if config.device == "cpu":
            environment.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{CPU_KV_CACHE_GIB:g}")
        done = run_process_group([sys.executable, "-m", "grpo_lab.bench", "engine-probe", str(spec_path)],
                                 environment, timeout_s=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise BenchError(f"the engine probe failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-2000:]}")
    return {**json.loads(lines[-1][7:]), "settings": {k: v for k, v in spec["engine"].items() if k != "model"},
            "sampling": spec["sampling"], "requests": len(spec["prompts"])}


def _run_engine_probe(spec_path: str) -> int:
    """The probe's own process: build the engine, time the generation, print ``RESULT {json}``."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    kind = device.detect()
    started = time.perf_counter()
    llm = LLM(**spec["engine"])
    load_s = time.perf_counter() - started
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = SamplingParams(**spec["sampling"])
    times, tokens = [], []
    for _ in range(1 + spec["repeats"]):
        llm.reset_prefix_cache()
        device.synchronize(kind)
        started = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        device.synchronize(kind)
        times.append(time.perf_counter() - started)
        tokens.append(sum(len(o.outputs[0].token_ids) for o in outputs))
    print("RESULT " + json.dumps({"load_s": load_s, "generate_s": times[1:], "median_s": median(times[1:]),
                                  "new_tokens": tokens[1:]}), flush=True)
    return 0


# --------------------------------------------------------------------------------------------------
# The whole run, results, summary
# --------------------------------------------------------------------------------------------------
REQUIRED_KEYS = {
    "": ("schema", "created", "command", "profile", "model", "environment", "load_average", "parts", "notes"),
    "model": ("path", "weights", "dtype", "params"),
    "rollout": ("workload", "method", "configs", "settings", "load_s", "variants"),
    "rollout.variant": ("lengths", "sampling", "configs", "speedup_vs_hf"),
    "rollout.config": ("times_s", "median_s", "new_tokens", "tokens_per_s"),
    "grpo_step": ("backends", "method", "completions_per_step"),
    "grpo_step.backend": ("backend", "step_s", "generation_s", "reward_s", "update_s", "median"),
    "roofline": ("device", "model_cost"),
}


def check_results(results: dict[str, Any]) -> dict[str, Any]:
    """Raise ValueError naming every missing key of a results dict (or JSON file's content); return it."""
    missing = [key for key in REQUIRED_KEYS[""] if key not in results]
    if results.get("schema") not in (None, SCHEMA):
        missing.append(f"schema {SCHEMA!r} (found {results.get('schema')!r})")
    missing += [f"model.{k}" for k in REQUIRED_KEYS["model"] if k not in results.get("model", {})]
    rollout = results.get("rollout")
    if rollout is not None:
        missing += [f"rollout.{k}" for k in REQUIRED_KEYS["rollout"] if k not in rollout]
        for variant, block in rollout.get("variants", {}).items():
            missing += [f"rollout.variants.{variant}.{k}" for k in REQUIRED_KEYS["rollout.variant"] if k not in block]
            for name, result in block.get("configs", {}).items():
                missing += [f"rollout.variants.{variant}.configs.{name}.{k}"
                            for k in REQUIRED_KEYS["rollout.config"] if k not in result]
    step = results.get("grpo_step")
    if step is not None and "skipped" not in step:
        missing += [f"grpo_step.{k}" for k in REQUIRED_KEYS["grpo_step"] if k not in step]
        for name, block in step.get("backends", {}).items():
            missing += [f"grpo_step.backends.{name}.{k}" for k in REQUIRED_KEYS["grpo_step.backend"] if k not in block]
    if results.get("roofline") is not None:
        missing += [f"roofline.{k}" for k in REQUIRED_KEYS["roofline"] if k not in results["roofline"]]
    if missing:
        raise ConfigError(f"benchmark results are missing: {', '.join(missing)}")
    return results


def bench_engine_config(profile: BenchProfile, kind: str, dummy: bool,
                        overrides: dict[str, Any] | None = None) -> tuple[Any, list[str]]:
    """The :class:`~grpo_lab.rollout.RolloutConfig` every engine of the rollout bench shares, and notes saying
    which defaults the bench chose differently from the rollout module and why (``overrides`` win)."""
    overrides = dict(overrides or {})
    notes = []
    # seed=None: vLLM seeds its engine once; per-request seeds would put its sampler on a slow per-request path
    values: dict[str, Any] = {"n": profile.step.num_generations, "max_tokens": profile.step.max_completion_length, "temperature": 1.0, "seed": None,
                              "load_format": "dummy" if dummy else "auto"}
    for name, engine_name in (("max_num_seqs", "vLLM"), ("hf_batch_size", "HF generate")):
        if name not in overrides:
            values[name] = profile.sequences
            notes.append(f"{name}={profile.sequences}: {engine_name} holds all {profile.sequences} sequences at once")
    options = dict(overrides.pop("vllm_options", {}))
    if kind == "cpu" and "block_size" not in options:
        options["block_size"] = 32
        notes.append("vLLM-CPU block_size=32 (its default 128 would cache nothing of a ~128-token prompt: only full "
                     "blocks are cached and the last prompt token is always recomputed; 32 is the smallest the CPU "
                     "attention kernel takes)")
    return RolloutConfig(**values, vllm_options=options, **overrides), notes


def run_bench(profile: BenchProfile, model: str | None = None, shape: str | None = None,
              parts: Sequence[str] = PARTS, configs: Sequence[str] = CONFIGS, variants: Sequence[str] = VARIANTS,
              ragged: str | None = None, prefix_off: str = "salt", engine: dict[str, Any] | None = None,
              grpo_backends: Sequence[str] | None = None, train_overrides: dict[str, Any] | None = None,
              command: str = "", progress: bool | None = None, grpo_workload: str = "fixed") -> dict[str, Any]:
    """Everything in one process: rollouts, GRPO step, roofline; returns the results dict.

    ``shape`` (``qwen2.5-0.5b``/``qwen2.5-1.5b``) runs random ("dummy") weights of that architecture with the
    tiny model's tokenizer; ``engine`` holds :class:`~grpo_lab.rollout.RolloutConfig` overrides for every
    engine (``max_num_seqs``, ``hf_batch_size``, ``vllm_options`` ...); ``ragged`` is ``uniform`` (drawn
    lengths, the default: random weights never end, and the tiny model answers these long prompts in ~6 tokens)
    or ``eos`` (a real model's own lengths). ``grpo_workload`` is the GRPO step's (``fixed`` or ``ragged``, see
    :func:`grpo_step_bench`); the ``engine`` part times the same step's generation on TRL's engine settings in a
    fresh process (:func:`engine_probe`).
    """
    _check_choice("parts", parts, PARTS)
    load = os.getloadavg()
    started = time.perf_counter()
    kind = device.detect()
    with tempfile.TemporaryDirectory(prefix="grpo-lab-bench-") as scratch:
        if shape:
            path = str(shaped_model_dir(shape, Path(scratch) / "model", model,
                                        random_weights="grpo" in parts))
        else:
            path = resolve_model(model)
        dummy = bool(shape)
        ragged = ragged or "uniform"
        tokenizer = load_tokenizer(path)
        rows = seed_workload(tokenizer, profile.num_prompts, profile.prompt_tokens)
        config, engine_notes = bench_engine_config(profile, kind, dummy, engine)
        dtype = config.dtype or str(device.preferred_dtype(kind)).removeprefix("torch.")
        cost = model_cost(path, dtype)
        notes = [f"profile {profile.name}: {profile.why}",
                 ("weights: RANDOM (dummy) of the " + shape + " shape with the tiny model's tokenizer: every number "
                  "here is speed only; outputs are noise") if dummy else f"weights: real ({Path(path).name})",
                 *(engine_notes if "rollout" in parts else []), SEED_REFERENCE]
        if kind == "cpu":
            notes.append(f"CPU timings are noisy: load average {load[0]:.1f} on {os.cpu_count()} cores at the start")
            notes.append("on the CPU, HF generate computes in this process with torch's threads (OMP_NUM_THREADS); "
                         "vLLM-CPU's worker binds its OpenMP threads to the cores it does not reserve for its "
                         "scheduler process (on 2 cores: one each), so on a loaded machine vLLM's extra processes get "
                         "a larger share of the CPU, which favours it; the roofline rates use this process's threads")
        results: dict[str, Any] = {
            "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
            "profile": profile.as_dict(), "parts": list(parts),
            "model": {"path": Path(path).name if not shape else f"{shape} (random weights)", "shape": shape,
                      "weights": "dummy" if dummy else "real", "dtype": dtype, "params": cost.params},
            "environment": env.report().as_dict(), "load_average": {"start": list(load)}, "notes": notes,
        }
        if "roofline" in parts:
            rates = measure_device(kind, dtype)
            results["roofline"] = {"device": asdict(rates), "model_cost": {**asdict(cost),
                                                                          "param_bytes": cost.param_bytes,
                                                                          "matmul_params": cost.matmul_params}}
        if "rollout" in parts:
            rollout = rollout_bench(path, rows, profile, config, configs, variants, ragged, prefix_off, progress)
            if "roofline" in parts:
                add_roofline(rollout, cost, rates)
            results["rollout"] = _public(rollout)
        probe = None
        backends = grpo_backends or profile.grpo_backends
        if "engine" in parts and "vllm" in backends:  # first, on an empty device: the trainers' engines hold memory
            if grpo_workload == "ragged" and dummy:
                raise ConfigError("--parts engine times the fixed workload (the ragged one changes the model's end "
                                  "tokens inside grpo_step_bench); run it with --grpo-workload fixed")
            longest = max(len(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows]))
            probe_config = dataclasses.replace(
                grpo_step_config(profile, path, "unused", longest, kind, **(train_overrides or {})),
                use_vllm=True).resolve(Machine.detect())
            probe = engine_probe(probe_config, path, rows)
        if "grpo" in parts:
            step = grpo_step_bench(path, rows, profile, grpo_backends, workload=grpo_workload, stop_ids=dummy,
                                   **(train_overrides or {}))
            results["grpo_step"] = step
            peak = (DATASHEET_RATES["NVIDIA H200"].matmul_flops_per_s if "H200" in device.device_name(kind=kind)
                    else rates.matmul_flops_per_s if "roofline" in parts else None)
            for name, block in step["backends"].items():
                block["completions_per_step"] = profile.sequences
                block["bottleneck"] = bottleneck(block)
                if peak:
                    block["mfu"] = update_mfu(block, cost, step["max_prompt_length"], profile.sequences, peak,
                                              extra_forwards(name, block["settings"]["beta"]))
            if probe is not None and "vllm" in step["backends"]:
                in_trainer = step["backends"]["vllm"]["median"].get("vllm_generate_s", float("nan"))
                step["fresh_engine"] = {**probe, "in_trainer_vs_fresh": in_trainer / probe["median_s"]}
            if "vllm" not in backends:
                notes.append("GRPO step: vLLM colocate not measured in this run (--grpo-backends hf,vllm adds it)")
        else:
            results["grpo_step"] = {"skipped": "not in --parts"}
    results["load_average"]["end"] = list(os.getloadavg())
    results["seconds"] = time.perf_counter() - started
    return check_results(results)


def _public(rollout: dict[str, Any]) -> dict[str, Any]:
    """The rollout block without the per-sequence lengths kept for the roofline (they would bloat the JSON)."""
    out = {k: v for k, v in rollout.items() if not k.startswith("_")}
    out["variants"] = {name: {k: v for k, v in block.items() if not k.startswith("_")}
                       for name, block in rollout["variants"].items()}
    return out


def summary(results: dict[str, Any]) -> str:
    """The results as text tables: rollout times, ratios and roofline; GRPO step split; device rates."""
    lines = []
    model = results["model"]
    lines.append(f"model: {model['path']}, {model['params'] / 1e6:,.1f} M parameters, {model['dtype']}, "
                 f"weights {model['weights'].upper()}")
    roof = results.get("roofline")
    if roof:
        lines.append("device: " + DeviceRates(**roof["device"]).describe())
    rollout = results.get("rollout")
    if rollout:
        w = rollout["workload"]
        lines.append(f"\nrollout: {w['num_prompts']} prompts x n={w['n']}, prompts {w['prompt_tokens_min']}-"
                     f"{w['prompt_tokens_max']} tokens (target {w['prompt_tokens_target']}), up to {w['max_tokens']} "
                     f"new tokens, T={w['temperature']}")
        lines.append(f"  {rollout['method']}")
        head = f"  {'variant':<8}{'config':<13}{'median s':>10}{'new tok':>9}{'tok/s':>10}{'vs hf':>8}"
        lines.append(head + (f"{'roofline s':>12}{'x roofline':>12}" if roof else ""))
        for variant, block in rollout["variants"].items():
            for name, r in block["configs"].items():
                ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
                line = (f"  {variant:<8}{name:<13}{r['median_s']:>10.2f}{median(r['new_tokens']):>9,.0f}"
                        f"{r['tokens_per_s']:>10,.0f}{ratio:>7.2f}x")
                if "roofline" in r:
                    line += f"{r['roofline']['seconds']:>12.3f}{r['x_roofline_time']:>11.1f}x"
                lines.append(line)
        for variant, block in rollout["variants"].items():
            lines.append(f"  {variant}: {block['lengths']}")
    step = results.get("grpo_step")
    if step and "skipped" not in step:
        lines.append(f"\nGRPO step ({step['completions_per_step']} completions): {step['method']}")
        lines.append(f"  {'backend':<8}{'step s':>9}{'generation':>12}{'reward':>9}{'update':>9}"
                     f"{'gen tok/s':>11}{'train samples/s':>17}  bound")
        for name, block in step["backends"].items():
            m, b = block["median"], block.get("bottleneck") or bottleneck({**block, "completions_per_step":
                                                                           step["completions_per_step"]})
            lines.append(f"  {name:<8}{m['step_s']:>9.2f}{m['generation_s']:>12.2f}{m['reward_s']:>9.3f}"
                         f"{m['update_s']:>9.2f}{b['generation_tokens_per_s']:>11,.0f}"
                         f"{b['training_samples_per_s']:>17,.1f}  {b['verdict']}")
        lines.append(f"  workload: {step.get('workload', 'fixed')}: {step.get('lengths', '')}")
        lines.append("  split (median s): " + "; ".join(
            f"{name}: " + ", ".join(f"{key.removesuffix('_s')} {value:.2f}" for key, value in block["median"].items()
                                    if key.endswith("_s") and key != "step_s")
            for name, block in step["backends"].items()))
        for name, block in step["backends"].items():
            if "mfu" in block:
                u = block["mfu"]
                lines.append(f"  {name} update: {u['update_tflop']:.0f} TFLOP of model FLOPs in "
                             f"{block['median']['update_s']:.2f} s = {u['update_tflop_per_s']:.0f} TFLOP/s, MFU "
                             f"{u['mfu']:.1%} of {u['peak_tflop_per_s']:.0f} TFLOP/s")
        if "fresh_engine" in step:
            f = step["fresh_engine"]
            lines.append(f"  vLLM generate in the trainer vs the same engine in a fresh process: "
                         f"{f['in_trainer_vs_fresh']:.2f}x (fresh {f['median_s']:.2f} s)")
        if "speedup_vs_hf" in step:
            lines.append(f"  step speed-up with vLLM colocate: {step['speedup_vs_hf']:.2f}x")
    elif step:
        lines.append(f"\nGRPO step: skipped ({step['skipped']})")
    lines += [f"note: {note}" for note in results["notes"]]
    return "\n".join(lines)


def save_results(results: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.png`` (the bar plots) into ``out_dir``; return both paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, png_path = folder / f"{stem}.json", folder / f"{stem}.png"
    json_path.write_text(json.dumps(check_results(results), indent=1, default=str) + "\n", encoding="utf-8")
    plot_bench(results).savefig(png_path, dpi=110)
    return json_path, png_path


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file written by :func:`save_results`, checked."""
    return check_results(json.loads(Path(path).read_text(encoding="utf-8")))


def committed_rollout_table(folder: str | Path) -> str:
    """A table of every rollout result in a folder of committed runs: this module's ``*.json`` and the older
    ``grpo-lab rollout --json`` files (one backend, no variants)."""
    lines = [f"{'file':<36}{'model':<31}{'variant':<9}{'config':<13}{'new tokens':>11}{'tok/s':>9}{'vs hf':>8}"]
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") == SCHEMA and data.get("rollout"):
            for variant, block in data["rollout"]["variants"].items():
                for name, r in block["configs"].items():
                    ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
                    lines.append(f"{path.name:<36}{data['model']['path']:<31}{variant:<9}{name:<13}"
                                 f"{median(r['new_tokens']):>11,.0f}{r['tokens_per_s']:>9,.0f}{ratio:>7.2f}x")
        elif "results" in data and "settings" in data:  # grpo-lab rollout --json: one call, no variants
            settings = data["settings"]
            model = f"{settings['shape']} (random)" if settings.get("shape") else str(settings.get("model") or "the tiny model")
            for name, r in data["results"].items():
                lines.append(f"{path.name:<36}{model:<31}{'as run':<9}{name:<13}{r['new_tokens']:>11,}"
                             f"{r['tokens_per_s']:>9,.0f}{'-':>8}")
    return "\n".join(lines)


def committed_grpo_table(folder: str | Path) -> str:
    """A table of every GRPO-step result in a folder of committed runs: median step, generation, update per backend."""
    lines = [f"{'file':<36}{'model':<31}{'backend':<9}{'step s':>8}{'gen s':>8}{'update s':>9}{'vs hf':>8}"]
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        step = data.get("grpo_step") if data.get("schema") == SCHEMA else None
        if not step or "backends" not in step:
            continue
        hf = step["backends"].get("hf", {}).get("median", {}).get("step_s")
        for name, r in step["backends"].items():
            m = r["median"]
            ratio = f"{hf / m['step_s']:>7.2f}x" if hf else f"{'-':>8}"
            lines.append(f"{path.name:<36}{data['model']['path']:<31}{name:<9}{m['step_s']:>8.2f}"
                         f"{m['generation_s']:>8.2f}{m['update_s']:>9.2f}{ratio}")
    return "\n".join(lines)


def committed_grpo_split(folder: str | Path) -> list[dict[str, Any]]:
    """One row per committed GRPO-step result and backend: the median step, its split (what the trainer timed; the
    files written before the split existed have only generation / reward / update), and the update's MFU against the
    H200's dense bf16 peak, computed the same way for every file (:func:`update_mfu`, the gpu profile's beta)."""
    rows = []
    peak = DATASHEET_RATES["NVIDIA H200"].matmul_flops_per_s
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        step = data.get("grpo_step") if data.get("schema") == SCHEMA else None
        if not step or "backends" not in step or not data["model"].get("shape"):
            continue
        cost = model_cost(SHAPES[data["model"]["shape"]] | {"model_type": "qwen2"}, data["model"]["dtype"])
        prompt = step.get("max_prompt_length") or data["profile"].get("prompt_tokens")
        hf = step["backends"].get("hf", {}).get("median", {}).get("step_s")
        for name, block in step["backends"].items():
            m = block["median"]
            beta = block.get("settings", {}).get("beta", 0.04)
            row = {"file": path.name, "workload": step.get("workload", "fixed"), "backend": name,
                   **{key.removesuffix("_s"): round(value, 2) for key, value in m.items() if key.endswith("_s")},
                   "tokens": round(m["mean_completion_tokens"]),
                   "vs hf": round(hf / m["step_s"], 2) if hf else None,
                   "update MFU": round(update_mfu(block, cost, prompt, step["completions_per_step"], peak,
                                                  extra_forwards(name, beta))["mfu"], 3)}
            rows.append(row)
    return rows


GRPO_STEP_TARGETS = (
    ("vLLM generate inside the trainer at most 1.2x the same engine in a fresh process", 1.2),
    ("GRPO step, fixed lengths: vLLM colocate at least 2x HF generate", 2.0),
    ("GRPO step, ragged lengths: vLLM colocate at least 3.3x HF generate (the write-up's ratio)", 3.3),
    ("update MFU at least 35 %", 0.35),
)
"""The targets set for the colocated GRPO step on one H200 (threshold each)."""


def committed_grpo_step_targets(folder: str | Path) -> list[dict[str, str]]:
    """Each of :data:`GRPO_STEP_TARGETS` with what the newest committed step files measured and a computed verdict."""
    files = {w: json.loads((Path(folder) / f"grpo_step_seed_qwen2.5-0.5b_{w}.json").read_text(encoding="utf-8"))
             ["grpo_step"] for w in ("fixed", "ragged")}
    fresh = files["fixed"]["fresh_engine"]
    split = [r for r in committed_grpo_split(folder) if r["file"].endswith(("_fixed.json", "_ragged.json"))]
    mfu = max(r["update MFU"] for r in split)
    in_trainer = files["fixed"]["backends"]["vllm"]["median"]["vllm_generate_s"]
    measured = [
        (fresh["in_trainer_vs_fresh"], f"{fresh['in_trainer_vs_fresh']:.2f}x ({in_trainer:.2f} s vs "
                                       f"{fresh['median_s']:.2f} s)", "<="),
        (files["fixed"]["speedup_vs_hf"], f"{files['fixed']['speedup_vs_hf']:.2f}x", ">="),
        (files["ragged"]["speedup_vs_hf"], f"{files['ragged']['speedup_vs_hf']:.2f}x", ">="),
        (mfu, f"{mfu:.1%} at best (" + ", ".join(f"{r['workload']} {r['backend']} {r['update MFU']:.1%}"
                                                 for r in split) + ")", ">="),
    ]
    return [{"target": what, "measured": text,
             "verdict": "met" if (value <= threshold if how == "<=" else value >= threshold) else "missed"}
            for (what, threshold), (value, text, how) in zip(GRPO_STEP_TARGETS, measured)]


def committed_rollout_headlines(folder: str | Path) -> list[dict[str, Any]]:
    """One row per committed bench file (this module's schema) and length variant: HF's tokens/s, the fastest vLLM
    config and its tokens/s, its speed-up over HF, its distance from the roofline time, what prefix caching changed
    (``vllm+prefix`` over ``vllm`` tokens/s), and the bytes of weights each decode step reads."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or not data.get("rollout"):
            continue
        for variant, block in data["rollout"]["variants"].items():
            configs = block["configs"]
            best = max((name for name in configs if name != "hf"), key=lambda name: configs[name]["tokens_per_s"])
            rows.append({
                "file": path.name, "model": data["model"].get("shape") or data["model"]["path"], "variant": variant,
                "param_bytes": data.get("roofline", {}).get("model_cost", {}).get("param_bytes"),
                "hf_tokens_per_s": configs["hf"]["tokens_per_s"], "best": best,
                "best_tokens_per_s": configs[best]["tokens_per_s"], "speedup": block["speedup_vs_hf"][best],
                "x_roofline": configs[best].get("x_roofline_time"),
                "vllm_tokens_per_s": {n: c["tokens_per_s"] for n, c in configs.items() if n != "hf"},
                "vllm_median_s": {n: c["median_s"] for n, c in configs.items() if n != "hf"},
                "prefix_gain": (configs["vllm+prefix"]["tokens_per_s"] / configs["vllm"]["tokens_per_s"]
                                if {"vllm", "vllm+prefix"} <= set(configs) else None)})
    return rows


PERFORMANCE_TARGETS = (
    ("ragged rollout: vLLM at least 6x HF generate", 6.0, "x"),
    ("GRPO step at least 4x faster with vLLM colocate", 4.0, "x"),
    ("1.5B rollout within 3x of the roofline time", 3.0, "x roofline"),
)
"""The targets the project set itself for the H200 runs: (what, threshold, unit)."""


def committed_targets(results_dir: str | Path, smollm2_dir: str | Path) -> list[dict[str, str]]:
    """Each of :data:`PERFORMANCE_TARGETS` with what the committed files measured and a verdict computed from it."""
    headlines = committed_rollout_headlines(results_dir)
    ragged = {row["model"]: row for row in headlines if row["variant"] == "ragged"}
    rollout, step, roofline = PERFORMANCE_TARGETS
    rows = [{"target": rollout[0], "measured": ", ".join(f"{r['speedup']:.2f}x ({m}, {r['best']})" for m, r in
                                                        ragged.items()),
             "verdict": "met" if any(r["speedup"] >= rollout[1] for r in ragged.values()) else "missed"}]
    steps = []
    for path in sorted(Path(results_dir).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        backends = (data.get("grpo_step") or {}).get("backends", {}) if data.get("schema") == SCHEMA else {}
        if {"hf", "vllm"} <= set(backends):
            workload = data["grpo_step"].get("workload")
            steps.append((f"{data['model'].get('shape') or data['model']['path']}"
                          f"{' ' + workload if workload else ''}, the write-up's workload",
                          backends["hf"]["median"]["step_s"] / backends["vllm"]["median"]["step_s"]))
    smollm2 = committed_smollm2_steps(smollm2_dir)
    steps.append((f"SmolLM2-135M, steps {smollm2['steps'][0]}-{smollm2['steps'][1]}", smollm2["speedup"]))
    met = [what.split(",")[0] for what, ratio in steps if ratio >= step[1]]
    missed = [what.split(",")[0] for what, ratio in steps if ratio < step[1]]
    rows.append({"target": step[0], "measured": "; ".join(f"{ratio:.2f}x ({what})" for what, ratio in steps),
                 "verdict": "met" if not missed else "missed" if not met else
                 f"met on {', '.join(met)}; missed on {', '.join(missed)}"})
    large = [r for m, r in ragged.items() if "1.5b" in m]
    rows.append({"target": roofline[0],
                 "measured": ", ".join(f"{r['x_roofline']:.1f}x the roofline time ({r['best']})" for r in large) or "-",
                 "verdict": ("met" if any(r["x_roofline"] <= roofline[1] for r in large) else "missed") if large
                 else "not measured"})
    return rows


def committed_smollm2_steps(folder: str | Path, first: int = 3, last: int = 6) -> dict[str, Any]:
    """The committed SmolLM2-135M GRPO step on the H200 (``benchmarks/grpo_smollm2``), vLLM colocate against HF
    ``generate`` over the same steps: ``run.py`` times HF's steps ``first``-``last`` (``results.json``,
    ``hf_generate``); the vLLM run's steps ``first``-``last`` are read from its ``metrics.jsonl``, so both columns
    cover the same steps (the vLLM mean over the whole run, with completions that shorten as it learns, is
    ``vllm_run_step_s``)."""
    folder = Path(folder)
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    records = runs.read_metrics(folder / "metrics.jsonl")
    window = [r for r in records if first <= r["step"] <= last]
    if not window or "hf_generate" not in results:
        raise ConfigError(f"{folder}: no steps {first}-{last} in metrics.jsonl or no hf_generate in results.json")
    vllm = {key: statistics.mean(r[key] for r in window) for key in ("step_time", "timing/generation_s")}
    hf = results["hf_generate"]
    return {"steps": (first, last), "vllm_step_s": vllm["step_time"], "vllm_generation_s": vllm["timing/generation_s"],
            "hf_step_s": hf["step_s"], "hf_generation_s": hf["generation_s"],
            "speedup": hf["step_s"] / vllm["step_time"],
            "vllm_run_step_s": results["vllm_colocate"]["step_s"], "vllm_run_steps": results["vllm_colocate"]["steps"],
            "device": results.get("device", "")}


# --------------------------------------------------------------------------------------------------
# `grpo-lab bench`
# --------------------------------------------------------------------------------------------------
def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE (VALUE in JSON, e.g. async_scheduling=true)")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-lab bench",
        description="HF generate vs vLLM vs vLLM + prefix caching (fixed and ragged lengths), the GRPO step "
                    "with HF generate vs vLLM colocate, and the roofline; prints ratios, writes JSON and a plot.")
    parser.add_argument("--profile", choices=sorted(BENCH_PROFILES),
                        help="sizes (default: tiny on the CPU, seed on accelerators)")
    parser.add_argument("--model", help="model folder (default: GRPO_LAB_MODEL or the shipped tiny model)")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this architecture (speed only)")
    parser.add_argument("--parts", type=_names, default=PARTS, help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--configs", type=_names, default=CONFIGS, help=f"comma-separated, of {','.join(CONFIGS)}")
    parser.add_argument("--variants", type=_names, default=VARIANTS, help="comma-separated, of fixed,ragged")
    parser.add_argument("--ragged", choices=RAGGED_MODES,
                        help="uniform (default): lengths drawn from a stated distribution, the same for every "
                             "config; eos: each completion ends at the model's end token (real models)")
    parser.add_argument("--prefix-off", choices=PREFIX_OFF_MODES, default="salt",
                        help="how 'vllm' runs without prefix reuse: " + "; ".join(
                            f"{k}: {v}" for k, v in PREFIX_OFF_MEANING.items()))
    for name in (*STEP_FIELDS, "prompt_tokens", "warmup", "repeats", "grpo_steps", "grpo_warmup_steps"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help="overrides the profile")
    parser.add_argument("--grpo-backends", type=_names, help="comma-separated, of hf,vllm (default: the profile's)")
    parser.add_argument("--grpo-workload", choices=GRPO_WORKLOADS, default="fixed",
                        help="fixed: every completion max_completion_length long; ragged: completions end early "
                             "(random weights: a stated share of the vocabulary ends them, see ragged_model_dir)")
    parser.add_argument("--max-num-seqs", type=int, help="vLLM (default: all sequences of the workload)")
    parser.add_argument("--hf-batch-size", type=int, help="HF generate (default: all sequences in one batch)")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--vllm-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra vllm.LLM argument (JSON value), repeatable: async_scheduling=true, "
                             "max_num_batched_tokens=16384, compilation_config='{\"cudagraph_capture_sizes\":[512]}'")
    parser.add_argument("--hf-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra model.generate argument, e.g. cache_implementation=static")
    parser.add_argument("--train-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="TrainConfig override for the GRPO step, e.g. beta=0.0")
    parser.add_argument("--out", help="folder for the JSON and the plot (default: runs/latest/bench)")
    parser.add_argument("--name", help="file name stem (default: bench_<profile>[_<shape>])")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab bench [--profile tiny] [--shape S] ...``: run, print the tables, write JSON + PNG."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["engine-probe"]:  # engine_probe's own process
        return _run_engine_probe(argv[1])
    args = build_parser().parse_args(argv)
    sizes = {name: getattr(args, name) for name in (*STEP_FIELDS, "prompt_tokens", "warmup", "repeats", "grpo_steps",
                                                     "grpo_warmup_steps")
             if getattr(args, name) is not None}
    engine = {name: getattr(args, name) for name in ("max_num_seqs", "hf_batch_size", "gpu_memory_utilization",
                                                      "enforce_eager") if getattr(args, name) is not None}
    if args.vllm_option:
        engine["vllm_options"] = dict(args.vllm_option)
    if args.hf_option:
        engine["hf_generate_options"] = dict(args.hf_option)
    try:
        profile = get_bench_profile(args.profile, **sizes)
        command = "python -m grpo_lab.bench " + " ".join(shlex.quote(a) for a in (argv if argv is not None else
                                                                                    sys.argv[1:]))
        results = run_bench(profile, model=args.model, shape=args.shape, parts=args.parts, configs=args.configs,
                            variants=args.variants, ragged=args.ragged, prefix_off=args.prefix_off, engine=engine,
                            grpo_backends=args.grpo_backends, train_overrides=dict(args.train_option),
                            command=command.strip(), grpo_workload=args.grpo_workload)
    except (GrpoLabError, ValueError, FileNotFoundError) as error:
        print(f"grpo-lab bench: {error}")
        return 2
    print(summary(results))
    stem = args.name or f"bench_{profile.name}" + (f"_{args.shape}" if args.shape else "") + (
        f"_{args.grpo_workload}" if "grpo" in args.parts else "")
    json_path, png_path = save_results(results, args.out or runs.workspace("bench"), stem)
    print(f"\nwrote {json_path} and {png_path} ({results['seconds']:.0f} s in all)")
    return 0


# --------------------------------------------------------------------------------------------------
# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

__getattr__ = moved_names(__name__, moved={"RESULTS_DIR": "grpo_lab.paths:RESULTS_DIR"})


if __name__ == "__main__":
    raise SystemExit(main())
