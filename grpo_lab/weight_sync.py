"""How the trainer's weights reach vLLM where TRL's own path cannot carry them: vLLM's ``reload_weights``.

Two places need it. **Colocated vLLM on the CPU** (below, :func:`install`), and **a vLLM server without NCCL**
(on the CPU or Ascend): the trainer writes its weights to ``<run>/.weight_sync/model.safetensors`` and asks the
server, through vLLM's development endpoint ``/collective_rpc``, to reload them (:class:`ReloadWeightsExtension`).
TRL has two clients for a server, and each gets the file transport its own way: server mode's ``VLLMClient``
through :func:`file_sync_client`, ``AsyncGRPOTrainer`` through its ``weight_transfer=`` argument
(:class:`FileWeightTransfer`). Only the transport changes: TRL still decides when and what to sync.

**The problem (colocate, CPU).** In ``vllm_mode="colocate"`` TRL copies the trainer's weights into the in-process vLLM engine
before each rollout, one parameter at a time, through ``model.load_weights([(name, tensor)])``. On hosts where its
oneDNN kernels apply (AVX-512), vLLM-CPU *repacks* every Linear weight after loading (into a oneDNN / SGL-kernel
layout held by the layer's ``cpu_linear`` function) and leaves an empty ``Parameter`` behind, without the
``weight_loader`` that ``load_weights`` needs (:func:`cpu_weights_repacked`; with AVX2 alone it keeps the loaded
weights, and both paths work). There the very first sync fails with::

    AttributeError: 'Parameter' object has no attribute 'weight_loader'

**The fix.** Push the weights through vLLM's own *reload* path instead: ``llm.collective_rpc("reload_weights",
...)`` asks the worker's model runner to restore the checkpoint-format parameters, load the new tensors and
run vLLM's post-processing (the repacking) again. One more detail: with tied embeddings (``lm_head`` shares
``embed_tokens``), the CPU ``lm_head`` keeps its own packed copy of the embedding matrix. The reload updates
``embed_tokens`` but never touches that copy, because no ``lm_head.weight`` is ever loaded, so the logits
would stay stale. :func:`repack_tied_lm_head` packs it again from the fresh embedding.

**A LoRA policy by its adapter** (``TrainConfig.vllm_lora_sync="adapter"``, :func:`install_adapter_sync`): TRL
merges a PEFT adapter into the base before each sync; under a 4-bit base that merge rounds a LoRA update away
(``grpo_lab.lora.QLORA_ENGINE_CAVEAT``). Instead the engine starts with vLLM's LoRA support
(:func:`engine_lora_arguments`), keeps the base as loaded, and each sync writes the adapter to a folder that the
engine's next ``generate`` loads as a new ``LoRARequest``.

**Only where needed.** :func:`install` swaps the sync method of one TRL ``VLLMGeneration`` object, and only
when vLLM runs on the CPU in colocate mode; on CUDA and Ascend TRL's own sync is left alone.

**The proof.** :func:`logprob_gap` compares the log-probabilities that vLLM and the trainer assign to the
same completion; after a training step with a large learning rate they agree with this fix, and disagree
(stale weights) without it. ``tests/test_weight_sync.py`` asserts both.

    >>> from grpo_lab import weight_sync
    >>> trainer = GRPOTrainer(..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate"))  # doctest: +SKIP
    >>> weight_sync.install(trainer.vllm_generation)                                     # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import types
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from grpo_lab.errors import GrpoLabError
from grpo_lab.upstream import UpstreamName

logger = logging.getLogger(__name__)

_GENERATION = "trl.generation.vllm_generation.VLLMGeneration"
_QWEN2 = "vllm.model_executor.models.qwen2"
UPSTREAM_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("attribute", "vllm.v1.worker.gpu_worker.Worker", "model_runner",
                 "the worker's model (CPUWorker's too)"),
    UpstreamName("method", "vllm.v1.worker.gpu_model_runner.GPUModelRunner", "get_model", "the worker's model"),
    UpstreamName("method", "vllm.v1.worker.gpu_worker.Worker", "reload_weights",
                 "the sync itself (colocated through collective_rpc, a server through ReloadWeightsExtension)"),
    UpstreamName("module", "vllm.model_executor.layers.linear", "LinearBase", "cpu_weights_repacked asks these only"),
    UpstreamName("attribute", "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm", "cpu_linear",
                 "vLLM-CPU's packed copy of a layer's weight: cpu_weights_repacked, repack_tied_lm_head"),
    UpstreamName("module", "vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm", "repack_tied_lm_head"),
    *(UpstreamName("attribute", owner, name, "repack_tied_lm_head: a tied lm_head and its embedding")
      for owner, name in ((f"{_QWEN2}.Qwen2ForCausalLM", "lm_head"), (f"{_QWEN2}.Qwen2ForCausalLM", "model"),
                          (f"{_QWEN2}.Qwen2Model", "embed_tokens"))),
    *(UpstreamName("attribute", _GENERATION, name, "the CPU sync replaces TRL's on this object")
      for name in ("mode", "llm", "model", "enable_sleep_mode", "_llm_weights_sleeping")),
    UpstreamName("method", _GENERATION, "sync_weights", "replaced on the CPU (install) and for adapter sync"),
    UpstreamName("module", "vllm.lora.request", "LoRARequest", "adapter sync: the adapter each rollout samples with"),
    UpstreamName("method", "vllm.LLM", "reset_prefix_cache", "adapter sync: cached prefixes of the old adapter"),
    UpstreamName("method", _GENERATION, "_iter_named_params", "the trainer's weights under vLLM's names, PEFT merged"),
    UpstreamName("module", "trl.generation.vllm_generation", "VLLMClient", "replaced by file_sync_client"),
    *(UpstreamName("method", "trl.generation.vllm_client.VLLMClient", name, "FileSyncVLLMClient")
      for name in ("init_communicator", "update_named_params", "_post", "get_server_info")),
    UpstreamName("attribute", "trl.generation.vllm_client.VLLMClient", "base_url", "FileSyncVLLMClient"),
    *(UpstreamName("method", "trl.experimental.async_grpo.vllm_client.VLLMClient", name, "FileWeightTransfer")
      for name in ("pause", "resume", "get_server_info")),
)

WORKER_EXTENSION = "grpo_lab.weight_sync.ReloadWeightsExtension"
"""vLLM ``--worker-extension-cls``: adds the reload-based weight sync to a server's workers."""
RELOAD_METHOD = "grpo_lab_reload_weights"
SYNC_FOLDER = ".weight_sync"
"""Folder of a run where the trainer writes the weights a server reloads."""


