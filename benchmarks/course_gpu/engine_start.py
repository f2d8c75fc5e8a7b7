"""Where a vLLM engine start goes on the GPU machine, and whether a second start of the same configuration is warm.

The course starts five engines (01, 03, 05 twice, 06), each 90-112 s on one H200 for a 135 M model. This probe starts
one engine configuration in fresh processes: cold (an empty compile cache), again with the same cache (warm), and
eager (no torch.compile, no CUDA graphs), each timed from the process's start to its first generated token, and
keeps vLLM's own INFO lines about weights, torch.compile, graph capture and engine init; then which modules make
``import vllm`` slow (``python -X importtime``).

    python3 benchmarks/course_gpu/engine_start.py --model /tmp/grpo-smollm2/model --out $OUT/engine_start.json
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
llm.generate(["12 + 7 ="], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
print("RESULT " + json.dumps({"import_s": t_import, "ready_s": t_ready, "first_generate_s": time.time() - t0}))
"""

# vLLM's INFO lines worth keeping (0.26 wording; a line that changed is simply not kept)
KEEP = re.compile(r"Loading weights took|Model loading took|torch\.compile take|Compiling a graph|Directly load|"
                  r"Dynamo bytecode|Graph capturing finished|init engine|KV cache|Available KV cache|compile range",
                  re.IGNORECASE)


def start_once(label: str, engine: dict, cache_root: Path) -> dict:
    """One fresh process: import vLLM, build the engine, generate one request; its seconds and vLLM's log lines."""
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache_root), "VLLM_LOGGING_LEVEL": "INFO"}
    began = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, repr(began), json.dumps(engine)], env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.time() - began
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), {})
    lines = [line.strip()[-220:] for line in (done.stdout + done.stderr).splitlines() if KEEP.search(line)]
    print(f"{label}: exit {done.returncode}, {wall:.1f} s wall, {result}", flush=True)
    return {"label": label, "engine": engine, "exit": done.returncode, "wall_s": round(wall, 2),
            **{k: round(v, 2) for k, v in result.items()}, "vllm_lines": lines,
            "error_tail": "" if done.returncode == 0 else (done.stderr or done.stdout)[-3000:]}


def import_profile(top: int = 15) -> list[dict]:
    """``python -X importtime -c "import vllm"``: the modules whose import (their own and their imports') took longest;
    ``depth`` 0 is ``vllm`` itself."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import vllm"], capture_output=True, text=True,
                          timeout=300)
    rows = []
    for line in done.stderr.splitlines():  # "import time: self [us] | cumulative | imported package"
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            rows.append({"module": name.strip(), "depth": (len(name) - len(name.lstrip())) // 2,
                         "self_s": int(parts[0]) / 1e6, "cumulative_s": int(parts[1]) / 1e6})
    rows.sort(key=lambda row: -row["cumulative_s"])
    print("slowest imports:", ", ".join(f"{r['module']} {r['cumulative_s']:.1f} s" for r in rows[:5]), flush=True)
    return rows[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-model-len", type=int, default=1024)
    args = parser.parse_args()
    engine = {"model": args.model, "gpu_memory_utilization": 0.3, "max_model_len": args.max_model_len, "max_num_seqs": 256,
              "seed": 0}
    records = []
    with tempfile.TemporaryDirectory(prefix="engine-start-") as scratch:
        compiled, eager = Path(scratch) / "compiled", Path(scratch) / "eager"
        records.append(start_once("cold (empty compile cache)", engine, compiled))
        records.append(start_once("warm (same configuration, same cache)", engine, compiled))
        records.append(start_once("eager (enforce_eager=True)", {**engine, "enforce_eager": True}, eager))
    imports = import_profile()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "records": records, "slowest_imports": imports},
                                         indent=2) + "\n")
    return 0 if all(r["exit"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
