"""One GRPO optimizer step with the memory behaviour of TRL's GRPOTrainer, phase by phase.

The forward goes through TRL's chunked LM head (``trl.trainer.utils.add_fused_lm_head``, the path
``GRPOTrainer._get_per_token_logps_and_entropies`` takes), the loss is GRPO's clipped-ratio surrogate on the
completion tokens, then gradient clipping and a fused AdamW step — what ``Trainer.training_step`` does.
Phases are marked with backward hooks so each peak can be compared with ``grpo_lab.memory.training_phases``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

PHASES = ("forward", "LM-head backward", "layer backward", "embedding backward", "optimizer step")


def random_model(config_path: str | Path, dtype: torch.dtype, gradient_checkpointing: bool,
                 num_hidden_layers: int | None = None, device: str = "cpu"):
    """A randomly initialised causal LM of the config's shape, with TRL's fused LM head, in train mode."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    values = {k: v for k, v in json.loads(Path(config_path).read_text()).items() if not k.startswith("_")}
    if num_hidden_layers:
        values.update(num_hidden_layers=num_hidden_layers, max_window_layers=num_hidden_layers)
    config = AutoConfig.for_model(**values)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model.train()


def padded_batch(batch_size: int, prompt_length: int, completion_length: int, vocab_size: int, device: str = "cpu"):
    """Token ids and attention mask like TRL's: prompts left-padded to the longest, completions full length."""
    generator = torch.Generator().manual_seed(0)
    total = prompt_length + completion_length
    ids = torch.randint(0, min(vocab_size, 1000), (batch_size, total), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, batch_size):  # every row but the first has a shorter prompt
        mask[row, : row % max(prompt_length // 2, 1)] = 0
    return ids.to(device), mask.to(device)


def grpo_step(model, optimizer, ids, mask, completion_length: int, mark: Callable[[str], None],
              autocast_dtype: torch.dtype | None = None) -> float:
    """Forward, GRPO loss, backward, clip, AdamW step; ``mark(phase)`` is called at the end of each phase."""
    device_type = ids.device.type
    seen: set[str] = set()

    def once(phase: str) -> None:  # checkpointed layers run their forward (and hooks) again in backward
        if phase not in seen:
            seen.add(phase)
            mark(phase)

    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion_length] = -100
    hooks = [model.model.layers[-1].register_full_backward_pre_hook(lambda *_: once("LM-head backward")),
             model.model.embed_tokens.register_full_backward_pre_hook(lambda *_: once("layer backward"))]
    try:
        with torch.autocast(device_type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        logps = out.log_probs[:, -completion_length:]
        advantages = torch.randn(ids.size(0), 1, device=ids.device)
        ratio = torch.exp(logps - logps.detach())
        loss = -torch.min(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages).mean()
        mark("forward")
        loss.backward()
        mark("embedding backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark("optimizer step")
    finally:
        for hook in hooks:
            hook.remove()
    return loss.item()
