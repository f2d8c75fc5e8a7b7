"""Serve a model folder (or a LoRA run) with vLLM's OpenAI-compatible server, as a watched child process."""

from __future__ import annotations

import ipaddress
import json
import math
import os
import shlex
import signal
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpo_lab import device, runs
from grpo_lab.errors import DeployError, GrpoLabError, ServerDied
from grpo_lab.experiment import TrainConfig
from grpo_lab.models import adapter_model
from grpo_lab.memory import (
    CPU_KV_CACHE_GIB,
    STEP_DEFAULTS,
    VLLM_MEMORY_FRACTION,
    ModelShape,
    check_vllm_memory_fraction,
    context_window,
)
from grpo_lab.rollout.vllm_backend import engine_environment
from grpo_lab.servers import ServerProcess, free_port, log_file_level, require_free_port
from grpo_lab.upstream.vllm import VLLM_LORA_RANKS

ADAPTER_CONFIG = "adapter_config.json"
FOUR_BIT_QUANTIZATION = "bitsandbytes"
"""vLLM's name for a 4-bit NF4 base quantized as it loads (TRL's colocated engine for a QLoRA policy)."""


def _is_loopback(host: str) -> bool:
    """True for 127.0.0.1, ::1 and localhost: addresses only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeConfig:
    """Server knobs; each is a ``vllm.entrypoints.openai.api_server`` flag."""

    model: str
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int | None = None  # None: a free port
    api_key: str | None = None
    served_model_name: str = "grpo-lab"
    max_model_len: int | None = None
    """The longest request served; None: :func:`default_max_model_len` (or size it: :func:`suggest_max_model_len`)."""
    max_num_seqs: int = 64
    gpu_memory_utilization: float = VLLM_MEMORY_FRACTION["serve"]  # higher than in training: the device is its own
    enable_prefix_caching: bool = True  # multi-turn chats re-send the history: cache its KV
    dtype: str = "auto"
    cpu_kvcache_gib: float = CPU_KV_CACHE_GIB  # KV cache in host RAM on the CPU (instead of gpu_memory_utilization)
    enforce_eager: bool | None = None  # None: the device's default (device.VLLM_EAGER_REASON)
    block_size: int | None = None  # KV block in tokens (None: vLLM's); only full blocks are prefix-cached
    startup_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    lora_adapter: str | None = None
    """A LoRA adapter folder served on ``model`` (its base) under :attr:`adapter_name`; None: plain weights only."""
    quantization: str | None = None
    """vLLM's ``--quantization``: ``"bitsandbytes"`` loads ``model`` in 4 bits (a QLoRA base); None: as saved."""

    def __post_init__(self) -> None:
        if self.max_model_len is None:
            object.__setattr__(self, "max_model_len", default_max_model_len(self.model))

    @property
    def adapter_name(self) -> str:
        """The model name requests use to reach the adapter (``model=`` in :func:`chat`)."""
        return f"{self.served_model_name}-lora"

    def validate(self) -> None:
        """Refuse bad knobs before any process starts; warn when the server is reachable without a key."""
        check_vllm_memory_fraction(self.gpu_memory_utilization, "gpu_memory_utilization")
        if self.max_model_len < 16:
            raise DeployError(f"max_model_len={self.max_model_len} is too small to hold a prompt and an answer; "
                              "size it with suggest_max_model_len (P99 of prompt + completion tokens), e.g. 512.")
        if not Path(self.model).is_dir() and self.model.startswith((".", "/")):
            raise DeployError(f"model folder {self.model} does not exist; export one with export_model first.")
        if Path(self.model).is_dir() and not any(Path(self.model).glob("*.safetensors")):
            raise DeployError(f"model folder {self.model} has no *.safetensors weights; the server loads weights "
                              "only from safetensors. Export the model with export_model (it writes safetensors).")
        if self.quantization not in (None, FOUR_BIT_QUANTIZATION):
            raise DeployError(f"quantization={self.quantization!r}: the course serves weights as saved (None) or a "
                              f"QLoRA base in 4 bits ({FOUR_BIT_QUANTIZATION!r}).")
        if self.lora_adapter is not None and not (Path(self.lora_adapter) / ADAPTER_CONFIG).is_file():
            raise DeployError(f"lora_adapter={self.lora_adapter}: no {ADAPTER_CONFIG} there; pass a LoRA run's "
                              f"adapter/ folder.")
        if not _is_loopback(self.host) and not self.api_key:
            warnings.warn(f"serving on {self.host} without an api_key: anyone who can reach port "
                          f"{self.port or '(free port)'} can use the model. Pass api_key=... (or set "
                          "GRPO_LAB_API_KEY for `grpo-lab serve`), or keep host='127.0.0.1'.", stacklevel=2)
        require_free_port(self.port, self.host)

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--served-model-name", self.served_model_name, "--host", self.host, "--port", str(port),
               "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
               "--dtype", self.dtype]  # remote code stays off
        cmd += ["--quantization", self.quantization] if self.quantization else ["--load-format", "safetensors"]
        kind = device.detect()
        kv_cache = device.vllm_kv_cache_arguments(self.gpu_memory_utilization, self.cpu_kvcache_gib, kind,
                                                  device.detect_cap(kind))
        for name, value in kv_cache.items():
            cmd += ["--" + name.replace("_", "-"), str(value)]
        cmd.append("--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching")
        if self.eager():
            cmd.append("--enforce-eager")
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        if self.lora_adapter is not None:
            rank = json.loads((Path(self.lora_adapter) / ADAPTER_CONFIG).read_text(encoding="utf-8"))["r"]
            cmd += ["--enable-lora", "--lora-modules", f"{self.adapter_name}={self.lora_adapter}",
                    "--max-lora-rank", str(next((r for r in VLLM_LORA_RANKS if r >= rank), rank))]
        return cmd + list(self.extra_args)

    def shell_command(self, port: int) -> str:
        """The same server as a command line without grpo_lab, the key left to ``$VLLM_API_KEY``."""
        command = self.command(port)
        if self.api_key:
            at = command.index("--api-key")
            command[at + 1] = "$VLLM_API_KEY"
        head = command.index("--model")
        serve = (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", command[head + 1]]
                 if device.is_cpu(device.detect()) else ["vllm", "serve", command[head + 1]])
        return " ".join(shlex.quote(part) if part != "$VLLM_API_KEY" else part
                        for part in serve + command[head + 2:])

    def eager(self) -> bool:
        """``enforce_eager``, else the device's default (``device.VLLM_EAGER_BY_DEFAULT``)."""
        return device.VLLM_EAGER_BY_DEFAULT[device.detect()] if self.enforce_eager is None else self.enforce_eager

    def environment(self) -> dict[str, str]:
        """The rollout engine's per-device variables, the allocator setting, and INFO logs for the log file."""
        kind = device.detect()
        env = {**os.environ, **engine_environment(kind), **device.allocator_env(kind)}
        env["VLLM_LOGGING_LEVEL"] = log_file_level(os.environ.get("VLLM_LOGGING_LEVEL"))
        return env


