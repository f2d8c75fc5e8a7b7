"""The committed rollout smoke runs (``grpo-lab rollout --json`` on a GPU: HF ``generate`` against vLLM), read from
the bench's catalogue (:func:`smoke_runs`); and ``python -m lab.rollout --shape S``, that command on random weights of
a public model's shape (:data:`~lab.bench.workload.SHAPES`), as the committed run on a shape was made."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpo_lab.rollout import main as rollout_main
from lab.bench.catalogue import Catalogue, read_catalogue
from lab.bench.workload import SHAPES, shaped_model_dir
from lab.committed import Provenance

SMOKE_RUNS = ("rollout call tiny", "rollout call 0.5b")
"""The catalogue's keys of the smoke runs a notebook compares with its own."""


@dataclass(frozen=True)
class BackendTiming:
    """One backend of a smoke run: engine start, generation, throughput."""

    load_s: float
    generate_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class SmokeRun:
    """A committed smoke run: the model (or shape), each backend's timing, and where it came from."""

    model: str
    backends: dict[str, BackendTiming]
    provenance: Provenance

    @property
    def vllm_over_hf(self) -> float:
        """vLLM's tokens/s over HF generate's."""
        return self.backends["vllm"].tokens_per_s / self.backends["hf"].tokens_per_s


def smoke_runs(catalogue: Catalogue | None = None) -> list[SmokeRun]:
    """The runs :data:`SMOKE_RUNS` names, each with the command rebuilt from the settings it recorded."""
    catalogue = catalogue or read_catalogue()
    runs = []
    for key in SMOKE_RUNS:
        run = catalogue.run(key)
        settings = run.results["settings"]
        runs.append(SmokeRun(model=settings.get("shape") or settings.get("model") or "the tiny model",
                             backends={name: BackendTiming(r["load_s"], r["generate_s"], r["tokens_per_s"])
                                       for name, r in run.results["results"].items()},
                             provenance=run.provenance))
    return runs


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.rollout --shape S [grpo-lab rollout's options]``: ``grpo-lab rollout`` on random weights of the
    shape ``S`` (the tokenizer of ``--model``, default the tiny model's); ``--json`` records the shape."""
    parser = argparse.ArgumentParser(prog="python -m lab.rollout", description=main.__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--model", help="the tokenizer's folder (default: GRPO_LAB_MODEL or the tiny model)")
    parser.add_argument("--json")
    args, rest = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-lab-shape-") as scratch:
        model = shaped_model_dir(args.shape, scratch, args.model)
        code = rollout_main([*rest, "--model", str(model), "--load-format", "dummy",
                             *(["--json", args.json] if args.json else [])])
    if args.json and code == 0:
        body = json.loads(Path(args.json).read_text(encoding="utf-8"))
        body["settings"].update(shape=args.shape, model=args.model)
        Path(args.json).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
