"""What a bench run measures: its profile (the GRPO step's shape under TRL's names, warm-up and timed rounds), the
names of its parts, configs and variants, and its error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from grpo_lab import device
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import TrainConfig

CONFIGS = ("hf", "vllm", "vllm+prefix")
VARIANTS = ("fixed", "ragged")
PARTS = ("rollout", "grpo", "roofline", "engine")
GRPO_WORKLOADS = ("fixed", "ragged")
RAGGED_MODES = ("eos", "uniform")
PREFIX_OFF_MODES = ("salt", "engine")


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
    """Timed GRPO steps per backend, backends interleaved step by step (a ratio needs ``stats.MIN_RUNS``)."""
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
        grpo_backends=("hf",), grpo_steps=5, grpo_warmup_steps=1,
        why=("the smallest run, with one vLLM engine start: fewer prompts and shorter completions than the "
             "write-up's workload (profile seed); the GRPO step runs with HF generate only (vLLM colocate would start "
             "a second engine; pass --grpo-backends hf,vllm to run it)")),
    "seed": BenchProfile(
        name="seed", step=_step(128, 4, 256, 32), prompt_tokens=128, warmup=1, repeats=5,
        grpo_backends=("hf", "vllm"), grpo_steps=5, grpo_warmup_steps=1,
        why="the source write-up's workload: 128 prompts x 4 completions, prompts of ~128 tokens, up to 256 new "
            "tokens"),
}
STEP_FIELDS = ("num_prompts", "num_generations", "max_completion_length", "per_device_train_batch_size")
"""What shapes a bench profile's step (``num_prompts`` sets ``gradient_accumulation_steps``)."""


def default_profile_name(kind: str | None = None) -> str:
    """The profile a bench run takes when none is named: ``tiny`` on the CPU, ``seed`` (the write-up's workload) on
    an accelerator (``kind``: the detected device when ``None``)."""
    return "tiny" if device.is_cpu(kind) else "seed"


def get_bench_profile(name: str | None = None, **overrides) -> BenchProfile:
    """A profile by name (default: :func:`default_profile_name`) with fields replaced; the step's fields
    (:data:`STEP_FIELDS`) are given by their TRL names."""
    key = (name or default_profile_name()).strip().lower()
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


def check_choice(name: str, given: Sequence[str], allowed: Sequence[str]) -> None:
    """Refuse an empty choice or one outside ``allowed``."""
    unknown = [g for g in given if g not in allowed]
    if unknown or not given:
        raise ConfigError(f"{name}={list(given)!r}: choose from {', '.join(allowed)}")
