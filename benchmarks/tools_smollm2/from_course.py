"""The tool lesson's record (``course_record.json``, in the form ``run.py`` writes) read from the GPU course's run of
notebook 10.

The whole course on a GPU runs notebook 10 with the ``gpu`` profile's lesson, the same code ``run.py`` calls; its
executed copy (``course_6cce9ba/10_tools.ipynb`` beside this script, with that course's ``run.json`` and
``summary.json``) prints every evaluation's summary and every paired change. This script turns those printed lines,
the GRPO run's ``metrics.jsonl`` and ``config.json`` (copied from the run folder the course packed) and the copy's
cell timings into the record ``lab.tool_lesson.committed_tool_run`` reads. What the printed lines round (shares to
0.1 %, a change's standard errors to 0.1) stays rounded. It reads the lines as the lesson printed them before it held
problem types out (shares ± standard errors); a run of today's lesson is recorded by ``run.py``, whose record keeps
each part of every evaluation.

    python benchmarks/tools_smollm2/from_course.py --course benchmarks/tools_smollm2/course_6cce9ba \\
        --run benchmarks/tools_smollm2/course_run --out benchmarks/tools_smollm2/course_record.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # grpo_lab and lab, from the project root

from grpo_lab import tool_use  # noqa: E402
from grpo_lab.tools import CALL_KINDS  # noqa: E402
from lab.tool_lesson import RECORDED_TRAIN_FIELDS  # noqa: E402

NOTEBOOK = "10_tools.ipynb"
SUMMARY = re.compile(
    r"^(?P<label>.+?) \((?P<offered>tool offered|no tool), (?P<problems>\d+) problems\): calls the tool "
    r"(?P<share>[\d.]+)% ± (?P<share_se>[\d.]+)%; (?P<calls>\d+) calls, (?P<ran>[\d.]+)% ± (?P<ran_se>[\d.]+)% parsed "
    r"and ran; tool errors: (?P<errors>.+?); (?P<capped>\d+) capped; accuracy (?P<acc>[\d.]+)% ± (?P<acc_se>[\d.]+)%$")
GAIN = re.compile(
    r"^(?P<what>.+?) (?:rose|fell|did not move) ?(?:(?P<points>[\d.]+) points )?\((?P<before>[\d.]+)% → "
    r"(?P<after>[\d.]+)%\)(?:, every one of the (?P<all>\d+) problems the same way \(no spread: not noise\)|, "
    r"(?P<se>[+-]?(?:[\d.]+|inf)) standard errors \(± (?P<se_points>[\d.]+) points over (?P<count>\d+) problems\))$")
PRIMED = re.compile(r"^primed in (?P<s>\d+) s: (?P<steps>\d+) steps on (?P<traces>\d+) traces \((?P<calling>\d+) call "
                    r"the tool\), mean loss (?P<loss>[\d.]+);")


def printed_lines(notebook: dict) -> list[tuple[int, str]]:
    """Every printed line of the executed copy, with its cell's index."""
    return [(index, line) for index, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
            for output in cell.get("outputs", []) if output.get("output_type") == "stream"
            for line in "".join(output["text"]).splitlines()]


def cell_seconds(cell: dict) -> float:
    timing = cell["metadata"]["execution"]
    began, ended = (datetime.fromisoformat(timing[key].replace("Z", "+00:00"))
                    for key in ("iopub.execute_input", "shell.execute_reply"))
    return round((ended - began).total_seconds(), 1)


def report(match: re.Match) -> dict:
    errors = {} if match["errors"] == "none" else {
        kind: int(count) for kind, count in (item.rsplit(" ", 1) for item in match["errors"].split(", "))}
    return {"label": match["label"], "offered": match["offered"] == "tool offered", "problems": int(match["problems"]),
            "seconds": None, "tool_call_share": float(match["share"]) / 100, "tool_call_share_se": float(match["share_se"]) / 100,
            "calls": int(match["calls"]), "calls_ran_share": float(match["ran"]) / 100,
            "calls_ran_share_se": float(match["ran_se"]) / 100, "tool_errors": errors, "capped": int(match["capped"]),
            "accuracy": float(match["acc"]) / 100, "accuracy_se": float(match["acc_se"]) / 100}


