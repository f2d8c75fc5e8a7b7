"""Memory budget of a GRPO step with vLLM colocated on the same device, and the settings that follow from it.

vLLM takes ``vllm_gpu_memory_utilization`` × the device's *total* memory for itself (its weights, activations, CUDA
graphs and, with what is left, the KV cache); the trainer needs room for weights, AdamW states, the reference model,
activations and gradients *on top of that*. This package counts each part from the model's ``config.json`` and
recommends the fraction, the number of sequences vLLM can hold and the micro-batch.

>>> from grpo_lab.memory import course_configs, plan_memory
>>> budget = plan_memory(course_configs()["qwen2.5-0.5b"], device_memory_gib=32, device_kind="npu",
...                      per_device_train_batch_size=8, num_generations=8)
>>> budget.fits, 0.0 < budget.recommended.vllm_gpu_memory_utilization < 1.0
(True, True)

How vLLM spends its fraction (``vllm/v1/worker/gpu_worker.py``): ``requested = ceil(total × utilization)``; vLLM
refuses to start when the device's *free* memory is below that; the KV cache gets ``requested − (weights +
activation peak of a profiling pass + non-torch memory) − CUDA-graph estimate``. Memory the trainer already holds is
not inside the fraction, so the trainer must fit in ``total × (1 − utilization)`` minus a runtime margin.

Assumptions (``MemoryBudget.assumptions`` repeats them next to every table):

* Precision ``bf16`` (a model loaded in bf16): weights, gradients and both AdamW moments in bf16, 8 bytes per
  parameter (torch's AdamW keeps its states in the parameter dtype). ``mixed``: fp32 master weights, gradients and
  AdamW moments with bf16 autocast, 16 bytes per parameter plus bf16 copies of the weights in use; ``grpo_lab.train``
  loads float32 on purpose, so with ``bf16=True`` it is ``mixed``. ``fp32``: 16 bytes.
* Optimizer: AdamW, fused (transformers' default), so the step allocates no temporaries.
* Activations: Hugging Face's Qwen2/Llama layers with SDPA attention, batches padded to the longest prompt and
  completion, TRL's chunked LM head (full logits never materialised); counted per token and layer from the tensors
  autograd saves, and per phase from what each backward step allocates (``training_phases``); on CUDA also cuBLAS's
  workspaces.
* vLLM: its own copy of the weights in ``vllm_dtype``; the activation peak of its profiling pass over
  ``max_num_batched_tokens`` plus sampler logits; a fixed runtime allowance (non-torch memory and CUDA graphs); KV
  cache per token = layers × KV heads × head dim × 2 × bytes.
* Runtime margin: the device context (CUDA/CANN), allocator fragmentation and collective buffers.

Modules, from inputs to answers: ``shapes`` (model shape, precision, step sizes), ``components`` (each part of the
step's memory), ``budget`` (:class:`MemoryBudget`), ``planner`` (:func:`plan_memory` and its advice).
"""

from __future__ import annotations

__all__ = [
    "GIB", "KNOBS_IN_ORDER", "PRECISIONS", "DoesNotFitError", "MemoryBudget", "MemoryPlanError", "ModelShape",
    "TrainingShape", "activation_bytes_per_token_per_layer", "course_configs", "get_precision", "kv_cache_sequences",
    "largest_fitting_batch", "largest_models", "lever_plans", "model_config", "plan_memory", "recommendation_table",
]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
from grpo_lab.memory.budget import (
    BudgetRow,
    MemoryBudget,
    Recommendation,
)
from grpo_lab.memory.components import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_THREADS,
    EMBEDDING_ROWS_PER_SEGMENT,
    KV_BLOCK_TOKENS,
    MARGIN_FRACTION,
    MARGIN_MIN_BYTES,
    NORM_FED_LINEARS,
    TOKEN_TILE,
    TORCH_FOLD_FP32_TILES,
    TRL_COLOCATE_MAX_NUM_BATCHED_TOKENS,
    VOCAB_TILE,
    activation_bytes_per_token_per_layer,
    default_margin_bytes,
    kv_cache_sequences,
    lora_activation_bytes_per_token_per_layer,
    training_phases,
    vllm_non_kv_bytes,
)
from grpo_lab.memory.planner import (
    KNOBS_IN_ORDER,
    LORA_R_TRIAL,
    UTILIZATION_STEP,
    VLLM_ASLEEP_BYTES,
    largest_fitting_batch,
    plan_memory,
)
from grpo_lab.memory.sampler import DeviceMemorySampler
from grpo_lab.memory.shapes import (
    CONFIG_DIR,
    CONTEXT_MARGIN,
    CPU_KV_CACHE_GIB,
    FOUR_BIT_BLOCK,
    FOUR_BIT_BYTES_PER_PARAMETER,
    GIB,
    PRECISIONS,
    REQUIRED_CONFIG_FIELDS,
    STEP_DEFAULTS,
    VLLM_MEMORY_FRACTION,
    VLLM_RUNTIME_BYTES,
    check_group,
    check_vllm_memory_fraction,
    context_window,
    course_configs,
    cpu_vllm_fraction,
    DoesNotFitError,
    dtype_bytes,
    get_precision,
    MemoryPlanError,
    model_config,
    ModelShape,
    Precision,
    TrainingShape,
)
from grpo_lab.memory.tables import (
    COMMON_DEVICES,
    LEVERS,
    DevicePreset,
    LeverPlan,
    largest_models,
    lever_plans,
    recommendation_table,
)
