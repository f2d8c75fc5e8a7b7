"""The trainer of asynchronous GRPO (:mod:`grpo_lab.async_grpo`): TRL's ``AsyncGRPOTrainer`` behind the
:class:`StalenessGate`, recording the lag of every trained completion (:class:`GrpoLabAsyncTrainer`). While it runs,
:func:`trl_workarounds` replaces two TRL functions only where they fail: the packed attention's FlashAttention-3 Hub
kernel (CUDA only, and out of reach offline) by :class:`TorchTreeAttention`, and the peak-FLOPs query off CUDA. Imports
TRL's experimental trainer (seconds); the names it relies on are declared in :mod:`grpo_lab.upstream.trl`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
from trl.experimental.async_grpo import AsyncGRPOTrainer, packing

from grpo_lab import device
from grpo_lab.errors import GrpoLabError

__all__ = ["GrpoLabAsyncTrainer", "StalenessGate", "TakenSample", "TorchTreeAttention", "attention_backend",
           "completion_digest", "trl_workarounds"]


def completion_digest(token_ids: Sequence[int]) -> str:
    """A short fingerprint of a completion's token ids."""
    return hashlib.sha1(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TakenSample:
    """What :class:`StalenessGate` keeps of a completion it let through, until the trainer trains it."""

    group_id: int
    model_version: int
    """The worker's tag: the policy version live when the group's first request went out."""
    step: int
    """The optimizer step (1-based ``global_step``) that will train it."""
    version: int
    """The trainer's policy version at that step."""
    completion_tokens: int
    digest: str
    logprob_sum: float
    """Sum of the server's log-probabilities of its tokens."""


class StalenessGate:
    """The rollout queue as TRL's dataloader sees it, minus every completion that would be trained too stale.

    With a fixed number per micro-batch (``token_budget=0``) the ``i``-th completion taken trains in step
    ``first + 1 + i // samples_per_step``, at the current version plus the syncs due before it; it passes when that
    minus its tag is at most ``max_staleness``, and a group follows its first completion. :meth:`claim` hands the
    trainer the records of a micro-batch's completions, in order.
    """

    def __init__(self, source: Any, *, max_staleness: int, samples_per_step: int, weight_sync_steps: int,
                 version: Callable[[], int], global_step: Callable[[], int], metrics: dict[str, list] | None = None):
        self.source = source
        self.max_staleness = max_staleness
        self.samples_per_step = samples_per_step
        self.weight_sync_steps = weight_sync_steps
        self.version = version
        self.global_step = global_step
        self.metrics = metrics
        self.first_step: int | None = None
        self.taken = 0
        self.dropped = 0
        self.pending: deque[TakenSample] = deque()
        self._group: tuple[int, bool] | None = None

    def version_at(self, step: int) -> int:
        """The trainer's policy version while it trains ``step`` (1-based), from its version now."""
        now = self.global_step()
        return self.version() + (step - 1) // self.weight_sync_steps - now // self.weight_sync_steps

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        while True:
            sample = self.source.get(block, timeout)
            if self.first_step is None:
                self.first_step = self.global_step()
            step = self.first_step + 1 + self.taken // self.samples_per_step
            version = self.version_at(step)
            fresh = version - sample.model_version <= self.max_staleness
            if self._group is not None and self._group[0] == sample.group_id and not self._group[1]:
                fresh = False  # the group's first completion was dropped: keep the group whole
            self._group = (sample.group_id, fresh)
            if fresh:
                self.taken += 1
                self.pending.append(_taken(sample, step, version))
                return sample
            self.dropped += 1
            if self.metrics is not None:
                self.metrics["staleness/dropped_total"].append(1.0)

    def qsize(self) -> int:
        return self.source.qsize()

    def claim(self, count: int) -> list[TakenSample]:
        """The records of the next ``count`` completions let through (one micro-batch), oldest first."""
        if len(self.pending) < count:
            raise GrpoLabError(f"the trainer is training a micro-batch of {count} completions but only "
                               f"{len(self.pending)} were taken from the queue: the gate's count of what each step "
                               f"trains is off (token_budget must be 0).")
        return [self.pending.popleft() for _ in range(count)]


def _taken(sample: Any, step: int, version: int) -> TakenSample:
    mask = sample.completion_mask == 1
    return TakenSample(group_id=int(sample.group_id), model_version=int(sample.model_version), step=step,
                       version=version, completion_tokens=int(mask.sum()),
                       digest=completion_digest(sample.input_ids[mask].tolist()),
                       logprob_sum=float(sample.old_log_probs[mask].sum()))


class TorchTreeAttention:
    """The ``flash_attn_varlen_func`` TRL's tree attention calls, in torch: segment ``s``'s query rows attend to its
    gathered key rows, causally with FlashAttention's bottom-right alignment (exact; one SDPA call per segment)."""

    @staticmethod
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                               softmax_scale=None, causal=True, window_size=(-1, -1), softcap=None, **_):
        if softcap:
            raise NotImplementedError("TorchTreeAttention has no logit soft-capping (the course's models use none).")
        out = torch.empty_like(q)
        for s in range(len(cu_seqlens_q) - 1):
            q0, q1, k0, k1 = (int(x) for x in (cu_seqlens_q[s], cu_seqlens_q[s + 1], cu_seqlens_k[s],
                                               cu_seqlens_k[s + 1]))
            rows = torch.arange(q1 - q0, device=q.device).unsqueeze(1) + (k1 - k0) - (q1 - q0)
            cols = torch.arange(k1 - k0, device=q.device).unsqueeze(0)
            mask = cols <= rows if causal else torch.ones_like(cols, dtype=torch.bool).expand(q1 - q0, -1)
            if window_size[0] >= 0:
                mask = mask & (cols >= rows - window_size[0])
            attended = torch.nn.functional.scaled_dot_product_attention(
                q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1), attn_mask=mask,
                scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
            out[q0:q1] = attended.transpose(0, 1)
        return out


