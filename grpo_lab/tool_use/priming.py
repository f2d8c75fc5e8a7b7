"""The priming: a short supervised fine-tune on tool-call traces (:mod:`.traces`) through TRL's ``SFTTrainer``."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo_lab import device, runs
from grpo_lab.data import to_dataset
from grpo_lab.errors import ConfigError
from grpo_lab.models import load_model_and_tokenizer, read_manifest, write_manifest
from grpo_lab.tool_use.traces import priming_rows
from grpo_lab.tools import calculator, use_tool_template

TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Qwen2.5's tool-format tokens: one token per tag where a byte-level vocabulary spells it out in a dozen."""


@dataclass(frozen=True)
class PrimingConfig:
    """The supervised priming (TRL's ``SFTConfig`` names where they exist)."""

    num_train_rows: int = 400
    tool_share: float = 0.5
    """Share of the traces with the tool offered that call it; the others answer directly."""
    plain_share: float = 0.2
    """Share of the traces without the tool offered: its accuracy without the tool stays a fair comparison."""
    num_train_epochs: float = 1.0
    learning_rate: float = 1e-3
    lr_scheduler_type: str = "constant"
    per_device_train_batch_size: int = 8
    max_length: int = 320
    add_tool_tokens: bool = True
    """Add the :data:`TOOL_TOKENS` the tokenizer lacks."""
    seed: int = 0


@dataclass
class PrimedModel:
    """A primed model folder: weights, the tool chat template, TRL's parser as ``response_template``, a manifest."""

    path: Path
    seconds: float
    train_loss: float
    steps: int
    traces: int
    calling_traces: int
    loss_log: list[dict[str, float]]
    """``{"step", "loss"}`` every 10 steps."""
    config: dict[str, Any]
    """The :class:`PrimingConfig` it ran and the tokens it added."""


def add_tool_tokens(model: Any, tokenizer: Any) -> list[str]:
    """Add the :data:`TOOL_TOKENS` ``tokenizer`` lacks, each with embedding (and output) rows at the mean of the
    others; return the tokens added."""
    missing = [token for token in TOOL_TOKENS if token not in tokenizer.get_vocab()]
    if missing and tokenizer.add_tokens(missing):
        embeddings = model.resize_token_embeddings(len(tokenizer), mean_resizing=False).weight
        embeddings.data[-len(missing):] = embeddings.data[:-len(missing)].mean(dim=0)
        head = model.get_output_embeddings()
        if head is not None and head.weight is not embeddings:
            head.weight.data[-len(missing):] = head.weight.data[:-len(missing)].mean(dim=0)
    return missing


def prime(model: str | Path, rows: Sequence[dict[str, Any]], out_dir: str | Path,
          config: PrimingConfig = PrimingConfig()) -> PrimedModel:
    """Fine-tune ``model`` on :func:`priming_rows` of ``rows`` with TRL's ``SFTTrainer`` (loss on the assistant's
    tokens only: the tool's answers are context, as in GRPO); save it to ``out_dir`` (replaced) with the tool
    template, TRL's parser and a manifest."""
    import datasets
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import get_json_schema
    from trl import SFTConfig, SFTTrainer

    if len(rows) < config.num_train_rows:
        raise ConfigError(f"{len(rows)} rows, but the priming asks for {config.num_train_rows}: pass more rows or "
                          f"lower PrimingConfig.num_train_rows")
    out_dir, started, kind = Path(out_dir), time.perf_counter(), device.detect()
    model_obj, tokenizer = load_model_and_tokenizer(str(model), device="cpu", dtype="float32")
    use_tool_template(tokenizer)
    added = add_tool_tokens(model_obj, tokenizer) if config.add_tool_tokens else []
    examples = priming_rows(rows[:config.num_train_rows], config.tool_share, config.plain_share, config.seed)
    schema = json.dumps([get_json_schema(calculator)])
    work = out_dir.parent / f".{out_dir.name}.sft"
    args = SFTConfig(output_dir=str(work), num_train_epochs=config.num_train_epochs,
                     learning_rate=config.learning_rate, lr_scheduler_type=config.lr_scheduler_type,
                     per_device_train_batch_size=config.per_device_train_batch_size, max_length=config.max_length,
                     assistant_only_loss=True, packing=False, seed=config.seed, data_seed=config.seed,
                     use_cpu=device.is_cpu(kind), bf16=device.is_accelerator(kind) and device.bf16_supported(kind),
                     save_strategy="no", report_to="none", logging_steps=10, dataloader_num_workers=0,
                     gradient_checkpointing=False, disable_tqdm=True)
    progress = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # while TRL tokenizes
    try:
        dataset = to_dataset([{**example, "tools": schema if example["tools"] else "[]"} for example in examples])
        trainer = SFTTrainer(model=model_obj, args=args, train_dataset=dataset, processing_class=tokenizer)
    finally:
        if progress:
            datasets.enable_progress_bars()
    trainer.remove_callback(PrinterCallback)  # the loss goes to the record, not to the output
    result = trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    shutil.rmtree(work, ignore_errors=True)
    calling = sum(len(example["completion"]) > 1 for example in examples)
    loss_log = [{"step": e["step"], "loss": round(e["loss"], 4)} for e in trainer.state.log_history if "loss" in e]
    base = read_manifest(model)
    write_manifest(out_dir, {
        "name": out_dir.name, "base_model": Path(str(model)).name,
        "description": f"{Path(str(model)).name} primed for calculator calls by grpo_lab.tool_use.prime ({calling} of "
                       f"{len(examples)} traces call it)",
        "languages": list(base.languages) if base else [],
        "priming": {**asdict(config), "added_tokens": added, "train_loss": round(result.training_loss, 4),
                    "global_steps": result.global_step, "loss_log": loss_log}})
    runs.record_use(out_dir, "primed")
    return PrimedModel(out_dir, time.perf_counter() - started, result.training_loss, result.global_step,
                       len(examples), calling, loss_log, {**asdict(config), "added_tokens": added})
