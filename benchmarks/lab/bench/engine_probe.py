"""The colocated engine in a fresh process: vLLM with TRL's colocate settings, outside the trainer, timing one GRPO
step's generation: the baseline for the trainer's own ``timing/vllm_generate_s``. The probe's process is
``python -m lab.bench engine-probe SPEC``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_lab import device
from grpo_lab.experiment import TrainConfig
from grpo_lab.memory import CPU_KV_CACHE_GIB
from grpo_lab.rollout import encode_prompts, load_tokenizer
from grpo_lab.servers import free_port, run_process_group
from lab.bench.profiles import BenchError
from lab.bench.stats import median

def trl_engine_settings(config: TrainConfig, model: str) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments as TRL 1.16 builds its colocated engine (trl/generation/vllm_generation.py)."""
    return dict(model=model, tensor_parallel_size=1, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                max_model_len=config.max_model_len, max_num_seqs=config.generation_batch_size,
                enable_sleep_mode=False, model_impl="vllm", distributed_executor_backend="external_launcher",
                seed=0, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs", trust_remote_code=False)


def engine_probe(config: TrainConfig, model: str, rows: Sequence[dict], repeats: int = 3) -> dict[str, Any]:
    """Time ``LLM.generate`` of one step's requests (each prompt ``num_generations`` times, n=1, log-probs, no
    detokenizing: what the trainer sends) on TRL's engine settings in a fresh process: the baseline for the
    in-trainer ``timing/vllm_generate_s``. Median of ``repeats`` after one warm-up, prefix cache reset each time."""
    tokenizer = load_tokenizer(model)
    prompts = [list(p.token_ids) for p in encode_prompts(tokenizer, [r["prompt"] for r in rows])]
    spec = {"engine": trl_engine_settings(config, model), "repeats": repeats,
            "prompts": [ids for ids in prompts for _ in range(config.num_generations)],
            "sampling": dict(n=1, temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_completion_length,
                             logprobs=0, detokenize=False)}
    with tempfile.TemporaryDirectory(prefix="grpo-lab-probe-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        environment = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}
        environment = {**device.vllm_kv_cache_env(CPU_KV_CACHE_GIB, config.device), **environment}
        done = run_process_group([sys.executable, "-m", "lab.bench", "engine-probe", str(spec_path)],
                                 environment, timeout_s=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise BenchError(f"the engine probe failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-2000:]}")
    return {**json.loads(lines[-1][7:]), "settings": {k: v for k, v in spec["engine"].items() if k != "model"},
            "sampling": spec["sampling"], "requests": len(spec["prompts"])}


def run_engine_probe(spec_path: str) -> int:
    """The probe's own process: build the engine, time the generation, print ``RESULT {json}``."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    kind = device.detect()
    started = time.perf_counter()
    llm = LLM(**spec["engine"])
    load_s = time.perf_counter() - started
    requests = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = SamplingParams(**spec["sampling"])
    times, tokens = [], []
    for _ in range(1 + spec["repeats"]):
        llm.reset_prefix_cache()
        device.synchronize(kind)
        started = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        device.synchronize(kind)
        times.append(time.perf_counter() - started)
        tokens.append(sum(len(o.outputs[0].token_ids) for o in outputs))
    print("RESULT " + json.dumps({"load_s": load_s, "generate_s": times[1:], "median_s": median(times[1:]),
                                  "new_tokens": tokens[1:]}), flush=True)
    return 0
