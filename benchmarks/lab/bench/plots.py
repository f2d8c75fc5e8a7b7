"""The bench's figure: rollout time per config and length variant with the speed-up over HF and the roofline, and the
GRPO step split into generation, reward and update (:func:`plot_bench`, drawn beside every results file)."""

from __future__ import annotations

from matplotlib.figure import Figure

from grpo_lab.errors import DataError

_BENCH_COLORS = {"hf": "#9aa0a6", "vllm": "#7fa7e8", "vllm+prefix": "#2a6fdb"}
_STEP_PARTS = (("generation_s", "generation", "#2a6fdb"), ("reward_s", "reward", "#f4b183"),
               ("update_s", "update (log-probs, backward, optimizer)", "#70ad47"))


def _bench_rollout_axes(ax, rollout: dict) -> None:
    variants = list(rollout["variants"])
    configs = list(next(iter(rollout["variants"].values()))["configs"])
    width = 0.8 / len(configs)
    tallest = 0.0
    for v, variant in enumerate(variants):
        block = rollout["variants"][variant]
        for c, name in enumerate(configs):
            result = block["configs"][name]
            x = v + (c - (len(configs) - 1) / 2) * width
            ax.bar(x, result["median_s"], width * 0.9, color=_BENCH_COLORS.get(name, "#2a9d4b"),
                   label=name if v == 0 else None)
            ratio = block["speedup_vs_hf"].get(name, 1.0 if name == "hf" else float("nan"))
            ax.annotate(f"{result['median_s']:.2f} s\n{ratio:.2f}x", (x, result["median_s"]), ha="center",
                        va="bottom", fontsize=7)
            tallest = max(tallest, result["median_s"])
        roofs = [block["configs"][name]["roofline"]["seconds"] for name in configs
                 if "roofline" in block["configs"][name]]
        if roofs:
            ax.hlines(min(roofs), v - 0.45, v + 0.45, colors="black", linestyles="dashed", linewidth=1,
                      label="roofline (lower bound)" if v == 0 else None)
    ragged = rollout["workload"].get("ragged", "")
    ax.set_xticks(range(len(variants)), [f"ragged ({ragged})" if v == "ragged" else v for v in variants])
    ax.set_ylim(0, tallest * 1.35)
    ax.set_ylabel("rollout time, median (s)")
    w = rollout["workload"]
    ax.set_title(f"rollout: {w['num_prompts']} prompts x n={w['n']}, <= {w['max_tokens']} tokens "
                 f"(labels: speed-up vs hf)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def _bench_step_axes(ax, step: dict) -> None:
    names = list(step["backends"])
    first = step["backends"][names[0]]["median"]["step_s"]
    for i, name in enumerate(names):
        median = step["backends"][name]["median"]
        bottom = 0.0
        for key, label, color in _STEP_PARTS:
            value = max(0.0, median[key])
            ax.bar(i, value, 0.6, bottom=bottom, color=color, label=label if i == 0 else None)
            bottom += value
        ax.annotate(f"{median['step_s']:.2f} s\n{first / median['step_s']:.2f}x", (i, median["step_s"]),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [f"{n} generate" if n == "hf" else f"{n} colocate" for n in names])
    ax.set_xlim(-0.75, max(1.75, len(names) - 0.25))
    ax.set_ylim(0, max(step["backends"][n]["median"]["step_s"] for n in names) * 1.4)
    ax.set_ylabel("GRPO step, median (s)")
    ax.set_title(f"GRPO step: {step['completions_per_step']} completions (labels: speed-up vs first)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")


def plot_bench(results: dict, title: str | None = None) -> Figure:
    """Bars of a results dict of :func:`~lab.bench.run.run_bench`: rollout time per config and variant with the
    speed-up over HF and the roofline, and (when measured) the GRPO step split into generation / reward / update."""
    rollout = results.get("rollout")
    step = results.get("grpo_step") if results.get("grpo_step") and "skipped" not in results["grpo_step"] else None
    panels = [p for p in (rollout, step) if p]
    if not panels:
        raise DataError("the results hold neither a rollout nor a GRPO step measurement: nothing to plot")
    fig = Figure(figsize=(5.2 * len(panels) + 0.6, 3.9), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    if rollout:
        _bench_rollout_axes(axes[0], rollout)
    if step:
        _bench_step_axes(axes[-1], step)
    model = results["model"]
    device = results.get("environment", {}).get("device", {}).get("name", "")
    weights = "RANDOM weights" if model["weights"] == "dummy" else "real weights"
    fig.suptitle(title or f"{model['path']} ({weights}, {model['dtype']}) on {device}", fontsize=10)
    return fig
