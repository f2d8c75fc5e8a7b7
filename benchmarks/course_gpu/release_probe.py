"""What notebook 03's ``result.release()`` hands back, and the device memory of the kernel and its next seed together.

Notebook 03 trains seed 0 in its kernel, releases it, then trains seed 1 in a child process (``train_again``); under
a cap the two together should stay under it. This trains a short run of the same kind in this process (the ``gpu``
profile, vLLM colocate), releases it, trains seed 1 as the notebook does, and writes what the device held at each
point to ``$OUT/release_probe.json``: ``held_gib`` (every process on the device: total minus free),
``this_process_gib`` (the driver's count for this process), torch's allocated and reserved, and the peak of this
process and its child together while seed 1 trained (:class:`grpo_lab.memory.DeviceMemorySampler`).

    GRPO_LAB_DEVICE_MEMORY_GIB=16 GRPO_LAB_MODEL=/tmp/grpo-smollm2/model python benchmarks/course_gpu/release_probe.py
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from grpo_lab import device
from grpo_lab import train as T
from grpo_lab.memory import DeviceMemorySampler
from grpo_lab.memory.sampler import gib


def snapshot(kind: str) -> dict[str, float | None]:
    held = device.memory_info(kind=kind)
    return {"held_gib": gib(held.total_bytes - held.free_bytes),
            "this_process_gib": gib(device.device_memory_of({os.getpid()}, kind)),
            "torch_allocated_gib": gib(torch.cuda.memory_allocated()),
            "torch_reserved_gib": gib(torch.cuda.memory_reserved())}


def main() -> None:
    steps = int(os.environ.get("PROBE_STEPS", "3"))
    out = Path(os.environ.get("OUT", "/tmp")) / "release_probe.json"
    folder = Path(tempfile.mkdtemp(prefix="release-probe-")) / "run"
    config = T.TrainConfig(profile="gpu", max_steps=steps, output_dir=str(folder), live_plot=False)
    record: dict = {"command": "python benchmarks/course_gpu/release_probe.py", "steps": steps,
                    "cap_gib": os.environ.get("GRPO_LAB_DEVICE_MEMORY_GIB"),
                    "commit": os.environ.get("GRPO_LAB_COMMIT", "unknown"),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "device": subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                             capture_output=True, text=True).stdout.strip()}
    def keep(key: str, value: object) -> None:  # written at each point: a call cut short keeps what it measured
        record[key] = value
        out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(key, json.dumps(value), flush=True)

    result = T.train(config)
    kind = result.config.device
    keep("after_training", snapshot(kind))
    result.release()
    keep("after_release", snapshot(kind))
    with DeviceMemorySampler(os.getpid(), kind, interval_s=0.5) as sampler:
        result.train_again(1)
    keep("seed_1_with_this_process_peak_gib", gib(sampler.peak_bytes))
    keep("after_seed_1", snapshot(kind))


if __name__ == "__main__":
    main()
