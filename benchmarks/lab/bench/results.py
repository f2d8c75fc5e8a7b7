"""A bench run's results: the schema and its check, the text summary, and the JSON + plot files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from lab.bench.grpo_step import bottleneck
from lab.bench.plots import plot_bench
from lab.bench.roofline import DeviceRates
from lab.bench.stats import RatioRange, Spread, median, paired_ratios, speedup_range

SCHEMA = "grpo-lab.bench/1"
"""The results files' schema (``results["schema"]``)."""


REQUIRED_KEYS = {
    "": ("schema", "created", "command", "profile", "model", "environment", "load_average", "parts", "notes"),
    "model": ("path", "weights", "dtype", "params"),
    "rollout": ("workload", "method", "configs", "settings", "load_s", "variants"),
    "rollout.variant": ("lengths", "sampling", "configs", "speedup_vs_hf"),
    "rollout.config": ("times_s", "median_s", "new_tokens", "tokens_per_s"),
    "grpo_step": ("backends", "method", "completions_per_step"),
    "grpo_step.backend": ("backend", "step_s", "generation_s", "reward_s", "update_s", "median"),
    "roofline": ("device", "model_cost"),
}


def check_results(results: dict[str, Any]) -> dict[str, Any]:
    """Raise ValueError naming every missing key of a results dict (or JSON file's content); return it."""
    missing = [key for key in REQUIRED_KEYS[""] if key not in results]
    if results.get("schema") not in (None, SCHEMA):
        missing.append(f"schema {SCHEMA!r} (found {results.get('schema')!r})")
    missing += [f"model.{k}" for k in REQUIRED_KEYS["model"] if k not in results.get("model", {})]
    rollout = results.get("rollout")
    if rollout is not None:
        missing += [f"rollout.{k}" for k in REQUIRED_KEYS["rollout"] if k not in rollout]
        for variant, block in rollout.get("variants", {}).items():
            missing += [f"rollout.variants.{variant}.{k}" for k in REQUIRED_KEYS["rollout.variant"] if k not in block]
            for name, result in block.get("configs", {}).items():
                missing += [f"rollout.variants.{variant}.configs.{name}.{k}"
                            for k in REQUIRED_KEYS["rollout.config"] if k not in result]
    step = results.get("grpo_step")
    if step is not None and "skipped" not in step:
        missing += [f"grpo_step.{k}" for k in REQUIRED_KEYS["grpo_step"] if k not in step]
        for name, block in step.get("backends", {}).items():
            missing += [f"grpo_step.backends.{name}.{k}" for k in REQUIRED_KEYS["grpo_step.backend"] if k not in block]
    if results.get("roofline") is not None:
        missing += [f"roofline.{k}" for k in REQUIRED_KEYS["roofline"] if k not in results["roofline"]]
    if missing:
        raise ConfigError(f"benchmark results are missing: {', '.join(missing)}")
    return results



