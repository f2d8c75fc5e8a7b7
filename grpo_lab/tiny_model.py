"""Build the course's default model on the CPU, in minutes: a byte-level BPE tokenizer (every digit its own token), a
randomly initialised Qwen2 of a few million parameters, TRL's ``SFTTrainer`` on the train split, an evaluation, and
``manifest.json`` (recipe, versions, metrics, sha256 of every file).

The recipe can teach a deliberate *slip*: a fraction of the SFT targets of some types use a consistent, plausible
mistake (``grpo_lab.data.SLIPS``). The model then samples both methods, so pass@k is far above greedy accuracy on
those types: where GRPO can raise accuracy by sharpening what the model already samples.

    python -m grpo_lab.tiny_model            # or: grpo-lab build-tiny-model
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.data import SLIPS, SplitConfig, build_split_problems, load_split, to_dataset
from grpo_lab.env import installed_versions
from grpo_lab.errors import ConfigError, DataError
from grpo_lab.evaluation import AccuracyReport, evaluate as evaluate_model
from grpo_lab.models import file_sha256, write_manifest
from grpo_lab.paths import TINY_MODEL_DIR

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
DEFAULT_SLIP_TYPES = ("price_quantity", "unit_conversion")


@dataclass(frozen=True)
class TinyModelRecipe:
    """Every knob of the tiny-model build. The defaults make the shipped model."""

    vocab_size: int = 1024  # the tokenizer's
    # model shape (head_dim = hidden_size / num_attention_heads = 64, which vLLM-CPU attention supports)
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    # supervised fine-tuning
    num_train_epochs: float = 6.0
    learning_rate: float = 5e-4
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    per_device_train_batch_size: int = 32
    max_length: int = 192
    seed: int = 0
    torch_threads: int | None = None  # None: torch's default (OMP_NUM_THREADS)
    # deliberate slip: in `slip_fraction` of the SFT targets of `slip_types`, teach the slip of grpo_lab.data.SLIPS
    slip_types: tuple[str, ...] = DEFAULT_SLIP_TYPES
    slip_fraction: float = 0.5
    slip_seed: int = 0
    # evaluation on the eval split
    eval_num_samples: int = 8
    eval_temperature: float = 1.0
    eval_max_new_tokens: int = 48
    eval_seed: int = 0
    split: SplitConfig = field(default_factory=SplitConfig)

    def __post_init__(self) -> None:
        unknown = [t for t in self.slip_types if t not in SLIPS]
        if unknown:
            raise ConfigError(f"slip_types {unknown} have no slip; choose from {sorted(SLIPS)}")
        if not 0.0 <= self.slip_fraction <= 1.0:
            raise ConfigError(f"slip_fraction must be in [0, 1], got {self.slip_fraction}")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("hidden_size must divide by num_attention_heads, and that by num_key_value_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def slip_statement(self) -> str:
        """One plain sentence about the deliberate slip (or its absence) for the manifest."""
        if not self.slip_types or self.slip_fraction == 0:
            return "None: every SFT target is correct."
        details = "; ".join(f"{t}: {SLIPS[t]}" for t in self.slip_types)
        return (f"DELIBERATE: in {self.slip_fraction:.0%} of the SFT targets of the types {list(self.slip_types)} the "
                f"working and the final answer are consistently wrong ({details}). The dataset answers stay "
                f"correct. This leaves the model sampling both methods (pass@k far above greedy on those types), so "
                f"GRPO with a correctness reward can visibly raise its accuracy there.")


def sft_rows(recipe: TinyModelRecipe = TinyModelRecipe()) -> list[dict[str, Any]]:
    """The train split as SFT pairs, with the recipe's slip applied to an exact fraction of each slip type."""
    problems = build_split_problems(recipe.split)["train"]
    shipped = load_split("train", recipe.split)
    if [p.to_row(f"train-{i:05d}") for i, p in enumerate(problems)] != shipped:
        raise DataError("data/train.jsonl differs from what grpo_lab.data generates; restore it with "
                        "`git checkout -- data/` or run grpo_lab.data.regenerate_splits()")
    rng = random.Random(recipe.slip_seed)
    slipped: set[int] = set()
    for kind in recipe.slip_types:
        indices = [i for i, p in enumerate(problems) if p.type == kind]
        slipped.update(rng.sample(indices, round(recipe.slip_fraction * len(indices))))
    return [{"prompt": [{"role": "user", "content": p.prompt_text()}],
             "completion": [{"role": "assistant", "content": p.completion(slip=i in slipped)}],
             "type": p.type, "slip": i in slipped} for i, p in enumerate(problems)]


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with single-digit tokens and the three chat special tokens, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN,
                                      unk_token=None, bos_token=None, model_max_length=512, padding_side="left")
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.add_special_tokens({"additional_special_tokens": [BOS_TOKEN]})
    return wrapped


