"""The rollout benchmark: HF generate vs vLLM vs vLLM + prefix caching on the write-up's workload, fixed and ragged
lengths, the configs alternating round by round; each config's repeats and each ratio's range over them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tqdm.auto import tqdm

from grpo_lab import device, env
from grpo_lab.rollout import RolloutConfig, Sampling, open_engine
from lab.bench.profiles import (
    CONFIGS,
    PREFIX_OFF_MODES,
    RAGGED_MODES,
    VARIANTS,
    BenchProfile,
    check_choice,
)
from lab.bench.stats import Spread, alternating_orders, median, speedup_range
from lab.bench.workload import draw_lengths, ragged_description

CONFIG_MEANING = {
    "hf": "transformers' model.generate, one padded batch of all sequences (TRL without vLLM)",
    "vllm": "vLLM with no prefix reuse: every sample computes its own prompt",
    "vllm+prefix": "vLLM with prefix caching: the n samples of a prompt share its KV blocks",
}
PREFIX_OFF_MEANING = {
    "salt": ("the same vLLM engine, its prefix cache reset and every sample given its own cache salt, so no "
             "block is reused (one engine start; the cache's hashing cost stays in)"),
    "engine": "a second vLLM engine opened with enable_prefix_caching=False",
}


@dataclass
class Measurement:
    """The timed repeats of one config on one variant."""

    times_s: list[float] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    completion_lengths: list[list[int]] = field(default_factory=list, repr=False)
    """Lengths of the last timed repeat, per prompt (for the roofline)."""
    stopped_share: float = float("nan")
    """Share of completions of the last repeat that ended at the end token."""

    def add(self, result) -> None:
        self.times_s.append(result.generate_s)
        self.new_tokens.append(result.new_tokens)
        self.completion_lengths = [[len(c.token_ids) for c in o.completions] for o in result.outputs]
        finished = [c.finish_reason == "stop" for o in result.outputs for c in o.completions]
        self.stopped_share = sum(finished) / len(finished)

    @property
    def median_s(self) -> float:
        return median(self.times_s)

    @property
    def tokens_per_s(self) -> float:
        """Median over repeats of new tokens / time (robust when token counts differ between repeats)."""
        return median([tokens / seconds for tokens, seconds in zip(self.new_tokens, self.times_s)])

    @property
    def seconds_per_token(self) -> list[float]:
        """Each repeat's time per new token: what a tokens/s ratio compares when token counts differ."""
        return [seconds / tokens for seconds, tokens in zip(self.times_s, self.new_tokens)]

    def as_dict(self) -> dict[str, Any]:
        sequences = sum(len(lengths) for lengths in self.completion_lengths)
        return {"times_s": self.times_s, "median_s": self.median_s, "spread_s": Spread.of(self.times_s).as_dict(),
                "new_tokens": self.new_tokens,
                "tokens_per_s": self.tokens_per_s, "stopped_share": self.stopped_share,
                "mean_completion_tokens": (sum(map(sum, self.completion_lengths)) / sequences) if sequences else None}



