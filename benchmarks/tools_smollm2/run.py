"""The tool lesson (notebook 10) on SmolLM2-135M-Instruct on one GPU: the base model, primed on tool-call traces
(TRL's ``SFTTrainer``), trained with GRPO and the calculator (TRL's ``GRPOTrainer(tools=...)``, vLLM colocate), each
stage evaluated with the calculator offered and without it on the 200 English held-out problems; ``results.json``
keeps every share with its standard error and every paired change (``lab.tool_lesson.committed_tool_run`` reads
it). The whole lesson is ``lab.tool_lesson.run_lesson`` with the ``gpu`` profile's lesson
(``grpo_lab.tool_use.LESSONS``).

    GRPO_LAB_PROFILE=gpu GRPO_LAB_MODEL=/tmp/grpo-smollm2/model python3 benchmarks/tools_smollm2/run.py --out DIR
    python benchmarks/tools_smollm2/run.py --smoke --out /tmp/tools-smoke     # the same code on a CPU, tiny model

``--out`` receives ``results.json`` only; the primed and trained models go to ``--work`` (default
``/tmp/tools-smollm2``), which is replaced.

``--smoke`` runs the tiny profile with a smaller lesson (40 priming traces, 20 problems, 2 GRPO steps) to check the
script, not to measure anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # grpo_lab and lab, from the project root

from grpo_lab import device, tool_use  # noqa: E402
from grpo_lab.device import Machine  # noqa: E402
from grpo_lab.experiment import PROFILE_ENV, TrainConfig, profile_name  # noqa: E402
from lab.tool_lesson import run_lesson  # noqa: E402

RESULTS = "results.json"


def smoke_lesson(lesson: tool_use.ToolLesson) -> tool_use.ToolLesson:
    """A lesson small enough to check the script on a CPU in a few minutes."""
    priming = dataclasses.replace(lesson.priming, num_train_rows=40, num_train_epochs=1)
    return dataclasses.replace(lesson, priming=priming, eval_size=20, train={**lesson.train, "max_steps": 2})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tools-smollm2"), help="folder for the models")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the lesson's)")
    parser.add_argument("--smoke", action="store_true", help="the tiny profile, a small lesson, on any machine")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ[PROFILE_ENV] = "tiny"
    machine = Machine.detect()
    lesson = tool_use.LESSONS[profile_name(machine=machine)]
    lesson = smoke_lesson(lesson) if args.smoke else lesson
    base_model = TrainConfig().with_profile(machine).model
    shutil.rmtree(args.work, ignore_errors=True)
    run = run_lesson(base_model, lesson, machine, args.work, **({"max_steps": args.steps} if args.steps else {}))
    command = "python3 benchmarks/tools_smollm2/run.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    record = run.record(command, device.device_name(kind=machine.kind))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / RESULTS).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for gain in tool_use.lesson_gains(run.reports).values():
        print(gain.describe())
    print(f"wrote {args.out / RESULTS} ({record['seconds']['total']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
