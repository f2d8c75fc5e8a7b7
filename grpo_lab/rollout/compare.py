"""Side by side: the same prompts through HF ``generate`` and vLLM (``grpo-lab rollout --help``), and the effect of
prefix caching. Timings exclude the engine start and follow one warm-up call; ``--load-format dummy``: random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from grpo_lab import device
from grpo_lab.data import load_split
from grpo_lab.rollout.backends import open_engine
from grpo_lab.rollout.config import RolloutConfig, Sampling
from grpo_lab.rollout.engine import RolloutResult
from grpo_lab.rollout.prompts import Prompt


def eval_prompts(count: int = 32, seed: int = 0) -> list[Prompt]:
    """The first ``count`` chat prompts of the course's eval split (cycled if more are asked for)."""
    rows = load_split("eval")
    return [rows[i % len(rows)]["prompt"] for i in range(seed, seed + count)]


def few_shot_prompts(count: int = 16, shots: int = 3, lang: str = "en") -> list[Prompt]:
    """Long prompts: eval questions, each after its own ``shots`` solved train examples (no shared header)."""
    examples = [r for r in load_split("train") if r["lang"] == lang]
    questions = [r for r in load_split("eval") if r["lang"] == lang][:count]
    prompts = []
    for i, question in enumerate(questions):
        shown = examples[i * shots:(i + 1) * shots]
        header = "\n\n".join(f"{r['prompt'][0]['content']}\n{r['completion']}" for r in shown)
        prompts.append([{"role": "user", "content": f"{header}\n\n{question['prompt'][0]['content']}"}])
    return prompts


def run_backend(backend: str, prompts: Sequence[Prompt], config: RolloutConfig, model: str | None = None,
                warmup: bool = True) -> RolloutResult:
    """Open one engine, warm it up on a few prompts, time one ``generate`` over all prompts, stop it."""
    with open_engine(model, config, backend=backend, prompts=prompts) as engine:
        c = engine.config
        print(f"[{engine.name}] {engine.choice.reason}; engine load {engine.load_s:.1f} s; dtype {c.dtype}, "
              f"max_model_len {c.max_model_len}, max_num_seqs {c.max_num_seqs}, enforce_eager {c.enforce_eager}, "
              f"gpu_memory_utilization {c.gpu_memory_utilization}, hf_batch_size {c.hf_batch_size}", flush=True)
        if warmup:
            engine.generate(list(prompts[:2]), replace(engine.config.sampling, n=1, max_tokens=4))
        return engine.generate(prompts)


def side_by_side(prompts: Sequence[Prompt], config: RolloutConfig, backends: Sequence[str] = ("hf", "vllm"),
                 model: str | None = None) -> dict[str, RolloutResult]:
    """Each backend in turn on the same prompts and settings (one engine at a time, stopped after use)."""
    return {backend: run_backend(backend, prompts, config, model) for backend in backends}


def comparison_table(results: dict[str, RolloutResult]) -> str:
    """One line per backend: load, generate time, new tokens, tokens/s and speed relative to the first."""
    first = next(iter(results.values()))
    lines = [f"{'backend':<8}{'load s':>9}{'generate s':>12}{'new tokens':>12}{'tokens/s':>11}"
             f"{'vs ' + first.backend:>9}"]
    for name, r in results.items():
        lines.append(f"{name:<8}{r.load_s:>9.1f}{r.generate_s:>12.2f}{r.new_tokens:>12,}{r.tokens_per_s:>11,.0f}"
                     f"{r.tokens_per_s / first.tokens_per_s:>8.2f}x")
    return "\n".join(lines)


@dataclass(frozen=True)
class PrefixCacheEffect:
    """The same batch twice on one vLLM engine: with an empty prefix cache, then with the cache warm."""

    cold_s: float
    warm_s: float
    prompt_tokens: int
    new_tokens: int

    @property
    def speedup(self) -> float:
        return self.cold_s / self.warm_s


def ratio_context(machine: Any, params: int) -> str:
    """Why the vLLM / HF ``generate`` ratio looks as it does on ``machine`` for a model of ``params``, in a sentence."""
    size = f"{params / 1e9:.1f} B" if params >= 1e9 else f"{params / 1e6:.{1 if params < 1e7 else 0}f} M"
    if device.is_cpu(machine.kind):
        return (f"On {os.cpu_count()} CPU cores with a model of {size} parameters, both backends are bound by Python "
                f"overhead rather than arithmetic, so the ratio says little about an accelerator.")
    where = f"one {machine.name or machine.kind}"
    if params < 1e9:
        graphs = device.VLLM_GRAPHS[machine.kind]
        return (f"On {where} a model of {size} parameters is too small to keep the device busy: HF generate launches "
                f"its kernels one decode step at a time while vLLM replays them as {graphs} graphs, so the ratio "
                f"measures overhead more than arithmetic.")
    return (f"On {where} a model of {size} parameters gives the device real arithmetic to do, so the ratio is less "
            f"about launch overhead than with a smaller model.")


def prefix_cache_effect(engine, prompts: Sequence[Prompt], sampling: Sampling, repeats: int = 3) -> PrefixCacheEffect:
    """Median time of ``generate`` after ``reset_prefix_cache()`` (cold) vs right after the same call (warm)."""
    cold, warm = [], []
    result = None
    for _ in range(repeats):
        engine.reset_prefix_cache()
        cold.append(engine.generate(prompts, sampling).generate_s)
        result = engine.generate(prompts, sampling)
        warm.append(result.generate_s)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in result.outputs)
    return PrefixCacheEffect(sorted(cold)[len(cold) // 2], sorted(warm)[len(warm) // 2], prompt_tokens,
                             result.new_tokens)


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_lab.rollout``: both backends on a batch of eval prompts; prints tokens/s for each."""
    parser = argparse.ArgumentParser(
        prog="grpo-lab rollout",
        description="HF generate and vLLM side by side on the course's eval prompts; prints tokens/s for each.")
    parser.add_argument("--model", help="model folder or hub id (default: GRPO_LAB_MODEL or the tiny model)")
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated, run in this order")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                        help="dummy: random weights of the model's architecture (speed only)")
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--hf-batch-size", type=int)
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    config = RolloutConfig(n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                           gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
                           hf_batch_size=args.hf_batch_size, enforce_eager=args.enforce_eager,
                           load_format=args.load_format)
    prompts = eval_prompts(args.num_prompts)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    started = time.perf_counter()
    results = side_by_side(prompts, config, backends, args.model)
    print(f"\n{len(prompts)} prompts x n={args.n}, up to {args.max_tokens} new tokens, "
          f"temperature {args.temperature}, weights: {config.load_format}; "
          f"total {time.perf_counter() - started:.0f} s\n")
    print(comparison_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": {k: v for k, v in vars(args).items()},
            "results": {name: {"load_s": r.load_s, "generate_s": r.generate_s, "new_tokens": r.new_tokens,
                               "tokens_per_s": r.tokens_per_s, "sampling": asdict(r.sampling)}
                        for name, r in results.items()}}, indent=2) + "\n", encoding="utf-8")
    return 0
