"""Model shape (read from config.json), training precision and the GRPO step's sizes: the planner's inputs."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, MissingFileError
from grpo_lab.paths import MODEL_CONFIGS_DIR

GIB = 2**30
"""Bytes in a GiB."""
CONFIG_DIR = MODEL_CONFIGS_DIR


# vllm_gpu_memory_utilization when nobody chose one, by who runs vLLM: the one table of these defaults.
VLLM_MEMORY_FRACTION: dict[str, float | str] = {
    "colocate": "auto",  # beside the trainer (TrainConfig): the planner's choice for the step and the machine
    "server": 0.9,       # TRL's rollout server (grpo_lab.scale): its devices are vLLM's alone
    "serve": 0.85,       # serving a trained model (grpo_lab.deploy): the device to itself, a margin for the runtime
    "engine": 0.3,       # a standalone rollout engine next to other work (sampling lessons, the bench)
    "verl": 0.3,         # verl's rollout share of each device in the export (verl frees it during the update)
}
CPU_KV_CACHE_GIB = 1.0
"""vLLM-CPU's KV cache, GiB of host memory (``VLLM_CPU_KVCACHE_SPACE``): plenty for the tiny model."""
VLLM_RUNTIME_BYTES = GIB
"""Non-torch memory vLLM adds while profiling (cuBLAS/attention workspaces) plus its CUDA-graph pool."""
FOUR_BIT_BLOCK = 64
"""Weights per block of bitsandbytes' 4-bit quantization (its default blocksize), each block with one fp32 scale."""
FOUR_BIT_BYTES_PER_PARAMETER = 0.5 + 4 / FOUR_BIT_BLOCK
"""A 4-bit NF4 weight: half a byte, plus its block's fp32 scale (no nested quantization of the scales)."""
REQUIRED_CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class MemoryPlanError(ConfigError):
    """Bad input to the memory planner (or a vLLM memory fraction out of range)."""


class DoesNotFitError(MemoryPlanError):
    """No setting fits on the device; the message says what would make it fit."""


