"""A smaller card stood in for: how ``GRPO_LAB_DEVICE_MEMORY_GIB`` becomes a :class:`Machine` with a cap, what the cap
converts (both ways), what it refuses (CPU only: the CUDA calls are stood in for and checked by what they are asked)."""

from __future__ import annotations

import subprocess

import pytest

from grpo_lab import device, doctor, experiment, memory
from grpo_lab.device import Machine, MemoryCap, MemoryCapError
from grpo_lab.experiment import TrainConfig

GIB = 2**30
DEVICE_GIB = 139.8


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device of 139.8 GiB as device.py sees it, torch's per-process fraction recorded instead of set."""
    fractions = []
    monkeypatch.setattr(device, "detect", lambda: "cuda")
    monkeypatch.setattr(device, "memory_info", lambda index=0, kind=None: device.MemoryInfo(int(DEVICE_GIB * GIB),
                                                                                             int(130 * GIB)))
    monkeypatch.setattr(device, "bf16_supported", lambda kind=None: True)
    monkeypatch.setattr(device, "device_name", lambda index=0, kind=None: "a GPU")
    monkeypatch.setattr(device.torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index=0: fractions.append((fraction, index)))
    monkeypatch.delenv(device.MEMORY_CAP_ENV, raising=False)
    return fractions


def test_unset_means_the_whole_device(gpu):
    machine = Machine.detect()
    assert machine.memory_gib == pytest.approx(DEVICE_GIB) and machine.cap is None and machine.device_gib is None
    assert machine.device_share(0.3) == 0.3 and device.enforce_cap(machine) is None and gpu == []
    assert device.detect_cap("cuda") is None


def test_the_variable_is_read_once_into_the_machine(gpu, monkeypatch):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "24")
    machine, cap = Machine.detect(), device.detect_cap("cuda")
    monkeypatch.delenv(device.MEMORY_CAP_ENV)  # read once: the machine carries it from here
    assert machine.memory_gib == 24 and machine.kind == "cuda" and machine.device_gib == pytest.approx(DEVICE_GIB)
    assert Machine.detect(memory_gib=24) == machine
    assert (cap.memory_gib, cap.device_gib, cap.kind) == (24, pytest.approx(DEVICE_GIB), "cuda") and cap.enforced
    assert machine.device_share(0.3) == pytest.approx(0.3 * 24 / DEVICE_GIB, abs=1e-4)
    assert machine.device_share(0.3) <= 0.3 * 24 / DEVICE_GIB  # rounded down: never more than the card's share
    assert cap == machine.cap and device.vllm_kv_cache_arguments(0.85, 1.0, "cuda", cap) == {
        "gpu_memory_utilization": machine.device_share(0.85)}
    assert device.enforce_cap(machine) == cap and gpu == [(pytest.approx(24 / DEVICE_GIB), 0)]


def test_the_share_converts_both_ways():
    cap = MemoryCap(16, 80, "cuda")
    for share in (0.05, 0.3, 0.55, 0.9):
        assert cap.card_share(cap.device_share(share)) == pytest.approx(share, abs=1e-3)
        assert cap.device_share(share) <= share * 16 / 80
    assert MemoryCap(16, 80, "cpu").device_share(0.55) == 0.55 == MemoryCap(16, 80, "cpu").card_share(0.55)


def test_the_doctor_and_the_planner_see_the_cap(gpu, monkeypatch):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "24")
    assert memory.plan_memory(memory.course_configs()["qwen2.5-0.5b"]).device_bytes == 24 * GIB  # the default
    check = doctor.check_device_memory()
    assert check.status == "pass" and "24 GiB" in check.detail and "bandwidth" in check.detail


def test_the_auto_share_and_the_micro_batch_follow_the_cap(gpu, monkeypatch):
    config = TrainConfig(profile="gpu", model="HuggingFaceTB/SmolLM2-135M-Instruct")
    whole = config.resolve(Machine.detect())
    capped = config.resolve(Machine.detect(memory_gib=16))
    assert capped == config.resolve(Machine("cuda", True, 16))  # the plan is the card's, whatever stands in for it
    assert capped.gradient_checkpointing and not whole.gradient_checkpointing  # 16 GiB needs it, 140 GiB not
    assert experiment.memory_budget(capped, Machine.detect(memory_gib=16)).fits