class _Contenders:
    """The engines of one rollout benchmark, opened once, and how each config calls them."""

    def __init__(self, model: str, config, prompts, configs: Sequence[str], prefix_off: str):
        self.engines: dict[str, Any] = {}
        self.prefix_off = prefix_off
        self.load_s: dict[str, float] = {}
        try:
            if "hf" in configs:
                self.engines["hf"] = open_engine(model, config, backend="hf", prompts=prompts)
            if "vllm+prefix" in configs or ("vllm" in configs and prefix_off == "salt"):
                self.engines["vllm+prefix"] = open_engine(model, config, backend="vllm", prompts=prompts,
                                                          enable_prefix_caching=True)
            if "vllm" in configs:
                self.engines["vllm"] = (self.engines["vllm+prefix"] if prefix_off == "salt" else
                                        open_engine(model, config, backend="vllm", prompts=prompts,
                                                    enable_prefix_caching=False))
        except BaseException:
            self.stop()
            raise
        self.load_s = {name: engine.load_s for name, engine in self.engines.items()}

    def run(self, name: str, prompts, sampling, lengths):
        engine = self.engines[name]
        if name == "hf":
            return engine.generate(prompts, sampling, lengths=lengths)
        if name == "vllm" and self.prefix_off == "salt":
            with engine.isolated_prefixes():
                return engine.generate(prompts, sampling, lengths=lengths)
        if engine.config.enable_prefix_caching:
            engine.reset_prefix_cache()  # new prompts every GRPO step: no cache carried over between repeats
        return engine.generate(prompts, sampling, lengths=lengths)

    def settings(self) -> dict[str, Any]:
        keep = ("dtype", "max_model_len", "max_num_seqs", "enforce_eager", "gpu_memory_utilization",
                "cpu_kvcache_gib", "enable_prefix_caching", "load_format", "hf_batch_size", "vllm_options",
                "hf_generate_options")
        out = {}
        for name, engine in self.engines.items():
            out[name] = {key: getattr(engine.config, key) for key in keep}
            out[name]["backend"] = engine.choice.reason
        return out

    def stop(self) -> None:
        for engine in {id(e): e for e in self.engines.values()}.values():
            engine.stop()


def rollout_bench(model: str, rows: Sequence[dict], profile: BenchProfile, config, configs: Sequence[str] = CONFIGS,
                  variants: Sequence[str] = VARIANTS, ragged: str = "uniform", prefix_off: str = "salt",
                  progress: bool | None = None) -> dict[str, Any]:
    """Time each config on each variant, alternating, ``profile.warmup`` rounds thrown away, then
    ``profile.repeats`` timed rounds. ``config`` is the :class:`~grpo_lab.rollout.RolloutConfig` for every engine.

    Returns the ``rollout`` block of the results (see :func:`check_results`); each vLLM call starts with an
    empty prefix cache, so prefix caching only shares a prompt among its own ``n`` samples, as in a GRPO step.
    """
    check_choice("configs", configs, CONFIGS)
    check_choice("variants", variants, VARIANTS)
    check_choice("ragged", [ragged], RAGGED_MODES)
    check_choice("prefix_off", [prefix_off], PREFIX_OFF_MODES)
    prompts = [row["prompt"] for row in rows]
    drawn = draw_lengths(len(prompts), profile.step.num_generations, profile.step.max_completion_length) if ragged == "uniform" else None
    plans = {
        "fixed": (Sampling(n=profile.step.num_generations, max_tokens=profile.step.max_completion_length, temperature=config.temperature,
                           seed=config.seed, min_tokens=profile.step.max_completion_length), None),
        "ragged": (Sampling(n=profile.step.num_generations, max_tokens=profile.step.max_completion_length, temperature=config.temperature,
                            seed=config.seed), drawn),
    }
    measurements = {variant: {name: Measurement() for name in configs} for variant in variants}
    rounds = profile.warmup + profile.repeats
    contenders = _Contenders(model, config, prompts, configs, prefix_off)
    try:
        prompt_lengths = [len(p.token_ids) for p in next(iter(contenders.engines.values())).encode(prompts)]
        calls = [(r, variant, name) for r, order in enumerate(alternating_orders(configs, rounds))
                 for variant in variants for name in order]
        show = env.show_progress() if progress is None else progress  # a bar in a terminal, none in a notebook
        for r, variant, name in tqdm(calls, desc="rollout bench", disable=not show):
            sampling, lengths = plans[variant]
            result = contenders.run(name, prompts, sampling, lengths)
            if r >= profile.warmup:
                measurements[variant][name].add(result)
        settings, load_s = contenders.settings(), contenders.load_s
    finally:
        contenders.stop()

    out_variants = {}
    for variant in variants:
        sampling, lengths = plans[variant]
        results = {name: m.as_dict() for name, m in measurements[variant].items()}
        base = results.get("hf", {}).get("tokens_per_s")
        out_variants[variant] = {
            "lengths": (f"every completion exactly {profile.step.max_completion_length} tokens (min_tokens = max_tokens)"
                        if variant == "fixed" else ragged_description(ragged, profile.step.max_completion_length)),
            "sampling": asdict(sampling),
            "configs": results,
            "speedup_vs_hf": ({name: r["tokens_per_s"] / base for name, r in results.items() if name != "hf"}
                              if base else {}),
            "speedup_range": ({name: speedup_range(measurements[variant]["hf"].seconds_per_token,
                                                   m.seconds_per_token, interleaved=True).as_dict()
                               for name, m in measurements[variant].items() if name != "hf"} if base else {}),
            "_lengths": {name: m.completion_lengths for name, m in measurements[variant].items()},
        }
    return {
        "workload": {"num_prompts": len(prompts), "n": profile.step.num_generations, "max_tokens": profile.step.max_completion_length,
                     "prompt_tokens_target": profile.prompt_tokens, "prompt_tokens_min": min(prompt_lengths),
                     "prompt_tokens_mean": sum(prompt_lengths) / len(prompt_lengths),
                     "prompt_tokens_max": max(prompt_lengths), "temperature": config.temperature,
                     "ragged": ragged},
        "method": (f"{profile.warmup} warm-up round(s) thrown away, then {profile.repeats} timed rounds; in each "
                   f"round every variant runs every config, the config order rotating by one per round; median "
                   f"reported; the prefix cache is emptied before every vLLM call"),
        "configs": {name: CONFIG_MEANING[name] for name in configs},
        "prefix_off": PREFIX_OFF_MEANING[prefix_off] if "vllm" in configs else None,
        "settings": settings,
        "load_s": load_s,
        "variants": out_variants,
        "_prompt_lengths": prompt_lengths,
    }


