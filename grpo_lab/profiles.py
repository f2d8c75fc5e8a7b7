"""Deprecated since grpo-lab 0.2.0, removed in 0.3.0: profiles are now :mod:`grpo_lab.experiment`'s.

A profile is a table of :class:`grpo_lab.experiment.TrainConfig` overrides (``experiment.PROFILES``) and
``experiment.get_profile(name)`` returns the profile's ``TrainConfig`` (TRL's names; ``.profile`` where 0.1.0's
``Profile`` had ``.name``; device and dtype come from ``.resolve(machine)``). The names below still work and warn.
"""

from __future__ import annotations

from grpo_lab.deprecation import moved_names, warn_moved
from grpo_lab.paths import TINY_MODEL_DIR

warn_moved("grpo_lab.profiles", "grpo_lab.experiment", "profiles are TrainConfig overrides now", stacklevel=3,
           since="0.2.0")

__getattr__ = moved_names(__name__, moved={
    "get_profile": ("grpo_lab.experiment:get_profile", "it returns the profile's TrainConfig: .profile for .name, "
                    "device and dtype from .resolve(machine)"),
    "DEFAULT_FOR_DEVICE": "grpo_lab.experiment:DEFAULT_FOR_DEVICE",
    "QWEN_SMALL": "grpo_lab.experiment:QWEN_SMALL",
    "ProfileError": "grpo_lab.experiment:ProfileError",
}, computed={
    "TINY_MODEL": ("str(grpo_lab.paths.TINY_MODEL_DIR)", "", lambda: str(TINY_MODEL_DIR)),
}, removed={
    "Profile": "a profile is now a grpo_lab.experiment.TrainConfig (experiment.get_profile(name))",
    "PROFILES": "grpo_lab.experiment.PROFILES holds each profile as TrainConfig overrides (a dict, not a Profile)",
}, since="0.2.0")