def test_a_given_share_stays_a_share_of_the_card_and_vllm_gets_the_device_s(gpu):
    machine = Machine.detect(memory_gib=24)
    step = experiment.plan(TrainConfig(profile="gpu", model="HuggingFaceTB/SmolLM2-135M-Instruct",
                                       vllm_gpu_memory_utilization=0.3, output_dir="unused"), machine)
    assert step.config.vllm_gpu_memory_utilization == 0.3  # the user's share, of their card
    assert step.trl_kwargs(use_vllm=True)["vllm_gpu_memory_utilization"] == machine.cap.device_share(0.3)
    assert step.trl_kwargs(use_vllm=True, device_units=False)["vllm_gpu_memory_utilization"] == 0.3


@pytest.mark.parametrize("text", ["0", "-8", "lots", "nan"])
def test_bad_values_stop_with_a_message(gpu, monkeypatch, text):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, text)
    with pytest.raises(MemoryCapError, match=device.MEMORY_CAP_ENV):
        Machine.detect()
    assert doctor.check_device_memory().status == "fail"


def test_a_cap_larger_than_the_device_is_refused(gpu, monkeypatch):
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "141")
    with pytest.raises(MemoryCapError, match=r"larger than the cuda device 0 it runs on \(139.8 GiB\)"):
        Machine.detect()
    with pytest.raises(MemoryCapError, match="larger than"):
        Machine("cuda", True, 200, device_gib=DEVICE_GIB)
    assert gpu == []


def test_on_the_cpu_a_cap_sizes_the_plan_only(monkeypatch):
    calls = []
    monkeypatch.setattr(device.torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    machine = Machine("cpu", True, 4, device_gib=23.5)
    assert device.enforce_cap(machine) is None and calls == [] and machine.device_share(0.3) == 0.3
    assert not MemoryCap(4, 23.5, "cpu").enforced
    with pytest.raises(MemoryCapError):
        Machine("cpu", True, 4, device_gib=2)


def test_served_share_is_checked_as_the_real_device_fraction(gpu, monkeypatch):
    from grpo_lab.deploy import server

    check_free_memory, checked = server.check_free_memory, []
    monkeypatch.setenv(device.MEMORY_CAP_ENV, "16")
    monkeypatch.setattr(server, "check_free_memory", lambda share, info, held: checked.append((share, info)))
    monkeypatch.setattr(device.torch.cuda, "memory_reserved", lambda index=0: 10 * GIB)
    monkeypatch.setattr(device, "started_here", lambda kind=None: True)
    monkeypatch.setattr(device, "release_memory", lambda kind=None: None)
    monkeypatch.setattr(device, "allocated_bytes", lambda index=0, kind=None: 0)
    serve = server.ServeConfig(model="data/models/tiny-qwen2", gpu_memory_utilization=0.85)
    command = serve.command(8000)
    assert command[command.index("--gpu-memory-utilization") + 1] == str(Machine.detect().device_share(0.85))
    monkeypatch.setattr(server.ServeConfig, "validate", lambda self: None)
    monkeypatch.setattr(server, "ServerProcess", _NoProcess)
    with pytest.raises(RuntimeError, match="not started in a test"):
        server.VLLMServer(serve).start()
    # the share of the capped device, against what the cap leaves beside this process's 10 GiB
    assert checked == [(0.85, device.MemoryInfo(16 * GIB, 6 * GIB))]
    with pytest.raises(server.DeployError, match="13.6 GiB of the device's 16.0 GiB, but 6.0 GiB are free"):
        check_free_memory(0.85, device.capped_memory_info("cuda", device.detect_cap("cuda")), 0)


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
    text = MemoryCap(24, DEVICE_GIB, "cuda").describe()
    assert all(word in text for word in ("bandwidth", "other processes", "CUDA context", device.MEMORY_CAP_ENV))


def test_sleep_mode_under_an_enforced_cap_is_flagged_before_the_run():
    """A sleeping engine's pool still counts against torch's per-process fraction, so a plan that counts on sleep mode
    fails under the cap and not on a real card: the plan says so before the run."""
    cap = MemoryCap(32, 79.18, "cuda")
    assert "sleep mode" in cap.describe()
    [caveat] = device.cap_caveats(cap, sleep_mode=True)
    assert "32" in caveat and "vllm_enable_sleep_mode" in caveat and "real 32 GiB card" in caveat
    assert "another process" in caveat  # how to stand in for such a card instead
    assert device.cap_caveats(cap, sleep_mode=False) == []
    assert device.cap_caveats(None, sleep_mode=True) == []
    assert device.cap_caveats(MemoryCap(32, 32, "cpu"), sleep_mode=True) == []  # the CPU only sizes the plan
