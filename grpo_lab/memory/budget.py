"""The planner's answer: every component of one step on one device, whether it fits and what to set."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field, fields
from typing import Any

from grpo_lab.memory.shapes import GIB, DoesNotFitError, ModelShape, Precision, TrainingShape


@dataclass(frozen=True)
class BudgetRow:
    """One component of the budget: where it lives (``training``, ``vllm`` or ``runtime``) and its size."""

    component: str
    side: str
    bytes: int
    note: str = ""

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass(frozen=True)
class Recommendation:
    """Settings that fit (TRL GRPOConfig names): pass them to the trainer."""

    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int
    max_num_seqs: int
    per_device_train_batch_size: int
    gradient_checkpointing: bool

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class MemoryBudget:
    """Every component of one GRPO step on one device, whether it fits, and what to set: ``rows`` at the training
    peak (``peak_phase``) plus vLLM's share and the margin; ``phases`` the training side's total of each phase."""

    model: ModelShape
    precision: Precision
    shape: TrainingShape
    device_bytes: int
    device_kind: str
    vllm_gpu_memory_utilization: float
    rows: list[BudgetRow]
    phases: dict[str, int]
    peak_phase: str
    kv_cache_bytes: int
    kv_bytes_per_token: int
    sequences_in_kv_cache: int
    fits: bool
    recommended: Recommendation | None
    advice: str
    assumptions: list[str] = field(default_factory=list)
    rollout_bytes: int = 0
    """With sleep mode: the memory in use while vLLM is awake (``rows`` then show the update); 0 without."""

    @property
    def training_peak_bytes(self) -> int:
        return self.phases[self.peak_phase]

    @property
    def vllm_bytes(self) -> int:
        return math.ceil(self.device_bytes * self.vllm_gpu_memory_utilization)

    @property
    def used_bytes(self) -> int:
        return sum(row.bytes for row in self.rows)

    @property
    def free_bytes(self) -> int:
        return self.device_bytes - self.used_bytes

    def side_bytes(self, side: str) -> int:
        return sum(row.bytes for row in self.rows if row.side == side)

    def table(self) -> list[dict[str, Any]]:
        """The budget as rows of plain values (component, side, GiB, share of the device, note)."""
        free = BudgetRow("free" if self.free_bytes >= 0 else "OVER BUDGET", "", self.free_bytes)
        return [{"component": r.component, "side": r.side, "GiB": round(r.gib, 3),
                 "share": round(r.bytes / self.device_bytes, 3), "note": r.note} for r in [*self.rows, free]]

    def check(self) -> MemoryBudget:
        """Return self when the plan fits; raise :class:`DoesNotFitError` with the advice otherwise."""
        if not self.fits:
            raise DoesNotFitError(self.advice)
        return self

    @property
    def trainer_fits(self) -> bool:
        """Without a vLLM engine on the device (HF ``generate`` samples): the training peak and the margin fit."""
        return self.training_peak_bytes + self.side_bytes("runtime") <= self.device_bytes

    def summary(self, rollouts: str = "vllm") -> str:
        """The plan in a few lines; ``rollouts="hf"``: no vLLM engine, only the trainer's side."""
        count = self.model.num_parameters
        size = f"{count / 1e9:.2f} B" if count >= 1e8 else f"{count / 1e6:.2f} M"
        lora = f", LoRA r={self.shape.lora_r}" if self.shape.lora else ""
        head = (f"{self.model.name} ({size} parameters, {self.precision.name}{lora}) on "
                f"{self.device_bytes / GIB:.0f} GiB")
        peak = f"training peak {self.training_peak_bytes / GIB:.2f} GiB ({self.peak_phase})"
        if rollouts == "hf":
            return (f"{head}, no vLLM engine (HF generate samples in the trainer's process): "
                    f"{'fits' if self.trainer_fits else 'does NOT fit'}; {peak}.")
        verdict = "fits" if self.fits else "does NOT fit"
        lines = [f"{head}, vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization:.2f}: {verdict}; {peak}, "
                 f"vLLM {self.vllm_bytes / GIB:.2f} GiB, KV cache holds {self.sequences_in_kv_cache} sequences of "
                 f"{self.shape.sequence_length} tokens."]
        if self.rollout_bytes:
            lines.append(f"sleep mode: vLLM sleeps during the update; awake (waking, generating) the device holds "
                         f"{self.rollout_bytes / GIB:.2f} GiB (vLLM's share next to the trainer's weights and "
                         f"optimizer states).")
        if self.recommended:
            lines.append("recommended: " + ", ".join(f"{k}={v}" for k, v in self.recommended.as_dict().items()))
        if self.advice:
            lines.append(self.advice)
        return "\n".join(lines)

    def __str__(self) -> str:
        rows = self.table()
        width = max(len(r["component"]) for r in rows)
        out = [f"{'component':<{width}}  {'side':<8}  {'GiB':>8}  {'share':>6}"]
        out += [f"{r['component']:<{width}}  {r['side']:<8}  {r['GiB']:>8.2f}  {r['share']:>6.1%}" for r in rows]
        return "\n".join(out + ["", self.summary()])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("component", "side", "GiB", "share", "note"))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in
                             (r["component"], r["side"], f"{r['GiB']:.2f}", f"{r['share']:.1%}", r["note"])) + "</tr>"
            for r in self.table())
        summary = html.escape(self.summary()).replace("\n", "<br>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><p>{summary}</p>"