def _is_training_run(path: Path) -> bool:
    """A run folder of grpo_lab.train: its ``config.json`` holds the experiment (a model's holds its shape)."""
    try:
        return runs.is_run(path) and "config" in runs.Run(path).record
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def served_weights(folder: str | Path, adapter: bool = False) -> tuple[str, str | None]:
    """``(model folder, LoRA adapter folder or None)`` to serve for a model folder or a run (its ``final/``; a QLoRA
    run's adapter on its base); ``adapter=True``: a LoRA run's base and adapter."""
    path = Path(folder)
    if _is_training_run(path):
        run = runs.Run(path)
        if adapter:
            if run.adapter_dir is None:
                raise DeployError(f"{path} is not a finished LoRA run (no {runs.ADAPTER}/): serve its final/ instead.")
            return str(run.record["config"]["model"]), str(run.adapter_dir)
        if run.final_dir is None:
            raise DeployError(f"{path} has not finished (no {runs.FINAL}/): resume it, or serve a checkpoint export.")
        path = run.final_dir
    delivered = adapter_model(path)
    if delivered is not None and delivered.quantization:  # a QLoRA run's final/: the adapter on its 4-bit base
        return delivered.base, str(path)
    if (path / ADAPTER_CONFIG).is_file():
        if not adapter:
            raise DeployError(f"{path} is a LoRA adapter, not a model: serve its run's merged {runs.FINAL}/ (the "
                              f"default), or serve it on its base model with adapter=True (grpo-lab serve --lora).")
        return delivered.base, str(path)
    if adapter:
        raise DeployError(f"{path} holds no LoRA adapter: pass a LoRA run folder or its {runs.ADAPTER}/ folder.")
    return str(path), None


