"""A memory calculator (every control re-plans and redraws through :meth:`MemoryCalculator.update`; call it once
yourself to draw the first state) and small HTML helpers for notebooks (:func:`html_table`, :func:`folded_source`).

>>> from grpo_lab.widgets import MemoryCalculator
>>> calc = MemoryCalculator()          # doctest: +SKIP
>>> calc.update(); calc.widget         # doctest: +SKIP
"""

from __future__ import annotations

__all__ = ["MemoryCalculator", "folded_source", "folded_text", "html_table"]

import html
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.memory import (COMMON_DEVICES, GIB, PRECISIONS, DevicePreset, MemoryBudget, MemoryPlanError,
                             course_configs, plan_memory)
from grpo_lab.plots import plot_memory_budget


def html_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A list of dicts as an HTML table (no pandas needed)."""
    if not rows:
        return "<p>(no rows)</p>"
    columns = list(columns or rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>"
                                    for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def folded_text(text: str, summary: str) -> str:
    """``text`` (code, a file) as HTML folded under a one-line ``summary`` (may hold HTML), one click away."""
    return f"<details><summary>{summary}</summary><pre>{html.escape(text)}</pre></details>"


def folded_source(*objects: Any, summary: str) -> str:
    """The source of functions or classes, folded under a one-line ``summary`` (:func:`folded_text`)."""
    names = ", ".join(f"<code>{html.escape(obj.__module__)}.{html.escape(obj.__qualname__)}</code>" for obj in objects)
    code = "\n\n".join(inspect.getsource(obj) for obj in objects)
    return folded_text(code, f"{html.escape(summary)} (click for the source of {names})")


def budget_summary_html(budget: MemoryBudget) -> str:
    """Verdict, recommended settings and advice of a plan, as HTML."""
    color = "#2a7d2a" if budget.fits else "#c00000"
    verdict = "fits" if budget.fits else "does NOT fit"
    lines = [f"<b style='color:{color}'>{html.escape(budget.model.name)}: {verdict}</b> — training peak "
             f"{budget.training_peak_bytes / GIB:.2f} GiB ({html.escape(budget.peak_phase)}), vLLM "
             f"{budget.vllm_gpu_memory_utilization:.2f} × {budget.device_bytes / GIB:.0f} GiB, KV cache for "
             f"{budget.sequences_in_kv_cache} sequences of {budget.shape.sequence_length} tokens"]
    if budget.recommended:
        settings = ", ".join(f"<code>{k}={v}</code>" for k, v in budget.recommended.as_dict().items())
        lines.append(f"recommended: {settings}")
    if budget.advice:
        lines.append(html.escape(budget.advice))
    return "<div>" + "<br>".join(lines) + "</div>"


class MemoryCalculator:
    """Controls, a recommendation line and a plot; ``widget`` is the box to display."""

    def __init__(self, configs: Mapping[str, Any] | None = None, devices: Sequence[DevicePreset] = COMMON_DEVICES,
                 model: str = "qwen2.5-0.5b", device: str | None = None) -> None:
        import ipywidgets as w

        self.configs = dict(configs or course_configs())
        if model not in self.configs:
            raise ConfigError(f"Unknown model {model!r}: choose one of {', '.join(self.configs)}.")
        self.devices = {d.name: d for d in devices}
        first = self.devices[device] if device else devices[0]
        common = {"style": {"description_width": "190px"}, "layout": w.Layout(width="460px")}

        def slider(cls, description, css, **kwargs):
            control = cls(description=description, continuous_update=False, **common, **kwargs)
            control.add_class(css)
            return control

        self.model = w.Dropdown(options=list(self.configs), value=model, description="model", **common)
        self.precision = w.Dropdown(options=list(PRECISIONS), value="bf16", description="precision", **common)
        self.device = w.Dropdown(options=list(self.devices), value=first.name, description="device", **common)
        self.memory = slider(w.FloatSlider, "device memory (GiB)", "grpo-memory-gib", min=4, max=192, step=1,
                             value=first.memory_gib)
        self.batch = slider(w.IntSlider, "micro-batch", "grpo-batch", min=1, max=64, value=8)
        self.num_generations = slider(w.IntSlider, "num_generations", "grpo-generations", min=2, max=16, value=8)
        self.prompt_length = slider(w.IntSlider, "prompt tokens", "grpo-prompt", min=16, max=4096, step=16, value=256)
        self.completion_length = slider(w.IntSlider, "completion tokens", "grpo-completion", min=16, max=8192,
                                        step=16, value=512)

        def checkbox(description, value):
            return w.Checkbox(value=value, description=description, indent=False, layout=w.Layout(width="460px",
                                                                                                  margin="0 0 0 200px"))

        self.checkpointing = checkbox("gradient checkpointing", True)
        self.reference = checkbox("reference model (beta > 0)", False)
        self.auto_utilization = checkbox("recommend vLLM's fraction", True)
        self.utilization = slider(w.FloatSlider, "vllm_gpu_memory_utilization", "grpo-utilization", min=0.05,
                                  max=0.95, step=0.05, value=0.3, disabled=True)
        self.summary, self.plot = w.HTML(), w.Output()
        self.summary.add_class("grpo-memory-summary")
        self.plot.add_class("grpo-memory-plot")
        self.budget: MemoryBudget | None = None
        self._updating = False

        self.device.observe(self._device_changed, names="value")
        self.auto_utilization.observe(self._auto_changed, names="value")
        for control in (self.model, self.precision, self.memory, self.batch, self.num_generations, self.prompt_length,
                        self.completion_length, self.checkpointing, self.reference, self.utilization):
            control.observe(self.update, names="value")
        left = w.VBox([self.model, self.precision, self.device, self.memory, self.auto_utilization, self.utilization])
        right = w.VBox([self.batch, self.num_generations, self.prompt_length, self.completion_length,
                        self.checkpointing, self.reference])
        self.widget = w.VBox([w.HBox([left, right]), self.summary, self.plot])

    def _device_changed(self, change) -> None:
        memory = self.devices[change["new"]].memory_gib
        if self.memory.value != memory:
            self.memory.value = memory  # its observer re-plans
        else:
            self.update()  # same memory, another kind (the LM-head kernel differs)

    def _auto_changed(self, change) -> None:
        self.utilization.disabled = change["new"]
        self.update()

    def plan(self) -> MemoryBudget:
        """The plan for the controls' current values."""
        return plan_memory(
            self.configs[self.model.value], precision=self.precision.value, device_memory_gib=self.memory.value,
            device_kind=self.devices[self.device.value].kind,
            vllm_gpu_memory_utilization=None if self.auto_utilization.value else self.utilization.value,
            per_device_train_batch_size=self.batch.value, num_generations=self.num_generations.value,
            max_prompt_length=self.prompt_length.value, max_completion_length=self.completion_length.value,
            gradient_checkpointing=self.checkpointing.value, beta=0.04 if self.reference.value else 0.0)

    def update(self, change=None) -> MemoryBudget | None:
        """Re-plan and redraw; returns the plan (None when the controls make no valid plan)."""
        from IPython.display import clear_output, display

        if self._updating:  # showing the recommended fraction on its slider must not re-plan
            return self.budget
        try:
            self.budget = self.plan()
        except MemoryPlanError as exc:
            self.budget = None
            self.summary.value = f"<b style='color:#c00000'>{html.escape(str(exc))}</b>"
            return None
        if self.auto_utilization.value:
            self._updating = True
            try:
                self.utilization.value = min(max(self.budget.vllm_gpu_memory_utilization, self.utilization.min),
                                             self.utilization.max)
            finally:
                self._updating = False
        self.summary.value = budget_summary_html(self.budget)
        with self.plot:
            clear_output(wait=True)
            display(plot_memory_budget(self.budget))
        return self.budget