class WeightSyncError(GrpoLabError, RuntimeError):
    """The server cannot take weights the way this trainer sends them; the message says how to start it."""


def vllm_runs_on_cpu() -> bool:
    """True when vLLM is importable and its platform is the CPU (the ``vllm-cpu`` build)."""
    try:
        from vllm.platforms import current_platform
    except Exception:  # no vLLM, or a vLLM that does not import here
        return False
    return bool(current_platform.is_cpu())


def needs_cpu_sync(vllm_generation: Any) -> bool:
    """Whether TRL's weight sync must be replaced: a colocated vLLM engine on the CPU."""
    return vllm_generation.mode == "colocate" and vllm_runs_on_cpu()


def repack_tied_lm_head(worker: Any) -> bool:
    """Re-pack the CPU ``lm_head`` from the (already reloaded) tied embedding; runs inside the vLLM worker.

    Returns True when a packed head was refreshed, False when there is nothing to do (untied head, or a
    head without a CPU packed copy).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    model = worker.model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = lm_head is not None and embed is not None and getattr(lm_head, "weight", None) is getattr(embed, "weight", 0)
    if not tied or not hasattr(lm_head, "cpu_linear"):
        return False
    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
    return True


def _linear_weights_repacked(worker: Any) -> bool:
    """Inside the vLLM worker: whether vLLM-CPU replaced a Linear layer's weight by an empty ``Parameter`` without the
    ``weight_loader`` that ``load_weights`` needs, keeping a packed copy in ``cpu_linear`` (its sgl-kernel or oneDNN
    GEMM: AMX or AVX-512 hosts); where it falls back to torch's linear (AVX2 alone) the loaded weight stays. Only
    vLLM's ``LinearBase`` layers are asked: the embedding and a tied ``lm_head`` keep their weight either way."""
    from vllm.model_executor.layers.linear import LinearBase

    for module in worker.model_runner.get_model().modules():
        if isinstance(module, LinearBase) and hasattr(module, "cpu_linear"):
            return not hasattr(getattr(module, "weight", None), "weight_loader")
    return False


def cpu_weights_repacked(llm: Any) -> bool:
    """Whether this colocated vLLM-CPU engine repacked its Linear weights (see :func:`_linear_weights_repacked`): then
    TRL's own sync fails and a tied ``lm_head`` keeps a packed copy that :func:`repack_tied_lm_head` refreshes."""
    return bool(llm.collective_rpc(_linear_weights_repacked)[0])


