""":class:`TrainConfig`: one GRPO experiment under TRL's names, checked when made, resolved for a machine."""

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
    LORA_LEARNING_RATE_SCALE,
    LORA_TARGET_MODULES,
    PROFILE_FIELDS,
    PROFILES,
    SMALLER_STEP_LEVERS,
    LORA_SYNC_MODES,
    VLLM_MODES,
    ProfileError,
    profile_name,
)
from grpo_lab.experiment.rows import default_train_types
from grpo_lab.rewards import REWARD_ERROR_MODES
from grpo_lab.rollout import RolloutConfig
from grpo_lab.tracking import TRACKERS
from grpo_lab.tools import get_tool


@dataclass(frozen=True)
class TrainConfig:
    """A GRPO experiment under TRL's ``GRPOConfig`` names, checked when made. ``None``: the profile's value, or chosen
    for the machine; :meth:`resolve` fills every field in."""

    profile: str | None = None
    """``tiny`` / ``gpu`` / ``npu``; default ``GRPO_LAB_PROFILE`` or the machine's device's."""
    model: str | None = None
    """A local model folder or hub id; default the profile's (``GRPO_LAB_MODEL`` overrides it)."""
    output_dir: str | None = None
    """The run folder; default a new ``grpo-<profile>-<time>`` folder under the runs root (:mod:`grpo_lab.runs`)."""
    dataset: str | None = None
    """A JSONL file in the shared row format; default the shipped ``data/train.jsonl``."""
    answer_column: str | None = None
    """The ``dataset`` column the course's rewards read as ``answer`` (None: ``answer``)."""
    train_types: tuple[str, ...] | None = None
    """Problem types to train on; on the shipped data the model manifest's slip types (pass@k far above greedy), else
    all. Your own ``dataset``: all unless you name them."""
    train_languages: tuple[str, ...] | None = None
    """Languages (the rows' ``lang``) to train on; on the shipped data the profile's, on your own ``dataset`` all."""
    train_size: int | None = None
    """Use at most this many training rows (after the filters)."""
    rewards: tuple[str, ...] | None = None
    """Names of registered rewards (``grpo_lab.rewards.list_rewards()``); default the profile's."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward (TRL's); default the profile's when ``rewards`` is too, else 1.0 each."""
    reward_errors: str = "raise"
    """A reward that raises or returns a non-finite value: ``"raise"`` stops before that step's update with a message;
    ``"skip"`` records None and counts it in ``rewards/<name>/skipped``."""
    num_generations: int | None = None
    """Completions sampled per prompt: the group GRPO normalises in."""
    per_device_train_batch_size: int | None = None
    """Completions per device per forward/backward (TRL counts completions, not prompts)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; TRL generates all of them at once."""
    max_prompt_length: int | None = None
    max_completion_length: int | None = None
    learning_rate: float | None = None
    """Default the profile's; with ``use_peft``, :data:`LORA_LEARNING_RATE_SCALE` times it."""
    vllm_gpu_memory_utilization: float | str = AUTO
    """vLLM's share of the device; ``"auto"``: the memory planner's (:func:`choose_vllm_memory`)."""
    max_steps: int | None = None
    lr_scheduler_type: str | None = None
    warmup_steps: float | None = None
    """Warmup steps, or a fraction of max_steps when below 1."""
    beta: float | None = None
    """KL penalty to a frozen reference model (0: none is loaded)."""
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    temperature: float | None = None
    """Sampling temperature of the rollouts; default the profile's."""
    top_p: float = 1.0
    use_vllm: bool | None = None
    vllm_importance_sampling_correction: bool = True
    """TRL's ``π_θ / π_vLLM`` correction of the loss; off, the engine samples without log-probs (synchronous only)."""
    vllm_mode: str = "colocate"
    """``"colocate"``: vLLM in the trainer's process; ``"server"``: a vLLM server on other devices (grpo_lab.scale)."""
    vllm_server_base_url: str | None = None
    vllm_server_timeout: float = 240.0
    """Seconds TRL waits for the server to answer."""
    vllm_group_port: int = 51216
    """Port of TRL's NCCL weight-transfer group (server mode on CUDA)."""
    bf16: bool | None = None
    """bf16 autocast over fp32 weights; default where the machine supports it, except on the CPU."""
    gradient_checkpointing: bool | None = None
    """Default: only where the memory planner says the step does not fit without it."""
    use_liger_kernel: bool | None = None
    """Liger's fused kernels (needs Triton); default on CUDA where ``liger_kernel`` is installed, not with 4-bit."""
    device: str | None = None
    """The device kind the run trains on; set by :meth:`resolve`."""
    save_steps: int | None = None
    save_total_limit: int | None = 3
    logging_steps: int = 1
    seed: int = 0
    eval_size: int | None = None
    """Held-out problems evaluated before and after training, and verl's validation rows."""
    resume_from_checkpoint: str | bool | None = None
    """True: the latest checkpoint of ``output_dir``; a path: that checkpoint."""
    live_plot: bool = True
    """Update a figure while training (in a notebook) and save it as ``curves.png``."""
    plot_every: int = 10
    """Redraw the live plot every this many logged steps."""
    max_minutes: float | None = None
    """Stop after this much training time, saving a checkpoint; resume later to the same ``max_steps``."""
    use_peft: bool = False
    """Train a LoRA adapter on the frozen base (TRL's name); ``final/`` holds it merged into plain weights."""
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: tuple[str, ...] = LORA_TARGET_MODULES
    """Module names that get an adapter (default: every linear layer of each decoder layer)."""
    vllm_enable_sleep_mode: bool = False
    """Release the colocated engine's weights and KV cache during the update (TRL's name; CUDA only)."""
    report_to: tuple[str, ...] = ()
    """Trackers TRL reports to (:data:`grpo_lab.tracking.TRACKERS`; empty: none, ``metrics.jsonl`` either way)."""
    load_in_4bit: bool = False
    """QLoRA (TRL's name): the frozen base in 4-bit NF4 (bitsandbytes); needs ``use_peft``; CUDA only."""
    vllm_lora_sync: str | None = None
    """How a LoRA policy reaches the colocated engine (:data:`LORA_SYNC_MODES`); default ``"adapter"`` for a 4-bit
    base sampled by an awake colocated engine (a merge would round the adapter away), else ``"merge"``."""
    ignore_eos: bool = False
    """Every completion runs to ``max_completion_length`` (the memory planner's case, for measurement runs)."""
    tools: tuple[str, ...] = ()
    """Registered tools the model may call in its rollouts (``grpo_lab.tools.list_tools()``; TRL's ``tools``)."""
    max_tool_calling_iterations: int | None = None
    """Rounds of tool calls in one completion (TRL's name; None: until the model stops calling)."""

    def __post_init__(self) -> None:
        for name in ("train_types", "train_languages", "rewards", "reward_weights", "tools", "lora_target_modules"):
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
        if self.profile is not None and str(self.profile).strip().lower() not in PROFILES:
            profile_name(self.profile)  # raises with the known names
        for name in ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "max_prompt_length", "max_completion_length", "max_steps", "save_steps", "logging_steps",
                     "plot_every", "train_size", "eval_size", "lora_r", "lora_alpha", "max_tool_calling_iterations"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer.")
        if self.num_generations is not None:
            memory.check_group(self.num_generations, self.per_device_train_batch_size, self.gradient_accumulation_steps,
                               steps_name="gradient_accumulation_steps")
        if self.vllm_gpu_memory_utilization != AUTO:
            memory.check_vllm_memory_fraction(self.vllm_gpu_memory_utilization)
        for name in ("learning_rate", "temperature", "max_minutes", "vllm_server_timeout", "beta", "warmup_steps"):
            value, zero_ok = getattr(self, name), name in ("beta", "warmup_steps")
            if value is not None and not (value >= 0 if zero_ok else value > 0):
                raise ConfigError(f"{name}={value!r} must be {'>= 0' if zero_ok else 'greater than 0'}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p}: must be in (0, 1] (1 keeps the whole distribution).")
        if None not in (self.rewards, self.reward_weights) and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights={self.reward_weights} has {len(self.reward_weights)} weight(s) for "
                              f"{len(self.rewards)} reward(s) {self.rewards}: give one weight per reward.")
        if self.reward_errors not in REWARD_ERROR_MODES:
            raise ConfigError(f"reward_errors={self.reward_errors!r}: use 'raise' (stop at a broken reward with a "
                              f"message saying what to fix) or 'skip' (record None for that sample and go on).")
        if self.vllm_mode not in VLLM_MODES:
            raise ConfigError(f"vllm_mode={self.vllm_mode!r}: use 'colocate' (vLLM inside the trainer) or 'server' "
                              f"(a vLLM server on other devices, grpo_lab.scale).")
        if self.rewards is not None and not (self.rewards and all(isinstance(n, str) and n for n in self.rewards)):
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
        """``vllm_lora_sync="adapter"`` needs a LoRA policy and the colocated engine, awake."""
        if self.vllm_lora_sync is not None and self.vllm_lora_sync not in LORA_SYNC_MODES:
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
        """``load_in_4bit`` needs ``use_peft`` and a device (``kind``, default ``device``) with 4-bit kernels."""
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
        """``vllm_enable_sleep_mode`` needs the colocated engine on a device (``kind``, default ``device``) with it."""
        if not self.vllm_enable_sleep_mode:
            return
        if self.use_vllm is False or self.vllm_mode != "colocate":
            raise ConfigError("vllm_enable_sleep_mode=True puts the colocated vLLM engine to sleep during the update: "
                              "it needs use_vllm=True and vllm_mode='colocate' (HF generate and a vLLM server have "
                              "nothing to release on the training device).")
        kind = kind or self.device
        missing = VLLM_SLEEP_MODE_MISSING.get(kind) if kind else None
        if missing:
            raise ConfigError(f"vllm_enable_sleep_mode=True on {kind}: {missing}. Leave it off and give the update "
                              f"room another way: {'; or '.join(SMALLER_STEP_LEVERS)} (the memory planner sizes each).")

    def with_profile(self, machine: Machine | None = None) -> TrainConfig:
        """A copy with the profile's values in every field left ``None`` (``machine`` picks the default profile)."""
        name = profile_name(self.profile, machine)
        values = {"profile": name, **{k: v for k, v in PROFILES[name].items() if getattr(self, k) is None}}
        if self.dataset is not None and self.train_languages is None:  # the profile's filter is for its own data
            values["train_languages"] = ()
        if self.learning_rate is None and self.use_peft:
            values["learning_rate"] = PROFILES[name]["learning_rate"] * LORA_LEARNING_RATE_SCALE
        if self.rewards is not None and self.reward_weights is None:  # the profile's weights are for its rewards
            values["reward_weights"] = (1.0,) * len(self.rewards)
        if self.model is None and os.environ.get(models.MODEL_ENV_VAR):
            values["model"] = os.environ[models.MODEL_ENV_VAR]
        return dataclasses.replace(self, **values)

    def with_rewards(self, reward_funcs: Sequence[Any] | None) -> TrainConfig:
        """A copy naming ``reward_funcs`` (functions or registered names) as its rewards, with the config's weights
        where there is one per function, else 1.0 each; None: the config as it is."""
        if reward_funcs is None:
            return self
        names = tuple(f if isinstance(f, str) else getattr(f, "__name__", type(f).__name__) for f in reward_funcs)
        weights = self.reward_weights
        if weights is not None and len(weights) != len(names):
            if self.rewards is None:
                raise ConfigError(f"reward_weights={weights} has {len(weights)} weight(s) for the {len(names)} "
                                  f"reward function(s) {names}: give one weight per function, or none (1.0 each).")
            weights = None  # the config's weights were for its own named rewards
        return dataclasses.replace(self, rewards=names, reward_weights=weights or (1.0,) * len(names))

    def resolve(self, machine: Machine) -> TrainConfig:
        """Every field but ``output_dir`` filled in for ``machine``: the profile's values, the machine's facts, the
        model manifest's rows, then the memory planner's micro-batch, checkpointing and vLLM share."""
        config = self.resolve_step(machine)
        if config.vllm_gpu_memory_utilization == AUTO:
            config = dataclasses.replace(config, vllm_gpu_memory_utilization=choose_vllm_memory(config, machine)[0])
        return config

    def resolve_step(self, machine: Machine) -> TrainConfig:
        """:meth:`resolve` with vLLM's share left as given (``"auto"`` stays)."""
        config = self.with_profile(machine)
        if config.device not in (None, machine.kind):
            raise ConfigError(f"device={config.device!r}, but the machine given is a {machine.kind} machine: "
                              f"resolve against a Machine of that kind (device.Machine('{config.device}', ...)).")
        config.check_sleep_mode(machine.kind)
        config.check_four_bit(machine.kind)
        facts: dict[str, Any] = {"device": machine.kind}
        if config.bf16 is None:
            facts["bf16"] = machine.trains_in_bf16
        if config.train_types is None:  # the manifest's slip types describe the shipped data
            facts["train_types"] = (default_train_types(config.model) if config.dataset is None else None) or ()
        if config.vllm_lora_sync is None:
            follows = (config.use_peft and config.load_in_4bit and config.use_vllm is not False
                       and config.vllm_mode == "colocate" and not config.vllm_enable_sleep_mode)
            facts["vllm_lora_sync"] = "adapter" if follows else "merge"
        if config.use_liger_kernel is None:
            facts["use_liger_kernel"] = (device.has_triton(machine.kind) and not config.load_in_4bit
                                         and importlib.util.find_spec("liger_kernel") is not None)
        config = dataclasses.replace(config, **facts)
        if self.per_device_train_batch_size is None and self.gradient_accumulation_steps == 1:
            micro, accumulation = fit_micro_batch(config, machine)
            config = dataclasses.replace(config, per_device_train_batch_size=micro,
                                         gradient_accumulation_steps=accumulation)
        if config.gradient_checkpointing is None:
            config = dataclasses.replace(config, gradient_checkpointing=needs_checkpointing(config, machine))
        return config

    @property
    def is_resolved(self) -> bool:
        return (self.device is not None and self.vllm_gpu_memory_utilization != AUTO
                and self.gradient_checkpointing is not None
                and all(getattr(self, key) is not None for key in PROFILE_FIELDS))

    def _require_resolved(self, what: str) -> None:
        if not self.is_resolved:
            raise ConfigError(f"{what} needs a resolved config: call config.resolve(Machine.detect()) first.")

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once per device: micro-batch × accumulation steps (TRL's generation batch)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def num_prompts_per_step(self) -> int:
        return self.generation_batch_size // self.num_generations

    def trains_on(self, row: dict[str, Any]) -> bool:
        """Whether ``train_types`` and ``train_languages`` keep ``row`` (an empty filter keeps every row)."""
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
        """vLLM's context window (TRL's ``vllm_max_model_length``, :func:`grpo_lab.memory.context_window`)."""
        return memory.context_window(self.max_prompt_length, self.max_completion_length)

    @property
    def precision(self) -> str:
        """The planner's precision: ``"mixed"`` (fp32 weights, bf16 autocast), ``"fp32"``, or with 4-bit ``"bf16"``."""
        return "bf16" if self.load_in_4bit else "mixed" if self.bf16 else "fp32"

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
        """This step as the memory planner's keyword arguments, all but the micro-batch and checkpointing."""
        self._require_resolved("planner_recipe()")
        shape = asdict(self.training_shape())
        for name in ("per_device_train_batch_size", "gradient_checkpointing", "steps_per_generation"):
            del shape[name]
        return {"precision": self.precision, **shape}

    def rollout_config(self, **overrides: Any) -> RolloutConfig:
        """A :class:`RolloutConfig` that samples as the trainer does; ``overrides`` are its fields."""
        self._require_resolved("rollout_config()")
        values: dict[str, Any] = dict(n=self.num_generations, max_tokens=self.max_completion_length,
                                      temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                      max_prompt_tokens=self.max_prompt_length)
        if not device.VLLM_KV_CACHE_IN_BYTES[self.device]:
            values["gpu_memory_utilization"] = self.vllm_gpu_memory_utilization
        return RolloutConfig(**{**values, **overrides})

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
        """One line: what a step of this resolved experiment is on its device."""
        self._require_resolved("step_summary()")
        micro = (f"one micro-batch of {self.per_device_train_batch_size}" if self.gradient_accumulation_steps == 1
                 else f"{self.gradient_accumulation_steps} micro-batches of {self.per_device_train_batch_size}")
        return (f"{self.profile} profile on {self.device}: {Path(self.model).name}, {self.num_prompts_per_step} "
                f"prompts x {self.num_generations} completions per step as {micro}, gradient checkpointing "
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
            "vllm_gpu_memory_utilization": "vLLM's share of the device (the memory plan's)",
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
    """One line per ``kind`` machine of each of ``memory_gibs``: the step ``profile`` resolves to, or why not."""
    lines = []
    for gib in memory_gibs:
        try:
            step = TrainConfig(profile=profile).resolve(Machine(kind, True, gib))
            lines.append(f"{gib:g} GiB: {step.step_summary()}")
        except memory.DoesNotFitError as error:
            lines.append(f"{gib:g} GiB: does not fit ({str(error).splitlines()[0]})")
    return lines


def get_profile(name: str | None = None, **overrides: Any) -> TrainConfig:
    """The profile's experiment, with ``overrides`` (TrainConfig fields) applied; machine facts still open."""
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ProfileError(f"Unknown profile field(s) {unknown}; known: {sorted(known)}.")
    return TrainConfig(profile=name, **overrides).with_profile()
