"""Does a sleeping vLLM engine's memory still count against the cap? One process, one GPU, a few seconds of GPU work.

The 63bd204 sleep-mode row (``results/seed-2b__sleep-mode-vllm-0-55.json``) ran out of memory in step 1's optimizer
step with 31.67 GiB allocated under a 32 GiB cap, although the planner put the update at 15.63 GiB with vLLM asleep.
A guess to check: vLLM's sleep mode allocates its weights and KV cache from a torch ``MemPool`` with its own cumem
allocator, and ``sleep()`` unmaps that memory from the device without freeing the pool's blocks in torch's caching
allocator. If so, torch's per-process fraction (the cap's stand-in) still counts them, while a real card of the cap's
size would have the memory free: the stand-in, not the planner, would be what failed.

This probe starts an in-process engine (as TRL's colocate mode does) with sleep mode on, under the cap, and prints
torch's allocated and reserved bytes and the driver's free memory before and after ``sleep(level=1)``, then tries to
allocate 90 % of what the driver says sleeping freed: refused under the cap while the driver has it free means the
stand-in counts the sleeping engine. Run on 2026-12-05 (one H100, commit 679831c): it does
(``results/probes/sleep_probe.json``; ``README.md``).

    PYTHONPATH=/tmp/grpo-gpu-site:$PWD VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 \\
      python3 benchmarks/capped/sleep_probe.py --model /tmp/grpo-smollm2/model --cap 32 --share 0.55
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # grpo_lab, from the project root

GIB = 2**30


def snapshot(torch, label: str) -> dict:
    free, total = torch.cuda.mem_get_info()
    row = {"when": label, "allocated_gib": round(torch.cuda.memory_allocated() / GIB, 3),
           "reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3), "driver_free_gib": round(free / GIB, 3),
           "driver_total_gib": round(total / GIB, 3)}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cap", type=float, default=32.0, help="GiB the device is treated as")
    parser.add_argument("--share", type=float, default=0.55, help="vLLM's share of the cap")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)

    import torch
    from vllm import LLM, SamplingParams

    from grpo_lab.device import Machine, enforce_cap

    cap = enforce_cap(Machine.detect(memory_gib=args.cap))
    rows = [snapshot(torch, "capped, before the engine")]
    llm = LLM(model=args.model, enable_sleep_mode=True, gpu_memory_utilization=cap.device_share(args.share),
              max_model_len=1024, seed=0)
    llm.generate(["2 + 2 ="], SamplingParams(max_tokens=8))
    rows.append(snapshot(torch, "engine awake, after one generate"))
    llm.sleep(level=1)
    rows.append(snapshot(torch, "engine asleep (level 1)"))
    # 90 % of what the driver says sleeping freed: a real card of the cap's size could hand it out again
    want = 0.9 * (rows[2]["driver_free_gib"] - rows[1]["driver_free_gib"])
    try:
        block = torch.empty(int(want * GIB), dtype=torch.uint8, device="cuda")
        outcome = f"allocated {want:.1f} GiB with the engine asleep"
        del block
    except torch.OutOfMemoryError as error:
        outcome = f"out of memory allocating {want:.1f} GiB with the engine asleep: {str(error).splitlines()[0]}"
    print(outcome, flush=True)
    rows.append(snapshot(torch, "after the allocation"))
    llm.wake_up()
    rows.append(snapshot(torch, "engine awake again"))
    if args.out:
        args.out.write_text(json.dumps({"cap_gib": args.cap, "share": args.share, "rows": rows, "outcome": outcome},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
