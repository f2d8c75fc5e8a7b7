#!/usr/bin/env bash
# One device call on an nvidia-h200-x2 machine whose GPU bundle is already assembled (../shared/gpu/):
# two job lists run side by side, one per GPU, each job in its own process with CUDA_VISIBLE_DEVICES set.
#
#   bash benchmarks/h200_session.sh "rollout memory" "grpo05"     # jobs on GPU 0, jobs on GPU 1; waits for both
#   bash benchmarks/h200_session.sh --detach "smollm2" "scale-colocate"   # starts both in their own session, returns
#   bash benchmarks/h200_session.sh --wait                        # waits (≤ H200_STREAM_LIMIT) for detached lists
#
# Detached lists outlive the call (the device tool keeps a process that started its own session), so a job may
# run longer than one call's ten minutes; later calls (`--wait`) keep the machine warm and collect the results.
# Every job writes under /tmp/h200/<job>/ and logs to /tmp/h200/logs/<job>.log; each call ends by packing
# /tmp/h200 into $OUT/h200.tgz (one file back, all calls' results so far). The jobs are listed in job() below;
# benchmarks/results/h200/README.md says which call ran which jobs and what came out. A bench file kept from a job goes
# into benchmarks/results/h200/ with a key (and its series) in benchmarks/results/catalogue.json.
set -uo pipefail
# /tmp/grpo-extra-site: wheels carried beside the bundle (.whl/: liger-kernel), put there by the device call with
# `python3 -m pip install -q --no-index --no-deps --target /tmp/grpo-extra-site .whl/*.whl`
export PYTHONPATH=/tmp/grpo-extra-site:/tmp/grpo-gpu-site:$PWD:$PWD/benchmarks VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
R=/tmp/h200
LIMIT=${H200_STREAM_LIMIT:-540}        # seconds a call waits for its job lists, so that packing fits in the call
DETACHED_LIMIT=${H200_DETACHED_LIMIT:-1500}   # seconds a detached job list may run in all
SCALE="benchmarks/scale_out/run.py --out $R/scale-out --profile seed --shape qwen2.5-0.5b --grpo-steps 2"
ASYNC="benchmarks/async_grpo/run.py --out $R/async"
ASYNC_SEED="--shape qwen2.5-0.5b --rollout-devices 0 --train-devices 1 --grpo-steps 4 --grpo-warmup-steps 2"
mkdir -p "$R/logs"