def build_model(tokenizer, recipe: TinyModelRecipe):
    """A randomly initialised tiny Qwen2ForCausalLM sized by the recipe."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden_size, intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers, num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads, head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": recipe.rope_theta}, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(recipe.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def supervised_fine_tune(model, tokenizer, rows: list[dict[str, Any]], recipe: TinyModelRecipe,
                         work_dir: Path) -> dict[str, Any]:
    """TRL ``SFTTrainer`` on prompt-completion pairs, loss on the completion only. Returns the train metrics."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(work_dir), num_train_epochs=recipe.num_train_epochs, learning_rate=recipe.learning_rate,
        lr_scheduler_type=recipe.lr_scheduler_type, warmup_steps=recipe.warmup_ratio,
        weight_decay=recipe.weight_decay, per_device_train_batch_size=recipe.per_device_train_batch_size,
        max_length=recipe.max_length, completion_only_loss=True, packing=False, seed=recipe.seed,
        data_seed=recipe.seed, use_cpu=True, bf16=False, save_strategy="no", report_to="none",
        logging_steps=25, dataloader_num_workers=0, gradient_checkpointing=False)
    dataset = to_dataset([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    result = trainer.train()
    return {"train_loss": round(result.training_loss, 4), "global_steps": result.global_step,
            "loss_log": [{"step": e["step"], "loss": round(e["loss"], 4)} for e in trainer.state.log_history
                         if "loss" in e]}


def build_tiny_model(out_dir: str | Path = TINY_MODEL_DIR, recipe: TinyModelRecipe = TinyModelRecipe(),
                     evaluate: bool = True) -> dict[str, Any]:
    """Run the whole build into ``out_dir`` (replaced if it exists) and return the manifest."""
    import torch

    out_dir = Path(out_dir)
    if recipe.torch_threads:
        torch.set_num_threads(recipe.torch_threads)
    timings: dict[str, float] = {}
    started = time.perf_counter()

    rows = sft_rows(recipe)
    texts = [f"user\n{r['prompt'][0]['content']}\nassistant\n{r['completion'][0]['content']}" for r in rows]
    tokenizer = train_tokenizer(texts, recipe.vocab_size)
    model = build_model(tokenizer, recipe)
    parameters = sum(p.numel() for p in model.parameters())
    timings["tokenizer_and_init_s"] = time.perf_counter() - started
    print(f"tokenizer: {len(tokenizer)} tokens; model: {parameters / 1e6:.2f} M parameters; "
          f"SFT on {len(rows)} rows ({sum(r['slip'] for r in rows)} with the deliberate slip)")

    with tempfile.TemporaryDirectory(prefix="tiny-sft-") as work_dir:
        step_started = time.perf_counter()
        sft_metrics = supervised_fine_tune(model, tokenizer, rows, recipe, Path(work_dir))
        timings["sft_s"] = time.perf_counter() - step_started
    model.eval()
    model.config.use_cache = True  # the trainer turns the KV cache off while training

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    report: AccuracyReport | None = None
    if evaluate:  # through the rollout engine, from the saved folder, as every other evaluation
        step_started = time.perf_counter()
        report = evaluate_model(out_dir, load_split("eval", recipe.split), num_samples=recipe.eval_num_samples,
                                temperature=recipe.eval_temperature, max_tokens=recipe.eval_max_new_tokens,
                                seed=recipe.eval_seed).report
        timings["eval_s"] = time.perf_counter() - step_started
        print(report.table())
    timings["total_s"] = time.perf_counter() - started
    split, recipe_info = recipe.split, asdict(recipe)
    recipe_info["split"].pop("data_dir")  # machine-specific path
    versions = installed_versions(["torch", "transformers", "trl", "tokenizers", "datasets"])
    info = {
        "name": TINY_MODEL_DIR.name,
        "description": "Tiny Qwen2 built from scratch by grpo_lab.tiny_model: own byte-level BPE tokenizer, "
                       "random init, TRL SFT on data/train.jsonl (CPU).",
        "rebuild": "python -m grpo_lab.tiny_model  (or: grpo-lab build-tiny-model)",
        "deliberate_slip": recipe.slip_statement(),
        "slip_types": list(recipe.slip_types) if recipe.slip_fraction else [],
        "parameters": parameters, "vocab_size": len(tokenizer),
        "recipe": {**recipe_info, "head_dim": recipe.head_dim},
        "data": {"train": {"rows": len(rows), "sha256": file_sha256(split.path("train"))},
                 "eval": {"rows": split.eval_size, "sha256": file_sha256(split.path("eval"))},
                 "train_seed": split.train_seed, "eval_seed": split.eval_seed,
                 "sft_rows_with_slip": sum(r["slip"] for r in rows)},
        "sft": sft_metrics, "eval": report.to_dict() if report else None,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "machine": {"device": "cpu", "torch_threads": torch.get_num_threads(),
                    "usable_cores": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "versions": {"python": platform.python_version(), **{k: v for k, v in versions.items() if v}},
    }
    write_manifest(out_dir, info)
    return json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tiny default model (CPU, a few minutes).")
    parser.add_argument("--out", type=Path, default=TINY_MODEL_DIR, help="output folder (replaced)")
    parser.add_argument("--slip-types", default=",".join(DEFAULT_SLIP_TYPES),
                        help="comma-separated types that get the deliberate slip; '' for a clean model")
    parser.add_argument("--slip-fraction", type=float, default=TinyModelRecipe.slip_fraction)
    parser.add_argument("--epochs", type=float, default=TinyModelRecipe.num_train_epochs)
    parser.add_argument("--seed", type=int, default=TinyModelRecipe.seed)
    parser.add_argument("--no-eval", action="store_true", help="skip the accuracy measurement")
    args = parser.parse_args(argv)
    recipe = TinyModelRecipe(slip_types=tuple(t for t in args.slip_types.split(",") if t),
                             slip_fraction=args.slip_fraction, num_train_epochs=args.epochs, seed=args.seed)
    manifest = build_tiny_model(args.out, recipe, evaluate=not args.no_eval)
    print(f"wrote {args.out} ({manifest['parameters'] / 1e6:.2f} M parameters, "
          f"{manifest['seconds']['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
