"""LoRA GRPO: PEFT's ``LoraConfig`` from the experiment's fields, the adapter merged into plain weights, and the check
that training changed the adapter and nothing else. A LoRA run keeps ``adapter/`` and ``final/`` (the adapter merged:
a plain model). QLoRA (``load_in_4bit``, CUDA): TRL loads the base in 4-bit NF4 (:func:`quantization_config`), the
engine is handed the adapter itself by default (:data:`QLORA_ENGINE_CAVEAT` says why), and ``final/`` is the adapter,
served on the 4-bit base it trained on.

>>> from grpo_lab import lora
>>> lora.peft_name_to_base("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
'model.layers.0.self_attn.q_proj.weight'
"""

from __future__ import annotations

__all__ = ["StartSnapshot", "adapter_names", "base_of", "compare", "folder_tensors", "tensors"]

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_lab.errors import ConfigError
from grpo_lab.models import (
    MANIFEST_NAME,
    load_model_and_tokenizer,
    require_safetensors,
    resolve_model,
    verify_model_dir,
)

FOUR_BIT_QUANT_TYPE = "nf4"
"""QLoRA's 4-bit data type (TRL's ``bnb_4bit_quant_type`` default)."""

QLORA_ENGINE_CAVEAT = (
    "QLoRA with vLLM rollouts: TRL syncs a 4-bit policy to its vLLM engine by merging the adapter into the base's "
    "4-bit weights (peft's merge_adapter), and that merge loses a LoRA update smaller than one 4-bit step. The engine "
    "keeps sampling about the base model, so the rollouts are off-policy and the trainer's engine cannot show what the "
    "run learned: evaluate final/ on HF generate (evaluation.evaluate(run.final_model_dir, rows, backend='hf')). "
    "TrainConfig(vllm_lora_sync='adapter') hands the engine the adapter itself instead (vLLM's LoRA support), or train "
    "LoRA on a 16-bit base where it fits."
)
"""Why a QLoRA run's vLLM engine does not follow its adapter (https://github.com/huggingface/trl/issues/3466)."""
ADAPTER_MARK = "lora_"
"""PEFT's adapter tensors carry this in their names (``lora_A``, ``lora_B``)."""


def lora_kwargs(config: Any) -> dict[str, Any] | None:
    """PEFT's ``LoraConfig`` fields for a ``TrainConfig`` with ``use_peft`` (as TRL's ``get_peft_config``), or None."""
    if not config.use_peft:
        return None
    return {"task_type": "CAUSAL_LM", "r": config.lora_r, "lora_alpha": config.lora_alpha,
            "lora_dropout": config.lora_dropout, "target_modules": list(config.lora_target_modules), "bias": "none"}


def lora_config(config: Any) -> Any | None:
    """PEFT's ``LoraConfig`` of :func:`lora_kwargs` (None without LoRA)."""
    kwargs = lora_kwargs(config)
    if kwargs is None:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ConfigError("use_peft=True needs the peft package: make install (it is in every stack), or "
                          "pip install peft -c grpo_lab/stacks/<stack>.txt.") from None
    return LoraConfig(**kwargs)


def rollout_caveats(config: Any) -> list[str]:
    """:data:`QLORA_ENGINE_CAVEAT` for QLoRA with vLLM rollouts through TRL's merge (none otherwise)."""
    merged = config.vllm_lora_sync == "merge"
    return [QLORA_ENGINE_CAVEAT] if config.load_in_4bit and config.use_peft and config.use_vllm and merged else []


def compute_dtype(config: Any) -> str:
    """The dtype a 4-bit base computes in and keeps its other weights in: bf16, or fp16 on a GPU without bf16."""
    return "bfloat16" if config.bf16 else "float16"


def quantization_kwargs(config: Any) -> dict[str, Any] | None:
    """``BitsAndBytesConfig`` fields for ``load_in_4bit`` (as TRL's ``get_quantization_config``), or None."""
    if not config.load_in_4bit:
        return None
    from trl import ModelConfig

    model_args = ModelConfig(load_in_4bit=True, bnb_4bit_quant_type=FOUR_BIT_QUANT_TYPE, dtype=compute_dtype(config))
    return {"load_in_4bit": True, "bnb_4bit_compute_dtype": model_args.dtype,
            "bnb_4bit_quant_type": model_args.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": model_args.use_bnb_nested_quant,
            "bnb_4bit_quant_storage": model_args.bnb_4bit_quant_storage}


