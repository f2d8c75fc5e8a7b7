"""Each component of a GRPO step's memory: the training phases, vLLM's share and its KV cache."""

from __future__ import annotations

import math

from grpo_lab import device
from grpo_lab.memory.shapes import GIB, VLLM_RUNTIME_BYTES, MemoryPlanError, ModelShape, Precision, TrainingShape


# TRL's chunked LM head (trl/kernels/chunked_logprob.py): projection tiles of TOKEN_TILE × VOCAB_TILE.
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# Without Triton (CPU, Ascend) torch ops fold the tile, keeping about this many fp32 copies of it alive at once.
TORCH_FOLD_FP32_TILES = 7.25
# cuBLAS keeps one workspace per thread's handle in torch's allocator (32 MiB on Hopper, torch's default, plus 1 MiB for
# cuBLASLt): one for the forward's thread, one for autograd's.
CUBLAS_WORKSPACE_BYTES = 33 * 2**20
CUBLAS_WORKSPACE_THREADS = 2
# CUDA's embedding backward sums each token id's rows in segments of this many rows, in worst-case fp32 buffers.
EMBEDDING_ROWS_PER_SEGMENT = 10
TRL_COLOCATE_MAX_NUM_BATCHED_TOKENS = 4096
KV_BLOCK_TOKENS = 16
# Runtime margin (device context, fragmentation, collective buffers): max(fixed, fraction of the device).
MARGIN_MIN_BYTES = GIB
MARGIN_FRACTION = 0.05


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


# LoRA's linears fed by an RMSNorm (their input is the residual stream's dtype); o_proj and down_proj take activations
NORM_FED_LINEARS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def lora_activation_bytes_per_token_per_layer(model: ModelShape, precision: Precision, shape: TrainingShape) -> int:
    """What LoRA adds per token in one decoder layer: lora_A's output and, with dropout, each adapted linear's dropped
    copy of its input and its mask (an estimate from the saved tensors)."""
    if not shape.lora:
        return 0
    linears = model.linear_layers()
    extra = 0
    for name in shape.lora_target_modules:
        if shape.lora_dropout > 0:
            input_bytes = precision.residual_bytes if name in NORM_FED_LINEARS else precision.activation_bytes
            extra += linears[name][0] * (input_bytes + 1)
        extra += shape.lora_r * precision.activation_bytes
    return extra


