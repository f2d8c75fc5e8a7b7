"""GRPO_LAB_DEVICE_MEMORY_GIB: how the cap resolves, what it converts, what it refuses (CPU only: the CUDA calls are
stood in for and checked by what they are asked)."""

from __future__ import annotations

import importlib
import subprocess

import pytest

from grpo_lab import device, doctor, experiment, memory
from grpo_lab.device import Machine, MemoryCap, MemoryCapError
from grpo_lab.experiment import TrainConfig

GIB = 2**30
H200_GIB = 139.8


@pytest.fixture
def h200(monkeypatch):
    """A CUDA device of 139.8 GiB as device.py sees it, torch's per-process fraction recorded instead of set."""
    fractions = []
    monkeypatch.setattr(device, "detect", lambda: "cuda")
    monkeypatch.setattr(device, "memory_info", lambda index=0, kind=None: device.MemoryInfo(int(H200_GIB * GIB),
                                                                                             int(130 * GIB)))
    monkeypatch.setattr(device, "bf16_supported", lambda kind=None: True)
    monkeypatch.setattr(device, "device_name", lambda index=0, kind=None: "NVIDIA H200")
    monkeypatch.setattr(device.torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index=0: fractions.append((fraction, index)))
    monkeypatch.setattr(device.capacity, "_APPLIED", {})
    monkeypatch.delenv(device.MEMORY_CAP_ENV, raising=False)
    return fractions


def test_unset_means_the_whole_device(h200):
    assert device.memory_cap_gib() is None and device.memory_cap() is None
    assert Machine.detect().memory_gib == pytest.approx(H200_GIB)
    assert device.device_share(0.3) == 0.3


def test_the_variable_makes_every_part_see_a_smaller_device(h200, monkeypatch):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "24")
    machine = Machine.detect()
    assert machine.memory_gib == 24 and machine.kind == "cuda"
    assert memory.plan_memory(memory.course_configs()["qwen2.5-0.5b"]).device_bytes == 24 * GIB  # the planner's default
    cap = device.memory_cap()
    assert (cap.memory_gib, cap.device_gib, cap.kind) == (24, pytest.approx(H200_GIB), "cuda") and cap.enforced
    assert device.device_share(0.3) == pytest.approx(0.3 * 24 / H200_GIB, abs=1e-4)
    assert device.device_share(0.3) <= 0.3 * 24 / H200_GIB  # rounded down: never more than the card's share
    assert device.vllm_kv_cache_arguments(0.85, 1.0) == {"gpu_memory_utilization": device.device_share(0.85)}
    check = doctor.check_device_memory()
    assert check.status == "pass" and "24 GiB" in check.detail and "bandwidth" in check.detail


def test_the_auto_share_and_the_micro_batch_follow_the_cap(h200, monkeypatch):
    config = TrainConfig(profile="gpu", model="HuggingFaceTB/SmolLM2-135M-Instruct")
    whole = config.resolve(Machine.detect())
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "16")
    capped = config.resolve(Machine.detect())
    assert capped == config.resolve(Machine("cuda", True, 16, "NVIDIA H200"))
    assert capped.gradient_checkpointing and not whole.gradient_checkpointing  # 16 GiB needs it, 140 GiB not
    assert experiment.memory_budget(capped, Machine.detect()).fits


def test_apply_sets_torch_fraction_and_a_given_share_stays_a_share_of_the_capped_device(h200):
    cap = device.apply_memory_cap(24, kind="cuda")
    assert h200 == [(pytest.approx(24 / H200_GIB), 0)]
    assert device.memory_cap() is cap and device.enforce_memory_cap(kind="cuda") == cap
    config = TrainConfig(profile="gpu", model="HuggingFaceTB/SmolLM2-135M-Instruct", vllm_gpu_memory_utilization=0.3,
                         output_dir="unused").resolve(Machine("cuda", True, 24))
    assert config.vllm_gpu_memory_utilization == 0.3  # the user's share, of their device
    from grpo_lab import train

    passed = {}
    trl = importlib.import_module("trl")
    original = trl.GRPOConfig
    try:
        trl.GRPOConfig = lambda **kwargs: passed.update(kwargs)
        train.grpo_args(config, use_vllm=False)
    finally:
        trl.GRPOConfig = original
    assert passed["vllm_gpu_memory_utilization"] == cap.device_share(0.3)  # what vLLM divides: the real device
    assert device.apply_memory_cap(H200_GIB, kind="cuda") is None and device.memory_cap() is None  # the whole device


@pytest.mark.parametrize("text", ["0", "-8", "lots", "nan"])
def test_bad_values_stop_with_a_message(h200, monkeypatch, text):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, text)
    with pytest.raises(MemoryCapError, match=device.MEMORY_CAP_ENV):
        Machine.detect()
    assert doctor.check_device_memory().status == "fail"


