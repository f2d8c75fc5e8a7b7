"""What the garbage collector costs while TRL reads the colocated engine's log-probs, with and without
:func:`grpo_lab.speedups.collection_paused`: vLLM's flat log-probs of ``--sequences`` completions of ``--tokens`` tokens
(the ``seed`` bench's 512 × 256 by default) through :func:`grpo_lab.speedups.extract_flat_logprobs` and TRL's
unwrapping (one list per token, then one log-prob per token), in a process that holds a trainer (the tiny profile's, so
the heap has torch, transformers, TRL and vLLM in it). The two modes alternate, ``--rounds`` each.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/trainer_switches/collection_pause.py [--rounds 5]

Prints min / median / max per mode of the wall time and of the collector's pauses, and how many objects the heap held.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from types import SimpleNamespace

from grpo_lab.device import Machine
from grpo_lab.experiment import TrainConfig
from grpo_lab.train import build_trainer
from grpo_lab.speedups import collection_paused, extract_flat_logprobs


def engine_outputs(sequences: int, tokens: int, seed: int = 0) -> list:
    """Requests as vLLM's ``LLM.generate`` returns them with ``logprobs=0, flat_logprobs=True``: one sampled token's
    log-prob per position."""
    from vllm.logprobs import FlatLogprobs

    rng = random.Random(seed)
    outputs = []
    for _ in range(sequences):
        flat = FlatLogprobs(start_indices=list(range(tokens)), end_indices=list(range(1, tokens + 1)),
                            token_ids=[rng.randrange(150_000) for _ in range(tokens)],
                            logprobs=[-rng.expovariate(1.0) for _ in range(tokens)], ranks=[1] * tokens,
                            decoded_tokens=[None] * tokens)
        outputs.append(SimpleNamespace(outputs=[SimpleNamespace(logprobs=flat)]))
    return outputs


def read_like_trl(outputs: list) -> list:
    """The trainer's extraction, then TRL 1.16's ``[[lp[0] for lp in seq] for seq in logprobs]``."""
    logprobs, token_ids = extract_flat_logprobs(outputs, fallback=lambda _: (None, None))
    return [[position[0] for position in sequence] for sequence in logprobs] + [token_ids]


class Pauses:
    """The collector's pauses and collections, summed from the last reset (``seconds``, ``collections``)."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, 0, 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        config = TrainConfig(profile="tiny", max_steps=1, output_dir=run_dir, save_steps=10**6,
                             live_plot=False).resolve(Machine.detect())
        trainer = build_trainer(config)  # held for its heap
        outputs = engine_outputs(args.sequences, args.tokens)
        pauses = Pauses()
        results: dict[bool, dict[str, list[float]]] = {mode: {"wall": [], "gc": [], "n": []} for mode in (False, True)}
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for paused in ((False, True) if round_ % 2 else (True, False)):
                pauses.seconds, pauses.collections = 0.0, 0
                start = time.perf_counter()
                with collection_paused(paused):
                    read = read_like_trl(outputs)
                del read
                gc.collect(0)  # what the pause deferred: the first young collection after it, counted in its mode
                wall = time.perf_counter() - start
                if round_:
                    results[paused]["wall"].append(wall)
                    results[paused]["gc"].append(pauses.seconds)
                    results[paused]["n"].append(pauses.collections)
        heap = len(gc.get_objects())
        del trainer
    print(f"{args.sequences} x {args.tokens} log-probs read as TRL reads them, a heap of {heap} objects, "
          f"{args.rounds} rounds per mode (min / median / max):")
    for paused in (False, True):
        r = results[paused]
        print(f"  collector {'paused ' if paused else 'running'}: wall s {spread(r['wall'])}; collector pauses s "
              f"{spread(r['gc'])}; collections {statistics.median(r['n']):.0f}")
    print(f"median wall, running / paused: "
          f"{statistics.median(results[False]['wall']) / statistics.median(results[True]['wall']):.1f}x")


if __name__ == "__main__":
    main()
