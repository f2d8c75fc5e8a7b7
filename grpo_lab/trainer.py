"""The trainer grpo_lab trains with: TRL's ``GRPOTrainer``, unchanged in what it computes, plus timings, a NaN guard,
reward errors that say what to do, checkpoints renamed into place once complete, the vLLM-CPU weight sync, and no
no-grad forward the loss does not need (:class:`GRPOLabTrainer`).

This module imports TRL (whose trainer loads vLLM: seconds), so :mod:`grpo_lab.train` imports it only when it builds
a trainer. Every TRL and transformers name the trainer overrides, reads or sets is listed once, in
:data:`TRL_INTERNALS`; ``tests/test_upstream_api.py`` checks each against the installed versions.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl import GRPOTrainer
from trl.generation import vllm_generation
from trl.trainer import grpo_trainer

from grpo_lab import device, env, runs, weight_sync
from grpo_lab.errors import NAN_ADVICE, ConfigError, TrainingDivergedError
from grpo_lab.rewards import RewardValidationError, ValidatedReward


class TrlName(NamedTuple):
    """One name of TRL (or transformers) that grpo_lab relies on."""

    kind: str
    """``method`` (overridden or called), ``attribute`` (set in ``owner.__init__``, read here), ``module`` (a
    module-level name replaced or called), ``batch`` (a key of the batch ``owner`` returns, read or written here),
    ``sample`` (a field of TRL's rollout sample), ``config`` (a ``GRPOConfig`` field grpo_lab sets or reads),
    ``not_config`` (a :class:`~grpo_lab.experiment.TrainConfig` field under a TRL-style name that TRL's config does
    *not* have)."""
    owner: str
    name: str
    why: str


COMPLETION_TOKEN_KEYS = ("completion_ids", "completion_mask", "old_per_token_logps", "sampling_per_token_logps",
                         "ref_per_token_logps", "importance_sampling_ratio", "tool_mask")
"""TRL 1.16's tensors of a micro-batch with a column per completion token (``importance_sampling_ratio`` only when
per token)."""
_BATCH_KEYS = frozenset({"prompt_ids", "prompt_mask", "advantages", "num_items_in_batch", *COMPLETION_TOKEN_KEYS})

TRL_INTERNALS: tuple[TrlName, ...] = (
    TrlName("method", "trl.GRPOTrainer", "_generate", "generation time"),
    TrlName("method", "trl.GRPOTrainer", "_generate_and_score_completions", "step timers; the deferred correction"),
    TrlName("method", "trl.GRPOTrainer", "_get_per_token_logps_and_entropies", "no-grad forward time; the correction"),
    TrlName("method", "trl.GRPOTrainer", "_compute_loss", "the importance-sampling correction from its forward"),
    TrlName("method", "trl.GRPOTrainer", "_calculate_rewards", "reward timing, errors, skipped counts"),
    TrlName("method", "trl.GRPOTrainer", "training_step", "NaN guard"),
    TrlName("method", "trl.GRPOTrainer", "log", "the deferred correction's metrics brought to the host"),
    TrlName("method", "trl.GRPOTrainer", "_prepare_inputs", "micro-batches grouped by completion length"),
    TrlName("module", "trl.trainer.grpo_trainer", "shuffle_sequence_dict",
            "the generation batch's shuffle, followed by the length order"),
    TrlName("method", "transformers.Trainer", "_save_checkpoint", "checkpoints renamed into place"),
    TrlName("method", "transformers.Trainer", "_get_output_dir", "checkpoint staging folder"),
    TrlName("method", "transformers.Trainer", "pop_callback", "quiet progress bar (grpo_lab.train)"),
    TrlName("module", "transformers.trainer_utils", "PREFIX_CHECKPOINT_DIR", "checkpoint names"),
    TrlName("module", "transformers.trainer_utils", "rotate_checkpoints", "save_total_limit in checkpoints/"),
    TrlName("module", "trl.generation.vllm_generation", "extract_logprobs",
            "flat log-probs read without a dict per token"),
    TrlName("module", "trl.generation.vllm_generation", "LLM",
            "the colocated engine starts without progress bars, with room for an evaluation's batch"),
    TrlName("attribute", "trl.GRPOTrainer", "use_vllm", "which rollout backend"),
    TrlName("attribute", "trl.GRPOTrainer", "vllm_generation", "timing, weight sync"),
    TrlName("method", "trl.generation.vllm_generation.VLLMGeneration", "sync_weights", "the engine lent to evaluation"),
    *(TrlName("attribute", "trl.generation.vllm_generation.VLLMGeneration", name, "the engine lent to evaluation")
      for name in ("llm", "mode", "enable_sleep_mode", "_llm_weights_sleeping")),
    TrlName("attribute", "trl.generation.vllm_generation.VLLMGeneration", "logprobs",
            "no sampled-token log-probs where nothing reads them"),
    TrlName("attribute", "trl.GRPOTrainer", "rollout_func", "when the sampled-token log-probs can be skipped"),
    TrlName("attribute", "trl.GRPOTrainer", "vllm_importance_sampling_correction", "the deferred correction"),
    TrlName("attribute", "trl.GRPOTrainer", "vllm_importance_sampling_mode", "the correction's formula"),
    TrlName("attribute", "trl.GRPOTrainer", "vllm_importance_sampling_clip_min", "the correction's formula"),
    TrlName("attribute", "trl.GRPOTrainer", "vllm_importance_sampling_clip_max", "the correction's formula"),
    TrlName("attribute", "trl.GRPOTrainer", "tools", "when the correction can be deferred"),
    TrlName("attribute", "trl.GRPOTrainer", "reward_funcs", "reward errors"),
    TrlName("attribute", "trl.GRPOTrainer", "reward_func_names", "which reward returned inf"),
    TrlName("attribute", "trl.GRPOTrainer", "_metrics", "timings and counts in TRL's logs"),
    *(TrlName("batch", "trl.GRPOTrainer._generate_and_score_completions", name,
              "length grouping: a batch it knows (and the deferred correction)") for name in sorted(_BATCH_KEYS)),
    *(TrlName("config", "trl.GRPOConfig", name, "set by grpo_lab.train.grpo_args, or read here") for name in (
        "output_dir", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
        "max_completion_length", "learning_rate", "lr_scheduler_type", "warmup_steps", "temperature", "top_p",
        "gradient_checkpointing", "bf16", "use_cpu", "logging_steps", "save_strategy", "save_steps",
        "save_total_limit", "seed", "data_seed", "report_to", "log_completions", "vllm_server_timeout",
        "vllm_server_base_url", "beta", "loss_type", "scale_rewards", "reward_weights", "use_vllm", "vllm_mode",
        "vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_enable_sleep_mode",
        "use_liger_kernel", "generation_kwargs", "dataloader_num_workers", "steps_per_generation", "num_iterations",
        "top_entropy_quantile", "vllm_importance_sampling_correction", "off_policy_mask_threshold",
        "max_tool_calling_iterations")),
    TrlName("not_config", "trl.GRPOConfig", "max_prompt_length",
            "TRL 1.16 has none and never truncates prompts: grpo_lab checks prompt lengths itself "
            "(experiment.check_prompt_lengths) and sizes vLLM with vllm_max_model_length"),
)


@contextlib.contextmanager
def _colocated_engine_arguments(max_num_seqs: int | None = None) -> Iterator[None]:
    """While the trainer starts its colocated vLLM engine, what grpo_lab changes in TRL's ``LLM(...)`` call: no
    weight-loading or CUDA-graph-capture progress bars in a notebook (TRL does not pass vLLM's ``use_tqdm_on_load``;
    the rollout engine does the same through its own arguments), and ``max_num_seqs`` raised to at least
    ``max_num_seqs`` (TRL sizes it to one generation batch; an evaluation lent the engine sends more at once)."""
    original = getattr(vllm_generation, "LLM", None)
    quiet = not env.show_progress()
    if original is None or (not quiet and max_num_seqs is None):  # TRL without vLLM, or nothing to change
        yield
        return

    def start_engine(*args: Any, **kwargs: Any) -> Any:
        if quiet:
            kwargs.setdefault("use_tqdm_on_load", False)
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max(kwargs.get("max_num_seqs") or 0, max_num_seqs)
        return original(*args, **kwargs)

    vllm_generation.LLM = start_engine
    try:
        yield
    finally:
        vllm_generation.LLM = original


def colocated_sampling_arguments() -> dict[str, bool]:
    """``SamplingParams`` fields for TRL's colocated engine (``GRPOConfig.generation_kwargs``): no detokenizing (vLLM
    would decode every sampled token in the thread that drives the device; TRL decodes the ids itself, and no stop
    strings are set), and the log-probs as a few flat lists per sequence where this vLLM has ``flat_logprobs``
    (instead of a dict per token; :func:`extract_flat_logprobs` reads them as TRL reads the dicts)."""
    from vllm import SamplingParams

    arguments = {"detokenize": False}
    if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()):
        arguments["flat_logprobs"] = True
    return arguments


def extract_flat_logprobs(all_outputs: list, fallback: Callable[[list], tuple]) -> tuple:
    """TRL's ``extract_logprobs`` (``fallback``) for outputs with flat log-probs: per sequence, per position, the
    log-probs and token ids ordered by rank (NaN as None, a token listed twice once), the same lists TRL builds from
    vLLM's per-token dicts, without building them; any other output goes to ``fallback``."""
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


