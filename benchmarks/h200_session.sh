#!/usr/bin/env bash
# One device call on an nvidia-h200-x2 machine whose GPU bundle is already assembled (../shared/gpu/):
# two job lists run side by side, one per GPU, each job in its own process with CUDA_VISIBLE_DEVICES set.
#
#   bash benchmarks/h200_session.sh "rollout memory" "grpo05"     # jobs on GPU 0, jobs on GPU 1
#
# Every job writes under /tmp/h200/<job>/ and logs to /tmp/h200/logs/<job>.log; the call ends by packing
# /tmp/h200 into $OUT/h200.tgz (one file back, all calls' results so far). The jobs are listed in job() below;
# benchmarks/README.md says which call ran which jobs and what came out.
set -uo pipefail
export PYTHONPATH=/tmp/grpo-gpu-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
R=/tmp/h200
LIMIT=${H200_STREAM_LIMIT:-540}   # seconds per job list, so that packing the results fits in the call
mkdir -p "$R/logs"

job() {
  local out="$R/$1"
  mkdir -p "$out"
  case $1 in
    env)      python3 -m grpo_lab.cli env --smoke > "$out/env.txt" 2>&1
              python3 -m grpo_lab.cli doctor --profile gpu > "$out/doctor.txt" 2>&1 ;;
    rollout)  python3 -m grpo_lab.rollout --backends hf,vllm --json "$out/rollout_tiny.json"
              python3 -m grpo_lab.rollout --shape qwen2.5-0.5b --backends hf,vllm --num-prompts 128 --n 4 \
                --max-tokens 256 --hf-batch-size 512 --json "$out/rollout_qwen2.5-0.5b.json" ;;
    memory)   python3 benchmarks/memory/measure_gpu.py --part train-step vllm colocate --out "$out" ;;
    grpo05)   python3 -m grpo_lab.bench --profile seed --shape qwen2.5-0.5b --parts grpo,roofline \
                --grpo-backends hf,vllm --grpo-steps 2 --out "$out" --name grpo_step_seed_qwen2.5-0.5b ;;
    bench15)  python3 -m grpo_lab.bench --profile seed --shape qwen2.5-1.5b --parts rollout,roofline \
                --vllm-option async_scheduling=true --out "$out" --name bench_seed_qwen2.5-1.5b ;;
    bench05)  python3 -m grpo_lab.bench --profile seed --shape qwen2.5-0.5b --parts rollout,roofline \
                --vllm-option async_scheduling=true --out "$out" --name bench_seed_qwen2.5-0.5b ;;
    smollm2)  python3 benchmarks/grpo_smollm2/run.py before train after --max-minutes "${SMOLLM2_MINUTES:-6}" \
                --out "$out" ;;
    smollm2-hf) python3 benchmarks/grpo_smollm2/run.py hf-steps --hf-steps 6 --out "$out" ;;
    *)        echo "unknown job $1"; return 2 ;;
  esac
}

stream() {  # stream GPU "job job ..."
  export CUDA_VISIBLE_DEVICES=$1
  for name in $2; do
    local start=$SECONDS
    job "$name" > "$R/logs/$name.log" 2>&1
    echo "[gpu $1] $name: exit $? after $((SECONDS - start)) s"
  done
}

timeout "$LIMIT" bash -c "$(declare -f job stream); R=$R; stream 0 '${1:-}'" &
timeout "$LIMIT" bash -c "$(declare -f job stream); R=$R; stream 1 '${2:-}'" &
wait
for log in "$R"/logs/*.log; do echo "== $log"; tail -n 15 "$log"; done
tar -C "$R" -czf "$OUT/h200.tgz" . && ls -la "$OUT"