def test_a_cap_larger_than_the_device_is_refused(h200, monkeypatch):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "141")
    with pytest.raises(MemoryCapError, match=r"larger than the cuda device 0 it runs on \(139.8 GiB\)"):
        Machine.detect()
    with pytest.raises(MemoryCapError, match="larger than"):
        device.apply_memory_cap(200, kind="cuda")
    assert h200 == []


def test_on_the_cpu_a_cap_sizes_the_plan_only(monkeypatch):
    calls = []
    monkeypatch.setattr(device.torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "4")
    monkeypatch.setattr(device.capacity, "_APPLIED", {})
    assert Machine.detect().memory_gib == 4 if device.detect() == "cpu" else True
    assert device.apply_memory_cap(4, kind="cpu") is None and calls == []
    assert device.device_share(0.3, kind="cpu") == 0.3
    assert not MemoryCap(4, 23.5, "cpu").enforced and MemoryCap(4, 23.5, "cpu").device_share(0.3) == 0.3
    assert device.apply_memory_cap(1000, kind="cpu") is None  # a described CPU machine larger than this host trains
    with pytest.raises(MemoryCapError):
        device.apply_memory_cap(0, kind="cpu")


def test_served_share_is_checked_as_the_real_device_fraction(h200, monkeypatch):
    from grpo_lab.deploy import server

    check_free_memory, checked = server.check_free_memory, []
    monkeypatch.setattr(server, "check_free_memory", lambda share, info, held: checked.append((share, info)))
    monkeypatch.setattr(device.torch.cuda, "memory_reserved", lambda index=0: 10 * GIB)
    monkeypatch.setattr(device, "started_here", lambda kind=None: True)
    monkeypatch.setattr(device, "release_memory", lambda kind=None: None)
    monkeypatch.setattr(device, "allocated_bytes", lambda index=0, kind=None: 0)
    device.apply_memory_cap(16, kind="cuda")
    serve = server.ServeConfig(model="data/models/tiny-qwen2", gpu_memory_utilization=0.85)
    command = serve.command(8000)
    assert command[command.index("--gpu-memory-utilization") + 1] == str(device.device_share(0.85))
    monkeypatch.setattr(server.ServeConfig, "validate", lambda self: None)
    monkeypatch.setattr(server, "ServerProcess", _NoProcess)
    with pytest.raises(RuntimeError, match="not started in a test"):
        server.VLLMServer(serve).start()
    # the share of the capped device, against what the cap leaves beside this process's 10 GiB
    assert checked == [(0.85, device.MemoryInfo(16 * GIB, 6 * GIB))]
    with pytest.raises(server.DeployError, match="13.6 GiB of the device's 16.0 GiB, but 6.0 GiB are free"):
        check_free_memory(0.85, device.capped_memory_info(), 0)


class _NoProcess:
    def __init__(self, *args, **kwargs):
        pass

    def start(self, timeout_s):
        raise RuntimeError("not started in a test")

    def stop(self, timeout_s=30.0):
        pass


def test_device_memory_of_counts_only_the_given_processes(monkeypatch):
    listing = "101, 2048\n202, 1024\n303, [N/A]\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, listing, ""))
    assert device.device_memory_of({101, 303}, "cuda") == 2048 * 2**20
    assert device.device_memory_of({101}, "cpu") is None and device.device_memory_of({999}, "cuda") is None


def test_the_cap_says_what_it_does_not_emulate():
    text = MemoryCap(24, H200_GIB, "cuda").describe()
    assert all(word in text for word in ("bandwidth", "other processes", "CUDA context"))
    assert device.MEMORY_CAP_ENV in (device.apply_memory_cap.__doc__ or "") + (device.__doc__ or "") + text


def test_sleep_mode_under_an_enforced_cap_is_flagged_before_the_run():
    """Measured on an H100 (results/probes/sleep_probe.json): a sleeping engine's pool still counts against torch's
    per-process fraction, so a plan that counts on sleep mode fails under the cap and not on a real card."""
    cap = MemoryCap(32, 79.18, "cuda")
    assert "sleep mode" in cap.describe()
    [caveat] = device.cap_caveats(cap, sleep_mode=True)
    assert "32" in caveat and "vllm_enable_sleep_mode" in caveat and "real 32 GiB card" in caveat
    assert "ballast.py" in caveat  # the stand-in that measured sleep mode (results/seed-2b-sleep__*.json)
    assert device.cap_caveats(cap, sleep_mode=False) == []
    assert device.cap_caveats(None, sleep_mode=True) == []
    assert device.cap_caveats(MemoryCap(32, 32, "cpu"), sleep_mode=True) == []  # the CPU only sizes the plan