@contextlib.contextmanager
def collection_paused(paused: bool = True) -> Iterator[None]:
    """While the block runs, Python's cyclic garbage collector waits (``gc.disable``), then resumes as it was.

    Generation makes containers by the hundred thousand that all stay alive to the end of the step: vLLM's per-request
    outputs, then TRL's nested lists of one log-prob and one token id per sampled token (512 × 256 of each on the
    ``seed`` workload). Each few hundred of them start a young-generation collection that walks every survivor so far,
    and their number sets off full collections over the whole heap, none of which frees anything. Memory cannot grow
    past what the block itself makes: objects without cycles are still freed at once, and the first collection after
    the block finds any cycle the block left."""
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


def defers_correction(args: Any, tools: bool = False) -> bool:
    """Whether a trainer with ``args`` (a ``GRPOConfig``) computes vLLM's importance-sampling correction
    ``π_old / π_vLLM`` from the loss's own forward instead of TRL's separate no-grad forward at generation.

    Exact when no optimizer step falls between a batch's generation and its last use: ``gradient_accumulation_steps``
    a multiple of ``steps_per_generation × num_iterations`` (TRL's own condition for skipping the old forward without
    vLLM). Every micro-batch's loss forward then runs on the weights that generated the batch and on the same padded
    rows TRL's no-grad pass used, so its log-probs, detached, *are* the old log-probs (with dropout on, each forward
    draws its own mask in both cases). Not with tool calls: TRL 1.16 does not hand the loss the tool mask the
    correction needs. The reference model's forward (``beta > 0``) stays.
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(args.use_vllm and args.vllm_importance_sampling_correction and not tools
                and args.gradient_accumulation_steps % generate_every == 0)


def reads_sampling_logprobs(args: Any, tools: bool = False) -> bool:
    """Whether a trainer with ``args`` (a ``GRPOConfig``) reads the log-prob vLLM returns with each sampled token
    (TRL 1.16 asks for it on every rollout): for the importance-sampling correction, the off-policy mask
    (``off_policy_mask_threshold``), VESPO's loss, or the tool-call loop that extends them. Otherwise they are thrown
    away, and the engine need not compute them (in a fresh process on the H200, vLLM's generate took 4.0 s with them
    and 3.5 s without on fixed lengths, 2.4 and 1.6 s on ragged ones: ``../shared/gpu/probes/README.md``)."""
    return bool(not args.use_vllm or args.vllm_importance_sampling_correction or tools or args.loss_type == "vespo"
                or args.off_policy_mask_threshold is not None)


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
    micro-batch's right-hand columns that no row uses leaves every kept token's position and log-prob as they were."""
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
    if set(inputs) - _BATCH_KEYS or inputs["completion_ids"].numel() == 0:
        return inputs
    width = inputs["completion_ids"].size(1)
    used = max(int(completion_widths(inputs["completion_mask"]).max()), 1)
    if used >= width:
        return inputs
    return {key: value[:, :used] if key in COMPLETION_TOKEN_KEYS and isinstance(value, torch.Tensor)
            and value.ndim == 2 and value.size(1) == width else value for key, value in inputs.items()}


