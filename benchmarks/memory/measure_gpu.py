"""Measured vs predicted memory on a CUDA GPU; writes results/gpu_<part>.json and results/gpu.md.

Parts (``--part``, several allowed):

* ``train-step``: one GRPO step (``grpo_step.py``) of Qwen2.5-0.5B- and 1.5B-shaped models with random weights,
  each phase's ``torch.cuda.max_memory_allocated`` against ``grpo_lab.memory.training_phases``.
* ``vllm``: vLLM alone (``load_format="dummy"``) at several ``gpu_memory_utilization`` values, one process
  each; the KV cache vLLM reports (blocks × block size, and its "Available KV cache memory" line) against
  the planner's ``utilization × total − (weights + activations + runtime)``.
* ``colocate``: TRL ``GRPOTrainer`` with ``vllm_mode="colocate"`` on a 0.5B-shaped model (random weights,
  the course's tiny tokenizer); the training-side peak (allocated during loss, backward and optimizer step,
  minus what vLLM keeps resident) against the planner, with the precision the trainer loaded the model in.
* ``sleep``: the same run twice, vLLM awake and with ``vllm_enable_sleep_mode=True``: the training peak, the device
  memory sleep mode frees during the update (device used at the first loss of each step, awake − asleep) against
  the planner's ``vLLM share − VLLM_ASLEEP_BYTES``, and the step time of each (what waking costs).
* ``lora``: the same run with a LoRA adapter (``peft_config``, TRL's default r=16 / alpha 32 / dropout 0.05 on every
  linear layer), awake and asleep: the training peak against the planner's LoRA plan, the memory sleep frees.

No network and no model hub: configs come from ``data/configs``. The result files keep what was measured and
each case's parameters; ``--render`` recomputes every prediction with the current ``grpo_lab.memory`` and
writes ``gpu.md`` and ``comparison_gpu.json`` (read by notebook 04). Run from the repository root (each call
under ten minutes; parts measured in separate calls land in separate files)::

    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/memory/measure_gpu.py --part train-step vllm --out DIR
    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/memory/measure_gpu.py --part colocate --out DIR
    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/memory/measure_gpu.py --part sleep --out DIR
    PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/memory/measure_gpu.py --part lora --out DIR
    python benchmarks/memory/measure_gpu.py --render --out benchmarks/memory/results   # after copying them
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

from grpo_step import PHASES, grpo_step, padded_batch, random_model  # noqa: E402

from grpo_lab.experiment import LORA_TARGET_MODULES  # noqa: E402
from grpo_lab.memory import (  # noqa: E402
    CONFIG_DIR,
    GIB,
    VLLM_ASLEEP_BYTES,
    ModelShape,
    TrainingShape,
    get_precision,
    plan_memory,
    training_phases,
    vllm_non_kv_bytes,
)

TRAIN_STEP_CASE = re.compile(r"(?P<config>[\w.-]+), (?P<precision>\w+), B=(?P<batch>\d+), (?P<prompt>\d+)\+"
                             r"(?P<completion>\d+), checkpointing (?P<checkpointing>on|off)")
COLOCATE_CASE = re.compile(r"utilization (?P<utilization>[\d.]+), B=(?P<batch>\d+), n=(?P<n>\d+), "
                           r"(?P<prompt>\d+)\+(?P<completion>\d+)")

MIB = 2**20
COMMAND = "PYTHONPATH=/tmp/grpo-gpu-site:$PWD python3 benchmarks/memory/measure_gpu.py --part {parts} --out DIR"
TRAIN_STEP_CASES = [
    # config, precision, batch, prompt, completion, checkpointing
    ("qwen2.5-0.5b", "bf16", 16, 256, 256, True),
    ("qwen2.5-0.5b", "bf16", 16, 256, 256, False),
    ("qwen2.5-0.5b", "bf16", 8, 256, 1024, True),
    ("qwen2.5-0.5b", "mixed", 8, 256, 256, True),
    ("qwen2.5-1.5b", "bf16", 8, 256, 512, True),
]
VLLM_UTILIZATIONS = (0.2, 0.4, 0.6)
VLLM_SHAPE = {"max_model_len": 512, "max_num_seqs": 64, "max_num_batched_tokens": 4096}
VLLM_CONFIG = COLOCATE_CONFIG = "qwen2.5-0.5b"
COLOCATE = {"vllm_gpu_memory_utilization": 0.3, "per_device_train_batch_size": 16, "num_generations": 4,
            "max_completion_length": 256, "steps": 3}
DTYPES = {"bf16": torch.bfloat16, "mixed": torch.float32}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05}  # TRL's ModelConfig defaults
# The colocate run's variants: (LoRA, sleep mode), and the parts that measure them (awake first: its sleeping twin is
# compared with it). A child process each, under COLOCATE_CHILD_TIMEOUT_S so that a part stays within one call.
VARIANTS = {"full": (False, False), "sleep": (False, True), "lora": (True, False), "lora+sleep": (True, True)}
PART_VARIANTS = {"colocate": ("full",), "sleep": ("full", "sleep"), "lora": ("lora", "lora+sleep")}
COLOCATE_CHILD_TIMEOUT_S = 280


def train_step_case(config_name, precision, batch, prompt, completion, checkpointing) -> dict:
    # add_fused_lm_head binds forward to the model (a reference cycle): without a collection the models of
    # earlier cases stay allocated and inflate every later peak
    gc.collect()
    torch.cuda.empty_cache()
    allocated_before = torch.cuda.memory_allocated()
    model = random_model(CONFIG_DIR / f"{config_name}.json", DTYPES[precision], checkpointing, device="cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids, mask = padded_batch(batch, prompt, completion, model.config.vocab_size, device="cuda")
    autocast = torch.bfloat16 if precision == "mixed" else None
    grpo_step(model, optimizer, ids, mask, completion, mark=lambda _: None, autocast_dtype=autocast)  # AdamW states
    measured: dict[str, int] = {}

    def mark(phase: str) -> None:
        torch.cuda.synchronize()
        measured[phase] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    grpo_step(model, optimizer, ids, mask, completion, mark=mark, autocast_dtype=autocast)
    del model, optimizer
    return {"part": "train-step", "case": f"{config_name}, {precision}, B={batch}, {prompt}+{completion}, "
            f"checkpointing {'on' if checkpointing else 'off'}",
            "measured_phases_mib": {k: round(measured[k] / MIB, 1) for k in PHASES},
            "measured_peak_mib": round(max(measured.values()) / MIB, 1),
            "measured_peak_phase": max(measured, key=measured.get),
            "allocated_before_mib": round(allocated_before / MIB, 1), "earlier_models_freed": True}


def write_config_dir(config_name: str, out: Path) -> Path:
    values = {k: v for k, v in json.loads((CONFIG_DIR / f"{config_name}.json").read_text()).items()
              if not k.startswith("_")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(values))
    return out


def vllm_child(model_dir: str, utilization: float) -> None:
    """One vLLM engine (in this process), one batch of generation; prints a JSON line."""
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
              gpu_memory_utilization=utilization, **VLLM_SHAPE)
    init_seconds = time.perf_counter() - start
    cache = llm.llm_engine.vllm_config.cache_config
    prompts = [{"prompt_token_ids": list(range(10 + i % 7, 200 + i % 7))} for i in range(VLLM_SHAPE["max_num_seqs"])]
    llm.generate(prompts, SamplingParams(max_tokens=256, ignore_eos=True, detokenize=False), use_tqdm=False)
    free, total = torch.cuda.mem_get_info()
    print("RESULT " + json.dumps({"num_gpu_blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
                                  "device_total": total, "device_used_after_generate": total - free,
                                  "init_seconds": round(init_seconds, 1)}), flush=True)


def vllm_case(utilization: float, model_dir: Path, shape: ModelShape) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run([sys.executable, __file__, "--vllm-child", str(model_dir), str(utilization)],
                          capture_output=True, text=True, env=env, timeout=420)
    log = done.stdout + done.stderr
    result_line = [line for line in log.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result_line:
        return {"part": "vllm", "case": f"vLLM alone, utilization {utilization}", "error_log": log[-3000:]}
    child = json.loads(result_line[-1][len("RESULT "):])
    total = child["device_total"]
    measured_kv = child["num_gpu_blocks"] * child["block_size"] * shape.kv_cache_bytes_per_token(2)
    requested = math.ceil(total * utilization)  # vLLM's request_memory

    def logged(pattern: str) -> float | None:
        found = re.findall(pattern, log)
        return float(found[-1]) if found else None

    return {"part": "vllm", "case": f"vLLM alone, 0.5B-shaped, utilization {utilization}",
            "utilization": utilization, "device_total_gib": round(total / GIB, 2),
            "requested_gib": round(requested / GIB, 2), "measured_kv_gib": round(measured_kv / GIB, 3),
            "logged_available_kv_gib": logged(r"Available KV cache memory: ([\d.]+) GiB"),
            "logged_model_loading_gib": logged(r"Model loading took ([\d.]+) GiB"),
            "logged_graph_capture_gib": logged(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB"),
            "measured_non_kv_gib": round((requested - measured_kv) / GIB, 3),
            "device_used_after_generate_gib": round(child["device_used_after_generate"] / GIB, 2),
            "init_seconds": child["init_seconds"]}


def colocate_child(model_dir: str, variant: str = "full") -> None:
    """TRL GRPOTrainer with colocated vLLM (``variant``: LoRA and/or sleep mode); prints a JSON line with the measured
    peaks, the device memory in use at the first loss of each step (vLLM asleep with sleep mode) and step times."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    use_lora, sleep = VARIANTS[variant]

    rows = [json.loads(line) for line in (HERE.parents[1] / "data" / "train.jsonl").read_text().splitlines()[:512]]
    steps = COLOCATE["steps"]
    record: dict = {"steps": []}

    class Peaks(TrainerCallback):
        """Peak allocated memory of generation + scoring, then of loss + backward + optimizer step."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.in_loss = False
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            record["steps"].append({"train_peak": torch.cuda.max_memory_allocated(),
                                    "generation_peak": record.pop("generation_peak", None),
                                    "device_used_in_update": record.pop("device_used_in_update", None),
                                    "reserved_peak": torch.cuda.max_memory_reserved(), "device_used": total - free,
                                    "seconds": time.perf_counter() - self.started})

    callback = Peaks()

    class MeasuredTrainer(GRPOTrainer):
        def compute_loss(self, *args, **kwargs):
            if not callback.in_loss:  # first micro-batch of the step: generation and scoring are done
                callback.in_loss = True
                torch.cuda.synchronize()
                record["generation_peak"] = torch.cuda.max_memory_allocated()
                free, total = torch.cuda.mem_get_info()  # vLLM asleep here with sleep mode
                record["device_used_in_update"] = total - free
                torch.cuda.reset_peak_memory_stats()
            return super().compute_loss(*args, **kwargs)

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_vllm=True, vllm_mode="colocate", bf16=True,
                      vllm_gpu_memory_utilization=COLOCATE["vllm_gpu_memory_utilization"],
                      per_device_train_batch_size=COLOCATE["per_device_train_batch_size"],
                      num_generations=COLOCATE["num_generations"],
                      max_completion_length=COLOCATE["max_completion_length"],
                      vllm_max_model_length=512, generation_kwargs={"ignore_eos": True}, max_steps=steps,
                      learning_rate=1e-6, logging_steps=1, report_to=[], save_strategy="no", seed=0,
                      vllm_enable_sleep_mode=sleep)
    peft_config = None
    if use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", target_modules=list(LORA_TARGET_MODULES), bias="none", **LORA)
    allocated_before = torch.cuda.memory_allocated()
    trainer = MeasuredTrainer(model=model_dir, args=args, callbacks=[callback], peft_config=peft_config,
                              reward_funcs=lambda completions, **_: [float(len(str(c)) % 3) for c in completions],
                              train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]))
    torch.cuda.synchronize()
    record["allocated_after_init"] = torch.cuda.memory_allocated() - allocated_before
    on_gpu = next(trainer.model.parameters()).is_cuda
    record["policy_weight_bytes"] = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) * on_gpu
    tok = trainer.processing_class
    record["prompt_length"] = max(len(tok(tok.apply_chat_template(r["prompt"], add_generation_prompt=True,
                                                                  tokenize=False), add_special_tokens=False).input_ids)
                                  for r in rows)
    record["gradient_checkpointing"] = args.gradient_checkpointing
    record["steps_per_generation"] = args.steps_per_generation
    record["variant"] = variant
    free, total = torch.cuda.mem_get_info()
    record["device_total"], record["device_used_after_init"] = total, total - free
    trainer.train()
    print("RESULT " + json.dumps(record), flush=True)


def colocate_case(model_dir: Path, part: str = "colocate", variant: str = "full") -> dict:
    timeout = 560 if part == "colocate" else COLOCATE_CHILD_TIMEOUT_S
    try:
        done = subprocess.run([sys.executable, __file__, "--colocate-child", str(model_dir), variant],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return {"part": part, "case": f"TRL GRPOTrainer colocate, {variant}", "variant": variant,
                "error_log": f"timed out after {timeout} s: {str(expired.stdout or '')[-2000:]}"}
    log = done.stdout + done.stderr
    result_line = [line for line in log.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not result_line:
        return {"part": part, "case": f"TRL GRPOTrainer colocate, {variant}", "variant": variant,
                "error_log": log[-3000:]}
    r = json.loads(result_line[-1][len("RESULT "):])
    # With sleep mode vLLM's weights and KV cache are unmapped, not freed through torch: the allocator's count of what
    # vLLM holds stays as it was after init, so the subtraction is the same in both variants.
    vllm_resident = r["allocated_after_init"] - r["policy_weight_bytes"]
    later = r["steps"][1:] or r["steps"]  # from step 2 on the AdamW states exist
    measured_training = max(s["train_peak"] for s in later) - vllm_resident
    use_lora, sleep = VARIANTS[variant]
    label = (", LoRA r=16" if use_lora else "") + (", sleep mode" if sleep else "")
    return {"part": part, "variant": variant,
            "case": f"TRL GRPOTrainer colocate{label}, 0.5B-shaped, utilization "
                    f"{COLOCATE['vllm_gpu_memory_utilization']}, B={COLOCATE['per_device_train_batch_size']}, "
                    f"n={COLOCATE['num_generations']}, {r['prompt_length']}+{COLOCATE['max_completion_length']}",
            "step_seconds": round(sum(s["seconds"] for s in later) / len(later), 3),
            "device_used_in_update_gib": round(max(s["device_used_in_update"] for s in later) / GIB, 3),
            "measured_peak_mib": round(measured_training / MIB, 1),
            "vllm_resident_gib": round(vllm_resident / GIB, 2),
            "device_used_max_gib": round(max(s["device_used"] for s in r["steps"]) / GIB, 2),
            "reserved_peak_gib": round(max(s["reserved_peak"] for s in r["steps"]) / GIB, 2), "raw": r}


def write_results(new: list[dict], out: Path, parts: list[str]) -> None:
    """One ``gpu_<part>.json`` per part measured now, then ``gpu.md`` from every part found in ``out``."""
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": COMMAND.format(parts=" ".join(parts)), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("vllm", "trl"):
        try:
            meta[name] = __import__(name).__version__
        except ImportError:
            meta[name] = None
    for part in dict.fromkeys(r["part"] for r in new):
        rows = [r for r in new if r["part"] == part]
        (out / f"gpu_{part}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    render(out)


def _parameters(pattern: re.Pattern, case: str) -> dict[str, str]:
    found = pattern.search(case)
    if not found:
        raise ValueError(f"Cannot read the parameters of case {case!r} (expected the form {pattern.pattern}).")
    return found.groupdict()


def train_step_prediction(case: str) -> tuple[str, int]:
    """(peak phase, bytes) the planner predicts for a ``train-step`` case, from the parameters in its name."""
    c = _parameters(TRAIN_STEP_CASE, case)
    training = TrainingShape(per_device_train_batch_size=int(c["batch"]), num_generations=int(c["batch"]),
                             max_prompt_length=int(c["prompt"]), max_completion_length=int(c["completion"]),
                             gradient_checkpointing=c["checkpointing"] == "on")
    phases = training_phases(ModelShape.from_config(CONFIG_DIR / f"{c['config']}.json"),
                             get_precision(c["precision"]), training, "cuda")
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    peak_phase = max(totals, key=totals.get)
    return peak_phase, totals[peak_phase]


def earlier_models_bytes(records: list[dict]) -> list[int]:
    """For each ``train-step`` record (in measuring order), the bytes its peaks include of earlier cases' models.

    Until the script collected garbage between cases (records without ``earlier_models_freed``), ``del model``
    freed nothing: TRL's ``add_fused_lm_head`` binds ``forward`` to the model, a reference cycle that only the
    garbage collector breaks, and it did not run. Every later case's peaks then include the weights of the
    models built before it: their parameter count × bytes per weight, known from the configs.
    """
    held, result = 0, []
    for record in records:
        if record.get("earlier_models_freed"):
            result.append(0)
            continue
        result.append(held)
        c = _parameters(TRAIN_STEP_CASE, record["case"])
        shape = ModelShape.from_config(CONFIG_DIR / f"{c['config']}.json")
        held += shape.num_parameters * get_precision(c["precision"]).weight_bytes
    return result


def colocate_budget(record: dict):
    """The planner's budget for the ``colocate`` run, from its case name and recorded trainer settings.

    TRL loads a model given by path in float32 unless ``model_init_kwargs`` sets ``dtype``; with ``bf16=True``
    that is the planner's ``mixed`` precision. The recorded policy bytes per parameter say which it was.
    """
    c, raw = _parameters(COLOCATE_CASE, record["case"]), record["raw"]
    use_lora, sleep = VARIANTS[record.get("variant", "full")]
    model = ModelShape.from_config(CONFIG_DIR / f"{COLOCATE_CONFIG}.json")
    adapter = model.num_hidden_layers * model.lora_layer_parameters(LORA["r"], LORA_TARGET_MODULES) if use_lora else 0
    bytes_per_weight = raw["policy_weight_bytes"] / (model.num_parameters + adapter)  # the adapter in fp32 too
    if bytes_per_weight not in (2, 4):
        raise ValueError(f"The colocate record's policy has {bytes_per_weight:.2f} bytes per parameter; expected 2 "
                         "(bf16) or 4 (fp32 with bf16 autocast).")
    return plan_memory(model, precision="mixed" if bytes_per_weight == 4 else "bf16",
                       device_memory_gib=raw["device_total"] / GIB, device_kind="cuda",
                       vllm_gpu_memory_utilization=float(c["utilization"]),
                       per_device_train_batch_size=int(c["batch"]), num_generations=int(c["n"]),
                       max_prompt_length=raw["prompt_length"], max_completion_length=int(c["completion"]),
                       gradient_checkpointing=raw["gradient_checkpointing"],
                       steps_per_generation=raw["steps_per_generation"], lora_r=LORA["r"] if use_lora else 0,
                       lora_target_modules=LORA_TARGET_MODULES, lora_dropout=LORA["lora_dropout"] if use_lora else 0.0,
                       vllm_enable_sleep_mode=sleep)


def vllm_prediction(record: dict) -> tuple[int, dict[str, int]]:
    """(KV cache bytes, non-KV parts) the planner predicts for a ``vllm`` record (engine shape: ``VLLM_SHAPE``)."""
    shape = ModelShape.from_config(CONFIG_DIR / f"{VLLM_CONFIG}.json")
    parts = vllm_non_kv_bytes(shape, 2, VLLM_SHAPE["max_num_seqs"], VLLM_SHAPE["max_num_batched_tokens"])
    requested = math.ceil(record["device_total_gib"] * GIB * record["utilization"])  # vLLM's request_memory
    return requested - sum(parts.values()), parts


def comparison_rows(out: Path) -> list[dict]:
    """Every ``gpu_*.json`` record in ``out`` against the current planner, as table rows (no GPU needed)."""
    rows = []
    for path in sorted(out.glob("gpu_*.json")):
        data = json.loads(path.read_text())
        steps = [r for r in data["results"] if r["part"] == "train-step" and "error_log" not in r]
        held = dict(zip(map(id, steps), earlier_models_bytes(steps)))
        for r in data["results"]:
            row = {"where": data["meta"]["device"], "part": r["part"], "case": r["case"]}
            if "error_log" in r:
                rows.append({**row, "failed": f"log in {path.name}"})
            elif r["part"] == "vllm":
                kv, parts = vllm_prediction(r)
                measured_kv = r["measured_kv_gib"] * GIB
                rows.append({**row, "quantity": "vLLM KV cache", "unit": "GiB", "measured": r["measured_kv_gib"],
                             "predicted": round(kv / GIB, 3), "error": round((kv - measured_kv) / measured_kv, 4),
                             "measured non-KV": r["measured_non_kv_gib"],
                             "predicted non-KV": round(sum(parts.values()) / GIB, 3)})
            else:
                if r["part"] in PART_VARIANTS:  # the step's peak minus what vLLM held after the trainer's init
                    budget = colocate_budget(r)
                    phase, predicted = budget.peak_phase, budget.training_peak_bytes
                    raw = r["raw"]
                    allocated = max(step["train_peak"] for step in raw["steps"][1:] or raw["steps"])
                    measured_phase, others = "", (allocated - r["measured_peak_mib"] * MIB, "colocated vLLM")
                else:
                    phase, predicted = train_step_prediction(r["case"])
                    allocated = r["measured_peak_mib"] * MIB
                    measured_phase, others = r["measured_peak_phase"], (held[id(r)], "earlier cases' models")
                measured = allocated - others[0]
                rows.append({**row, "quantity": "training peak", "unit": "MiB", "measured": round(measured / MIB, 1),
                             "predicted": round(predicted / MIB, 1),
                             "error": round((predicted - measured) / measured, 4), "measured phase": measured_phase,
                             "predicted phase": phase, "max_memory_allocated": round(allocated / MIB, 1),
                             "held by others": round(others[0] / MIB, 1), "held by": others[1]})
                awake = _awake_twin(r, data["results"])
                if awake is not None:
                    rows.append({**row, **freed_by_sleep(r, awake)})
    return rows


def _awake_twin(record: dict, records: list[dict]) -> dict | None:
    """For a sleep-mode record, the record of the same run with vLLM awake (measured in the same call)."""
    variant = record.get("variant", "full")
    if not VARIANTS[variant][1]:
        return None
    awake = {"sleep": "full", "lora+sleep": "lora"}[variant]
    return next((x for x in records if x.get("variant") == awake and "error_log" not in x), None)


def freed_by_sleep(asleep: dict, awake: dict) -> dict:
    """The device memory sleep mode frees during the update (device used at the first loss of a step, awake −
    asleep) against the planner's vLLM share less what a sleeping vLLM keeps (``VLLM_ASLEEP_BYTES``)."""
    measured = (awake["device_used_in_update_gib"] - asleep["device_used_in_update_gib"]) * GIB
    predicted = colocate_budget(asleep).vllm_bytes - VLLM_ASLEEP_BYTES
    return {"quantity": "freed by sleep mode in the update", "unit": "MiB", "measured": round(measured / MIB, 1),
            "predicted": round(predicted / MIB, 1), "error": round((predicted - measured) / measured, 4),
            "measured phase": "", "predicted phase": "", "max_memory_allocated": 0, "held by others": 0,
            "held by": "", "note": f"step time {awake['step_seconds']:.2f} s awake, {asleep['step_seconds']:.2f} s with "
                                   f"sleep mode (waking and re-sending the weights each step)"}


