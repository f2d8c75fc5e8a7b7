"""grpo-lab doctor: each troubleshooting row gives pass / warn / fail with a fix."""

import json
import shutil

import pytest

from grpo_lab import doctor, memory, models
from grpo_lab.experiment import TrainConfig


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_cpu_setup_passes(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_PROFILE", raising=False)
    monkeypatch.delenv("GRPO_LAB_MODEL", raising=False)
    monkeypatch.delenv("GRPO_LAB_DEVICE_MEMORY_GIB", raising=False)
    checks = by_name(doctor.run_checks())
    assert set(checks) == {"versions", "device", "device memory", "vllm", "python bytecode", "memory plan", "tokenizer",
                           "dtype", "prefix caching", "allocator", "serving", "vllm processes"}
    for name in ("device", "device memory", "memory plan", "tokenizer", "dtype", "prefix caching", "allocator",
                 "serving"):
        assert checks[name].status == "pass", checks[name]


def test_packages_without_bytecode_under_pythondontwritebytecode_warn_with_the_command(monkeypatch):
    from grpo_lab import env

    missing = env.BytecodeStatus(writes=False, missing=("torch", "vllm"), folders=("/opt/venv/site-packages",))
    monkeypatch.setattr(env, "bytecode_status", lambda: missing)
    check = doctor.check_bytecode()
    assert check.status == "warn" and "torch, vllm" in check.detail
    assert check.fix.endswith("-m compileall -q -j 0 /opt/venv/site-packages")
    monkeypatch.setattr(env, "bytecode_status", lambda: env.BytecodeStatus(True, ("torch",), ("/x",)))
    assert doctor.check_bytecode().status == "pass", "Python writes the bytecode itself at the first import"


def test_device_mismatch_fails_with_fix():
    check = doctor.check_device(doctor.DoctorConfig(TrainConfig(profile="gpu")))
    assert check.status == "fail" and "profile 'gpu' is for cuda" in check.detail
    assert "GRPO_LAB_PROFILE=tiny" in check.fix


def test_risky_settings_warn():
    assert doctor.check_dtype(doctor.DoctorConfig(dtype="float16")).status == "warn"
    off = doctor.check_prefix_caching(doctor.DoctorConfig(enable_prefix_caching=False))
    assert off.status == "warn" and "enable_prefix_caching=True" in off.fix
    serving = doctor.check_serving(doctor.DoctorConfig(serve_max_num_seqs=4, expected_concurrent_requests=32))
    assert serving.status == "warn" and "--max-num-seqs" in serving.fix


def test_tokenizer_mismatch_fails(tmp_path):
    other = tmp_path / "tok"
    shutil.copytree(models.TINY_MODEL_DIR, other)
    config_path = other / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config_path.write_text(json.dumps(config))
    (other / "chat_template.jinja").unlink(missing_ok=True)
    check = doctor.check_tokenizer(doctor.DoctorConfig(tokenizer=str(other)))
    assert check.status == "fail" and "chat template" in check.detail.lower()


def test_memory_plan_that_cannot_fit_fails(monkeypatch):
    from grpo_lab import device

    tiny_device = device.MemoryInfo(total_bytes=64 * 2**20, free_bytes=64 * 2**20)  # a 64 MiB "device"
    monkeypatch.setattr(device, "memory_info", lambda *args, **kwargs: tiny_device)
    check = doctor.check_memory(doctor.DoctorConfig())
    assert check.status == "fail" and "OOM" in check.detail
    assert check.fix


def test_a_check_that_crashes_is_reported_not_raised():
    def boom():
        raise RuntimeError("driver exploded")

    check = doctor._guard("x", boom)
    assert check.status == "fail" and "driver exploded" in check.detail


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        doctor.DoctorConfig.from_file(bad)
    bad.write_text('{"dtypes": "bf16"}')
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['dtypes'\]"):
        doctor.DoctorConfig.from_file(bad)
    bad.write_text('{"profile": "tiny", "learning_rate": 1e-4, "expected_concurrent_requests": 4}')
    mixed = doctor.DoctorConfig.from_file(bad)  # the experiment's fields and the doctor's own, in one file
    assert mixed.experiment.learning_rate == 1e-4 and mixed.expected_concurrent_requests == 4


def test_cli_exit_code(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text('{"profile": "gpu"}')
    assert doctor.main(["--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] device" in out and "doctor:" in out


def test_the_symptom_table_covers_the_write_ups_rows_and_names_real_checks():
    checks = doctor.run_checks()
    names = {c.name for c in checks}
    for symptom in doctor.SYMPTOMS:
        assert set(symptom.checks) <= names, symptom
        assert symptom.causes and symptom.fix
    seen = " ".join(s.symptom for s in doctor.SYMPTOMS)
    for row in ("reward flat", "loss zero", "out of memory at step N", "vLLM will not start", "server unreachable"):
        assert row in seen
    table = doctor.symptom_table(checks)
    assert len(table) == len(doctor.SYMPTOMS)
    memory_row = next(r for r in table if r["symptom"].startswith("out of memory"))
    assert "memory plan: " in memory_row["checks here"]
    oom = next(s for s in doctor.SYMPTOMS if s.symptom.startswith("out of memory"))
    positions = [oom.fix.index(knob) for knob in memory.KNOBS_IN_ORDER]  # the levers, in the planner's order
    assert positions == sorted(positions) and "LoRA (use_peft=True" in oom.fix


@pytest.mark.parametrize("sleep, value, status", [
    (False, None, "pass"),  # PyTorch's default: advice, not a warning (notebook 00 sets it only in its own kernel)
    (False, "expandable_segments:True", "pass"),
    (True, "expandable_segments:True", "fail"),  # vLLM's sleep mode refuses it as its engine starts
    (True, None, "pass"),
])
def test_the_allocator_check_follows_vllms_sleep_mode(monkeypatch, sleep, value, status):
    from grpo_lab import device

    monkeypatch.setattr(device, "detect", lambda: "cuda")
    if value is None:
        monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", value)
    experiment = TrainConfig(profile="gpu", vllm_enable_sleep_mode=sleep)
    check = doctor.check_allocator(doctor.DoctorConfig(experiment))
    assert check.status == status, check
    assert ("sleep mode" in check.detail) == (sleep or value is None)