def _named_weights(vllm_generation: Any) -> list[tuple[str, torch.Tensor]]:
    """The trainer's weights under the names vLLM expects (TRL's own iterator: handles PEFT merging).

    With PEFT, TRL merges the adapter into the base weights in place while it iterates and unmerges them when it
    ends; the list outlives the iteration, so the merged tensors are copied, or vLLM would get the bare base."""
    merged = hasattr(vllm_generation.model, "peft_config")
    return [(name, tensor.detach().clone() if merged else tensor.detach())
            for name, tensor in vllm_generation._iter_named_params()]


def sync_weights_via_reload(vllm_generation: Any, repack_lm_head: bool = True) -> None:
    """Copy the trainer's current weights into the colocated vLLM-CPU engine (replacement for TRL's sync).

    ``repack_lm_head=False`` exists only to show the stale-logits bug that the re-packing fixes.
    """
    llm = vllm_generation.llm
    if vllm_generation.enable_sleep_mode:
        llm.wake_up(tags=["weights"])
        vllm_generation._llm_weights_sleeping = False
    weights = _named_weights(vllm_generation)
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    if repack_lm_head:
        llm.collective_rpc(repack_tied_lm_head)
    llm.reset_prefix_cache()


def install(vllm_generation: Any) -> bool:
    """Make ``vllm_generation.sync_weights`` use :func:`sync_weights_via_reload` when vLLM runs on the CPU.

    Returns True when the fix was installed, False when it is not needed (GPU/NPU, or server mode).
    """
    if not needs_cpu_sync(vllm_generation):
        return False
    vllm_generation.sync_weights = types.MethodType(sync_weights_via_reload, vllm_generation)
    logger.info("vLLM runs on the CPU: weight sync goes through vLLM's reload_weights (grpo_lab.weight_sync).")
    return True


# --------------------------------------------------------------------------------------------------
# A LoRA policy by its adapter: the engine keeps the base, each sync hands it the adapter
# --------------------------------------------------------------------------------------------------
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM takes as ``max_lora_rank`` (an adapter of any rank up to it loads)."""
ADAPTER_FOLDER = ".engine-adapter"
"""Folder of a run where adapter sync writes the adapter the engine loads next."""


def engine_lora_arguments(rank: int) -> dict[str, Any]:
    """vLLM ``LLM(...)`` arguments for an engine that follows an adapter of ``rank``: one adapter at a time."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise WeightSyncError(f"lora_r={rank}: vLLM's LoRA support takes ranks up to {VLLM_LORA_RANKS[-1]}; use a "
                              f"smaller lora_r or vllm_lora_sync='merge'.")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


class AdapterSync:
    """``VLLMGeneration.sync_weights`` for a PEFT policy whose engine runs the base with vLLM's LoRA support: the
    adapter saved to a fresh folder of ``folder`` (PEFT's ``save_pretrained``) and named in a new ``LoRARequest``,
    which every later ``llm.generate`` call of the engine carries (unless the caller passes its own)."""

    def __init__(self, vllm_generation: Any, folder: Path):
        self.generation, self.folder = vllm_generation, Path(folder)
        self.count = 0
        self.request: Any | None = None  # before the first sync the adapter is PEFT's initial one: B = 0, the base
        self._generate = vllm_generation.llm.generate

    def sync(self) -> None:
        from vllm.lora.request import LoRARequest

        self.count += 1
        path = self.folder / f"adapter-{self.count}"
        shutil.rmtree(path, ignore_errors=True)
        self.generation.model.save_pretrained(str(path))
        self.request = LoRARequest(f"policy-{self.count}", self.count, str(path))
        self.generation.llm.reset_prefix_cache()  # prefixes computed under the previous adapter
        for old in self.folder.glob("adapter-*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.request is not None:
            kwargs.setdefault("lora_request", self.request)
        return self._generate(*args, **kwargs)


def install_adapter_sync(vllm_generation: Any, folder: Path) -> AdapterSync:
    """Make the colocated engine follow the PEFT policy by its adapter (:class:`AdapterSync`); the engine must have
    started with :func:`engine_lora_arguments`."""
    sync = AdapterSync(vllm_generation, folder)
    vllm_generation.llm.generate = sync.generate
    vllm_generation.sync_weights = sync.sync
    logger.info("the colocated engine follows the LoRA adapter through vLLM's LoRA support (grpo_lab.weight_sync).")
    return sync


# --------------------------------------------------------------------------------------------------
# The proof: vLLM and the trainer give the same log-probabilities to the same completion
# --------------------------------------------------------------------------------------------------
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
    """Largest per-token |log p_trainer - log p_vLLM| on one completion; ~0.01–0.1 when in sync.

    vLLM-CPU runs a float32 checkpoint in bfloat16, so a synced engine is close but not bit-equal.
    """
    ours = torch.tensor(trainer_logprobs(model, prompt_ids, completion_ids))
    theirs = torch.tensor(vllm_logprobs(llm, prompt_ids, completion_ids))
    return float((ours - theirs).abs().max())


# --------------------------------------------------------------------------------------------------
# Weight sync without NCCL: safetensors in a folder + vLLM's reload_weights (server mode: server side and trainer side)
# --------------------------------------------------------------------------------------------------
class ReloadWeightsExtension:
    """Mixed into the server's vLLM workers (``--worker-extension-cls``); called via ``/collective_rpc``."""

    def grpo_lab_reload_weights(self, weights_path: str) -> bool:
        """vLLM's own ``reload_weights`` from a folder of safetensors, then the tied ``lm_head`` re-packed (CPU)."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return repack_tied_lm_head(self) if vllm_runs_on_cpu() else False


def require_reload_extension(parallel_config: dict, base_url: str) -> None:
    """Raise :class:`WeightSyncError` unless the server's workers carry :data:`WORKER_EXTENSION` (from the
    ``parallel_config`` of its ``/server_info``)."""
    extension = parallel_config.get("worker_extension_cls")
    if extension != WORKER_EXTENSION:
        raise WeightSyncError(f"the vLLM server at {base_url} runs without --worker-extension-cls {WORKER_EXTENSION}, "
                              f"which the file weight sync needs; start it with grpo_lab.scale.launch_rollout_server "
                              f"(weight_sync='file').")


def stage_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], sync_dir: Path) -> dict[str, Any]:
    """Write ``(name, tensor)`` pairs to ``sync_dir/model.safetensors`` (renamed into place once complete, so the
    server never reads half a file) and return the ``/collective_rpc`` request that makes the server reload them."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
    staged = sync_dir / "model.safetensors.partial"
    save_file(tensors, str(staged), metadata={"format": "pt"})
    os.replace(staged, sync_dir / "model.safetensors")
    return {"method": RELOAD_METHOD, "args": [str(sync_dir.resolve())]}


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
            self._post(f"{self.base_url}/collective_rpc", json=stage_weights(named_params, self.sync_dir))

    return FileSyncVLLMClient


