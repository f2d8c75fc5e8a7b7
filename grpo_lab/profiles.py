"""One switch for the whole course: a profile sets model, lengths, batch sizes and memory fraction.

``GRPO_LAB_PROFILE=tiny|gpu|npu`` picks the profile (default: from the detected device) and
``GRPO_LAB_MODEL`` (a hub id or a local path) replaces the profile's model. Every notebook calls
:func:`get_profile` and nothing else to learn its sizes.

>>> from grpo_lab.profiles import get_profile
>>> get_profile("tiny").num_generations
8
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from grpo_lab import device

TINY_MODEL = str(Path(__file__).resolve().parent.parent / "data" / "models" / "tiny-qwen2")
QWEN_SMALL = "Qwen/Qwen2.5-0.5B-Instruct"


class ProfileError(ValueError):
    """An unknown profile name."""


@dataclass(frozen=True)
class Profile:
    """Sizes shared by every notebook; field names follow TRL's GRPOConfig where one exists."""

    name: str
    model: str
    device: str
    dtype: str
    max_prompt_length: int
    max_completion_length: int
    num_generations: int
    per_device_train_batch_size: int
    learning_rate: float
    vllm_gpu_memory_utilization: float
    eval_size: int

    def as_dict(self) -> dict:
        return asdict(self)


PROFILES: dict[str, Profile] = {
    # CPU: the repository's own tiny model; fp32 because it is fast and exact on CPU.
    "tiny": Profile(
        name="tiny", model=TINY_MODEL, device="cpu", dtype="float32",
        max_prompt_length=96, max_completion_length=32, num_generations=8,
        per_device_train_batch_size=32, learning_rate=5e-5,
        vllm_gpu_memory_utilization=0.3, eval_size=200,
    ),
    # NVIDIA GPU: the seed's recipe on Qwen2.5-0.5B-Instruct (bf16, lr 5e-6, 4 samples per prompt).
    "gpu": Profile(
        name="gpu", model=QWEN_SMALL, device="cuda", dtype="bfloat16",
        max_prompt_length=256, max_completion_length=256, num_generations=4,
        per_device_train_batch_size=16, learning_rate=5e-6,
        vllm_gpu_memory_utilization=0.3, eval_size=400,
    ),
    # Ascend NPU: same recipe; 0.3 of a 32 GB 910B leaves room for weights, grads and AdamW (notebook 04).
    "npu": Profile(
        name="npu", model=QWEN_SMALL, device="npu", dtype="bfloat16",
        max_prompt_length=256, max_completion_length=256, num_generations=4,
        per_device_train_batch_size=8, learning_rate=5e-6,
        vllm_gpu_memory_utilization=0.3, eval_size=400,
    ),
}
DEFAULT_FOR_DEVICE = {"cpu": "tiny", "cuda": "gpu", "npu": "npu"}


def get_profile(name: str | None = None, **overrides) -> Profile:
    """The profile named (or ``GRPO_LAB_PROFILE``, or the detected device's), with overrides applied.

    ``GRPO_LAB_MODEL`` replaces the model unless ``model=`` is passed explicitly.
    """
    chosen = name or os.environ.get("GRPO_LAB_PROFILE") or DEFAULT_FOR_DEVICE[device.detect()]
    key = chosen.strip().lower()
    if key not in PROFILES:
        raise ProfileError(
            f"Unknown profile {chosen!r}: use one of {', '.join(PROFILES)} "
            "(set GRPO_LAB_PROFILE or pass name=...)."
        )
    profile = PROFILES[key]
    env_model = os.environ.get("GRPO_LAB_MODEL")
    if env_model and "model" not in overrides:
        overrides["model"] = env_model
    unknown = set(overrides) - set(profile.as_dict())
    if unknown:
        raise ProfileError(f"Unknown profile field(s) {sorted(unknown)}; known: {sorted(profile.as_dict())}.")
    return replace(profile, **overrides)
