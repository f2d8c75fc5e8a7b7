"""From a trained policy to a running vLLM OpenAI-compatible server.

The seed's deployment section, every step real: export a self-contained folder (safetensors, tokenizer,
chat template, generation config, manifest of checksums), verify it, reload it with transformers and
compare greedy output with vLLM, serve it with ``python -m vllm.entrypoints.openai.api_server`` (the
module exists in the CPU, CUDA and Ascend builds alike) and query it with the ``openai`` client.

>>> from grpo_lab import deploy                                    # doctest: +SKIP
>>> folder = deploy.export_model("runs/grpo/final", "runs/export")   # doctest: +SKIP
>>> with deploy.VLLMServer(folder) as server:                        # doctest: +SKIP
...     print(deploy.complete(server, "1 + 1 =").text)
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from grpo_lab import __version__, device, models, runs
from grpo_lab.errors import GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.memory import (
    CPU_KV_CACHE_GIB,
    STEP_DEFAULTS,
    VLLM_MEMORY_FRACTION,
    ModelShape,
    check_vllm_memory_fraction,
    context_window,
)
from grpo_lab.rollout import Sampling, open_engine
from grpo_lab.rollout.vllm_backend import engine_environment
from grpo_lab.servers import ServerProcess, free_port, require_free_port

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ADAPTER_CONFIG = "adapter_config.json"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""
REQUIRED_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)


class DeployError(GrpoLabError, RuntimeError):
    """An export, a folder or a server that is not usable; the message says what to do."""


class ServerDied(DeployError):
    """The server process is not running (it died or was stopped) while a client needed it."""


# --------------------------------------------------------------------------------------------------
# Export and verify
# --------------------------------------------------------------------------------------------------
def export_model(source, out_dir: str | Path, tokenizer=None, overwrite: bool = False) -> Path:
    """Write a self-contained serving folder from a model folder / checkpoint or an in-memory model.

    ``source`` is a path (a checkpoint or a model folder; loaded from safetensors) or a transformers model
    (then pass its ``tokenizer``). The folder gets safetensors weights, tokenizer files with the chat
    template, ``generation_config.json`` and a ``manifest.json`` with every file's sha256.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise DeployError(f"{out_dir} is not empty; choose a new folder or pass overwrite=True.")
        shutil.rmtree(out_dir)
    if isinstance(source, (str, Path)):
        source_name = str(source)
        model, tokenizer = models.load_model_and_tokenizer(source, verify=True)
    else:
        if tokenizer is None:
            raise DeployError("export_model(model, ...) needs the tokenizer too: export_model(model, out, tokenizer=tok).")
        model, source_name = source, type(source).__name__
    if not getattr(tokenizer, "chat_template", None):
        raise DeployError("the tokenizer has no chat template; chat requests to the server would fail. "
                          "Set tokenizer.chat_template before exporting.")
    staging = out_dir.with_name(out_dir.name + ".partial")  # never leave a half-written export behind
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if not (staging / "generation_config.json").is_file():
        model.generation_config.save_pretrained(staging)
    models.write_manifest(staging, {
        "kind": "grpo-lab export", "source": source_name, "grpo_lab": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    staging.rename(out_dir)
    return out_dir


@dataclass
class VerifyReport:
    """What :func:`verify_export` found; ``ok`` when ``problems`` is empty."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"{self.folder}: {'OK' if self.ok else f'{len(self.problems)} problem(s)'}"
        return "\n".join([head] + [f"  ✓ {c}" for c in self.checked] + [f"  ✗ {p}" for p in self.problems])

    def raise_if_bad(self) -> None:
        if not self.ok:
            raise DeployError(str(self) + "\nFix: re-export the model with grpo_lab.deploy.export_model.")


def verify_export(folder: str | Path, load_weights: bool = True) -> VerifyReport:
    """Check a serving folder: required files, manifest checksums, weights load, tokenizer fits the model."""
    folder = Path(folder)
    report = VerifyReport(folder)
    if not folder.is_dir():
        report.problems.append("folder does not exist")
        return report
    for name in REQUIRED_FILES:
        (report.checked if (folder / name).is_file() else report.problems).append(
            f"{name} present" if (folder / name).is_file() else f"missing {name}")
    weights = sorted(folder.glob("*.safetensors"))
    if weights:
        report.checked.append(f"{len(weights)} safetensors file(s)")
    else:
        report.problems.append("missing weights: no *.safetensors file")
    pickles = [p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles:
        report.problems.append(f"pickle weights {pickles}: serve only safetensors (delete them or re-export)")
    try:
        models.verify_model_dir(folder)
        report.checked.append("manifest checksums match")
    except models.ModelIntegrityError as exc:
        listed = [line[4:] for line in str(exc).splitlines() if line.startswith("  - ")]
        # a required file reported missing above is one problem, not two
        already = {f"missing file: {name}" for name in REQUIRED_FILES if f"missing {name}" in report.problems}
        report.problems.extend([p for p in listed if p not in already] if listed else [str(exc).splitlines()[0]])
    if report.problems or not load_weights:
        return report
    try:
        model, tokenizer = models.load_model_and_tokenizer(folder, verify=False)
    except Exception as exc:
        report.problems.append(f"weights or tokenizer do not load: {type(exc).__name__}: {exc}")
        return report
    report.checked.append("weights load with transformers")
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        report.problems.append(f"tokenizer has {len(tokenizer)} tokens but the model only {rows} embedding rows")
    else:
        report.checked.append(f"tokenizer ({len(tokenizer)} tokens) fits the embedding ({rows} rows)")
    if not getattr(tokenizer, "chat_template", None):
        report.problems.append("tokenizer has no chat template")
    else:
        report.checked.append("chat template present")
    return report


# --------------------------------------------------------------------------------------------------
# Serve
# --------------------------------------------------------------------------------------------------
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
    """The longest request (prompt + completion) served. None: :func:`default_max_model_len`; size it to a workload
    with :func:`suggest_max_model_len` (the P99 of request lengths, notebook 05)."""
    max_num_seqs: int = 64
    gpu_memory_utilization: float = VLLM_MEMORY_FRACTION["serve"]  # higher than in training: the device is its own
    enable_prefix_caching: bool = True  # multi-turn chats re-send the history: cache its KV
    dtype: str = "auto"
    cpu_kvcache_gib: float = CPU_KV_CACHE_GIB  # KV cache in host RAM on the CPU (instead of gpu_memory_utilization)
    # None: eager on the CPU (torch.compile adds minutes to a start there and no speed for small models), CUDA/ACL
    # graphs on accelerators (they remove per-step launch overhead)
    enforce_eager: bool | None = None
    block_size: int | None = None  # KV block (tokens); None: vLLM's (16 on GPUs, 128 on the CPU). Only full blocks
    # are prefix-cached, so a short prompt shares nothing with 128-token blocks: use 32 on the CPU to see reuse
    startup_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    lora_adapter: str | None = None
    """A LoRA adapter folder (a run's ``adapter/``) served on ``model`` (its base) with vLLM's LoRA serving, under
    the name :attr:`adapter_name`. None (the default): plain weights only, e.g. a LoRA run's merged ``final/``."""

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
               "--dtype", self.dtype, "--load-format", "safetensors"]  # never pickle weights; remote code stays off
        for name, value in device.vllm_kv_cache_arguments(self.gpu_memory_utilization, self.cpu_kvcache_gib).items():
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

    def eager(self) -> bool:
        """Whether the server runs without compiled graphs: ``enforce_eager``, else the device's default (eager on
        the CPU only: ``device.VLLM_EAGER_BY_DEFAULT``)."""
        return device.VLLM_EAGER_BY_DEFAULT[device.detect()] if self.enforce_eager is None else self.enforce_eager

    def environment(self) -> dict[str, str]:
        """The rollout engine's per-device variables, the allocator setting, and INFO logs for the log file."""
        kind = device.detect()
        env = {**os.environ, **engine_environment(kind), **device.allocator_env(kind)}
        env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "INFO")
        return env


def _is_training_run(path: Path) -> bool:
    """A run folder of grpo_lab.train: its ``config.json`` holds the experiment (a model's holds its shape)."""
    try:
        return runs.is_run(path) and "config" in runs.Run(path).record
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def served_weights(folder: str | Path, adapter: bool = False) -> tuple[str, str | None]:
    """``(model folder, LoRA adapter folder or None)`` to serve for ``folder``: a model folder as it is; a training
    run's ``final/`` (for a LoRA run: the adapter merged into plain weights, the default: it serves anywhere, with
    no LoRA overhead per request); with ``adapter=True`` a LoRA run's (or an adapter folder's) base model and
    adapter, for vLLM's LoRA serving (several adapters can share one base)."""
    path = Path(folder)
    if _is_training_run(path):
        run = runs.Run(path)
        if adapter:
            if run.adapter_dir is None:
                raise DeployError(f"{path} is not a finished LoRA run (no {runs.ADAPTER}/): serve its final/ instead.")
            return str(run.record["config"]["model"]), str(run.adapter_dir)
        if run.final_dir is None:
            raise DeployError(f"{path} has not finished (no {runs.FINAL}/): resume it, or serve a checkpoint export.")
        return str(run.final_dir), None
    if (path / ADAPTER_CONFIG).is_file():
        if not adapter:
            raise DeployError(f"{path} is a LoRA adapter, not a model: serve its run's merged {runs.FINAL}/ (the "
                              f"default), or serve it on its base model with adapter=True (grpo-lab serve --lora).")
        base = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"]
        return str(base), str(path)
    if adapter:
        raise DeployError(f"{path} holds no LoRA adapter: pass a LoRA run folder or its {runs.ADAPTER}/ folder.")
    return str(path), None


def default_max_model_len(model: str | Path) -> int:
    """The serving default: the context window of the course's default step (:func:`memory.context_window` of
    ``memory.STEP_DEFAULTS``' lengths), within the model's own context length where its config.json gives one."""
    window = context_window(STEP_DEFAULTS["max_prompt_length"], STEP_DEFAULTS["max_completion_length"])
    try:
        limit = ModelShape.from_config(model).max_position_embeddings
    except GrpoLabError:  # not a local decoder folder: the window as it is
        limit = None
    return min(window, limit or window)


def suggest_max_model_len(tokenizer, prompts: list[list[dict[str, str]]], max_tokens: int,
                          percentile: float = 99.0, multiple: int = 16) -> int:
    """``max_model_len`` from the P99 of request lengths (chat prompt tokens + ``max_tokens``).

    Sizing for the longest request ever seen wastes KV cache on every sequence; the P99, rounded up to a
    multiple of the KV block size, serves 99 % of requests and rejects the rest with a clear error.
    """
    import numpy as np

    if not prompts:
        raise DeployError("suggest_max_model_len needs at least one example prompt.")
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    lengths = [len(ids) + max_tokens for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    p99 = float(np.percentile(lengths, percentile))
    return int(-(-p99 // multiple) * multiple)


def serve_config(model: str | Path, experiment: TrainConfig, **knobs) -> ServeConfig:
    """Serving knobs for a model trained by ``experiment``: its context window (``max_model_len`` = longest prompt
    + longest completion it was trained with); ``knobs`` are more :class:`ServeConfig` fields."""
    return ServeConfig(model=str(model), **{"max_model_len": experiment.max_model_len, **knobs})


class VLLMServer:
    """vLLM's OpenAI-compatible server as a child process; a context manager that always stops it.

    The server runs in its own process group (:class:`grpo_lab.servers.ServerProcess`), so :meth:`stop` ends it
    and every worker it spawned, also after an error or a notebook interrupt (``KeyboardInterrupt`` leaves the
    ``with`` block normally). It also ends when this Python process does, however that happens: exit, SIGTERM (the
    children are stopped first), SIGKILL or a kernel restart (its watchdog sees the owner gone within a second).
    """

    def __init__(self, model: str | Path | ServeConfig, log_path: str | Path | None = None, **knobs):
        self.config = model if isinstance(model, ServeConfig) else ServeConfig(model=str(model), **knobs)
        self.log_path = Path(log_path) if log_path else None
        self.server: ServerProcess | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def process(self):
        """The server's leader process while it runs (None once stopped)."""
        return None if self.server is None else self.server.process

    def start(self) -> VLLMServer:
        self.config.validate()
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
        """How long the last start took, until ``/health`` answered (None when not running)."""
        return None if self.server is None else self.server.start_seconds

    def log_tail(self, lines: int = 30) -> str:
        return self.server.log_tail(lines) if self.server else "(no log)"

    def alive(self) -> bool:
        """True while the server process runs (False once it died, was killed, or was stopped)."""
        return self.server is not None and self.server.alive()

    def exit_code(self) -> int | None:
        """The server process's exit code once it ended (negative: killed by that signal); None while it runs."""
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
        """Stop what is left of the server (its workers too) and start it again with the same settings (on a new
        free port unless ``port`` was set)."""
        self.stop()
        return self.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the server's whole process group (SIGTERM, then SIGKILL after ``timeout_s``). Safe to call twice."""
        if self.server is None:
            return
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


# --------------------------------------------------------------------------------------------------
# Query
# --------------------------------------------------------------------------------------------------
@dataclass
class Reply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


def _request_error(exc: Exception, server: VLLMServer) -> DeployError:
    from openai import APIConnectionError, AuthenticationError, BadRequestError

    if isinstance(exc, APIConnectionError) and not server.alive():
        return ServerDied(f"request failed ({type(exc).__name__}): {server.death_report()}")
    too_long = any(word in str(exc).lower() for word in ("context length", "max_model_len", "maximum context"))
    if isinstance(exc, BadRequestError) and too_long:
        return DeployError(f"the request is longer than the server's max_model_len "
                           f"({server.config.max_model_len}): shorten the prompt or max_tokens, or restart "
                           f"the server with a larger max_model_len.\nServer said: {exc}")
    if isinstance(exc, AuthenticationError):
        return DeployError("the server rejected the API key; pass the same api_key to the server and client.")
    return DeployError(f"request failed: {exc}")


def complete(server: VLLMServer, prompt: str, max_tokens: int = 32, temperature: float = 0.0,
             model: str | None = None) -> Reply:
    """``/v1/completions`` on a raw prompt (``model``: the served name, or ``server.config.adapter_name``)."""
    from openai import OpenAIError

    start = time.perf_counter()
    try:
        out = server.client().completions.create(model=model or server.config.served_model_name, prompt=prompt,
                                                 max_tokens=max_tokens, temperature=temperature)
    except OpenAIError as exc:
        raise _request_error(exc, server) from None
    choice = out.choices[0]
    return Reply(choice.text, choice.finish_reason, out.usage.prompt_tokens, out.usage.completion_tokens,
                 time.perf_counter() - start)


def chat(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
         temperature: float = 0.0, model: str | None = None) -> Reply:
    """``/v1/chat/completions``: the server applies the exported chat template (``model``: the served name, or
    ``server.config.adapter_name`` for the LoRA adapter)."""
    from openai import OpenAIError

    start = time.perf_counter()
    try:
        out = server.client().chat.completions.create(model=model or server.config.served_model_name,
                                                      messages=messages, max_tokens=max_tokens,
                                                      temperature=temperature)
    except OpenAIError as exc:
        raise _request_error(exc, server) from None
    choice = out.choices[0]
    return Reply(choice.message.content or "", choice.finish_reason, out.usage.prompt_tokens,
                 out.usage.completion_tokens, time.perf_counter() - start)


@dataclass
class GreedyCheck:
    """transformers greedy vs vLLM greedy on the same chat prompts."""

    total: int
    matches: int
    pairs: list[tuple[str, str]]

    def __str__(self) -> str:
        rows = [f"{self.matches}/{self.total} prompts: transformers and vLLM greedy outputs identical"]
        rows += [f"  {'=' if a == b else '≠'} hf: {a!r}\n    vllm: {b!r}" for a, b in self.pairs]
        return "\n".join(rows)


def compare_greedy(folder: str | Path, server: VLLMServer, prompts: list[list[dict[str, str]]],
                   max_tokens: int = 32, model: str | None = None) -> GreedyCheck:
    """Reload the folder with transformers (the rollout engine's HF backend, fp32) and compare its greedy output
    with the server's.

    Identical text is what intact weights and a shared tokenizer/chat template give in fp32; a mismatch
    on the first tokens means the export or the serving config differs from what was trained.
    """
    with open_engine(str(folder), backend="hf", dtype="float32", n=1, max_tokens=max_tokens, temperature=0.0,
                     prompts=prompts) as engine:
        hf = [texts[0] for texts in engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens,
                                                                      temperature=0.0)).texts]
    served = [chat(server, p, max_tokens=max_tokens, model=model).text for p in prompts]
    pairs = list(zip(hf, served))
    return GreedyCheck(len(pairs), sum(a.strip() == b.strip() for a, b in pairs), pairs)


def curl_command(server: VLLMServer, messages: list[dict[str, str]], max_tokens: int = 32,
                 model: str | None = None) -> str:
    """The equivalent ``curl`` call for a chat request, to paste into a terminal."""
    body = json.dumps({"model": model or server.config.served_model_name, "messages": messages,
                       "max_tokens": max_tokens, "temperature": 0}, ensure_ascii=False)
    auth = ' -H "Authorization: Bearer $GRPO_LAB_API_KEY"' if server.config.api_key else ""
    return (f"curl -s {server.base_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
STOP_HELP = ("What stops the server: Ctrl-C (SIGINT) or SIGTERM to this command (kill PID, systemd, docker stop) "
             "stops it gracefully, its whole process group (API server, engine core, workers), then this command "
             "exits; if this command is killed outright (kill -9, the OOM killer, a crash) the server's watchdog ends "
             "the group within a few seconds. Either way the port is free again. `grpo-lab doctor` lists vLLM "
             "processes of yours that still hold a device or a port, with the command to stop them.")


def main(argv: list[str] | None = None) -> int:
    """`grpo-lab serve`: verify a folder, serve it until Ctrl-C (or answer one prompt with --ask)."""
    import argparse

    parser = argparse.ArgumentParser(prog="grpo-lab serve", description="Serve a model folder with vLLM.",
                                     epilog=STOP_HELP)
    parser.add_argument("model", nargs="?", default=str(models.TINY_MODEL_DIR),
                        help="model folder, or a training run (its final/: a LoRA run's adapter merged)")
    parser.add_argument("--lora", action="store_true",
                        help="a LoRA run (or adapter folder): serve the adapter on its base with vLLM's LoRA serving")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--api-key", default=os.environ.get("GRPO_LAB_API_KEY"), help="require this key")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest request (default: deploy.default_max_model_len for the model)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--log", default=None, help="server log file")
    parser.add_argument("--ask", default=None, help="send one chat message, print the reply, stop")
    args = parser.parse_args(argv)
    model, adapter = served_weights(args.model, adapter=args.lora)
    if adapter is None:
        report = verify_export(model, load_weights=False)
        print(report)
        report.raise_if_bad()
    server = VLLMServer(model, log_path=args.log, host=args.host, port=args.port, api_key=args.api_key,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        enable_prefix_caching=not args.no_prefix_caching, lora_adapter=adapter)
    with server:
        name = server.config.adapter_name if adapter else server.config.served_model_name
        print(f"serving {model}{f' with the LoRA adapter {adapter} as {name!r}' if adapter else ''} at "
              f"{server.base_url}/v1 (log: {server.log_path}); Ctrl-C or `kill {os.getpid()}` stops it")
        messages = [{"role": "user", "content": args.ask or "Hello"}]
        print("try:", curl_command(server, messages, model=name))
        if args.ask:
            print(chat(server, messages, model=name).text)
            return 0
        try:
            while server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping")
        return 0 if server.process is None or server.process.poll() in (None, 0) else 1


# --------------------------------------------------------------------------------------------------
# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

__getattr__ = moved_names(__name__, moved={
    name: f"grpo_lab.servers:{name}" for name in ("LOG_TAIL_LINES", "port_is_free", "wait_until_healthy")})