def gain(match: re.Match) -> dict:
    before, after = float(match["before"]) / 100, float(match["after"]) / 100
    points = round(100 * (after - before), 2)
    if match["all"]:  # the same change on every problem: evaluation.Gain's ±infinity
        count, se_points, errors = int(match["all"]), 0.0, math.copysign(math.inf, points) if points else 0.0
    else:
        count, errors = int(match["count"]), float(match["se"])
        # the printed ± is rounded to 0.1 point; points / standard errors gives back the printed ratio
        se_points = round(points / errors, 4) if errors and math.isfinite(errors) else float(match["se_points"])
    return {"what": match["what"], "before": before, "after": after, "count": count, "points": points,
            "standard_error_points": se_points, "standard_errors": errors}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def record(course: Path, run: Path, model_name: str) -> dict:
    notebook = json.loads((course / NOTEBOOK).read_text(encoding="utf-8"))
    provenance = json.loads((course / "run.json").read_text(encoding="utf-8"))
    saved = json.loads((run / "config.json").read_text(encoding="utf-8"))  # the run folder's: config, backend, versions
    config = saved["config"]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    metrics = [m for m in metrics if "tools/call_frequency" in m]  # the training steps (not the run's summary line)
    stage_of = {value: stage for stage, value in tool_use.STAGES.items()}
    reports, gains, primed, cells = {}, {}, None, {}
    for index, line in printed_lines(notebook):
        if found := SUMMARY.match(line):
            stage = stage_of[(found["label"], found["offered"] == "tool offered")]
            reports[stage] = report(found)
            cells.setdefault(stage, index)
        elif found := GAIN.match(line):
            gains[found["what"]] = gain(found)
        elif found := PRIMED.match(line):
            primed = {"steps": int(found["steps"]), "train_loss": float(found["loss"]),
                      "traces": int(found["traces"]), "calling_traces": int(found["calling"])}
    missing = set(tool_use.STAGES) - set(reports) or (not gains and {"gains"}) or (primed is None and {"primed"})
    if missing:
        raise SystemExit(f"{course / NOTEBOOK} does not print {sorted(missing)}: not a finished run of notebook 10")
    stages_in = {cell: [stage for stage, at in cells.items() if at == cell] for cell in set(cells.values())}
    grpo_cell = next(i for i, c in enumerate(notebook["cells"]) if "train(config" in "".join(c["source"]))
    summary = {row["notebook"]: row for row in json.loads((course / "summary.json").read_text(encoding="utf-8"))}
    return {
        "command": f"{provenance['command']} (notebook 10 of the course; this record: python "
                   f"benchmarks/tools_smollm2/from_course.py)",
        "date": provenance["started"], "device": provenance["device"], "model": model_name,
        "commit": provenance["commit"], "cap_gib": provenance["cap_gib"], "versions": saved["versions"],
        "settings": {"train": {key: config[key] for key in RECORDED_TRAIN_FIELDS if key in config},
                     "priming": tool_use.LESSONS[provenance["profile"]].priming.__dict__},
        "reports": reports, "gains": gains,
        "train": {"steps": len(metrics), "backend": saved["backend"], "call_frequency_first_5": mean([m["tools/call_frequency"] for m in metrics[:5]]),
                  "call_frequency_last_5": mean([m["tools/call_frequency"] for m in metrics[-5:]]),
                  "reward_first_5": mean([m["reward"] for m in metrics[:5]]),
                  "reward_last_5": mean([m["reward"] for m in metrics[-5:]]),
                  "calls_by_kind": {kind: sum(m.get(f"tools/{kind}", 0.0) for m in metrics) for kind in CALL_KINDS}},
        "priming": primed,
        "seconds": {**{f"cell {cell}, evaluating {', '.join(stages)}": cell_seconds(notebook["cells"][cell])
                       for cell, stages in sorted(stages_in.items())},
                    f"cell {grpo_cell}, GRPO (the trainer's start included)": cell_seconds(notebook["cells"][grpo_cell]),
                    "notebook": round(summary[NOTEBOOK]["seconds"], 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, required=True, help="the GPU course's folder of executed copies")
    parser.add_argument("--run", type=Path, required=True, help="notebook 10's GRPO run folder (config, metrics)")
    parser.add_argument("--out", type=Path, required=True, help="the record to write (course_record.json)")
    parser.add_argument("--model-name", default="SmolLM2-135M-Instruct",
                        help="the base model's name (the converted model's manifest: benchmarks/grpo_smollm2)")
    args = parser.parse_args(argv)
    body = record(args.course, args.run, args.model_name)
    args.out.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, change in body["gains"].items():
        print(f"{name}: {change['points']:+.1f} points, {change['standard_errors']:+.1f} standard errors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
