"""The trainer grpo_lab trains with: TRL's ``GRPOTrainer``, unchanged in what it computes, plus what the course adds
(:class:`GRPOLabTrainer`): timings of every part of a step, a NaN guard, reward errors that say what to do, checkpoints
renamed into place once complete, the vLLM-CPU weight sync, a LoRA policy's adapter sync, and the colocated engine lent
to evaluation.

It builds on :class:`grpo_lab.speedups.SpeedUpTrainer`, TRL's trainer with the speed-ups that change no result (flat
log-probs, no log-probs where nothing reads them, the collector paused, the deferred correction, length grouping):
each is described, with when it is exact and what it bought, in :mod:`grpo_lab.speedups`.

This module imports TRL (whose trainer loads vLLM: seconds), so :mod:`grpo_lab.train` imports it only when it builds
a trainer. Every TRL and transformers name the trainer overrides, reads or sets is listed in :data:`TRL_INTERNALS`
(and the speed-ups' in :data:`grpo_lab.speedups.TRL_INTERNALS`); ``tests/test_upstream_api.py`` checks each against
the installed versions.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.generation import vllm_generation

from grpo_lab import device, env, runs, weight_sync
from grpo_lab.errors import NAN_ADVICE, TrainingDivergedError
from grpo_lab.rewards import RewardValidationError, ValidatedReward
from grpo_lab.speedups import SpeedUpTrainer
from grpo_lab.upstream import SHARED_TRL_FIELDS, UpstreamName

_OWNER = "trl.GRPOTrainer"
_GENERATION = "trl.generation.vllm_generation.VLLMGeneration"
TRL_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("method", _OWNER, "_generate", "generation time"),
    UpstreamName("method", _OWNER, "_generate_and_score_completions", "step timers"),
    UpstreamName("method", _OWNER, "_get_per_token_logps_and_entropies", "no-grad forward time"),
    UpstreamName("method", _OWNER, "_calculate_rewards", "reward timing, errors, skipped counts"),
    UpstreamName("method", _OWNER, "training_step", "NaN guard"),
    UpstreamName("method", "transformers.Trainer", "_save_checkpoint", "checkpoints renamed into place"),
    UpstreamName("method", "transformers.Trainer", "_get_output_dir", "checkpoint staging folder"),
    UpstreamName("method", "transformers.Trainer", "pop_callback", "quiet progress bar (grpo_lab.train)"),
    UpstreamName("module", "transformers.trainer_utils", "PREFIX_CHECKPOINT_DIR", "checkpoint names"),
    UpstreamName("module", "transformers.trainer_utils", "rotate_checkpoints", "save_total_limit in checkpoints/"),
    UpstreamName("module", "trl.generation.vllm_generation", "LLM",
                 "the colocated engine starts without progress bars, with room for an evaluation's batch"),
    UpstreamName("attribute", _OWNER, "use_vllm", "which rollout backend"),
    UpstreamName("attribute", _OWNER, "vllm_generation", "timing, weight sync"),
    UpstreamName("method", _GENERATION, "sync_weights", "the engine lent to evaluation"),
    *(UpstreamName("attribute", _GENERATION, name, "the engine lent to evaluation")
      for name in ("llm", "mode", "enable_sleep_mode", "_llm_weights_sleeping")),
    UpstreamName("attribute", _OWNER, "reward_funcs", "reward errors"),
    UpstreamName("attribute", _OWNER, "reward_func_names", "which reward returned inf"),
    UpstreamName("attribute", _OWNER, "_metrics", "timings and counts in TRL's logs"),
    *(UpstreamName("config", "trl.GRPOConfig", name, "set by grpo_lab.train.grpo_args, or read here") for name in (
        *SHARED_TRL_FIELDS, "beta", "loss_type", "scale_rewards", "reward_weights", "use_vllm", "vllm_mode",
        "vllm_server_base_url", "vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length",
        "vllm_enable_sleep_mode", "vllm_importance_sampling_correction", "use_liger_kernel", "generation_kwargs",
        "model_init_kwargs", "dataloader_num_workers", "max_tool_calling_iterations")),
    UpstreamName("not_config", "trl.GRPOConfig", "max_prompt_length",
                 "TRL 1.16 has none and never truncates prompts: grpo_lab checks prompt lengths itself "
                 "(experiment.check_prompt_lengths) and sizes vLLM with vllm_max_model_length"),
)


@contextlib.contextmanager
def _colocated_engine_arguments(max_num_seqs: int | None = None, lora_rank: int | None = None) -> Iterator[None]:
    """While the trainer starts its colocated vLLM engine, what grpo_lab changes in TRL's ``LLM(...)`` call: no
    weight-loading or CUDA-graph-capture progress bars in a notebook (TRL does not pass vLLM's ``use_tqdm_on_load``;
    the rollout engine does the same through its own arguments), ``max_num_seqs`` raised to at least
    ``max_num_seqs`` (TRL sizes it to one generation batch; an evaluation lent the engine sends more at once), and
    with ``lora_rank`` vLLM's LoRA support (adapter sync, :func:`grpo_lab.weight_sync.engine_lora_arguments`)."""
    original = getattr(vllm_generation, "LLM", None)
    quiet = not env.show_progress()
    if original is None or (not quiet and max_num_seqs is None and lora_rank is None):  # nothing to change
        yield
        return

    def start_engine(*args: Any, **kwargs: Any) -> Any:
        if quiet:
            kwargs.setdefault("use_tqdm_on_load", False)
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max(kwargs.get("max_num_seqs") or 0, max_num_seqs)
        if lora_rank is not None:
            kwargs.update(weight_sync.engine_lora_arguments(lora_rank))
        return original(*args, **kwargs)

    vllm_generation.LLM = start_engine
    try:
        yield
    finally:
        vllm_generation.LLM = original