job() {
  local out="$R/$1"
  mkdir -p "$out"
  case $1 in
    env)      python3 -m grpo_lab.cli env --smoke > "$out/env.txt" 2>&1
              python3 -m grpo_lab.cli doctor --profile gpu > "$out/doctor.txt" 2>&1 ;;
    rollout)  python3 -m grpo_lab.rollout --backends hf,vllm --json "$out/rollout_tiny.json"
              python3 -m lab.rollout --shape qwen2.5-0.5b --backends hf,vllm --num-prompts 128 --n 4 \
                --max-tokens 256 --hf-batch-size 512 --json "$out/rollout_qwen2.5-0.5b.json" ;;
    memory)   timeout "${MEMORY_LIMIT:-900}" python3 benchmarks/memory/measure_gpu.py --part train-step vllm colocate \
                --out "$out" ;;
    grpo05)   python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --parts grpo,roofline \
                --grpo-backends hf,vllm --grpo-steps 2 --out "$out" --name grpo_step_seed_qwen2.5-0.5b ;;
    # issue 16 (2026-12-01): the GRPO step after the changes, fixed and ragged, with the whole split, update MFU and
    # (fixed) the same engine timed in a fresh process
    grpo-fixed)  python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --parts grpo,roofline,engine \
                   --grpo-backends hf,vllm --grpo-steps 2 --grpo-workload fixed --out "$out" \
                   --name grpo_step_seed_qwen2.5-0.5b_fixed ;;
    grpo-ragged) python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --parts grpo,roofline \
                   --grpo-backends hf,vllm --grpo-steps 2 --grpo-workload ragged --out "$out" \
                   --name grpo_step_seed_qwen2.5-0.5b_ragged ;;
    # issue 18: the served 0.5B shape under load, 64 and 256 clients (one server, plus one without prefix caching)
    serving)     python3 benchmarks/serving/run.py --shape qwen2.5-0.5b --concurrency 64,256 --knob-concurrency 256 \
                   --max-num-seqs 256 --max-model-len 2048 --max-tokens 128 --repeats 1 --requests-per-client 2 \
                   --max-seconds 120 --out "$out" --name h200_qwen2.5-0.5b ;;
    bench15)  python3 -m lab.bench --profile seed --shape qwen2.5-1.5b --parts rollout,roofline \
                --vllm-option async_scheduling=true --out "$out" --name bench_seed_qwen2.5-1.5b ;;
    bench05)  python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --parts rollout,roofline \
                --vllm-option async_scheduling=true --out "$out" --name bench_seed_qwen2.5-0.5b ;;
    smollm2)  python3 benchmarks/grpo_smollm2/run.py ${SMOLLM2_PHASES:-before train after} \
                --max-minutes "${SMOLLM2_MINUTES:-6}" --out "$out" ;;
    smollm2-before) python3 benchmarks/grpo_smollm2/run.py before --out "$out" ;;
    smollm2-hf) python3 benchmarks/grpo_smollm2/run.py hf-steps --hf-steps 6 --out "$out" ;;
    # issue 10: colocate on this stream's GPU alone; server mode takes both GPUs (run it with the other list empty)
    scale-colocate) CUDA_VISIBLE_DEVICES=0,1 python3 $SCALE --parts colocate \
                      --rollout-devices "$GPU" --train-devices "$((1 - GPU))" ;;
    scale-server)   CUDA_VISIBLE_DEVICES=0,1 python3 $SCALE --parts server --rollout-devices 0 --train-devices 1 ;;
    # issue 19: asynchronous GRPO vs synchronous server mode vs colocate (benchmarks/async_grpo/README.md); the async
    # and server jobs take both GPUs, so they run in one list, one after the other
    async-speed)    CUDA_VISIBLE_DEVICES=0,1 python3 $ASYNC speed --layouts async $ASYNC_SEED ;;
    async-server)   CUDA_VISIBLE_DEVICES=0,1 python3 $ASYNC speed --layouts server $ASYNC_SEED ;;
    async-colocate) CUDA_VISIBLE_DEVICES=0,1 python3 $ASYNC speed --layouts colocate $ASYNC_SEED ;;
    async-curve)    CUDA_VISIBLE_DEVICES=0,1 python3 $ASYNC curve --model /tmp/grpo-smollm2/model \
                      --rollout-devices 0 --train-devices 1 --steps "${ASYNC_CURVE_STEPS:-60}" ;;
    # issue 26, session 8 (one H200, 2026-12-02): five interleaved steps per backend, the hand-over keeping the
    # device's memory cache; the fixed one under py-spy (50 samples/s, --nonblocking: the process never stops; raw
    # stacks, one line per distinct stack, read by lab.bench.Stacks)
    grpo-fixed5)  $(spy "$out/pyspy_fixed.txt") python3 -m lab.bench --profile seed --shape qwen2.5-0.5b \
                    --grpo-steps 5 --parts grpo --grpo-backends hf,vllm --grpo-workload fixed --out "$out" \
                    --name grpo_step_seed_qwen2.5-0.5b_fixed ;;
    grpo-ragged5) python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --grpo-steps 5 --parts grpo \
                    --grpo-backends hf,vllm --grpo-workload ragged --out "$out" \
                    --name grpo_step_seed_qwen2.5-0.5b_ragged ;;
    # session 9: the same with vLLM's importance-sampling correction off (the loss HF generate's path computes): the
    # colocated engine samples without log-probs (grpo_lab.trainer.reads_sampling_logprobs)
    grpo-fixed-nocorr)  python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --grpo-steps 5 --parts grpo \
                          --grpo-backends hf,vllm --grpo-workload fixed \
                          --train-option vllm_importance_sampling_correction=false --out "$out" \
                          --name grpo_step_seed_qwen2.5-0.5b_fixed_nocorrection ;;
    grpo-ragged-nocorr) python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --grpo-steps 5 --parts grpo \
                          --grpo-backends hf,vllm --grpo-workload ragged \
                          --train-option vllm_importance_sampling_correction=false --out "$out" \
                          --name grpo_step_seed_qwen2.5-0.5b_ragged_nocorrection ;;
    # session 10: the fixed step (TRL's default, correction on) with the whole generation batch in 4 micro-batches of
    # 128 instead of 16 of 32, vLLM's share lowered to make room (the planner: 72 GiB training peak at 128, vLLM's
    # KV cache needs 2.4 GiB for the step's 512 x 384 tokens)
    # grpo-fixed-mb128-N / grpo-ragged-mb128-N: the same command again in one list, its file named ..._mb128_N
    grpo-fixed-mb128|grpo-fixed-mb128-[0-9]) python3 -m lab.bench --profile seed --shape qwen2.5-0.5b \
                        --grpo-steps 5 --parts grpo \
                        --grpo-backends hf,vllm --grpo-workload fixed --per-device-train-batch-size 128 \
                        --train-option vllm_gpu_memory_utilization=0.25 --out "$out" \
                        --name "grpo_step_seed_qwen2.5-0.5b_fixed_mb128$(repeat_suffix "$1")" ;;
    grpo-fixed-mb64)  python3 -m lab.bench --profile seed --shape qwen2.5-0.5b --grpo-steps 5 --parts grpo \
                        --grpo-backends hf,vllm --grpo-workload fixed --per-device-train-batch-size 64 \
                        --train-option vllm_gpu_memory_utilization=0.45 --out "$out" \
                        --name grpo_step_seed_qwen2.5-0.5b_fixed_mb64 ;;
    # session 11: the ragged step in micro-batches of 128; length grouping switched step by
    # step on the 0.5B shape (micro-batches of 128: 4 per step, each cut to its own longest completion when grouped)
    grpo-ragged-mb128|grpo-ragged-mb128-[0-9]) python3 -m lab.bench --profile seed --shape qwen2.5-0.5b \
                         --grpo-steps 5 --parts grpo \
                         --grpo-backends hf,vllm --grpo-workload ragged --per-device-train-batch-size 128 \
                         --train-option vllm_gpu_memory_utilization=0.25 --out "$out" \
                         --name "grpo_step_seed_qwen2.5-0.5b_ragged_mb128$(repeat_suffix "$1")" ;;
    switch-length-05) python3 benchmarks/trainer_switches/run.py --switch length_grouping --profile gpu \
                        --shape qwen2.5-0.5b --ragged --steps 8 --set num_generations=4 \
                        --set per_device_train_batch_size=128 --set gradient_accumulation_steps=4 \
                        --set max_completion_length=256 ;;
    # verl at its own settings with padding removal on (best_settings() fixed after session 7)
    verl-best)    python3 benchmarks/verl/run.py env smollm2-best --smollm2-steps 8 --smollm2-save-freq 8 \
                    --skip-val-before --continue-from benchmarks/verl/results.json \
                    --verl-transformers /tmp/verl-tf-carried --out "$out" --budget-s "${VERL_BUDGET:-540}" ;;
    # the trainer's switches, each on and off step by step in one SmolLM2 run (benchmarks/trainer_switches)
    switch-length) GRPO_LAB_MODEL=/tmp/grpo-smollm2/model python3 benchmarks/trainer_switches/run.py \
                     --switch length_grouping --profile gpu --steps 16 \
                     --set per_device_train_batch_size=32 --set gradient_accumulation_steps=4 ;;
    # session 9: vLLM's sampled-token log-probs on and off step by step in one trainer, the bench's 0.5B shape and
    # 512 completions of 256 tokens per step, the correction off (nothing reads them then)
    switch-logprobs) python3 benchmarks/trainer_switches/run.py --switch sampling_logprobs --profile gpu \
                       --shape qwen2.5-0.5b --steps 8 --set vllm_importance_sampling_correction=false \
                       --set num_generations=4 --set per_device_train_batch_size=128 \
                       --set gradient_accumulation_steps=4 --set max_completion_length=256 ;;
    *)        echo "unknown job $1"; return 2 ;;
  esac
}