def training_phases(model: ModelShape, precision: Precision, shape: TrainingShape, device_kind: str
                    ) -> dict[str, dict[str, int]]:
    """Training-side components alive at the peak of each phase of one optimizer step (the forward's extras are
    smaller than the backward's; ``device_kind`` picks the kernels):

    * ``LM-head backward``: every saved activation plus TRL's chunked-LM-head buffers (tile, fp32 accumulators, casts);
    * ``layer backward``: one layer's MLP backward next to the gradients made so far (with checkpointing the larger of
      the first layer done, all inputs still kept, and the last, nearly all gradients made);
    * ``embedding backward``: all gradients, the gradient of the embedding output and the kernel's buffers;
    * ``optimizer step``: weights, gradients and AdamW states (fused AdamW allocates nothing more).
    """
    if device_kind not in device.KINDS:
        raise MemoryPlanError(f"device_kind must be one of {', '.join(device.KINDS)}, got {device_kind!r}.")
    p, layers = model.num_parameters, model.num_hidden_layers
    h, i, v = model.hidden_size, model.intermediate_size, model.vocab_size
    b, t, c = shape.per_device_train_batch_size, shape.sequence_length, shape.max_completion_length
    e, r, g = precision.activation_bytes, precision.residual_bytes, precision.grad_bytes
    tokens = b * t
    cuda, triton = device.is_cuda(device_kind), device.has_triton(device_kind)  # cuBLAS/CUDA kernels, Triton's
    lm_tokens = b * c if triton else b * (t - 1)  # Triton scores the completion tokens only

    # LoRA: only the adapters train; TRL's reference is the base with the adapter off (no copy)
    lora_layer = model.lora_layer_parameters(shape.lora_r, shape.lora_target_modules) if shape.lora else 0
    trainable = layers * lora_layer if shape.lora else p
    static = {"policy weights": model.weight_bytes(precision.weight_bytes, shape.load_in_4bit),
              "AdamW states": trainable * precision.adamw_bytes}
    if shape.lora:
        static["LoRA adapters"] = trainable * precision.weight_bytes
    if shape.beta > 0 and not shape.lora:
        static["reference model"] = p * precision.weight_bytes
    if cuda:
        static["cuBLAS workspaces"] = CUBLAS_WORKSPACE_THREADS * CUBLAS_WORKSPACE_BYTES
    grads = trainable * g
    # the LM head's gradient, made first (tied: waits for the embedding's to be added); none when it is frozen
    head_grad = 0 if shape.lora else v * h * g

    per_layer = tokens * (activation_bytes_per_token_per_layer(model, precision)  # + the attention mask
                          + lora_activation_bytes_per_token_per_layer(model, precision, shape)) + b * t * t * e
    layer_copies = model.layer_linear_parameters * precision.autocast_copy_bytes  # one layer's bf16 weights
    final_norm_and_head_input = tokens * (4 * h + r * h) + lm_tokens * r * h
    # Checkpointing keeps each layer's input and the boolean padding mask; autocast's weight cache empties after forward
    padding_mask = b * t * t if shape.gradient_checkpointing else 0
    if shape.gradient_checkpointing:
        saved_layers, kept_copies = layers * tokens * r * h, 0
    else:  # every linear keeps its bf16 weight copy for its backward
        saved_layers, kept_copies = layers * per_layer, layers * layer_copies

    tile_rows = min(lm_tokens, TOKEN_TILE)
    head_weight_grad = 0 if shape.lora else v * h  # a frozen LM head: TRL's kernel skips the weight gradient
    fp32_accumulators = head_weight_grad * 4 + lm_tokens * h * 4  # weight and input gradients, accumulated in fp32
    casts = head_weight_grad * _cast_bytes(g) + lm_tokens * h * _cast_bytes(r)  # to the model dtype, at the end
    fold = 0 if triton else int(TORCH_FOLD_FP32_TILES * tile_rows * min(v, VOCAB_TILE) * 4)
    autocast_chunks = (min(v, VOCAB_TILE) + tile_rows) * h * precision.autocast_copy_bytes
    lm_head = tile_rows * VOCAB_TILE * e + fp32_accumulators + max(fold + autocast_chunks, casts)

    phases = {"LM-head backward": {**static, "activations saved for backward": saved_layers + final_norm_and_head_input
                                   + padding_mask, "autocast weight copies": kept_copies,
                                   "LM-head backward buffers": lm_head}}

    # The MLP backward of one layer: gradients of gate, up and act(gate)·up, and the gradient flowing in
    mlp_backward = tokens * (2 * e * i + r * h)
    # LM head, final norm, the top layer's down_proj (LoRA: the top layer's adapters)
    first_layer_done_grads = lora_layer * g if shape.lora else head_grad + h * g + h * i * g
    if shape.gradient_checkpointing:
        # With an fp32 residual the first RMSNorm's upcast is the layer's input itself, already kept
        recomputed = per_layer - (tokens * 4 * h if r == 4 else 0)
        # At the last layer (layer 0) its other gradients and, untied, the embedding's are not made yet
        last_grads = grads if shape.lora else (
            grads - (model.layer_parameters - h * i) * g - (0 if model.tie_word_embeddings else head_grad))
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
    if shape.load_in_4bit:  # bitsandbytes dequantizes a frozen weight for each matmul of the backward, one at a time
        phases["layer backward"]["4-bit weight dequantized"] = max(
            i * o for i, o in model.linear_layers().values()) * precision.weight_bytes

    # The kernel makes a dense vocab × hidden gradient: tied, added in place to the LM head's; untied, the embedding's
    # .grad. CUDA also sums each token id's rows in worst-case fp32 partial sums.
    embedding = tokens * r * h + (head_grad if model.tie_word_embeddings else 0)
    if shape.lora:  # a frozen embedding: only the gradient of its output, which TRL asks for under checkpointing
        embedding = tokens * r * h if shape.gradient_checkpointing else 0
    elif cuda:
        embedding += (tokens // EMBEDDING_ROWS_PER_SEGMENT + min(tokens, v)) * h * 4
    phases["embedding backward"] = {**static, "gradients": grads, "embedding backward buffers": embedding}
    phases["optimizer step"] = {**static, "gradients": grads}
    return phases


def _cast_bytes(target_bytes: int) -> int:
    """Bytes per element of casting an fp32 buffer to a dtype of ``target_bytes`` (fp32 → fp32 is free)."""
    return 0 if target_bytes == 4 else target_bytes


def vllm_non_kv_bytes(model: ModelShape, vllm_dtype_bytes: int, max_num_seqs: int,
                      max_num_batched_tokens: int = TRL_COLOCATE_MAX_NUM_BATCHED_TOKENS,
                      load_in_4bit: bool = False) -> dict[str, int]:
    """vLLM's memory other than the KV cache: weights (``load_in_4bit``: the linear layers in NF4, as TRL starts vLLM
    with ``quantization="bitsandbytes"`` for a 4-bit policy), its profiling pass's activation peak, runtime."""
    h, i, e = model.hidden_size, model.intermediate_size, vllm_dtype_bytes
    per_token = e * (4 * h + 2 * model.q_dim + 2 * model.kv_dim + 4 * i)  # residual, qkv, attn out, gate_up, act
    sampler = max_num_seqs * model.vocab_size * 4 * 3  # fp32 logits, probabilities, log-probabilities
    return {"vLLM weights": model.weight_bytes(e, load_in_4bit),
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