def quantization_config(config: Any) -> Any | None:
    """transformers' ``BitsAndBytesConfig`` of :func:`quantization_kwargs` (None without a 4-bit base)."""
    kwargs = quantization_kwargs(config)
    if kwargs is None:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**kwargs)


def model_init_kwargs(config: Any) -> dict[str, str] | None:
    """TRL's ``model_init_kwargs`` for a 4-bit base (which TRL loads by name): its compute dtype; else None."""
    return {"dtype": compute_dtype(config)} if config.load_in_4bit else None


def trainer_inputs(config: Any) -> tuple[Any, Any, Any, Any, Any]:
    """``(model, tokenizer, model config, LoraConfig or None, BitsAndBytesConfig or None)`` for the trainer: the model in
    fp32 on the CPU (lr-sized updates vanish in bf16 weights), or with ``load_in_4bit`` its checked name, for TRL to
    load in 4 bits; the tokenizer pads with its end token where it has no pad token."""
    adapter, quantization = lora_config(config), quantization_config(config)
    if not config.load_in_4bit:
        model, tokenizer = load_model_and_tokenizer(config.model, device="cpu", dtype="float32")
        model_config = model.config
    else:
        from transformers import AutoConfig, AutoTokenizer

        model = resolve_model(config.model)
        if (Path(model) / MANIFEST_NAME).is_file():
            verify_model_dir(model)
        if Path(model).is_dir():
            require_safetensors(model)
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
        model_config = AutoConfig.from_pretrained(model, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, model_config, adapter, quantization


def peft_name_to_base(name: str) -> str:
    """A PEFT-wrapped parameter's name in the base model (``base_model.model.`` and ``.base_layer`` dropped)."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def merge_into(base_model: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Merge the adapter into a fresh fp32 copy of the base and save the plain model to ``out_dir`` (merging inside the
    trainer would round its frozen weights: ``W + BA − BA`` is not ``W`` in floating point)."""
    from peft import PeftModel

    base, _ = load_model_and_tokenizer(str(base_model), device="cpu", dtype="float32")
    merged = PeftModel.from_pretrained(base, str(adapter_dir), trust_remote_code=False).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    return Path(out_dir)


@dataclass(frozen=True)
class WeightChange:
    """Which tensors differ between two snapshots of a model (compared bit for bit)."""

    changed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def of(self, names: set[str]) -> tuple[int, int]:
        """(changed, total) among ``names``."""
        return sum(name in names for name in self.changed), len(names)


def compare(before: Mapping[str, Any], after: Mapping[str, Any]) -> WeightChange:
    """Compare two state dicts by name (``torch.equal``); names present in only one are refused."""
    import torch

    if set(before) != set(after):
        raise ConfigError(f"the snapshots hold different tensors: {sorted(set(before) ^ set(after))[:5]} ...")
    changed = tuple(name for name in before if not torch.equal(before[name].cpu(), after[name].cpu()))
    return WeightChange(changed=changed, unchanged=tuple(name for name in before if name not in changed))


def adapter_names(names: Any) -> set[str]:
    """The names of LoRA adapter tensors among ``names``."""
    return {name for name in names if ADAPTER_MARK in name}


def tensors(model: Any) -> dict[str, Any]:
    """A model's tensors by name (detached; views of the live weights, not copies)."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def folder_tensors(folder: str | Path) -> dict[str, Any]:
    """The tensors of a model folder's ``*.safetensors`` files, by name."""
    from safetensors.torch import load_file

    return {name: tensor for path in sorted(Path(folder).glob("*.safetensors")) for name, tensor in
            load_file(path).items()}


class StartSnapshot(TrainerCallback):
    """Pass to ``train(callbacks=[...])``: a host copy of the model's tensors at the start, for :func:`compare`."""

    tensors: dict[str, Any]

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.tensors = {name: tensor.to("cpu", copy=True) for name, tensor in tensors(model).items()}


def base_of(model: Any, names: Any = None) -> dict[str, Any]:
    """The frozen base tensors of a PEFT model under the base's names; only ``names`` when given (a tied head)."""
    base = {peft_name_to_base(name): tensor for name, tensor in tensors(model).items() if ADAPTER_MARK not in name}
    return base if names is None else {name: base[name] for name in names}
