"""vLLM 0.26's two model runners side by side: engine start (cold and warm) and decoding speed, in the course's setting.

Every cold engine start in the course's GPU runs spent 14-17 s between "Graph capturing finished" and "Kernel JIT
monitor activated" (`README.md`): there vLLM 0.26's V2 model runner runs `warmup_kernels` to JIT its Triton kernels,
whose cache vLLM keeps per compiled configuration, so every new configuration (notebook 01, 05's servers, 10's trainer)
pays it again. ``VLLM_USE_V2_MODEL_RUNNER=0`` selects the V1 runner, which has no such warm-up. This probe starts the
engine notebook 03's trainer starts (TRL's colocated settings, in-process as TRL runs it) in fresh processes, each
runner cold (an empty compile cache of its own) then warm (the same cache again), interleaved, and times each from
the process's start to ready, then decodes 128 sequences of exactly 256 tokens three times (tokens per second).

    PYTHONPATH=/tmp/grpo-gpu-site VLLM_USE_FLASHINFER_SAMPLER=0 \\
        python3 benchmarks/course_gpu/runner_probe.py --model /tmp/grpo-smollm2/model --out $OUT/runner_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import sys, time, json
t0 = float(sys.argv[1])
from vllm import LLM, SamplingParams
t_import = time.time() - t0
llm = LLM(**json.loads(sys.argv[2]))
t_ready = time.time() - t0
prompts = ["Count from one to a thousand in words: one, two, three,"] * 128
params = SamplingParams(max_tokens=256, min_tokens=256, ignore_eos=True, temperature=1.0, seed=0)
rounds = []
for _ in range(4):
    began = time.perf_counter()
    out = llm.generate(prompts, params, use_tqdm=False)
    rounds.append((sum(len(o.outputs[0].token_ids) for o in out), time.perf_counter() - began))
print("RESULT " + json.dumps({"import_s": t_import, "ready_s": t_ready,
                              "decode_tok_per_s": [round(n / s) for n, s in rounds[1:]]}))
"""

KEEP = re.compile(r"Model Runner|Model loading took|torch\.compile took|Directly load|Graph capturing finished|"
                  r"init engine|JIT monitor|Compiling a graph", re.IGNORECASE)


def start_once(label: str, runner: str, engine: dict, cache_root: Path) -> dict:
    """One fresh process with the ``runner`` ("1" V2, "0" V1): import vLLM, start, decode; seconds and vLLM's lines."""
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache_root), "VLLM_LOGGING_LEVEL": "INFO",
           "VLLM_USE_V2_MODEL_RUNNER": runner, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    began = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, repr(began), json.dumps(engine)], env=env,
                          capture_output=True, text=True, timeout=400)
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), {})
    lines = [line.strip()[-200:] for line in (done.stdout + done.stderr).splitlines() if KEEP.search(line)]
    row = {"label": label, "exit": done.returncode, "wall_s": round(time.time() - began, 1),
           **{k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()}, "vllm_lines": lines,
           "error_tail": "" if done.returncode == 0 else (done.stderr or done.stdout)[-2000:]}
    print(f"{label}: exit {done.returncode}, {row['wall_s']} s wall, {result}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    # notebook 03's trainer engine on CUDA: train.colocated_engine_settings (window 368, decode batch 512)
    engine = {"model": args.model, "max_model_len": 368, "max_num_seqs": 512, "max_num_batched_tokens": 4096,
              "model_impl": "vllm", "gpu_memory_utilization": 0.1, "dtype": "bfloat16", "seed": 0}
    with tempfile.TemporaryDirectory() as v2_root, tempfile.TemporaryDirectory() as v1_root:
        plan = [("V2 cold", "1", v2_root), ("V1 cold", "0", v1_root), ("V1 warm", "0", v1_root),
                ("V2 warm", "1", v2_root)]
        rows = [start_once(label, runner, engine, Path(root)) for label, runner, root in plan]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"engine": engine, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                    "starts": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