def attention_backend(kind: str) -> tuple[str, str]:
    """``("fa3" | "torch", why)``: TRL's FlashAttention-3 kernel where it loads, else :class:`TorchTreeAttention`."""
    if not device.is_cuda(kind):
        return "torch", f"FlashAttention-3 is a CUDA (Hopper) kernel; on {kind} the packed attention runs in torch"
    try:
        packing._flash_attn()
    except Exception as error:  # noqa: BLE001 - `kernels` missing, the Hub unreachable, no cached kernel
        return "torch", (f"the FlashAttention-3 kernel did not load ({type(error).__name__}: {str(error)[:160]}); the "
                         f"packed attention runs in torch (slower). For FA3: pip install kernels and cache "
                         f"kernels-community/flash-attn3 where the Hub is reachable")
    return "fa3", "TRL's FlashAttention-3 kernel (kernels-community/flash-attn3)"


@contextlib.contextmanager
def trl_workarounds(kind: str) -> Iterator[dict[str, str]]:
    """While the trainer runs on ``kind``: the packed attention in torch where FA3 does not load, no peak-FLOPs query
    off CUDA. Yields what was replaced and why."""
    saved = packing._flash_attn, trainer_module.get_peak_flops_per_device
    backend, why = attention_backend(kind)
    applied = {"attention": f"{backend}: {why}"}
    if backend == "torch":
        packing._flash_attn = lambda: TorchTreeAttention  # tree_attention looks it up in packing's globals
    if not device.is_cuda(kind):
        trainer_module.get_peak_flops_per_device = lambda *args, **kwargs: None
        applied["peak_flops"] = ("not queried: TRL asks torch.cuda for the device name, which fails off CUDA; no "
                                 "perf/mfu_* metrics")
    try:
        yield applied
    finally:
        packing._flash_attn, trainer_module.get_peak_flops_per_device = saved


class GrpoLabAsyncTrainer(AsyncGRPOTrainer):
    """TRL's ``AsyncGRPOTrainer`` behind the gate; each micro-batch records the lag it trains with (``staleness/*``
    metrics, ``trained_samples.jsonl``)."""

    def __init__(self, *args, samples_file: Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.samples_file = samples_file
        self.lag_counts: Counter[int] = Counter()
        self.gate = None
        if self.accelerator.is_main_process:
            self.gate = StalenessGate(
                self.rollout_queue, max_staleness=self.args.max_staleness,
                samples_per_step=self.microbatch_size * self.args.gradient_accumulation_steps,
                weight_sync_steps=self.args.weight_sync_steps, version=lambda: self.model_version,
                global_step=lambda: self.state.global_step, metrics=self._metrics["train"])
            self.rollout_queue = self.gate  # get_train_dataloader reads it from here

    @property
    def microbatch_size(self) -> int:
        return self.args.per_device_train_batch_size * self.accelerator.num_processes

    def train(self, *args, **kwargs):
        """TRL's; afterwards the model attends with SDPA again, so it saves and loads as a plain model."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.model.set_attn_implementation("sdpa")

    def training_step(self, model, inputs, num_items_in_batch):
        if self.gate is not None:
            self._record(self.gate.claim(self.microbatch_size), inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def _record(self, taken: list[TakenSample], inputs: dict) -> None:
        step = self.state.global_step + 1
        lags = [self.model_version - t.model_version for t in taken]
        if self.accelerator.num_processes == 1:  # the whole micro-batch is here: the records must match it
            trained = int((inputs["token_index"] >= 0).sum())
            if trained != sum(t.completion_tokens for t in taken):
                raise GrpoLabError(f"step {step}: the micro-batch trains {trained} completion tokens but the "
                                   f"completions recorded for it hold {sum(t.completion_tokens for t in taken)}")
        metrics = self._metrics["train"]
        metrics["staleness/lag_max"].append(float(max(lags)))
        metrics["staleness/lag_mean"].append(sum(lags) / len(lags))
        metrics["staleness/policy_version"].append(float(self.model_version))
        metrics["staleness/off_plan_total"].append(float(sum(t.version != self.model_version for t in taken)))
        for lag, count in Counter(lags).items():
            metrics[f"staleness/samples_lag_{lag}_total"].append(float(count))
        self.lag_counts.update(lags)
        if self.samples_file is not None:
            with self.samples_file.open("a", encoding="utf-8") as handle:
                for t, lag in zip(taken, lags):
                    handle.write(json.dumps({"step": step, "group_id": t.group_id, "model_version": t.model_version,
                                             "trained_at": self.model_version, "lag": lag,
                                             "tokens": t.completion_tokens, "digest": t.digest,
                                             "logprob_sum": round(t.logprob_sum, 6)}) + "\n")
