"""The rollout server: TRL's ``trl vllm-serve`` command on the rollout devices, one process group, always stopped
(:func:`launch_rollout_server`), and the queries that check it (:class:`RolloutServer`)."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab.experiment import TrainConfig
from grpo_lab.rollout.vllm_backend import engine_environment
from grpo_lab.scale.config import SERVER_LOG, ScaleOutError, ServerModeConfig
from grpo_lab.scale.devices import DevicePlan, plan_devices
from grpo_lab.servers import ServerProcess, free_port, log_file_level, metric_totals, ranked_prompt_tokens
from grpo_lab.upstream.vllm import WORKER_EXTENSION

CPU_SERVER_FLAGS = ("--no-enable-chunked-prefill",)
"""vLLM-CPU kills its engine when a *seeded* request's prefill is split over two engine steps (its CPU generators
cannot rewind); TRL's asynchronous worker seeds every request, so on the CPU prompts are never split."""


def server_command(config: ServerModeConfig, train_config: TrainConfig, plan: DevicePlan, port: int) -> list[str]:
    """The server's command line: TRL's ``build_command`` (what ``trl vllm-serve`` runs) with safetensors-only loading;
    with ``weight_sync="file"`` the reload extension replaces NCCL; on the CPU vLLM's ``api_server`` module replaces
    ``vllm serve`` (absent under vllm-cpu), with :data:`CPU_SERVER_FLAGS`."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    arguments = ScriptArguments(
        model=train_config.model, host=config.host, port=port, tensor_parallel_size=plan.tensor_parallel_size,
        gpu_memory_utilization=train_config.vllm_gpu_memory_utilization, max_model_len=train_config.max_model_len)
    command = build_command(arguments, ["--load-format", "safetensors", *config.extra_server_args])
    if config.weight_sync == "file":
        at = command.index("--weight-transfer-config")
        del command[at:at + 2]
        command += ["--worker-extension-cls", WORKER_EXTENSION]
    if device_module.is_cpu(plan.kind):
        at = command.index("serve")
        command[at - 1:at + 2] = ["vllm.entrypoints.openai.api_server", "--model", train_config.model]
        kv_cache = device_module.vllm_kv_cache_arguments(train_config.vllm_gpu_memory_utilization,
                                                          config.cpu_kvcache_gib, plan.kind)
        command += ["--kv-cache-memory-bytes", str(kv_cache["kv_cache_memory_bytes"]), *CPU_SERVER_FLAGS]
    return command


def server_environment(plan: DevicePlan) -> dict[str, str]:
    """This environment plus the server's devices, TRL's dev mode (its weight-sync endpoints), allocator, INFO logs."""
    return {**os.environ, **engine_environment(plan.kind), **device_module.allocator_env(plan.kind),
            **plan.rollout_env(), "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1",
            "VLLM_LOGGING_LEVEL": log_file_level(os.environ.get("VLLM_LOGGING_LEVEL"))}


def _http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


class RolloutServer(ServerProcess):
    """TRL's vLLM server on the rollout devices (a :class:`grpo_lab.servers.ServerProcess`), and queries to check it."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log_path: Path, host: str, port: int,
                 plan: DevicePlan, weight_sync: str):
        super().__init__(command, env, log_path, f"http://{host}:{port}", "the rollout server", ScaleOutError)
        self.port, self.plan, self.weight_sync = port, plan, weight_sync

    def stats(self) -> dict[str, float]:
        """Totals from the server's Prometheus ``/metrics``: finished requests, prompt and generated tokens."""
        wanted = {"vllm:request_success_total": "requests", "vllm:prompt_tokens_total": "prompt_tokens",
                  "vllm:generation_tokens_total": "generation_tokens"}
        totals = metric_totals(self.base_url, tuple(wanted), timeout_s=30)
        return {label: totals.get(name, 0.0) for name, label in wanted.items()}

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """The server's log-probability of each completion token (the policy it samples from, temperature 1)."""
        ids = [int(i) for i in prompt_ids] + [int(i) for i in completion_ids]
        model = _http_json(f"{self.base_url}/v1/models")["data"][0]["id"]
        payload = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
        positions = ranked_prompt_tokens(_http_json(f"{self.base_url}/v1/completions", payload)["choices"][0]
                                         ["prompt_logprobs"])
        return [positions[i][ids[i]][0] for i in range(len(prompt_ids), len(ids))]


@contextlib.contextmanager
def launch_rollout_server(config: ServerModeConfig, train_config: TrainConfig, plan: DevicePlan | None = None,
                          log_path: str | Path | None = None, command: Sequence[str] | None = None,
                          wait: bool = True) -> Iterator[RolloutServer]:
    """Start TRL's vLLM server on the rollout devices (a watched process group), wait for ``/health``, yield it, and
    always stop it. ``train_config``: resolved; ``command`` replaces the server command; ``wait=False`` yields at once,
    so the trainer can start while the engine loads."""
    config = config.resolved()
    plan = plan or plan_devices(config.device, rollout_devices=config.rollout_devices,
                                train_devices=config.train_devices)
    port = config.port or free_port(config.host)
    command = list(command) if command is not None else server_command(config, train_config, plan, port)
    log_path = Path(log_path) if log_path else Path(train_config.output_dir) / SERVER_LOG
    server = RolloutServer(command, server_environment(plan), log_path, config.host, port, plan, config.weight_sync)
    try:
        yield server.start(config.startup_timeout_s, wait=wait)
    finally:
        server.stop(config.shutdown_timeout_s)
