"""The whole bench run in one process: rollouts, roofline, the engine probe and the GRPO step, into one results dict."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from grpo_lab import device, env
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.models import resolve_model
from grpo_lab.rollout import encode_prompts, load_tokenizer
from lab.bench.engine_probe import engine_probe
from lab.bench.grpo_step import bottleneck, grpo_step_bench, grpo_step_config
from lab.bench.profiles import CONFIGS, PARTS, VARIANTS, BenchProfile, check_choice
from lab.bench.results import SCHEMA, check_results
from lab.bench.rollout_bench import bench_engine_config, rollout_bench, without_internals
from lab.bench.roofline import (
    DATASHEET_RATES,
    add_roofline,
    extra_forwards,
    measure_device,
    model_cost,
    update_mfu,
)
from lab.bench.workload import seed_workload, shaped_model_dir

SEED_REFERENCE = ("the write-up: one Ascend NPU, 2B model, 128 prompts x n=4 x 256 tokens: HF generate 16 s -> vLLM + "
                  "prefix caching 3.9 s (4.1x); GRPO step 22 s -> 6.7 s (3.3x). Qwen2.5-0.5B on an A100: 312 -> "
                  "1280 tok/s at batch 32 (4.1x)")


def run_bench(profile: BenchProfile, model: str | None = None, shape: str | None = None,
              parts: Sequence[str] = PARTS, configs: Sequence[str] = CONFIGS, variants: Sequence[str] = VARIANTS,
              ragged: str | None = None, prefix_off: str = "salt", engine: dict[str, Any] | None = None,
              grpo_backends: Sequence[str] | None = None, train_overrides: dict[str, Any] | None = None,
              command: str = "", progress: bool | None = None, grpo_workload: str = "fixed") -> dict[str, Any]:
    """Everything in one process: rollouts, GRPO step, roofline; returns the results dict.

    ``shape`` (``qwen2.5-0.5b``/``qwen2.5-1.5b``) runs random ("dummy") weights of that architecture with the
    tokenizer of ``model`` (``GRPO_LAB_MODEL`` or the shipped tiny model); ``engine`` holds
    :class:`~grpo_lab.rollout.RolloutConfig` overrides for every engine (``max_num_seqs``, ``hf_batch_size``,
    ``vllm_options`` ...); ``ragged`` is ``uniform`` (drawn
    lengths, the default: random weights never end, and the tiny model answers these long prompts in ~6 tokens)
    or ``eos`` (a real model's own lengths). ``grpo_workload`` is the GRPO step's (``fixed`` or ``ragged``, see
    :func:`grpo_step_bench`); the ``engine`` part times the same step's generation on TRL's engine settings in a
    fresh process (:func:`engine_probe`).
    """
    check_choice("parts", parts, PARTS)
    load = os.getloadavg()
    started = time.perf_counter()
    kind = device.detect()
    with tempfile.TemporaryDirectory(prefix="grpo-lab-bench-") as scratch:
        if shape:
            path = str(shaped_model_dir(shape, Path(scratch) / "model", model,
                                        random_weights="grpo" in parts))
        else:
            path = resolve_model(model)
        dummy = bool(shape)
        ragged = ragged or "uniform"
        tokenizer = load_tokenizer(path)
        rows = seed_workload(tokenizer, profile.num_prompts, profile.prompt_tokens)
        config, engine_notes = bench_engine_config(profile, kind, dummy, engine)
        dtype = config.dtype or str(device.preferred_dtype(kind)).removeprefix("torch.")
        cost = model_cost(path, dtype)
        notes = [f"profile {profile.name}: {profile.why}",
                 (f"weights: RANDOM (dummy) of the {shape} shape with the tokenizer of "
                  f"{Path(resolve_model(model)).name}: every number here is speed only; outputs are noise")
                 if dummy else f"weights: real ({Path(path).name})",
                 *(engine_notes if "rollout" in parts else []), SEED_REFERENCE]
        if device.is_cpu(kind):
            notes.append(f"CPU timings are noisy: load average {load[0]:.1f} on {os.cpu_count()} cores at the start")
            notes.append("on the CPU, HF generate computes in this process with torch's threads (OMP_NUM_THREADS); "
                         "vLLM-CPU's worker binds its OpenMP threads to the cores it does not reserve for its "
                         "scheduler process (on 2 cores: one each), so on a loaded machine vLLM's extra processes get "
                         "a larger share of the CPU, which favours it; the roofline rates use this process's threads")
        results: dict[str, Any] = {
            "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
            "profile": profile.as_dict(), "parts": list(parts),
            "model": {"path": Path(path).name if not shape else f"{shape} (random weights)", "shape": shape,
                      "weights": "dummy" if dummy else "real", "dtype": dtype, "params": cost.params},
            "environment": env.report().as_dict(), "load_average": {"start": list(load)}, "notes": notes,
        }
        if "roofline" in parts:
            rates = measure_device(kind, dtype)
            results["roofline"] = {"device": asdict(rates), "model_cost": {**asdict(cost),
                                                                          "param_bytes": cost.param_bytes,
                                                                          "matmul_params": cost.matmul_params}}
        if "rollout" in parts:
            rollout = rollout_bench(path, rows, profile, config, configs, variants, ragged, prefix_off, progress)
            if "roofline" in parts:
                add_roofline(rollout, cost, rates)
            results["rollout"] = without_internals(rollout)
        probe = None
        backends = grpo_backends or profile.grpo_backends
        if "engine" in parts and "vllm" in backends:  # first, on an empty device: the trainers' engines hold memory
            if grpo_workload == "ragged" and dummy:
                raise ConfigError("--parts engine times the fixed workload (the ragged one changes the model's end "
                                  "tokens inside grpo_step_bench); run it with --grpo-workload fixed")
            longest = max(len(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows]))
            probe_config = dataclasses.replace(
                grpo_step_config(profile, path, "unused", longest, kind, **(train_overrides or {})),
                use_vllm=True).resolve(Machine.detect())
            probe = engine_probe(probe_config, path, rows)
        if "grpo" in parts:
            step = grpo_step_bench(path, rows, profile, grpo_backends, workload=grpo_workload, stop_ids=dummy,
                                   **(train_overrides or {}))
            results["grpo_step"] = step
            peak = (DATASHEET_RATES["NVIDIA H200"].matmul_flops_per_s if "H200" in device.device_name(kind=kind)
                    else rates.matmul_flops_per_s if "roofline" in parts else None)
            for name, block in step["backends"].items():
                block["completions_per_step"] = profile.sequences
                block["bottleneck"] = bottleneck(block)
                if peak:
                    block["mfu"] = update_mfu(block, cost, step["max_prompt_length"], profile.sequences, peak,
                                              extra_forwards(name, block["settings"]["beta"],
                                                             block["settings"]["deferred_correction"],
                                                             block["settings"]["vllm_importance_sampling_correction"]))
            if probe is not None and "vllm" in step["backends"]:
                in_trainer = step["backends"]["vllm"]["median"].get("vllm_generate_s", float("nan"))
                step["fresh_engine"] = {**probe, "in_trainer_vs_fresh": in_trainer / probe["median_s"]}
            if "vllm" not in backends:
                notes.append("GRPO step: vLLM colocate not measured in this run (--grpo-backends hf,vllm adds it)")
        else:
            results["grpo_step"] = {"skipped": "not in --parts"}
    results["load_average"]["end"] = list(os.getloadavg())
    results["seconds"] = time.perf_counter() - started
    return check_results(results)