def summary(results: dict[str, Any]) -> str:
    """The results as text tables: rollout times, ratios and roofline; GRPO step split; device rates."""
    lines = []
    model = results["model"]
    lines.append(f"model: {model['path']}, {model['params'] / 1e6:,.1f} M parameters, {model['dtype']}, "
                 f"weights {model['weights'].upper()}")
    roof = results.get("roofline")
    if roof:
        lines.append("device: " + DeviceRates(**roof["device"]).describe())
    rollout = results.get("rollout")
    if rollout:
        w = rollout["workload"]
        lines.append(f"\nrollout: {w['num_prompts']} prompts x n={w['n']}, prompts {w['prompt_tokens_min']}-"
                     f"{w['prompt_tokens_max']} tokens (target {w['prompt_tokens_target']}), up to {w['max_tokens']} "
                     f"new tokens, T={w['temperature']}")
        lines.append(f"  {rollout['method']}")
        head = (f"  {'variant':<8}{'config':<13}{'median s':>10}{'min..max s':>14}{'new tok':>9}{'tok/s':>10}"
                f"{'vs hf':>8}{'range':>14}")
        lines.append(head + (f"{'roofline s':>12}{'x roofline':>12}" if roof else ""))
        for variant, block in rollout["variants"].items():
            for name, r in block["configs"].items():
                ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
                bounds = block.get("speedup_range", {}).get(name)
                span = f"{bounds['low']:.2f}..{bounds['high']:.2f}x" if bounds else ""
                line = (f"  {variant:<8}{name:<13}{r['median_s']:>10.2f}{_span(r['times_s']):>14}"
                        f"{median(r['new_tokens']):>9,.0f}{r['tokens_per_s']:>10,.0f}{ratio:>7.2f}x{span:>14}")
                if "roofline" in r:
                    line += f"{r['roofline']['seconds']:>12.3f}{r['x_roofline_time']:>11.1f}x"
                lines.append(line)
        for variant, block in rollout["variants"].items():
            lines.append(f"  {variant}: {block['lengths']}")
    step = results.get("grpo_step")
    if step and "skipped" not in step:
        lines.append(f"\nGRPO step ({step['completions_per_step']} completions): {step['method']}")
        lines.append(f"  {'backend':<8}{'step s':>9}{'min..max':>14}{'generation':>12}{'reward':>9}{'update':>9}"
                     f"{'gen tok/s':>11}{'train samples/s':>17}  bound")
        for name, block in step["backends"].items():
            m, b = block["median"], block.get("bottleneck") or bottleneck({**block, "completions_per_step":
                                                                           step["completions_per_step"]})
            lines.append(f"  {name:<8}{m['step_s']:>9.2f}{_span(block['step_s']):>14}"
                         f"{m['generation_s']:>12.2f}{m['reward_s']:>9.3f}"
                         f"{m['update_s']:>9.2f}{b['generation_tokens_per_s']:>11,.0f}"
                         f"{b['training_samples_per_s']:>17,.1f}  {b['verdict']}")
        lines.append(f"  workload: {step.get('workload', 'fixed')}: {step.get('lengths', '')}")
        lines.append("  split (median s): " + "; ".join(
            f"{name}: " + ", ".join(f"{key.removesuffix('_s')} {value:.2f}" for key, value in block["median"].items()
                                    if key.endswith("_s") and key != "step_s")
            for name, block in step["backends"].items()))
        for name, block in step["backends"].items():
            if "mfu" in block:
                u = block["mfu"]
                lines.append(f"  {name} update: {_flop(u['update_tflop'] * 1e12)} of model FLOPs in "
                             f"{block['median']['update_s']:.2f} s = {_flop(u['update_tflop_per_s'] * 1e12)}/s, MFU "
                             f"{u['mfu']:.1%} of {_flop(u['peak_tflop_per_s'] * 1e12)}/s")
        for name, block in step["backends"].items():
            if block.get("host"):
                h = {key: median(values) for key, values in block["host"].items() if values}
                lines.append(f"  {name} host per step (median): CPU {h['host_cpu_s']:.2f} s over all threads, "
                             f"garbage collection {h['gc_pause_s']:.3f} s, "
                             f"{h['driver_allocations']:.0f} device allocations from the driver")
        if "fresh_engine" in step:
            f = step["fresh_engine"]
            lines.append(f"  vLLM generate in the trainer vs the same engine in a fresh process: "
                         f"{f['in_trainer_vs_fresh']:.2f}x (fresh {f['median_s']:.2f} s)")
        if "speedup_vs_hf" in step:
            lines.append(f"  step speed-up with vLLM colocate: {step_ratio(step).describe()}")
    elif step:
        lines.append(f"\nGRPO step: skipped ({step['skipped']})")
    lines += [f"note: {note}" for note in results["notes"]]
    return "\n".join(lines)


def step_ratio(step: dict[str, Any]) -> RatioRange:
    """HF step time over vLLM colocate step time in a ``grpo_step`` block, with its range; files written before the
    backends were interleaved (no ``interleaved`` key) count as not interleaved."""
    hf, vllm = step["backends"]["hf"]["step_s"], step["backends"]["vllm"]["step_s"]
    return speedup_range(hf, vllm, interleaved=bool(step.get("interleaved")))


def paired_step_ratios(step: dict[str, Any]) -> Spread | None:
    """HF step time over vLLM colocate step time round by round (:func:`~lab.bench.stats.paired_ratios`), for a
    ``grpo_step`` block whose backends alternated; ``None`` for one whose did not."""
    if not step.get("interleaved"):
        return None
    return paired_ratios(step["backends"]["hf"]["step_s"], step["backends"]["vllm"]["step_s"])


def _span(values: list[float]) -> str:
    spread = Spread.of(values)
    return f"{spread.min:.2f}..{spread.max:.2f}"


def _flop(value: float) -> str:
    """FLOPs with the prefix that keeps the number readable: 3.2 GFLOP, 41 TFLOP."""
    scale, prefix = next(((s, p) for s, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")) if value >= s),
                         (1.0, ""))
    return f"{value / scale:,.3g} {prefix}FLOP"


def save_results(results: dict[str, Any], out_dir: str | Path, stem: str = "bench") -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.png`` (the bar plots) into ``out_dir``; return both paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, png_path = folder / f"{stem}.json", folder / f"{stem}.png"
    json_path.write_text(json.dumps(check_results(results), indent=1, default=str) + "\n", encoding="utf-8")
    plot_bench(results).savefig(png_path, dpi=110)
    return json_path, png_path


def load_results(path: str | Path) -> dict[str, Any]:
    """A results file written by :func:`save_results`, checked."""
    return check_results(json.loads(Path(path).read_text(encoding="utf-8")))