def served_quantization(folder: str | Path, adapter: bool = False) -> str | None:
    """vLLM's ``--quantization`` for what :func:`served_weights` serves of ``folder``: ``"bitsandbytes"`` for a QLoRA
    run or its ``adapter/`` (the base it trained on), else None."""
    path = Path(folder)
    run = path if _is_training_run(path) else path.parent if (path / ADAPTER_CONFIG).is_file() else None
    if run is None or not _is_training_run(run):
        return None
    return FOUR_BIT_QUANTIZATION if runs.Run(run).record["config"].get("load_in_4bit") else None


def default_max_model_len(model: str | Path) -> int:
    """The context window of the course's default step, within the model's own context length where known."""
    window = context_window(STEP_DEFAULTS["max_prompt_length"], STEP_DEFAULTS["max_completion_length"])
    try:
        limit = ModelShape.from_config(model).max_position_embeddings
    except GrpoLabError:  # not a local decoder folder: the window as it is
        limit = None
    return min(window, limit or window)


def suggest_max_model_len(tokenizer, prompts: list[list[dict[str, str]]], max_tokens: int,
                          percentile: float = 99.0, multiple: int = 16) -> int:
    """``max_model_len`` from the P99 of request lengths (chat prompt + ``max_tokens``), rounded up to ``multiple``."""
    if not prompts:
        raise DeployError("suggest_max_model_len needs at least one example prompt.")
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    lengths = [len(ids) + max_tokens for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    p99 = float(np.percentile(lengths, percentile))
    return int(-(-p99 // multiple) * multiple)


def serve_config(model: str | Path, experiment: TrainConfig, **knobs) -> ServeConfig:
    """Serving knobs for a model trained by ``experiment`` (its context window); ``knobs``: more fields."""
    return ServeConfig(model=str(model), **{"max_model_len": experiment.max_model_len, **knobs})


def check_free_memory(gpu_memory_utilization: float, memory: device.MemoryInfo, held_bytes: int) -> None:
    """Refuse a share larger than what is free before vLLM starts (``held_bytes``: this process's tensors)."""
    wanted = gpu_memory_utilization * memory.total_bytes
    if memory.free_bytes >= wanted:
        return
    fits = math.floor(memory.free_bytes / memory.total_bytes * 100 - 1) / 100  # one point of the device as margin
    remedy = (f"or serve with gpu_memory_utilization={fits:.2f} (the largest share free now)" if fits >= 0.05
              else "nothing useful is free now")
    raise DeployError(
        f"gpu_memory_utilization={gpu_memory_utilization} asks vLLM for {wanted / 2**30:.1f} GiB of the device's "
        f"{memory.total_gib:.1f} GiB, but {memory.free_gib:.1f} GiB are free. This process's tensors hold "
        f"{held_bytes / 2**30:.1f} GiB (a model or trainer still referenced: `del` it; a trainer's colocated vLLM "
        f"engine keeps its share while the trainer lives); other processes hold the rest (nvidia-smi or npu-smi "
        f"lists them). Free that memory, {remedy}.")


class VLLMServer:
    """vLLM's OpenAI-compatible server as a child process in its own process group (a context manager): :meth:`stop`
    ends every worker, and a watchdog ends it when this process ends, however that happens."""

    def __init__(self, model: str | Path | ServeConfig, log_path: str | Path | None = None, **knobs):
        self.config = model if isinstance(model, ServeConfig) else ServeConfig(model=str(model), **knobs)
        self.log_path = Path(log_path) if log_path else None
        self.server: ServerProcess | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def shell_command(self) -> str:
        """This server as a plain vLLM command line (:meth:`ServeConfig.shell_command`), once started."""
        return self.config.shell_command(self.port)

    @property
    def process(self):
        """The server's leader process while it runs (None once stopped)."""
        return None if self.server is None else self.server.process

    def start(self) -> VLLMServer:
        """Start the server and wait until ``/health`` answers; a process that used the accelerator first frees what it
        no longer uses and checks the share is free (of the capped device under a cap)."""
        self.config.validate()
        kind = device.detect()
        if device.started_here(kind):  # otherwise this process holds nothing, and asking would start a context
            device.release_memory(kind)
            card = device.capped_memory_info(kind, device.detect_cap(kind))
            check_free_memory(self.config.gpu_memory_utilization, card, device.allocated_bytes(kind=kind))
        self.port = self.config.port or free_port(self.config.host)
        if self.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="grpo-lab-serve-")) / "server.log"
        self.server = ServerProcess(self.config.command(self.port), self.config.environment(), self.log_path,
                                    self.base_url, name="the vLLM server", error=DeployError)
        try:
            self.server.start(self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def start_seconds(self) -> float | None:
        """Seconds the last start took until ``/health`` answered (None when not running)."""
        return None if self.server is None else self.server.start_seconds

    def log_tail(self, lines: int = 30) -> str:
        return self.server.log_tail(lines) if self.server else "(no log)"

    def alive(self) -> bool:
        """True while the server process runs (False once it died, was killed, or was stopped)."""
        return self.server is not None and self.server.alive()

    def exit_code(self) -> int | None:
        """The exit code once it ended (negative: killed by that signal); None while it runs."""
        return None if self.server is None else self.server.exit_code()

    def death_report(self) -> str:
        """Why requests to this server cannot succeed: its URL, how the process ended, and its log's last lines."""
        if self.server is None:
            return (f"the vLLM server at {self.base_url} is not running: it was stopped or never started. Start it "
                    "again with server.start() (or open a new `with VLLMServer(...)` block).")
        code = self.exit_code()
        if code is None:
            return f"the vLLM server at {self.base_url} is running (pid {self.server.process.pid})."
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
            else f"exited with code {code}"
        # the last lines that are not one per request (uvicorn's access log): where a crash leaves its reason
        lines = [line for line in self.log_tail(400).splitlines() if ' HTTP/1.1" ' not in line][-10:]
        return (f"the vLLM server at {self.base_url} is not running: its process {how}. Its log is {self.log_path}; "
                f"read it for the cause (out of memory? killed from outside?), then start it again with "
                f"server.restart(). Last lines (without the access log):\n" + "\n".join(lines))

    def check_alive(self) -> None:
        """Raise :class:`ServerDied` (with :meth:`death_report`) unless the server process runs."""
        if not self.alive():
            raise ServerDied(self.death_report())

    def restart(self) -> VLLMServer:
        """Stop what is left of the server and start it again with the same settings."""
        self.stop()
        return self.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``). Safe to call twice."""
        if self.server is not None:
            self.server.stop(timeout_s)
            self.server = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self):
        """An ``openai.OpenAI`` client for this server."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key=self.config.api_key or "EMPTY")
