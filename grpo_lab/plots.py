"""Plot helpers for the course; each returns a matplotlib Figure."""

from __future__ import annotations

__all__ = [
    "plot_accuracy_before_after", "plot_async_tradeoff", "plot_group_advantages", "plot_load_test",
    "plot_memory_budget", "plot_memory_budgets", "plot_prefix_cache_effect", "plot_reward_components",
    "plot_rollout_throughput", "plot_timeline", "plot_training_curves",
]

import itertools
import math
from collections.abc import Sequence

from matplotlib.figure import Figure

from grpo_lab.errors import DataError

_POSITIVE, _NEGATIVE, _NEUTRAL = "#2a9d4b", "#d1495b", "#9aa0a6"


def plot_group_advantages(result, labels: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """An ``Advantages``' rewards and group means (left), advantages coloured by sign (right), groups dotted apart."""
    n, G = len(result.rewards), result.num_generations
    labels = list(labels) if labels is not None else [f"g{i // G}·c{i % G}" for i in range(n)]
    fig = Figure(figsize=(max(6.0, 1.1 * n + 3), 3.4), layout="constrained")
    ax_r, ax_a = fig.subplots(1, 2)
    x = range(n)
    ax_r.bar(x, [0.0 if math.isnan(r) else r for r in result.rewards], color="#4c78a8")  # NaN: unscorable
    for g in range(0, n, G):
        span = (g - 0.4, g + G - 0.6)
        label = "group mean" if g == 0 else None
        ax_r.hlines(result.group_mean[g], *span, colors="black", linestyles="--", label=label)
        if g:
            for ax in (ax_r, ax_a):
                ax.axvline(g - 0.5, color="#cccccc", linestyle=":")
    finite = [r for r in result.rewards if not math.isnan(r)] or [0.0]
    low, high = min(0.0, *finite), max(0.0, *finite)
    ax_r.set_ylim(low - 0.05 * (high - low or 1), high + 0.3 * (high - low or 1))  # room for the legend
    ax_r.set_title("reward per completion")
    ax_r.legend(loc="upper left", fontsize=8)
    ax_a.bar(x, result.advantages, color=[_POSITIVE if a > 1e-9 else _NEGATIVE if a < -1e-9 else _NEUTRAL
                                          for a in result.advantages])
    ax_a.axhline(0.0, color="black", linewidth=0.8)
    for i, a in enumerate(result.advantages):
        ax_a.annotate(f"{a:+.2f}", (i, a), ha="center", va="bottom" if a >= 0 else "top", fontsize=8)
    ax_a.margins(y=0.15)
    ax_a.set_title(f"advantage (scale_rewards={result.scale_rewards!r})")
    for ax in (ax_r, ax_a):
        ax.set_xticks(list(x), labels, rotation=30 if n > 6 else 0, fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_reward_components(table, labels: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """A ``RewardTable``'s weighted rewards per completion (a bar per function, None as 0), total as a black dot."""
    n, k = len(table.values), len(table.names)
    labels = list(labels) if labels is not None else [f"#{i}" for i in range(n)]
    fig = Figure(figsize=(max(6.0, 0.9 * n * max(k, 2) / 2 + 3), 3.4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / k
    for j, (name, weight) in enumerate(zip(table.names, table.weights)):
        heights = [0.0 if row[j] is None else row[j] * weight for row in table.values]
        ax.bar([i - 0.4 + width * (j + 0.5) for i in range(n)], heights, width, label=f"{name} × {weight:g}")
    ax.scatter(range(n), [0.0 if t is None else t for t in table.totals], color="black", zorder=3, label="total")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(n), labels, fontsize=8)
    ax.set_ylabel("weighted reward")
    ax.legend(loc="best", fontsize=8)
    ax.set_title(title or "reward components per completion")
    return fig


def _series(records: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records if key in r and r[key] is not None and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def _smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (the raw per-step GRPO numbers are noisy)."""
    sums = [0.0, *itertools.accumulate(values)]
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


_CURVE_PANELS = {  # the panels after the reward's, by (row, column): title, lines (metric, label, colour)
    (0, 1): ("KL and entropy", [("kl", "KL to reference", "#d1495b"), ("entropy", "entropy (nats/token)", "#2a9d4b")]),
    (0, 2): ("completion length (tokens)", [("completions/mean_length", "mean completion tokens", "#6f4e7c")]),
    (1, 0): ("fractions", [("clip_ratio/region_mean", "PPO clip ratio", "#e07a1f"),
                           ("completions/clipped_ratio", "truncated completions", "#9aa0a6"),
                           ("frac_reward_zero_std", "groups with zero reward std", "#2b2d42")]),
    (1, 1): ("seconds per step", [("timing/generation_s", "generation", "#4c78a8"),
                                  ("timing/update_s", "update (log-probs, backward, optimizer)", "#e07a1f"),
                                  ("timing/reward_s", "rewards", "#2a9d4b")]),
    (1, 2): ("loss", [("loss", "loss", "#2b2d42")]),
}


def plot_training_curves(records: Sequence[dict], title: str | None = None, smooth: int | None = None) -> Figure:
    """Six panels from a GRPO run's per-step records: reward, KL and entropy, completion length, clip ratios, the
    step's time split, loss. Thin lines per step, thick a trailing mean over ``smooth`` steps (default: a twentieth)."""
    fig = Figure(figsize=(13, 6.4), layout="constrained")
    axes = fig.subplots(2, 3)
    window = smooth or max(1, len(records) // 20)

    def line(ax, key, label, color=None, width=1.8):
        steps, values = _series(records, key)
        if not steps:
            return False
        ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
        ax.plot(steps, _smooth(values, window), color=color, linewidth=width, label=label)
        return True

    ax = axes[0, 0]
    steps, reward = _series(records, "reward")
    _, std = _series(records, "reward_std")
    if line(ax, "reward", "total reward", "#4c78a8", 2.0) and len(std) == len(steps):
        mean, spread = _smooth(reward, window), _smooth(std, window)
        ax.fill_between(steps, [m - s for m, s in zip(mean, spread)], [m + s for m, s in zip(mean, spread)],
                        color="#4c78a8", alpha=0.12, label="± std in batch")
    names = sorted({k.split("/")[1] for r in records for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    if len(names) > 1:
        for name in names:
            line(ax, f"rewards/{name}/mean", name)
    ax.set_title("reward")
    ax.legend(loc="best", fontsize=8)
    for (row, column), (name, lines) in _CURVE_PANELS.items():
        ax = axes[row, column]
        if sum(line(ax, *spec) for spec in lines) and len(lines) > 1:
            ax.legend(loc="best", fontsize=8)
        ax.set_title(name)
    axes[1, 0].set_ylim(-0.02, 1.02)
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.grid(alpha=0.25)
    fig.suptitle(title or f"GRPO training ({len(records)} logged steps)")
    return fig


def plot_accuracy_before_after(before, after, metric: str = "sampled_pass_at_1", trained_types: Sequence[str] = (),
                               title: str | None = None) -> Figure:
    """Per-type accuracy before and after training (``grpo_lab.evaluation.AccuracyReport`` objects); ``metric`` is
    ``greedy``, ``sampled_pass_at_1`` or ``pass_at_k``; types trained on are marked with ``*``."""
    kinds = sorted(set(before.per_type) | set(after.per_type))
    labels = [f"{k}*" if k in trained_types else k for k in kinds]
    fig = Figure(figsize=(max(6.0, 0.9 * len(kinds) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    x = range(len(kinds))
    old = [before.per_type.get(k, {}).get(metric, 0.0) * 100 for k in kinds]
    new = [after.per_type.get(k, {}).get(metric, 0.0) * 100 for k in kinds]
    ax.bar([i - 0.2 for i in x], old, 0.4, color="#9aa0a6", label="before")
    ax.bar([i + 0.2 for i in x], new, 0.4, color="#2a9d4b", label="after")
    for i, (a, b) in enumerate(zip(old, new)):
        ax.annotate(f"{b - a:+.0f}", (i + 0.2, b), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=f"{metric.replace('_', ' ')} (%)", ylim=(0, 105))
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title or f"held-out {metric.replace('_', ' ')} per type (* = trained on)")
    return fig


def plot_rollout_throughput(results, title: str | None = None) -> Figure:
    """Generated tokens per second for each backend (``{name: RolloutResult}``), with the ratio to the first."""
    names = list(results)
    speeds = [results[name].tokens_per_s for name in names]
    fig = Figure(figsize=(max(4.0, 1.6 * len(names) + 1.5), 3.4), layout="constrained")
    ax = fig.subplots()
    palette = {"hf": "#9aa0a6", "vllm": "#2a6fdb"}
    ax.bar(names, speeds, color=[palette.get(name, "#2a9d4b") for name in names], width=0.6)
    for i, speed in enumerate(speeds):
        ax.annotate(f"{speed:,.0f} tok/s\n{speed / speeds[0]:.2f}x", (i, speed), ha="center", va="bottom", fontsize=8)
    ax.set(ylim=(0, max(speeds) * 1.3), ylabel="new tokens / s")
    first = results[names[0]]
    ax.set_title(title or f"{len(first.outputs)} prompts x n={first.sampling.n}, "
                          f"up to {first.sampling.max_tokens} tokens")
    return fig


def plot_prefix_cache_effect(effects, title: str | None = None) -> Figure:
    """Cold vs warm prefix cache, one pair of bars per workload (``{label: PrefixCacheEffect}``)."""
    labels = list(effects)
    fig = Figure(figsize=(max(4.2, 2.4 * len(labels) + 1), 3.4), layout="constrained")
    ax = fig.subplots()
    x = range(len(labels))
    cold = [effects[k].cold_s for k in labels]
    warm = [effects[k].warm_s for k in labels]
    ax.bar([i - 0.2 for i in x], cold, 0.4, color="#9aa0a6", label="cold cache (reset)")
    ax.bar([i + 0.2 for i in x], warm, 0.4, color="#2a6fdb", label="warm cache (same prompts again)")
    for i, key in enumerate(labels):
        ax.annotate(f"{effects[key].speedup:.2f}x", (i + 0.2, warm[i]), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set(ylim=(0, max(cold) * 1.3), ylabel="generate time (s)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title or "prefix caching on repeated prompts")
    return fig


_MEMORY_COLORS = {
    "policy weights": "#1f4e79", "AdamW states": "#2e75b6", "reference model": "#5b9bd5", "gradients": "#9dc3e6",
    "activations saved for backward": "#70ad47", "recomputed layer": "#a9d18e", "layer backward buffers": "#c5e0b4",
    "LM-head backward buffers": "#548235", "embedding backward buffers": "#bdd7ee", "autocast weight copies": "#8faadc",
    "cuBLAS workspaces": "#d9d9d9", "vLLM weights": "#c55a11", "vLLM activations": "#f4b183",
    "vLLM runtime (non-torch, CUDA graphs)": "#f8cbad", "vLLM KV cache": "#ed7d31", "runtime margin": "#a6a6a6"}


def _stack(ax, x: float, parts: Sequence[tuple[str, float]], seen: set, width: float = 0.6) -> float:
    bottom = 0.0
    for name, gib in parts:
        if gib <= 0:
            continue
        ax.bar(x, gib, width, bottom=bottom, color=_MEMORY_COLORS.get(name, "#7f7f7f"),
               label=None if name in seen else name, edgecolor="white", linewidth=0.5)
        seen.add(name)
        bottom += gib
    return bottom


def plot_memory_budgets(budgets: Sequence, labels: Sequence[str] | None = None, title: str | None = None) -> Figure:
    """Stacked bars of several ``grpo_lab.memory.MemoryBudget`` (GiB), each device's memory a line above them."""
    labels = list(labels) if labels is not None else [f"{b.vllm_gpu_memory_utilization:.2f}" for b in budgets]
    fig = Figure(figsize=(max(5.5, 1.6 * len(budgets) + 4.5), 4.2), layout="constrained")
    ax = fig.subplots()
    seen: set = set()
    for i, budget in enumerate(budgets):
        total = _stack(ax, i, [(r.component, r.gib) for r in budget.rows], seen)
        device_gib = budget.device_bytes / 2**30
        ax.hlines(device_gib, i - 0.4, i + 0.4, colors="black", linewidth=2)
        verdict = "fits" if budget.fits else "OOM"
        ax.annotate(f"{total:.1f} / {device_gib:.0f} GiB\n{verdict}", (i, max(total, device_gib)), ha="center",
                    va="bottom", fontsize=8, color="black" if budget.fits else "#c00000")
    ax.set_xticks(list(range(len(budgets))), labels, fontsize=8)
    ax.set(ylabel="GiB", ylim=(0, max(max(b.used_bytes, b.device_bytes) for b in budgets) / 2**30 * 1.22))
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    ax.set_title(title or "device memory at the training peak (black line: device)")
    return fig


def plot_memory_budget(budget, title: str | None = None) -> Figure:
    """One plan: the device's memory at the training peak (left) and the trainer's total per phase (right)."""
    fig = Figure(figsize=(9.0, 4.2), layout="constrained")
    ax_device, ax_phases = fig.subplots(1, 2, width_ratios=[1, 1.6])
    seen: set = set()
    total = _stack(ax_device, 0, [(r.component, r.gib) for r in budget.rows], seen, width=0.5)
    device_gib = budget.device_bytes / 2**30
    ax_device.axhline(device_gib, color="black", linewidth=2)
    vllm_floor = sum(r.gib for r in budget.rows if r.side == "training")
    ax_device.axhline(vllm_floor, color="#c55a11", linestyle=":", linewidth=1)
    ax_device.annotate(f"vLLM: {budget.vllm_gpu_memory_utilization:.2f} × {device_gib:.0f} GiB", (0.3, vllm_floor),
                       fontsize=7, va="bottom", color="#c55a11")
    ax_device.set_xticks([0], [f"{total:.1f} / {device_gib:.0f} GiB"], fontsize=8)
    ax_device.set(xlim=(-0.6, 1.2), ylim=(0, max(total, device_gib) * 1.15), ylabel="GiB")
    ax_device.set_title("fits" if budget.fits else "does NOT fit", color="black" if budget.fits else "#c00000")
    phases = list(budget.phases)
    for i, phase in enumerate(phases):
        gib = budget.phases[phase] / 2**30
        ax_phases.bar(i, gib, 0.6, color="#2e75b6" if phase == budget.peak_phase else "#9dc3e6")
        ax_phases.annotate(f"{gib:.1f}", (i, gib), ha="center", va="bottom", fontsize=8)
    ax_phases.set_xticks(list(range(len(phases))), [p.replace(" ", "\n", 1) for p in phases], fontsize=8)
    ax_phases.set_ylim(0, max(budget.phases.values()) / 2**30 * 1.2)
    ax_phases.set_title("trainer's memory per phase of a step (dark: peak)", fontsize=9)
    ax_device.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize=7, frameon=False, ncol=2)
    fig.suptitle(title or f"{budget.model.name}, {budget.precision.name}, micro-batch "
                          f"{budget.shape.per_device_train_batch_size}, {budget.shape.sequence_length} tokens")
    return fig


def plot_load_test(records: Sequence[dict], title: str | None = None) -> Figure:
    """Throughput (tokens/s, dashed: requests/s) and p99 latency (end-to-end, first token) against concurrent
    clients, one colour per ``label``, from ``LoadResult.record()`` rows; runs with errors are ringed in red."""
    if not records:
        raise DataError("no load-test records to plot")
    fig = Figure(figsize=(10.0, 3.6), layout="constrained")
    ax_t, ax_l = fig.subplots(1, 2)
    ax_r = ax_t.twinx()
    labels = list(dict.fromkeys(r.get("label") or r.get("workload", "") for r in records))
    for label in labels:
        rows = sorted((r for r in records if (r.get("label") or r.get("workload", "")) == label),
                      key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in rows]
        line, = ax_t.plot(x, [r["output_tokens_per_s"] for r in rows], "o-", label=f"{label}: tokens/s")
        color = line.get_color()
        ax_r.plot(x, [r["requests_per_s"] for r in rows], "s--", color=color, alpha=0.6, label=f"{label}: requests/s")
        ax_l.plot(x, [r["e2e_p99_ms"] for r in rows], "o-", color=color, label=f"{label}: end-to-end")
        ax_l.plot(x, [r["ttft_p99_ms"] for r in rows], "^:", color=color, label=f"{label}: first token")
        failed = [r for r in rows if r["errors"]]
        ax_l.scatter([r["concurrency"] for r in failed], [r["e2e_p99_ms"] for r in failed], s=160,
                     facecolors="none", edgecolors="#d1495b", label="had errors" if failed else None)
    clients = sorted({r["concurrency"] for r in records})
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_r.set_ylim(bottom=0)
    handles = [h for ax in (ax_t, ax_r) for h in ax.get_legend_handles_labels()[0]]
    ax_t.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="lower right")
    ax_l.legend(fontsize=7, loc="upper left")
    ax_t.set(ylabel="output tokens / s", title="throughput")
    ax_r.set_ylabel("requests / s")
    ax_l.set(ylabel="p99 latency (ms)", title="p99 latency")
    first = records[0]
    server = first.get("server", {})
    fig.suptitle(title or f"{server.get('model', '')} on {server.get('device', '')}: {first.get('workload')} "
                          f"workload, up to {first.get('max_tokens')} tokens per answer", fontsize=10)
    return fig


_PHASE_COLORS = {"generate": "#4c78a8", "generate (weights pushed meanwhile)": "#4c78a8", "update": "#e07a1f",
                 "wait for completions": "#d9d9d9", "idle": "#f2f2f2", "weight sync": "#d1495b",
                 "paused for the weight sync": "#f4a3ad", "rewards, batching, logging": "#9aa0a6",
                 "queue full: generation waits": "#bdd7ee"}


def plot_timeline(spans: Sequence, title: str | None = None) -> Figure:
    """Gantt bars of steps: one panel per ``span.panel``, one row per ``span.lane``, coloured by ``span.label``
    (``label == "step"``: a dotted boundary); the panels share the time axis."""
    panels = list(dict.fromkeys(s.panel for s in spans))
    fig = Figure(figsize=(12, 1.2 + 1.5 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    seen: set = set()
    for ax, panel in zip(axes, panels):
        mine = [s for s in spans if s.panel == panel]
        lanes = list(dict.fromkeys(s.lane for s in mine if s.label != "step"))
        for s in mine:
            if s.label == "step":
                ax.axvline(s.start, color="black", linestyle=":", linewidth=0.8)
                ax.annotate(s.lane, (s.start, len(lanes) - 0.45), fontsize=7, ha="left", va="bottom")
                continue
            ax.barh(lanes.index(s.lane), s.seconds, left=s.start, height=0.6,
                    color=_PHASE_COLORS.get(s.label, "#7f7f7f"), edgecolor="white", linewidth=0.5,
                    label=None if s.label in seen else s.label)
            seen.add(s.label)
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.set_ylim(-0.6, len(lanes) - 0.1)
        ax.invert_yaxis()
        ax.set_title(panel, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.25)
    axes[-1].set_xlabel("seconds")
    fig.legend(loc="outside right center", fontsize=7, frameon=False)
    fig.suptitle(title or "one GRPO step after another")
    return fig


def plot_async_tradeoff(runs: dict, title: str | None = None) -> Figure:
    """Throughput, reward per completion trained, and staleness, side by side: ``runs`` maps a name to
    ``{"completions_per_second", "completions" (cumulative), "reward", "lag_counts" (optional)}``."""
    fig = Figure(figsize=(13, 3.6), layout="constrained")
    ax_speed, ax_reward, ax_lag = fig.subplots(1, 3, width_ratios=[1, 1.6, 1])
    names = list(runs)
    colors = ["#4c78a8", "#e07a1f", "#2a9d4b", "#6f4e7c"]
    speeds = [runs[n]["completions_per_second"] for n in names]
    ax_speed.bar(range(len(names)), speeds, color=colors[:len(names)])
    for i, value in enumerate(speeds):
        ax_speed.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
    ax_speed.set_xticks(range(len(names)), names, fontsize=8)
    ax_speed.set_title("completions trained per second")
    for name, color in zip(names, colors):
        ax_reward.plot(runs[name]["completions"], runs[name]["reward"], marker="o", markersize=3, color=color,
                       label=name)
    ax_reward.set(xlabel="completions trained", title="reward per step")
    ax_reward.legend(fontsize=8)
    ax_reward.grid(alpha=0.25)
    with_lags = [n for n in names if runs[n].get("lag_counts")]
    width = 0.8 / max(1, len(with_lags))
    for j, name in enumerate(with_lags):
        counts = {int(k): v for k, v in runs[name]["lag_counts"].items()}
        total = sum(counts.values())
        lags = sorted(counts)
        ax_lag.bar([lag + j * width for lag in lags], [counts[lag] / total for lag in lags], width,
                   color=colors[names.index(name)], label=name)
    ax_lag.set_xticks(sorted({int(k) for n in with_lags for k in runs[n]["lag_counts"]}))
    ax_lag.set(xlabel="policy versions behind the trainer", ylabel="share", title="staleness of trained completions")
    if with_lags:
        ax_lag.legend(fontsize=8)
    fig.suptitle(title or "synchronous vs asynchronous GRPO")
    return fig
