"""Ballast: a process of its own that holds device memory until only ``--leave-gib`` GiB stay free on device 0, so
that a row started after it finds the device as a card of that size would (the driver refuses what does not fit).

    python3 benchmarks/capped/ballast.py --leave-gib 32 --ready /tmp/capped/ballast.json   # holds until SIGTERM

It stands in where torch's per-process fraction cannot: memory a process hands back to the driver while torch still
counts it (vLLM's sleep mode: ``results/probes/sleep_probe.json``) is free again under ballast, as on a real card. The
row then runs without ``device.enforce_cap`` and its processes are not the ballast's (``DeviceMemorySampler``
counts the row's process tree only). It still does not emulate the smaller card's bandwidth or compute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

GIB = 1024**3
CHUNK_BYTES = 1 * GIB
"""Held in chunks of 1 GiB, the remainder last: no single allocation of tens of GiB has to find room."""


def ballast_bytes(free_bytes: int, leave_bytes: int) -> int:
    """What to hold so that ``leave_bytes`` stay free of ``free_bytes``; an error when less than that is free."""
    if leave_bytes <= 0:
        raise ValueError(f"ballast must leave a positive amount free, not {leave_bytes} bytes")
    if free_bytes < leave_bytes:
        raise ValueError(f"only {free_bytes / GIB:.2f} GiB are free on the device, less than the "
                         f"{leave_bytes / GIB:.2f} GiB the row should find: nothing to stand in for")
    return free_bytes - leave_bytes


def chunks(total: int, size: int = CHUNK_BYTES) -> list[int]:
    """``total`` bytes as allocations of ``size`` and a last, smaller one."""
    return [size] * (total // size) + ([total % size] if total % size else [])


def hold(leave_gib: float, ready: Path) -> None:
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()  # after this process's own CUDA context
    sizes = chunks(ballast_bytes(free, int(leave_gib * GIB)))
    held = [torch.empty(size, dtype=torch.uint8, device="cuda") for size in sizes]
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    ready.parent.mkdir(parents=True, exist_ok=True)
    ready.write_text(json.dumps({"leave_gib": leave_gib, "device_total_gib": round(total / GIB, 3),
                                 "free_before_gib": round(free / GIB, 3),
                                 "held_gib": round(sum(t.numel() for t in held) / GIB, 3),
                                 "free_after_gib": round(free_after / GIB, 3)}, indent=1) + "\n")
    print(ready.read_text(), flush=True)
    while True:  # until run.py's SIGTERM ends the process; the driver then frees what it held
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-gib", type=float, required=True, help="GiB left free on device 0")
    parser.add_argument("--ready", type=Path, required=True, help="written (JSON) once the memory is held")
    args = parser.parse_args(argv)
    hold(args.leave_gib, args.ready)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