@contextlib.contextmanager
def file_sync_client(sync_dir: str | None) -> Iterator[None]:
    """While the trainer is built with ``sync_dir``: TRL's client pushes weights through files (no NCCL)."""
    import trl.generation.vllm_generation as vllm_generation

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
    """The ``weight_transfer=`` seam of TRL's ``AsyncGRPOTrainer`` (its ``WeightTransferProtocol``) without NCCL.

    TRL's own transfer (``trl.experimental.async_grpo.weight_transfer.WeightTransferClient``) streams the weights over
    NCCL through vLLM's weight-transfer engine, which exists only on CUDA. Where there is no NCCL (the CPU, and Ascend)
    this class moves them the way server mode does (:func:`file_sync_client`): a safetensors file in ``sync_dir`` and
    a ``/collective_rpc`` request that makes the server's workers run :class:`ReloadWeightsExtension`. Pausing,
    resuming and the health check are TRL's own async client (``trl.experimental.async_grpo.vllm_client.VLLMClient``),
    so only the transport differs. The trainer calls it on rank 0 only: :meth:`init_weight_transfer` once, then
    :meth:`pause`, :meth:`send_weights`, :meth:`resume` at every sync, :meth:`destroy` at the end.

    The server pauses with ``mode=keep``: requests in flight freeze and continue under the new weights after the
    reload, so one completion can mix two policies; its tokens' log-probabilities are each from the policy that
    sampled them, and its version tag is the older one.
    """

    def __init__(self, base_url: str, sync_dir: str | Path, server_timeout: float = 240.0,
                 request_timeout: float = 1800.0):
        self.base_url = base_url.rstrip("/")
        self.sync_dir = Path(sync_dir)
        self.server_timeout = server_timeout
        self.request_timeout = request_timeout
        self.pushes = 0
        """Weight pushes so far (the cold sync before training counts)."""

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
        import requests

        response = requests.post(f"{self.base_url}/collective_rpc", json=stage_weights(iterator, self.sync_dir),
                                 timeout=self.request_timeout)
        if response.status_code != 200:
            raise WeightSyncError(f"the server at {self.base_url} did not reload the weights from {self.sync_dir}: "
                                  f"HTTP {response.status_code} {response.text[:500]}")
        self.pushes += 1

    def resume(self) -> None:
        self._client().resume(timeout=self.request_timeout)

    def destroy(self) -> None:
        """Delete the staged weights (the run's ``final/`` holds the trained model)."""
        shutil.rmtree(self.sync_dir, ignore_errors=True)
