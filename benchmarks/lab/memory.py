"""The memory planner against measured peaks: the committed rows of ``benchmarks/memory/results`` (each prediction
recomputed from the parameters recorded with its measurement, by ``measure_cpu.py --render`` and
``measure_gpu.py --render``), and the commands and devices that measured them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig, memory_budget
from grpo_lab.experiment.planning import fit_micro_batch
from grpo_lab.memory import GIB, MemoryPlanError
from lab.committed import BENCHMARKS_DIR, Provenance, read_committed

MEASUREMENTS_DIR = BENCHMARKS_DIR / "memory" / "results"


def measured_vs_predicted(results_dir: str | Path = MEASUREMENTS_DIR) -> list[dict[str, Any]]:
    """The committed measurements against the planner, as rows: where, case, what was measured, measured and
    predicted sizes, error of the prediction, note.

    ``benchmarks/memory/measure_cpu.py --render`` and ``measure_gpu.py --render`` recompute every prediction
    from the parameters recorded with each measurement into ``comparison_cpu.json`` / ``comparison_gpu.json``
    (``tests/test_memory.py`` checks those files match the current planner).
    """
    rows = []
    for path in sorted(Path(results_dir).glob("comparison_*.json")):
        for r in json.loads(path.read_text()):
            if "failed" in r:
                continue
            to_gib = 1 / 1024 if r["unit"] == "MiB" else 1
            note = r.get("note", "")
            if r.get("held by others"):
                note = (f"max_memory_allocated {r['max_memory_allocated'] * to_gib:.2f} GiB less "
                        f"{r['held by others'] * to_gib:.2f} GiB held by {r['held by']}")
            rows.append({"where": r["where"], "case": r["case"], "measured": r["quantity"],
                         "measured GiB": round(r["measured"] * to_gib, 3),
                         "predicted GiB": round(r["predicted"] * to_gib, 3), "error": f"{r['error']:+.1%}",
                         "note": note})
    return rows


def measurement_provenance(results_dir: str | Path = MEASUREMENTS_DIR) -> list[Provenance]:
    """Each command and device behind the rows (the ``meta`` of ``cpu.json`` and ``gpu_*.json``), once each."""
    seen: dict[tuple[str, str], Provenance] = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        if path.name.startswith("comparison_"):
            continue
        meta = read_committed(path)["meta"]
        device = meta.get("device") or f"{meta.get('machine', '')} CPU, {meta.get('cpus', '?')} cores"
        seen.setdefault((meta["command"], device), Provenance(meta["command"], "", device, path))
    return list(seen.values())


@dataclass(frozen=True)
class LengthMargin:
    """A run's step planned at the lengths the planner assumes (every completion ``max_completion_length`` tokens)
    beside the same step at the lengths its model wrote (the mean completion over the run): the safety margin, and
    what it costs in micro-batches (:func:`fit_micro_batch` at each length, at the run's vLLM share). Prompts are
    planned at ``max_prompt_length`` in both."""

    run: str
    memory_gib: float
    max_completion_length: int
    mean_completion: float
    longest_completion: int
    """The longest completion of any step: a micro-batch pads to its longest, so a step with one long completion
    still reaches the planned activations."""
    planned_peak_gib: float
    own_peak_gib: float
    micro_batches_planned: tuple[int, int]
    micro_batches_own: tuple[int, int]

    @property
    def left_free_gib(self) -> float:
        """What the model's own (mean) completion length leaves of the training peak planned at the maximum."""
        return self.planned_peak_gib - self.own_peak_gib

    def summary(self) -> str:
        def split(pair: tuple[int, int]) -> str:
            micro, accumulation = pair
            return f"one micro-batch of {micro}" if accumulation == 1 else f"{accumulation} micro-batches of {micro}"

        return (f"{self.run} on {self.memory_gib:g} GiB: at {self.max_completion_length}-token completions (the plan) "
                f"the training peak is {self.planned_peak_gib:.1f} GiB in {split(self.micro_batches_planned)}; at the "
                f"model's own {self.mean_completion:.0f} tokens (mean; longest {self.longest_completion}) "
                f"{self.own_peak_gib:.1f} GiB in {split(self.micro_batches_own)}: {self.left_free_gib:.1f} GiB of "
                f"margin.")


def length_margin(config: TrainConfig, machine: Machine, metrics: list[dict], run: str = "run") -> LengthMargin:
    """The plan of an experiment resolved for ``machine`` at its ``max_completion_length`` and at the mean completion
    length a run of it logged (TRL's ``completions/mean_length`` per step in ``metrics.jsonl``)."""
    means = [m["completions/mean_length"] for m in metrics if "completions/mean_length" in m]
    if not means:
        raise MemoryPlanError(f"{run}: its metrics hold no completions/mean_length to compare the plan with.")
    mean = sum(means) / len(means)
    longest = int(max((m.get("completions/max_length", 0) for m in metrics), default=0))

    def at(length: int) -> tuple[float, tuple[int, int]]:
        step = dataclasses.replace(config, max_completion_length=max(1, length))
        whole = dataclasses.replace(step, gradient_accumulation_steps=1,
                                    per_device_train_batch_size=config.generation_batch_size)
        return round(memory_budget(step, machine).training_peak_bytes / GIB, 2), fit_micro_batch(whole, machine)

    (planned, planned_split), (own, own_split) = at(config.max_completion_length), at(round(mean))
    return LengthMargin(run, machine.memory_gib, config.max_completion_length, round(mean, 1), longest, planned, own,
                        planned_split, own_split)