def bench_engine_config(profile: BenchProfile, kind: str, dummy: bool,
                        overrides: dict[str, Any] | None = None) -> tuple[Any, list[str]]:
    """The :class:`~grpo_lab.rollout.RolloutConfig` every engine of the rollout bench shares, and notes saying
    which defaults the bench chose differently from the rollout module and why (``overrides`` win)."""
    overrides = dict(overrides or {})
    notes = []
    # seed=None: vLLM seeds its engine once; per-request seeds would put its sampler on a slow per-request path
    values: dict[str, Any] = {"n": profile.step.num_generations, "max_tokens": profile.step.max_completion_length, "temperature": 1.0, "seed": None,
                              "load_format": "dummy" if dummy else "auto"}
    for name, engine_name in (("max_num_seqs", "vLLM"), ("hf_batch_size", "HF generate")):
        if name not in overrides:
            values[name] = profile.sequences
            notes.append(f"{name}={profile.sequences}: {engine_name} holds all {profile.sequences} sequences at once")
    options = dict(overrides.pop("vllm_options", {}))
    if device.is_cpu(kind) and "block_size" not in options:
        options["block_size"] = 32
        notes.append("vLLM-CPU block_size=32 (its default 128 would cache nothing of a ~128-token prompt: only full "
                     "blocks are cached and the last prompt token is always recomputed; 32 is the smallest the CPU "
                     "attention kernel takes)")
    return RolloutConfig(**values, vllm_options=options, **overrides), notes


def without_internals(rollout: dict[str, Any]) -> dict[str, Any]:
    """The rollout block without the per-sequence lengths kept for the roofline (they would bloat the JSON)."""
    out = {k: v for k, v in rollout.items() if not k.startswith("_")}
    out["variants"] = {name: {k: v for k, v in block.items() if not k.startswith("_")}
                       for name, block in rollout["variants"].items()}
    return out
