"""grpo_lab.device on this machine (CPU) and its per-vendor tables."""

import pytest
import torch

from grpo_lab import device


def test_detects_cpu_here(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_DEVICE", raising=False)
    if torch.cuda.is_available() or device.npu_available():
        pytest.skip("an accelerator is present")
    assert device.detect() == "cpu"
    assert device.torch_device() == torch.device("cpu")
    assert device.device_count() == 1
    assert device.preferred_dtype() == torch.float32
    assert device.visible_devices_var() is None
    assert device.dist_backend() == "gloo"
    assert device.allocator_env() == {}


def test_cpu_memory_is_host_ram():
    mem = device.memory_info(kind="cpu")
    assert 0 < mem.free_bytes <= mem.total_bytes
    assert mem.total_gib > 0.5


def test_env_override_and_bad_names(monkeypatch):
    monkeypatch.setenv("GRPO_LAB_DEVICE", "CPU")
    assert device.detect() == "cpu"
    monkeypatch.setenv("GRPO_LAB_DEVICE", "tpu")
    with pytest.raises(device.DeviceError, match="Unknown device 'tpu'.*npu, cuda, cpu"):
        device.detect()


def test_absent_accelerator_is_a_clear_error():
    if device.npu_available():
        pytest.skip("an NPU is present")
    with pytest.raises(device.DeviceError, match="ASCEND_RT_VISIBLE_DEVICES"):
        device.check_kind("npu")


def test_vendor_spellings():
    assert device.visible_devices_var("npu") == "ASCEND_RT_VISIBLE_DEVICES"
    assert device.visible_devices_var("cuda") == "CUDA_VISIBLE_DEVICES"
    assert device.dist_backend("npu") == "hccl" and device.dist_backend("cuda") == "nccl"
    assert device.allocator_env("npu") == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    assert device.allocator_env("cuda") == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert device.visible_devices_env([0, 2], kind="npu") == {"ASCEND_RT_VISIBLE_DEVICES": "0,2"}


def test_kind_predicates():
    assert [k for k in device.KINDS if device.is_accelerator(k)] == ["npu", "cuda"]
    assert [k for k in device.KINDS if device.is_npu(k)] == ["npu"] and not device.is_accelerator("tpu")


def test_apply_allocator_keeps_user_choice(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert device.apply_allocator_env("cuda") == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    assert device.apply_allocator_env("npu") == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}


def test_npu_detection_is_guarded_without_torch_npu():
    # torch_npu is not installed here: detection must say False, not raise ImportError.
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        assert device.npu_available() is False


@pytest.mark.accelerator
def test_accelerator_memory_and_dtype():
    kind = device.detect()
    mem = device.memory_info(kind=kind)
    assert mem.total_gib > 1
    assert device.preferred_dtype(kind) in (torch.bfloat16, torch.float16)
    x = torch.ones(1024, 1024, device=device.torch_device(kind=kind))
    device.synchronize(kind)
    assert device.peak_memory_bytes(kind=kind) >= x.numel() * 4