def check_vllm_memory_fraction(value: Any, name: str = "vllm_gpu_memory_utilization") -> float | None:
    """The one range check of vLLM's memory fraction (None passes: "choose for me"); returns the value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise MemoryPlanError(
            f"{name}={value}: must be in (0, 1] (got {value}): it is the fraction of the device's total memory vLLM "
            f"may take (weights + KV cache). Use e.g. 0.3 next to a trainer, 0.9 for a device of its own, or leave "
            f"TrainConfig's vllm_gpu_memory_utilization='auto' for the memory planner's choice.")
    return float(value)


@dataclass(frozen=True)
class ModelShape:
    """The fields of a decoder-only config.json that decide memory (Qwen2 / Llama family)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    name: str = "model"
    max_position_embeddings: int | None = None
    """The model's context length, when its config states one."""

    def __post_init__(self) -> None:
        for f in (*REQUIRED_CONFIG_FIELDS, "num_key_value_heads", "head_dim"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MemoryPlanError(f"{self.name}: {f} must be a positive integer, got {value!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise MemoryPlanError(f"{self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                                  f"multiple of num_key_value_heads ({self.num_key_value_heads}).")

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> ModelShape:
        """Read a shape from a config.json path (file or model folder), a dict, or a transformers config, with
        transformers' defaults for missing fields (``attention_bias``: True for ``model_type: qwen2``)."""
        if isinstance(config, ModelShape):
            return config
        values, default_name = _config_dict(config)
        if "text_config" in values and "hidden_size" not in values:  # vision-language: the language model
            values = dict(values["text_config"])
        missing = [f for f in REQUIRED_CONFIG_FIELDS if values.get(f) is None]
        if missing:
            raise MemoryPlanError(f"The config of {name or default_name} lacks {', '.join(missing)}; the planner "
                                  f"needs {', '.join(REQUIRED_CONFIG_FIELDS)} (as in a model's config.json).")
        heads = values["num_attention_heads"]
        head_dim = values.get("head_dim") or (values["hidden_size"] // heads if heads else 0)
        return cls(
            hidden_size=values["hidden_size"], intermediate_size=values["intermediate_size"],
            num_hidden_layers=values["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=values.get("num_key_value_heads") or heads, head_dim=head_dim,
            vocab_size=values["vocab_size"], tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
            attention_bias=bool(values.get("attention_bias", values.get("model_type") == "qwen2")),
            name=name or default_name, max_position_embeddings=values.get("max_position_embeddings"))

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: q/k/v/o projections (+ q/k/v bias), gated MLP, two RMSNorms."""
        h, i = self.hidden_size, self.intermediate_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.attention_bias:
            attention += self.q_dim + 2 * self.kv_dim
        return attention + 3 * h * i + 2 * h

    @property
    def layer_linear_parameters(self) -> int:
        """Parameters of one decoder layer's seven linear layers (weights and biases): what autocast copies."""
        return self.layer_parameters - 2 * self.hidden_size

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_parameters(self) -> int:
        """Embedding + layers + final norm (+ a separate LM head when embeddings are not tied)."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return self.embedding_parameters + self.num_hidden_layers * self.layer_parameters + self.hidden_size + lm_head

    @property
    def quantized_parameters(self) -> int:
        """The weights a 4-bit base quantizes: the decoder layers' linear weights (the rest stays as it is)."""
        return self.num_hidden_layers * sum(i * o for i, o in self.linear_layers().values())

    def weight_bytes(self, dtype_bytes: int, load_in_4bit: bool = False) -> int:
        """Bytes of the weights in ``dtype_bytes`` per parameter (``load_in_4bit``: the quantized ones in NF4)."""
        quantized = self.quantized_parameters if load_in_4bit else 0
        return math.ceil(quantized * FOUR_BIT_BYTES_PER_PARAMETER) + (self.num_parameters - quantized) * dtype_bytes

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every layer: layers × KV heads × head dim × 2 × bytes."""
        return self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2 * dtype_bytes

    def linear_layers(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by its Qwen2/Llama module name."""
        h, i = self.hidden_size, self.intermediate_size
        return {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
                "o_proj": (self.q_dim, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_layer_parameters(self, r: int, target_modules: tuple[str, ...]) -> int:
        """LoRA parameters of one decoder layer: ``r × (in + out)`` (A and B) for each targeted linear layer."""
        layers = self.linear_layers()
        unknown = sorted(set(target_modules) - set(layers))
        if unknown:
            raise MemoryPlanError(f"{self.name}: the planner knows the linear layers {', '.join(layers)}; cannot plan "
                                  f"LoRA on {', '.join(unknown)}.")
        return sum(r * (layers[m][0] + layers[m][1]) for m in target_modules)


def _config_dict(config: Any) -> tuple[dict, str]:
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise MissingFileError(f"No config.json at {path}: pass a model folder, a config.json path, a dict "
                                   f"or a transformers config (course configs are in {CONFIG_DIR}).")
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise MemoryPlanError(f"{path} is not valid JSON ({exc}).") from exc
        return values, path.stem if path.name != "config.json" else path.parent.name
    if isinstance(config, Mapping):
        return dict(config), str(config.get("_name_or_path") or config.get("name") or "model")
    if hasattr(config, "to_dict"):
        return config.to_dict(), str(getattr(config, "name_or_path", "") or type(config).__name__)
    raise MemoryPlanError(f"Cannot read a model config from {type(config).__name__}: pass a path, a dict or a "
                          "transformers PretrainedConfig.")


def course_configs() -> dict[str, Path]:
    """The model shapes shipped with the course (``data/configs/*.json``), by file stem."""
    return {path.stem: path for path in sorted(CONFIG_DIR.glob("*.json"))}


def model_config(model: str | Path) -> Path | dict[str, Any]:
    """Where a model's shape can be read: a local folder; for a hub id the course's shipped config of that name
    (``Qwen/Qwen2.5-0.5B-Instruct`` → ``qwen2.5-0.5b``), else transformers' ``AutoConfig``."""
    if Path(model).is_dir():
        return Path(model)
    shipped = course_configs()
    stem = str(model).rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    if stem in shipped:
        return shipped[stem]
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(model), trust_remote_code=False).to_dict()
    except Exception as error:  # offline and not cached, or not a model id
        raise MemoryPlanError(f"cannot read the shape of {model!r} to plan memory ({type(error).__name__}): pass a "
                              f"local model folder, or set vllm_gpu_memory_utilization to a number.") from None


def cpu_vllm_fraction(model: Any, host_memory_gib: float, step: float = 0.05) -> float:
    """vLLM-CPU's ``gpu_memory_utilization``: the least it needs as a share of the host, rounded up to ``step``."""
    shape = ModelShape.from_config(model)
    needed = shape.num_parameters * 4 + VLLM_RUNTIME_BYTES + CPU_KV_CACHE_GIB * GIB
    return min(1.0, round(math.ceil(needed / (host_memory_gib * GIB) / step) * step, 2))


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each training-side copy, and the dtype activations are kept in."""

    name: str
    weight_bytes: int
    grad_bytes: int
    adamw_bytes: int  # exp_avg + exp_avg_sq
    activation_bytes: int
    residual_bytes: int  # dtype of the residual stream between layers
    autocast_copy_bytes: int  # per linear parameter: autocast's lower-precision copy (0 without autocast)
    description: str


PRECISIONS = {
    "bf16": Precision("bf16", 2, 2, 4, 2, 2, 0,
                      "bf16 weights, gradients and AdamW moments (torch's AdamW keeps its states in the parameter "
                      "dtype), no fp32 master copy: TRL's default with a bf16 checkpoint, 8 bytes per parameter"),
    "mixed": Precision("mixed", 4, 4, 8, 2, 4, 2,
                       "fp32 master weights, fp32 gradients and fp32 AdamW moments with bf16 autocast: 16 bytes "
                       "per parameter plus bf16 copies of the linear weights (in the backward, with gradient "
                       "checkpointing, only the recomputed layer's)"),
    "fp32": Precision("fp32", 4, 4, 8, 4, 4, 0,
                      "fp32 weights, gradients and AdamW moments (the tiny CPU profile): 16 bytes per parameter"),
}
"""The training precisions the planner counts, by name (:class:`Precision`)."""
_PRECISION_ALIASES = {"bfloat16": "bf16", "float32": "fp32", "float": "fp32", "mixed-bf16": "mixed",
                      "amp": "mixed", "bf16-mixed": "mixed"}
_DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4, "float": 4}


def get_precision(precision: str | Precision) -> Precision:
    """A :class:`Precision` from its name (``bf16``, ``mixed``, ``fp32``; ``torch.bfloat16`` etc. accepted)."""
    if isinstance(precision, Precision):
        return precision
    key = str(precision).lower().removeprefix("torch.")
    key = _PRECISION_ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise MemoryPlanError(f"Unknown precision {precision!r}: use one of {', '.join(PRECISIONS)} "
                              "(fp16 training keeps fp32 master weights: plan it as 'mixed').")
    return PRECISIONS[key]


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``bf16``, ``float16``, ``torch.float32`` ...)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise MemoryPlanError(f"Unknown dtype {dtype!r}: use bf16, fp16 or fp32.")
    return _DTYPE_BYTES[key]


STEP_DEFAULTS: dict[str, int] = {"num_generations": 8, "max_prompt_length": 256, "max_completion_length": 256}
"""A GRPO step's group size and lengths where nothing else is said (the accelerator profiles and the planner's)."""
CONTEXT_MARGIN = 1.1
"""The spare share of :func:`context_window` (the write-up's 10 %)."""


def context_window(prompt_tokens: int, completion_tokens: int) -> int:
    """vLLM's ``max_model_len`` for the trainer, the rollout engine and the server: ``ceil(1.1 x (prompt +
    completion))``, as an engine may count a prompt a few tokens longer.

    >>> context_window(96, 32)
    141
    """
    return math.ceil(round(CONTEXT_MARGIN * (prompt_tokens + completion_tokens), 6))


def check_group(num_generations: int, per_device_train_batch_size: int | None, steps: int = 1,
                steps_name: str = "steps_per_generation", error: type[ConfigError] = ConfigError) -> None:
    """GRPO's group rules: at least 2 completions a group, and whole groups in each generation batch."""
    if num_generations < 2:
        raise error(f"num_generations={num_generations}: GRPO compares completions of the same prompt, so it needs "
                    f"at least 2 (the course uses 4-8).")
    if per_device_train_batch_size is None:
        return
    batch = per_device_train_batch_size * steps
    if batch % num_generations:
        fits = [n for n in range(2, batch + 1) if batch % n == 0]
        raise error(f"num_generations={num_generations} does not divide the generation batch "
                    f"(per_device_train_batch_size × {steps_name} = {batch}), so a prompt's group would be split. "
                    f"Use num_generations in {fits}, or per_device_train_batch_size = a multiple of {num_generations} "
                    f"(e.g. {num_generations * max(1, batch // num_generations)}).")


@dataclass(frozen=True)
class TrainingShape:
    """The GRPO step's sizes, in TRL's GRPOConfig names. ``per_device_train_batch_size`` is the micro-batch;
    ``max_prompt_length`` the longest prompt in tokens (TRL pads to it); ``steps_per_generation`` defaults to the
    smallest value that makes the generation batch a multiple of ``num_generations``."""

    per_device_train_batch_size: int = 8
    num_generations: int = STEP_DEFAULTS["num_generations"]
    max_prompt_length: int = STEP_DEFAULTS["max_prompt_length"]
    max_completion_length: int = STEP_DEFAULTS["max_completion_length"]
    gradient_checkpointing: bool = True
    beta: float = 0.0
    steps_per_generation: int | None = None
    lora_r: int = 0
    """LoRA rank (TRL's ``lora_r`` with ``use_peft``); 0: full fine-tuning."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora_dropout: float = 0.0
    vllm_enable_sleep_mode: bool = False
    """vLLM releases its weights and KV cache during the update (TRL's sleep level 2) and wakes for the rollout."""
    load_in_4bit: bool = False
    """QLoRA: the base's linear weights in 4-bit NF4, in the trainer and in vLLM; needs ``lora_r > 0``."""

    def __post_init__(self) -> None:
        for f in ("per_device_train_batch_size", "num_generations", "max_prompt_length", "max_completion_length"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MemoryPlanError(f"{f} must be a positive integer, got {value!r}.")
        if not isinstance(self.beta, (int, float)) or self.beta < 0:
            raise MemoryPlanError(f"beta must be >= 0 (0 drops the reference model), got {self.beta!r}.")
        if not isinstance(self.lora_r, int) or isinstance(self.lora_r, bool) or self.lora_r < 0:
            raise MemoryPlanError(f"lora_r must be a non-negative integer (0: full fine-tuning), got {self.lora_r!r}.")
        if self.load_in_4bit and not self.lora:
            raise MemoryPlanError("load_in_4bit=True freezes a 4-bit base: plan it with a LoRA adapter (lora_r > 0).")
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        steps = self.steps_per_generation
        if steps is None:
            b, n = self.per_device_train_batch_size, self.num_generations
            object.__setattr__(self, "steps_per_generation", n // math.gcd(b, n))
        elif not isinstance(steps, int) or steps <= 0:
            raise MemoryPlanError(f"steps_per_generation must be a positive integer, got {steps!r}.")
        check_group(self.num_generations, self.per_device_train_batch_size, self.steps_per_generation,
                    error=MemoryPlanError)

    @property
    def sequence_length(self) -> int:
        """The longest sequence of the step (prompt + completion, tools' answers included)."""
        return self.max_prompt_length + self.max_completion_length

    @property
    def context_window(self) -> int:
        """vLLM's ``max_model_len`` for this step (:func:`context_window`)."""
        return context_window(self.max_prompt_length, self.max_completion_length)

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once (one device): micro-batch × steps_per_generation."""
        return self.per_device_train_batch_size * self.steps_per_generation

    @property
    def lora(self) -> bool:
        return self.lora_r > 0

