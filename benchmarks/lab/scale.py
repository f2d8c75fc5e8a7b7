"""The committed measurements of the scale-out layouts (``grpo_lab.scale``, ``grpo_lab.async_grpo``), as records with
their provenance.

* :func:`read_scale_out`: ``benchmarks/scale_out``'s run, colocate on one GPU against server mode on two, the
  course's trainer as it was then (``beta=0.04``);
* :func:`read_async_speed`: ``benchmarks/async_grpo``'s three layouts on two GPUs (``beta=0``), or None until it
  has been measured.

>>> seed = read_scale_out()
>>> round(seed.speedup_server_vs_colocate, 2), seed.provenance.device
(1.07, '2 × NVIDIA H200')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.committed import BENCHMARKS_DIR, Provenance, read_committed

SCALE_OUT_SEED = BENCHMARKS_DIR / "scale_out" / "results" / "scale_out_seed.json"
"""``benchmarks/scale_out/run.py``'s run of the seed workload (Qwen2.5-0.5B shape)."""
ASYNC_RESULTS = BENCHMARKS_DIR / "async_grpo" / "results.json"
"""``benchmarks/async_grpo/run.py report``'s summary (absent until the 2-GPU run)."""
SYNC_LAYOUTS = ("colocate", "server")


@dataclass(frozen=True)
class StepSplit:
    """The median GRPO step of one layout and its parts, in seconds."""

    step_s: float
    generation_s: float
    reward_s: float
    update_s: float

    @property
    def overlapped_s(self) -> float:
        """The step if generation overlapped perfectly with the rest (reward and update): the longer of the two."""
        return max(self.generation_s, self.reward_s + self.update_s)

    @property
    def overlap_ceiling(self) -> float:
        """How many times the completions per second overlap could at most buy: ``step_s / overlapped_s``."""
        return self.step_s / self.overlapped_s


@dataclass(frozen=True)
class ScaleOutResult:
    """Colocate (one GPU) against TRL's server mode (vLLM on a second GPU), median steps of the same workload."""

    colocate: StepSplit
    server: StepSplit
    speedup_server_vs_colocate: float
    provenance: Provenance

    def layouts(self) -> dict[str, StepSplit]:
        return {"colocate": self.colocate, "server": self.server}


def _device(facts: dict[str, Any]) -> str:
    return f"{facts['count']} × {facts['name']}"


def read_scale_out(path: str | Path = SCALE_OUT_SEED) -> ScaleOutResult:
    """The committed server-mode against colocate comparison (``benchmarks/scale_out/results``)."""
    body = read_committed(path)
    splits = {layout: StepSplit(**{key: body[layout]["median"][key] for key in
                                   ("step_s", "generation_s", "reward_s", "update_s")}) for layout in SYNC_LAYOUTS}
    calls = [body.get("earlier_run", {}).get("command"), body["command"]]  # the parts may come from two calls
    return ScaleOutResult(**splits, speedup_server_vs_colocate=body["speedup_server_vs_colocate"],
                          provenance=Provenance("; ".join(c for c in calls if c), body["created"],
                                                _device(body["device"]), Path(path)))


@dataclass(frozen=True)
class LayoutSpeed:
    """One layout's throughput: completions trained per second, from its median step."""

    completions_per_second: float
    median_step_s: float


@dataclass(frozen=True)
class AsyncSpeed:
    """Asynchronous GRPO against the synchronous layouts on the seed workload (``layouts``: async, server, colocate)."""

    layouts: dict[str, LayoutSpeed]
    speedup_vs_sync_server: float
    provenance: Provenance


def read_async_speed(path: str | Path = ASYNC_RESULTS) -> AsyncSpeed | None:
    """The committed asynchronous speed comparison, or None while ``benchmarks/async_grpo`` has not measured it."""
    if not Path(path).is_file():
        return None
    body = read_committed(path)
    speed = body.get("speed")
    if speed is None:
        return None
    layouts = {name: LayoutSpeed(row["completions_per_second"], row["median_step_s"])
               for name, row in speed["layouts"].items()}
    return AsyncSpeed(layouts, body["speedup_vs_sync_server"],
                      Provenance(speed["command"], speed["created"], _device(speed["device"]), Path(path)))
