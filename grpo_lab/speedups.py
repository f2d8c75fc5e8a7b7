"""The speed-ups of grpo_lab's GRPO trainer: TRL's ``GRPOTrainer`` made faster without changing what it computes
(:class:`SpeedUpTrainer`, which :class:`grpo_lab.trainer.GRPOLabTrainer` builds on).

Each one is taken only where it is exact, and says what it bought, as measured by the benchmark it names:

* **Flat log-probs** (:func:`colocated_sampling_arguments`, :func:`extract_flat_logprobs`): the colocated engine
  returns each sequence's log-probs as a few flat lists, read into the lists TRL builds from a dict per token.
  Bit-identical lists (``tests/test_rollout.py``, on real vLLM outputs).
* **No detokenizing** in the engine's decode loop (:func:`colocated_sampling_arguments`). Bit-identical: TRL decodes
  the token ids itself.
* **No sampled-token log-probs where nothing reads them** (:func:`reads_sampling_logprobs`). Bit-identical loss and
  gradients (``tests/test_weight_sync.py``).
* **The collector paused while TRL generates** (:func:`collection_paused`). Changes no number.
* **vLLM's importance-sampling correction from the loss's own forward** (:func:`defers_correction`). TRL's ratio, loss
  and gradients to float rounding (rtol 1e-5 / 1e-4, ``tests/test_weight_sync.py``).
* **Micro-batches grouped by completion length**, each cut to its longest (:func:`groups_by_length`). TRL's summed
  loss and gradients to float rounding (rtol 1e-5 / 1e-4, ``tests/test_weight_sync.py``).

``benchmarks/trainer_switches/`` switches each on and off step by step in one trainer. This module imports TRL (whose
trainer loads vLLM: seconds); every TRL name it relies on is listed in :data:`TRL_INTERNALS`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from trl import GRPOTrainer
from trl.generation import vllm_generation
from trl.trainer import grpo_trainer

from grpo_lab.errors import ConfigError
from grpo_lab.upstream import UpstreamName

COMPLETION_TOKEN_KEYS = ("completion_ids", "completion_mask", "old_per_token_logps", "sampling_per_token_logps",
                         "ref_per_token_logps", "importance_sampling_ratio", "tool_mask")
"""TRL 1.16's tensors of a micro-batch with a column per completion token (``importance_sampling_ratio`` only when
per token)."""
BATCH_KEYS = frozenset({"prompt_ids", "prompt_mask", "advantages", "num_items_in_batch", *COMPLETION_TOKEN_KEYS})
"""Every key of the text batch TRL 1.16 hands its loss: a batch with any other key is not cut."""

_OWNER = "trl.GRPOTrainer"
TRL_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("method", _OWNER, "_generate", "flat log-probs, none where unread, the collector paused"),
    UpstreamName("method", _OWNER, "_generate_and_score_completions", "the correction deferred"),
    UpstreamName("method", _OWNER, "_get_per_token_logps_and_entropies", "the correction from the loss's forward"),
    UpstreamName("method", _OWNER, "_compute_loss", "the correction from the loss's forward"),
    UpstreamName("method", _OWNER, "log", "the deferred correction's metrics brought to the host"),
    UpstreamName("method", _OWNER, "_prepare_inputs", "micro-batches grouped by completion length"),
    UpstreamName("module", "trl.trainer.grpo_trainer", "shuffle_sequence_dict",
                 "the generation batch's shuffle, followed by the length order"),
    UpstreamName("module", "trl.generation.vllm_generation", "extract_logprobs",
                 "flat log-probs read without a dict per token; none where unread"),
    UpstreamName("attribute", "trl.generation.vllm_generation.VLLMGeneration", "logprobs",
                 "no sampled-token log-probs where nothing reads them"),
    UpstreamName("attribute", "trl.generation.vllm_generation.VLLMGeneration", "mode", "colocated engine only"),
    UpstreamName("attribute", _OWNER, "use_vllm", "colocated engine only"),
    UpstreamName("attribute", _OWNER, "vllm_generation", "the engine that samples without log-probs"),
    UpstreamName("attribute", _OWNER, "rollout_func", "when the sampled-token log-probs can be skipped"),
    UpstreamName("attribute", _OWNER, "vllm_importance_sampling_correction", "the deferred correction"),
    *(UpstreamName("attribute", _OWNER, f"vllm_importance_sampling_{name}", "the correction's formula")
      for name in ("mode", "clip_min", "clip_max")),
    UpstreamName("attribute", _OWNER, "tools", "when the correction can be deferred and the log-probs skipped"),
    UpstreamName("attribute", _OWNER, "_metrics", "the correction's sampling/* metrics"),
    *(UpstreamName("batch", "trl.GRPOTrainer._generate_and_score_completions", name,
                   "length grouping: a batch it knows (and the deferred correction)") for name in sorted(BATCH_KEYS)),
    *(UpstreamName("config", "trl.GRPOConfig", name, "read to decide which speed-up is exact") for name in (
        "use_vllm", "vllm_importance_sampling_correction", "gradient_accumulation_steps", "steps_per_generation",
        "num_iterations", "loss_type", "off_policy_mask_threshold", "top_entropy_quantile", "generation_kwargs")),
)


# --------------------------------------------------------------------------------------------------
# Generation: flat log-probs, none where nothing reads them, the collector paused
# --------------------------------------------------------------------------------------------------
def colocated_sampling_arguments() -> dict[str, bool]:
    """``SamplingParams`` fields for TRL's colocated engine (``GRPOConfig.generation_kwargs``).

    ``detokenize=False``: vLLM would decode every sampled token in the thread that drives the device; TRL decodes the
    ids itself and sets no stop strings, so nothing changes. Bought, together with the trainer's other changes of that
    run: vLLM's generate inside TRL's trainer 7.8–8.3 s → 3.39 s per 0.5B-shape step on the H200, as fast as the
    same engine in a fresh process (``benchmarks/results/h200/README.md``).

    ``flat_logprobs=True`` where this vLLM has it: the log-probs as a few flat lists per sequence instead of a dict
    per token, which :func:`extract_flat_logprobs` reads."""
    from vllm import SamplingParams

    arguments = {"detokenize": False}
    if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()):
        arguments["flat_logprobs"] = True
    return arguments


def extract_flat_logprobs(all_outputs: list, fallback: Callable[[list], tuple]) -> tuple:
    """TRL's ``extract_logprobs`` (``fallback``) for outputs with flat log-probs: per sequence, per position, the
    log-probs and token ids ordered by rank (NaN as None, a token listed twice once), the same lists TRL builds from
    vLLM's per-token dicts, without building them; any other output goes to ``fallback``.

    Exact: the same lists, value for value (``tests/test_rollout.py``). Bought: 512 × 256 sampled tokens extracted in
    50 ms instead of TRL's 205 ms on a 2-core CPU (``benchmarks/logprob_extraction/README.md``); on the H200, TRL's
    work around vLLM's generate went from 1.19–1.29 s to 0.56 s per 0.5B-shape step, a before/after on two machines,
    not an A/B (``benchmarks/results/h200/README.md``)."""
    from vllm.logprobs import FlatLogprobs

    samples = [output for request in all_outputs for output in request.outputs]
    if not samples or not all(isinstance(output.logprobs, FlatLogprobs) for output in samples):
        return fallback(all_outputs)
    all_logprobs, all_token_ids = [], []
    for output in samples:
        flat = output.logprobs
        values, ids, ranks = flat.logprobs, flat.token_ids, flat.ranks
        if len(ids) == len(flat.start_indices):  # one entry per position (TRL's logprobs=0: the sampled token)
            all_logprobs.append([[None if math.isnan(value) else value] for value in values])
            all_token_ids.append([[token_id] for token_id in ids])
            continue
        positions = []
        for start, end in zip(flat.start_indices, flat.end_indices):
            entries: dict[int, int] = {}  # token id -> index, as vLLM's dict keeps it: first place, last value
            for index in range(start, end):  # (the sampled token comes again when it is also among the top ones)
                entries[ids[index]] = index
            positions.append(sorted(entries.values(), key=ranks.__getitem__))
        all_logprobs.append([[None if math.isnan(values[i]) else values[i] for i in order] for order in positions])
        all_token_ids.append([[ids[i] for i in order] for order in positions])
    return all_logprobs, all_token_ids


def reads_sampling_logprobs(args: Any, tools: bool = False) -> bool:
    """Whether a trainer with ``args`` (a ``GRPOConfig``) reads the log-prob vLLM returns with each sampled token
    (TRL 1.16 asks for it on every rollout): for the importance-sampling correction, the off-policy mask
    (``off_policy_mask_threshold``), VESPO's loss, or the tool-call loop that extends them. Otherwise they are thrown
    away, and the engine need not compute them.

    Exact: the same loss and gradients, since nothing reads them (``tests/test_weight_sync.py``). Bought, with the
    correction off: a 22 % shorter step on the 0.5B shape on the H200, 5.86 s → 4.58 s, step by step in one trainer
    (``benchmarks/trainer_switches/README.md``)."""
    return bool(not args.use_vllm or args.vllm_importance_sampling_correction or tools or args.loss_type == "vespo"
                or args.off_policy_mask_threshold is not None)


@contextlib.contextmanager
def collection_paused(paused: bool = True) -> Iterator[None]:
    """While the block runs, Python's cyclic garbage collector waits (``gc.disable``), then resumes as it was.

    Generation makes containers by the hundred thousand that all stay alive to the end of the step: vLLM's per-request
    outputs, then TRL's nested lists of one log-prob and one token id per sampled token (512 × 256 of each on the
    ``seed`` workload). Each few hundred of them start a young-generation collection that walks every survivor so far,
    and their number sets off full collections over the whole heap, none of which frees anything. Memory cannot grow
    past what the block itself makes: objects without cycles are still freed at once, and the first collection after
    the block finds any cycle the block left.

    Exact: it changes no number. Bought: the collector's pauses in a vLLM step on the H200 went from 0.11–0.32 s to
    0.01–0.06 s (``benchmarks/results/h200/README.md``); the log-prob extraction of 512 × 256 tokens alone, on a
    2-core CPU, 0.98 s → 0.09 s (``benchmarks/trainer_switches/README.md``)."""
    if not paused or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def _no_sampling_logprobs(generation: Any) -> Iterator[None]:
    """While TRL generates: the colocated engine (``generation``, TRL's ``VLLMGeneration``) samples without log-probs,
    and TRL's ``extract_logprobs`` hands back an empty list per sequence (TRL indexes them before it looks)."""
    requested, extract = generation.logprobs, vllm_generation.extract_logprobs
    generation.logprobs = None
    vllm_generation.extract_logprobs = lambda outputs: ([[] for request in outputs for _ in request.outputs], None)
    try:
        yield
    finally:
        generation.logprobs, vllm_generation.extract_logprobs = requested, extract


@contextlib.contextmanager
def _flat_logprob_extraction() -> Iterator[None]:
    """While TRL generates: its ``extract_logprobs`` also reads the flat log-probs the colocated engine returns
    (:func:`colocated_sampling_arguments`), the same lists without a dict per token."""
    original = vllm_generation.extract_logprobs
    vllm_generation.extract_logprobs = functools.partial(extract_flat_logprobs, fallback=original)
    try:
        yield
    finally:
        vllm_generation.extract_logprobs = original


# --------------------------------------------------------------------------------------------------
# The update: the correction from the loss's forward, micro-batches grouped by length
# --------------------------------------------------------------------------------------------------
def defers_correction(args: Any, tools: bool = False) -> bool:
    """Whether a trainer with ``args`` (a ``GRPOConfig``) computes vLLM's importance-sampling correction
    ``π_old / π_vLLM`` from the loss's own forward instead of TRL's separate no-grad forward at generation.

    Exact when no optimizer step falls between a batch's generation and its last use: ``gradient_accumulation_steps``
    a multiple of ``steps_per_generation × num_iterations`` (TRL's own condition for skipping the old forward without
    vLLM). Every micro-batch's loss forward then runs on the weights that generated the batch and on the same padded
    rows TRL's no-grad pass used, so its log-probs, detached, *are* the old log-probs (with dropout on, each forward
    draws its own mask in both cases). Not with tool calls: TRL 1.16 does not hand the loss the tool mask the
    correction needs. The reference model's forward (``beta > 0``) stays.

    Bought: TRL's no-grad forwards 0.140 s → 0.078 s per step on SmolLM2-135M on the H200, a step 1.06× shorter on
    the medians, inside the spread; 1.33× on the tiny model on a 2-core CPU
    (``benchmarks/trainer_switches/README.md``).
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(args.use_vllm and args.vllm_importance_sampling_correction and not tools
                and args.gradient_accumulation_steps % generate_every == 0)


ROW_ORDER_FREE_LOSSES = ("dapo", "cispo", "dr_grpo", "grpo")
"""TRL loss types whose sum over one optimizer step's micro-batches does not depend on which rows share a
micro-batch (all micro-batches of one generation batch are the same size). Not ``bnpo``: it divides by each
micro-batch's own token count."""


def groups_by_length(args: Any) -> bool:
    """Whether a trainer with ``args`` (a ``GRPOConfig``) may order a generation batch's rows by completion length
    before TRL splits it into micro-batches, each then cut to its own longest completion.

    Worth it when a generation batch is split (``steps_per_generation`` > 1): TRL pads every micro-batch to the longest
    completion of the whole batch, and on ragged lengths most micro-batches end well before it. Exact where the
    gradient cannot tell: every micro-batch of a generation lands in one optimizer step (as in
    :func:`defers_correction`), the loss type sums rows the same way whatever their grouping
    (:data:`ROW_ORDER_FREE_LOSSES`), and no mask depends on the micro-batch (``top_entropy_quantile`` = 1). Cutting a
    micro-batch's right-hand columns that no row uses leaves every kept token's position and log-prob as they were.

    Bought: on the 0.5B shape with ragged lengths on the H200, 37 % fewer completion columns and a 17 % shorter update
    (1.72 s → 1.43 s); nothing measurable at 135 M parameters, where the update is per-call overhead
    (``benchmarks/trainer_switches/README.md``)."""
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(args.steps_per_generation > 1 and args.loss_type in ROW_ORDER_FREE_LOSSES
                and args.top_entropy_quantile >= 1.0 and args.gradient_accumulation_steps % generate_every == 0)


def completion_widths(completion_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the columns up to and including its last completion token (0 for a row without any)."""
    if completion_mask.size(1) == 0:
        return completion_mask.new_zeros(completion_mask.size(0), dtype=torch.long)
    columns = torch.arange(1, completion_mask.size(1) + 1, device=completion_mask.device)
    return (completion_mask.to(columns.dtype) * columns).amax(dim=1)


def order_rows_by_length(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` (a generation batch, as TRL's ``shuffle_sequence_dict`` returns it) with its rows ordered by
    completion width; equal widths keep their (shuffled) order."""
    order = torch.argsort(completion_widths(batch["completion_mask"]), stable=True)

    def reorder(value: Any) -> Any:
        if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
            return value
        if isinstance(value, torch.Tensor):
            return value[order.to(value.device)]
        return [value[i] for i in order.tolist()]

    return {key: reorder(value) for key, value in batch.items()}


def trim_completions(inputs: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch cut to its longest completion: the completion columns after it, padding in every row, dropped
    from every per-token tensor (:data:`COMPLETION_TOKEN_KEYS`). A batch with other keys (images, token types) is
    returned as it is."""
    if set(inputs) - BATCH_KEYS or inputs["completion_ids"].numel() == 0:
        return inputs
    width = inputs["completion_ids"].size(1)
    used = max(int(completion_widths(inputs["completion_mask"]).max()), 1)
    if used >= width:
        return inputs
    return {key: value[:, :used] if key in COMPLETION_TOKEN_KEYS and isinstance(value, torch.Tensor)
            and value.ndim == 2 and value.size(1) == width else value for key, value in inputs.items()}


@contextlib.contextmanager
def _rows_by_length() -> Iterator[None]:
    """While TRL prepares a generation batch: its shuffle is followed by :func:`order_rows_by_length`."""
    shuffle = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda batch: order_rows_by_length(shuffle(batch))
    try:
        yield
    finally:
        grpo_trainer.shuffle_sequence_dict = shuffle


def masked_statistic(values: torch.Tensor, kept: torch.Tensor, stat: str) -> torch.Tensor:
    """``min``, ``mean`` or ``max`` of ``values[kept]`` (0 where nothing is kept), computed without the boolean
    indexing that makes the host wait for the device (the deferred correction's metrics, inside the loss's forward)."""
    if stat not in ("min", "mean", "max"):
        raise ConfigError(f"stat={stat!r}: write 'min', 'mean' or 'max'")
    count = kept.sum()
    if stat == "mean":
        return torch.where(kept, values, 0.0).sum() / count.clamp(min=1)
    masked = torch.where(kept, values, math.inf if stat == "min" else -math.inf)
    return torch.where(count > 0, masked.amin() if stat == "min" else masked.amax(), 0.0)


# --------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------
class SpeedUpTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with this module's speed-ups, each switched on where it is exact: the correction from the
    loss's forward (``deferred_correction``), micro-batches grouped by length (``length_grouping``), generation with
    the collector paused (``pause_collection``) and, where nothing reads them, without the sampled tokens' log-probs
    (``sampling_logprobs`` False). Each switch is an attribute a benchmark may turn off."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._loss_inputs: dict[str, Any] | None = None
        self._correction_metrics: dict[str, dict[str, list[torch.Tensor]]] = {}  # mode -> metric -> device scalars
        self.deferred_correction = defers_correction(self.args, bool(self.tools))
        """Compute vLLM's importance-sampling correction from the loss's forward (:func:`defers_correction`)."""
        self.length_grouping = groups_by_length(self.args)
        """Micro-batches of similar completion lengths, each cut to its longest (:func:`groups_by_length`)."""
        self.pause_collection = True
        """Generation runs with the garbage collector paused (:func:`collection_paused`)."""
        self.sampling_logprobs = bool(reads_sampling_logprobs(self.args, bool(self.tools)) or self.rollout_func
                                      or not (self.use_vllm and self.vllm_generation.mode == "colocate"))
        """The colocated engine returns each sampled token's log-prob (False only where nothing reads it:
        :func:`reads_sampling_logprobs`); without them TRL's batch has no ``sampling_per_token_logps``, as with HF
        generate."""

    def _generate(self, prompts):
        """TRL's, reading flat log-probs (:func:`extract_flat_logprobs`), or none without ``sampling_logprobs``, with
        the garbage collector paused while ``pause_collection`` (:func:`collection_paused`)."""
        logprobs = _flat_logprob_extraction() if self.sampling_logprobs else _no_sampling_logprobs(self.vllm_generation)
        with logprobs, collection_paused(self.pause_collection):
            result = super()._generate(prompts)
        if not self.sampling_logprobs:  # TRL 1.16's (prompt_ids, completion_ids, tool_mask, completions, logprobs, ...)
            result = (*result[:4], None, *result[5:])
        return result

    @contextlib.contextmanager
    def _correction_deferred(self) -> Iterator[None]:
        """While TRL generates and scores: with ``deferred_correction``, no old-log-prob forward and no ratio
        (``_compute_loss`` computes it)."""
        if not self.deferred_correction:
            yield
            return
        self.vllm_importance_sampling_correction = False
        try:
            yield
        finally:
            self.vllm_importance_sampling_correction = True

    def _generate_and_score_completions(self, inputs):
        """TRL's; with ``deferred_correction``, without the old log-probs and the ratio."""
        with self._correction_deferred():
            return super()._generate_and_score_completions(inputs)

    def _prepare_inputs(self, generation_batch):
        """TRL's; in training with ``length_grouping``, rows ordered by completion length and each micro-batch cut to
        its longest completion (:func:`groups_by_length`)."""
        if not (self.length_grouping and self.model.training):
            return super()._prepare_inputs(generation_batch)
        with _rows_by_length():
            return trim_completions(super()._prepare_inputs(generation_batch))

    def _compute_loss(self, model, inputs):
        """TRL's; with ``deferred_correction`` the policy forward it starts with also yields the correction."""
        deferred = self.deferred_correction and "importance_sampling_ratio" not in inputs
        self._loss_inputs = inputs if deferred else None
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_inputs = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's. Inside a deferred ``_compute_loss`` its first call is the policy's forward: its log-probs, detached,
        give the importance-sampling ratio."""
        if self._loss_inputs is None:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs, self._loss_inputs = self._loss_inputs, None
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs["importance_sampling_ratio"] = self.importance_sampling_ratio(result[0].detach(), inputs)
        return result

    def importance_sampling_ratio(self, old_logps: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """vLLM's importance-sampling weight ``π_old / π_vLLM`` of a batch, by TRL 1.16's formula (in its
        ``_generate_and_score_completions``): per token or per sequence, truncated or masked to
        ``[clip_min, clip_max]``; tokens vLLM could not score weigh 1. Logs TRL's ``sampling/*`` metrics."""
        mask = inputs["completion_mask"]
        diff = torch.nan_to_num((old_logps - inputs["sampling_per_token_logps"]) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        per_sequence = mode.startswith("sequence_")
        ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if per_sequence else diff)
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode.endswith("_truncate"):
            ratio = torch.clamp(ratio, min=low, max=high)
        elif mode.endswith("_mask"):
            too_far = (ratio < (-math.inf if low is None else low)) | (ratio > (math.inf if high is None else high))
            ratio = ratio.masked_fill(too_far, 0.0)
        else:
            raise ConfigError(f"vllm_importance_sampling_mode={mode!r}: unknown to this trainer (TRL 1.16's modes end "
                              f"in _truncate or _mask).")
        delta = (old_logps - inputs["sampling_per_token_logps"]).abs()
        scored = mask.bool() & ~torch.isnan(delta)
        self._log_correction((delta, scored), (ratio, torch.ones_like(ratio, dtype=torch.bool) if per_sequence
                                               else mask.bool()))
        return ratio

    def _log_correction(self, delta: tuple[torch.Tensor, torch.Tensor],
                        ratios: tuple[torch.Tensor, torch.Tensor]) -> None:
        """TRL's ``sampling/*`` metrics of the correction (per micro-batch here, per generation batch in TRL), each of
        ``(values, kept)``. They stay on the device until :meth:`log`: a host sync here, inside the loss's forward,
        would stall the device while the rest of the micro-batch is launched."""
        pending = self._correction_metrics.setdefault("train" if self.model.training else "eval", {})
        for name, (values, kept), stats in (("sampling_logp_difference", delta, ("mean", "max")),
                                            ("importance_sampling_ratio", ratios, ("min", "mean", "max"))):
            for stat in stats:
                value = masked_statistic(values, kept, stat)
                gathered = self.accelerator.gather(value)
                pending.setdefault(f"sampling/{name}/{stat}", []).append(getattr(gathered, stat)())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, with the deferred correction's metrics since the last log brought to the host first (one sync)."""
        for mode, pending in self._correction_metrics.items():
            for key, values in pending.items():
                self._metrics[mode][key].extend(torch.stack(values).tolist())
        self._correction_metrics = {}
        super().log(logs, start_time)