class GRPOLabTrainer(SpeedUpTrainer):
    """TRL's GRPOTrainer, unchanged in what it computes, with the speed-ups of
    :class:`grpo_lab.speedups.SpeedUpTrainer`. It adds timings, a NaN guard, reward errors that say what to do (and
    ``rewards/<name>/skipped`` counts), checkpoints renamed into place once complete, the CPU weight sync, and lends
    its colocated engine to evaluation (:meth:`lend_engine`).

    ``engine_max_num_seqs``: the colocated engine decodes at least this many sequences at once (None: TRL's sizing,
    one generation batch; ``grpo_lab.train`` passes ``device.COLOCATED_MAX_NUM_SEQS``). ``adapter_sync``: the
    folder where the colocated engine is handed the LoRA adapter each sync, and the adapter's rank
    (``TrainConfig.vllm_lora_sync="adapter"``, :func:`grpo_lab.weight_sync.install_adapter_sync`); None: TRL's
    merged weights."""

    def __init__(self, *args: Any, engine_max_num_seqs: int | None = None,
                 adapter_sync: tuple[Path, int] | None = None, **kwargs: Any):
        with _colocated_engine_arguments(engine_max_num_seqs, adapter_sync[1] if adapter_sync else None):
            super().__init__(*args, **kwargs)
        colocated = self.use_vllm and self.vllm_generation.mode == "colocate"
        self.adapter_sync = (weight_sync.install_adapter_sync(self.vllm_generation, adapter_sync[0])
                             if adapter_sync and colocated else None)
        self.weight_sync_installed = bool(self.use_vllm and not self.adapter_sync
                                          and weight_sync.install(self.vllm_generation))
        self._staging: Path | None = None
        self._timers: dict[str, float] = {}
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

    def _generate_and_score_completions(self, inputs):
        """TRL's, with the step's timers reset before and logged after (one generation batch per call)."""
        self._timers = {}
        result = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        for key, seconds in self._timers.items():
            self._metrics[mode][key].append(seconds)
        return result

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's; the no-grad calls (old and reference log-probs) are timed."""
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        start = time.perf_counter()
        try:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        finally:
            device.synchronize(self.model.device.type)
            key = "timing/old_ref_logps_s"
            self._timers[key] = self._timers.get(key, 0.0) + time.perf_counter() - start

    def _generate(self, prompts):
        """TRL's (with the speed-ups' changes), timed."""
        start = time.perf_counter()
        result = super()._generate(prompts)
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


# --------------------------------------------------------------------------------------------------
# Moved names: the speed-ups live in grpo_lab.speedups (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop)

__getattr__ = moved_names(__name__, moved={
    **{name: f"grpo_lab.speedups:{name}" for name in (
        "COMPLETION_TOKEN_KEYS", "ROW_ORDER_FREE_LOSSES", "colocated_sampling_arguments", "collection_paused",
        "completion_widths", "defers_correction", "extract_flat_logprobs", "groups_by_length", "masked_statistic",
        "order_rows_by_length", "reads_sampling_logprobs", "trim_completions")},
    "TrlName": ("grpo_lab.upstream:UpstreamName", "it lists vLLM's and transformers' names too"),
})