def masked_statistic(values: torch.Tensor, kept: torch.Tensor, stat: str) -> torch.Tensor:
    """``min``, ``mean`` or ``max`` of ``values[kept]`` (0 where nothing is kept), computed without the boolean
    indexing that makes the host wait for the device."""
    if stat not in ("min", "mean", "max"):
        raise ConfigError(f"stat={stat!r}: write 'min', 'mean' or 'max'")
    count = kept.sum()
    if stat == "mean":
        return torch.where(kept, values, 0.0).sum() / count.clamp(min=1)
    masked = torch.where(kept, values, math.inf if stat == "min" else -math.inf)
    return torch.where(count > 0, masked.amin() if stat == "min" else masked.amax(), 0.0)


@contextlib.contextmanager
def _rows_by_length() -> Iterator[None]:
    """While TRL prepares a generation batch: its shuffle is followed by :func:`order_rows_by_length`."""
    shuffle = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda batch: order_rows_by_length(shuffle(batch))
    try:
        yield
    finally:
        grpo_trainer.shuffle_sequence_dict = shuffle


class GRPOLabTrainer(GRPOTrainer):
    """TRL's GRPOTrainer, unchanged in what it computes. It adds timings, a NaN guard, reward errors that say what to
    do (and ``rewards/<name>/skipped`` counts), checkpoints renamed into place once complete, the CPU weight sync, and
    computes vLLM's importance-sampling correction from the loss's own forward where that is exact
    (:func:`defers_correction`), groups micro-batches by completion length, each cut to its longest, where that is
    exact (:func:`groups_by_length`), generates with the garbage collector paused (:func:`collection_paused`) and
    without the sampled tokens' log-probs where nothing reads them (:func:`reads_sampling_logprobs`).

    ``engine_max_num_seqs``: the colocated engine decodes at least this many sequences at once (None: TRL's sizing,
    one generation batch; ``grpo_lab.train`` passes ``device.COLOCATED_MAX_NUM_SEQS``)."""

    def __init__(self, *args: Any, engine_max_num_seqs: int | None = None, **kwargs: Any):
        with _colocated_engine_arguments(engine_max_num_seqs):
            super().__init__(*args, **kwargs)
        self.weight_sync_installed = bool(self.use_vllm and weight_sync.install(self.vllm_generation))
        self._staging: Path | None = None
        self._timers: dict[str, float] = {}
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
        if self.use_vllm and self.vllm_generation.mode == "colocate":  # time vLLM's own calls inside _generate
            self._time_calls(self.vllm_generation.llm, "generate", "timing/vllm_generate_s")
            self._time_calls(self.vllm_generation, "sync_weights", "timing/weight_sync_s")

    def lend_engine(self) -> Any | None:
        """TRL's colocated ``vllm.LLM``, awake and holding the policy's current weights, to sample with outside a
        step (evaluation before or after training); None without one. :meth:`take_engine_back` ends the loan."""
        generation = self.vllm_generation if self.use_vllm else None
        if generation is None or generation.mode != "colocate":
            return None
        generation.sync_weights()  # it holds the weights of the last rollout; under sleep mode this wakes them
        if generation.enable_sleep_mode:
            generation.llm.wake_up(tags=["kv_cache"])
        return generation.llm

    def take_engine_back(self) -> None:
        """Leave the engine as TRL keeps it between steps: under sleep mode asleep, weights and KV cache released."""
        generation = self.vllm_generation
        if generation.enable_sleep_mode:
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True

    def _time_calls(self, owner: Any, name: str, key: str) -> None:
        """Add the wall time of every call of ``owner.name`` to the step's ``key`` (device synchronised)."""
        call = getattr(owner, name)

        def timed(*args, **kwargs):
            device.synchronize(self.model.device.type)
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                device.synchronize(self.model.device.type)
                self._timers[key] = self._timers.get(key, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

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
        """TRL's, with the step's timers reset before and logged after (one generation batch per call)."""
        self._timers = {}
        with self._correction_deferred():
            result = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        for key, seconds in self._timers.items():
            self._metrics[mode][key].append(seconds)
        return result

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
        give the importance-sampling ratio. The no-grad calls (old and reference log-probs) are timed."""
        if self._loss_inputs is not None:
            inputs, self._loss_inputs = self._loss_inputs, None
            result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            inputs["importance_sampling_ratio"] = self.importance_sampling_ratio(result[0].detach(), inputs)
            return result
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        start = time.perf_counter()
        try:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        finally:
            device.synchronize(self.model.device.type)
            key = "timing/old_ref_logps_s"
            self._timers[key] = self._timers.get(key, 0.0) + time.perf_counter() - start

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
            raise ConfigError(f"vllm_importance_sampling_mode={mode!r}: unknown to this trainer (TRL 1.16's modes end in _truncate or _mask).")
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
                pending.setdefault(f"sampling/{name}/{stat}", []).append(getattr(self.accelerator.gather(value), stat)())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, with the deferred correction's metrics since the last log brought to the host first (one sync)."""
        for mode, pending in self._correction_metrics.items():
            for key, values in pending.items():
                self._metrics[mode][key].extend(torch.stack(values).tolist())
        self._correction_metrics = {}
        super().log(logs, start_time)

    def _generate(self, prompts):
        """TRL's, timed, reading flat log-probs (:func:`extract_flat_logprobs`), or none without
        ``sampling_logprobs``, with the garbage collector paused while ``pause_collection`` (:func:`collection_paused`)."""
        start = time.perf_counter()
        logprobs = _flat_logprob_extraction() if self.sampling_logprobs else _no_sampling_logprobs(self.vllm_generation)
        with logprobs, collection_paused(self.pause_collection):
            result = super()._generate(prompts)
        if not self.sampling_logprobs:  # TRL 1.16's (prompt_ids, completion_ids, tool_mask, completions, logprobs, ...)
            result = (*result[:4], None, *result[5:])
        self._metrics["train" if self.model.training else "eval"]["timing/generation_s"].append(
            time.perf_counter() - start)
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        mode = "train" if self.model.training else "eval"
        skipping = [(fn, len(fn.issues)) for fn in self.reward_funcs
                    if isinstance(fn, ValidatedReward) and fn.mode == "skip"]
        try:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except RewardValidationError as error:
            raise RewardValidationError(
                f"{error} This was at step {self.state.global_step + 1}, before its update: nothing of that step "
                f"was applied and every saved checkpoint is intact. Fix the function and continue with "
                f"resume_from_checkpoint=True (same output_dir), or set reward_errors='skip' to record None for "
                f"such samples and go on.") from error
        self._metrics[mode]["timing/reward_s"].append(time.perf_counter() - start)
        for fn, seen in skipping:
            skipped = sum(len(completions) if issue.index is None else 1 for issue in fn.issues[seen:])
            self._metrics[mode][f"rewards/{fn.__name__}/skipped"].append(float(skipped))
        if torch.isinf(rewards).any():
            bad = [self.reward_func_names[j] for j in range(rewards.shape[1]) if torch.isinf(rewards[:, j]).any()]
            raise TrainingDivergedError(f"reward function(s) {bad} returned inf at step {self.state.global_step}."
                                        f" {NAN_ADVICE}")
        return rewards

    def training_step(self, model, inputs, num_items_in_batch):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            raise TrainingDivergedError(f"the loss is {loss.item()} at step {self.state.global_step + 1} "
                                        f"(before the optimizer step). {NAN_ADVICE}")
        return loss

    def _save_checkpoint(self, model, trial):
        """The Trainer's save, into ``<run>/.partial/checkpoint-N``, then renamed into ``checkpoints/``."""
        checkpoints = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = checkpoints.parent / runs.PARTIAL
        if self.args.should_save:
            shutil.rmtree(staging / name, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self._staging = staging  # _get_output_dir answers with it while the Trainer writes
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            runs.publish_folder(staging / name, checkpoints / name)
            rotate_checkpoints(output_dir=str(checkpoints), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

    def _get_output_dir(self, trial):
        return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)