repeat_suffix() {  # repeat_suffix JOB: "_N" for a job named ...-N (a repeat), nothing otherwise
  [[ $1 =~ -([0-9])$ ]] && echo "_${BASH_REMATCH[1]}"
}

spy() {  # spy FILE: the py-spy command line to put before a job's command, or nothing without py-spy
  local bin=/tmp/grpo-extra-site/bin/py-spy
  [ -x "$bin" ] && echo "$bin record --nonblocking --rate 50 --format raw --output $1 --"
}

stream() {  # stream GPU "job job ..."
  export CUDA_VISIBLE_DEVICES=$1 GPU=$1
  for name in $2; do
    local start=$SECONDS
    # a verl run killed at its limit may leave TRL moved aside (benchmarks/verl/run.py puts it back otherwise)
    [ -d /tmp/grpo-gpu-site/trl.off ] && [ ! -e /tmp/grpo-gpu-site/trl ] && mv /tmp/grpo-gpu-site/trl.off /tmp/grpo-gpu-site/trl
    job "$name" > "$R/logs/$name.log" 2>&1
    echo "[gpu $1] $name: exit $? after $((SECONDS - start)) s"
  done
}

pack() {
  for log in "$R"/logs/*.log; do echo "== $log"; tail -n 12 "$log"; done
  tar -C "$R" -czf "$OUT/h200.tgz" --exclude='*.safetensors' . && ls -la "$OUT"
}

run_list() {  # run_list GPU "jobs" TIMEOUT: one job list, marked done in $R/done-GPU when it ends
  # through this script again, so that no process's command line holds the job bodies (a `pkill -f` aimed at one
  # job's command would otherwise match, and kill, whole job lists: it ended a run on 2026-11-30)
  timeout "$3" bash "$0" --stream "$1" "$2"
  touch "$R/done-$1"
}

case ${1:-} in
  --stream)
    stream "$2" "$3" ;;
  --detach)
    for gpu in 0 1; do
      jobs=${2:-}; [ "$gpu" = 1 ] && jobs=${3:-}
      [ -n "$jobs" ] || continue
      rm -f "$R/done-$gpu"; touch "$R/detached-$gpu"
      setsid bash "$0" --run-list "$gpu" "$jobs" "$DETACHED_LIMIT" >> "$R/logs/stream-$gpu.log" 2>&1 < /dev/null &
      echo "detached GPU $gpu: $jobs"
    done ;;
  --run-list)
    run_list "$2" "$3" "$4" ;;
  --wait)
    waited=0
    for marker in "$R"/detached-*; do
      [ -e "$marker" ] || continue
      gpu=${marker##*-}
      while [ ! -e "$R/done-$gpu" ] && [ "$waited" -lt "$LIMIT" ]; do sleep 5; waited=$((waited + 5)); done
      [ -e "$R/done-$gpu" ] && rm -f "$marker" && echo "GPU $gpu: done" || echo "GPU $gpu: still running"
    done
    cat "$R"/logs/stream-*.log 2>/dev/null
    pack ;;
  *)
    run_list 0 "${1:-}" "$LIMIT" &
    run_list 1 "${2:-}" "$LIMIT" &
    wait
    pack ;;
esac
