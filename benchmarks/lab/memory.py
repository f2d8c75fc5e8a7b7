"""The memory planner against measured peaks: the committed rows of ``benchmarks/memory/results`` (each prediction
recomputed from the parameters recorded with its measurement, by ``measure_cpu.py --render`` and
``measure_gpu.py --render``), and the commands and devices that measured them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
