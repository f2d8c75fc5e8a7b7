"""GRPO_LAB_PROFILE / GRPO_LAB_MODEL select sizes and model for every notebook."""

import pytest

from grpo_lab.profiles import PROFILES, ProfileError, get_profile


def test_default_profile_follows_device(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_PROFILE", raising=False)
    monkeypatch.delenv("GRPO_LAB_MODEL", raising=False)
    monkeypatch.setenv("GRPO_LAB_DEVICE", "cpu")
    assert get_profile().name == "tiny"


def test_env_switches(monkeypatch):
    monkeypatch.setenv("GRPO_LAB_PROFILE", "GPU")
    monkeypatch.setenv("GRPO_LAB_MODEL", "/models/my-qwen")
    profile = get_profile()
    assert profile.name == "gpu" and profile.model == "/models/my-qwen"
    assert get_profile(model="x").model == "x"


def test_unknown_profile_and_field():
    with pytest.raises(ProfileError, match="Unknown profile 'huge'.*tiny, gpu, npu"):
        get_profile("huge")
    with pytest.raises(ProfileError, match="Unknown profile field"):
        get_profile("tiny", num_generation=4)


def test_seed_recipe_on_accelerators():
    for name in ("gpu", "npu"):
        p = PROFILES[name]
        assert p.learning_rate == 5e-6 and p.dtype == "bfloat16" and 0 < p.vllm_gpu_memory_utilization < 1