def render(out: Path) -> None:
    """Write ``gpu.md`` and ``comparison_gpu.json`` from the ``gpu_*.json`` in ``out`` (runs anywhere, no GPU)."""
    parts = [json.loads(path.read_text()) for path in sorted(out.glob("gpu_*.json"))]
    rows = comparison_rows(out)
    lines = ["# Memory on a GPU: measured vs predicted", ""]
    for meta in {json.dumps(p["meta"], sort_keys=True): p["meta"] for p in parts}.values():
        lines.append(f"Command: `{meta['command']}` on {meta['device']} (torch {meta['torch']}, transformers "
                     f"{meta['transformers']}, vLLM {meta['vllm']}, TRL {meta['trl']}).")
    lines += ["", "Predictions recomputed from each case's parameters with the current `grpo_lab.memory` "
              "(`python benchmarks/memory/measure_gpu.py --render --out benchmarks/memory/results`). Training "
              "rows: the peak of `max_memory_allocated`, minus what others held on the device — the colocated "
              "vLLM, or earlier cases' models where the script left them allocated (see README) — against the "
              "predicted training peak.", "",
              "| part | case | max_memory_allocated | held by others | training, measured | predicted | error |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['part']} | {r['case']} | failed ({r['failed']}) | | | | |")
        elif r["part"] == "vllm":
            lines.append(f"| vllm | {r['case']} | KV {r['measured']:.2f} GiB (non-KV {r['measured non-KV']:.2f}) | | "
                         f"| KV {r['predicted']:.2f} GiB (non-KV {r['predicted non-KV']:.2f}) | {r['error']:+.1%} |")
        elif r["quantity"] == "freed by sleep mode in the update":
            lines.append(f"| {r['part']} | {r['case']} | device memory freed in the update (awake − asleep; "
                         f"{r['note']}) | | {r['measured']:.0f} MiB | {r['predicted']:.0f} MiB | {r['error']:+.1%} |")
        else:
            phase = f" ({r['measured phase']})" if r["measured phase"] else ""
            others = f"{r['held by others']:.0f} MiB ({r['held by']})" if r["held by others"] else "0"
            lines.append(f"| {r['part']} | {r['case']} | {r['max_memory_allocated']:.0f} MiB{phase} | {others} | "
                         f"{r['measured']:.0f} MiB | {r['predicted']:.0f} MiB "
                         f"({r['predicted phase']}) | {r['error']:+.1%} |")
    (out / "gpu.md").write_text("\n".join(lines) + "\n")
    (out / "comparison_gpu.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=("train-step", "vllm", *PART_VARIANTS), default=["train-step"])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--vllm-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--colocate-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--render", action="store_true",
                        help="only rebuild gpu.md and comparison_gpu.json from the gpu_*.json in --out")
    args = parser.parse_args(argv)
    if args.render:
        return render(args.out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the GPU bundle
    if args.vllm_child:
        return vllm_child(args.vllm_child[0], float(args.vllm_child[1]))
    if args.colocate_child:
        return colocate_child(*args.colocate_child)
    if not torch.cuda.is_available():
        raise SystemExit("measure_gpu.py needs a CUDA GPU; on CPU run benchmarks/memory/measure_cpu.py.")
    results = []
    work = Path(tempfile.mkdtemp(prefix="grpo-lab-memory-"))
    if "train-step" in args.part:
        for case in TRAIN_STEP_CASES:
            results.append(train_step_case(*case))
            print(json.dumps(results[-1]), flush=True)
    if "vllm" in args.part:
        model_dir = write_config_dir(VLLM_CONFIG, work / "dummy-0.5b")
        shape = ModelShape.from_config(model_dir)
        for utilization in VLLM_UTILIZATIONS:
            results.append(vllm_case(utilization, model_dir, shape))
            print(json.dumps(results[-1]), flush=True)
    colocated = [part for part in PART_VARIANTS if part in args.part]
    if colocated:
        from standin import save_random_model

        model_dir = save_random_model(CONFIG_DIR / f"{COLOCATE_CONFIG}.json", work / "random-0.5b")
        for part in colocated:
            for variant in PART_VARIANTS[part]:
                results.append(colocate_case(model_dir, part, variant))
                print(json.dumps(results[-1]), flush=True)
    write_results(results, args.out, args.part)
    print((args.out / "gpu.md").read_text())


if __name__ == "__main__":
    main()
