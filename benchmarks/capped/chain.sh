#!/usr/bin/env bash
# One GPU session (an H200, or an H100: every cap here but bench-80's is below 79 GiB) for issue 42's rows that are still missing, each ALONE on the machine (side by side, vLLM 0.26's
# start asserted while another process freed memory, and jobs raced for TRL's port: README.md, 2026-12-03), in order
# of what they settle, after the staging calls of ../course_gpu/README.md:
#
#   qlora (learns, served) -> sleep probe -> lengths-16 -> notebooks 03-05 under 16 GiB -> bench-80 (4 min; on an
#   H100, the 80 GB card itself) -> 03-05 under 32 GiB -> lengths-32 -> lengths-24
#
#   GRPO_LAB_COMMIT=<sha> setsid bash benchmarks/capped/chain.sh > /tmp/chain.log 2>&1 < /dev/null &
#   bash benchmarks/capped/chain.sh collect     # waits <= CHAIN_WAIT_S (540), copies what has finished to $OUT/chain
#
# Each step's rows and logs land under /tmp/capped and /tmp/course-<cap>; /tmp/chain/progress says what finished.
# `collect` copies only rows, logs, summaries and executed notebooks (never weights), so it can be called as often as
# a call is needed to keep the machine held.
set -u
cd "$(dirname "$0")/../.."
LOG=/tmp/chain
if [ "${1:-}" = collect ]; then
  waited=0
  while ! grep -q '^done' "$LOG/progress" 2>/dev/null && [ "$waited" -lt "${CHAIN_WAIT_S:-540}" ]; do
    sleep 10; waited=$((waited + 10))
  done
  cat "$LOG/progress" 2>/dev/null
  target=${OUT:-/tmp/out}/chain
  mkdir -p "$target"
  cp -r "$LOG" "$target/" 2>/dev/null
  for folder in rows logs bench; do [ -d /tmp/capped/$folder ] && cp -r /tmp/capped/$folder "$target/"; done
  for course in /tmp/course-*; do
    [ -d "$course" ] || continue
    tar -C "$course" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='*.pth' \
      --exclude='checkpoints' --exclude='model' --exclude='final' -czf "$target/$(basename "$course").tgz" .
  done
  du -sh "$target"
  exit 0
fi
mkdir -p "$LOG"
echo "started $(date +%T)" > "$LOG/progress"
step() { echo "$1 $2 $(date +%T)" >> "$LOG/progress"; }
bash benchmarks/course_gpu/run.sh compile > "$LOG/compile.out" 2>&1
python3 benchmarks/capped/run.py jobs qlora > "$LOG/qlora.out" 2>&1; step qlora $?
(
  export PYTHONPATH=/tmp/grpo-gpu-site:$PWD VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0
  timeout 240 python3 benchmarks/capped/sleep_probe.py --model /tmp/grpo-smollm2/model --cap 32 --share 0.55 \
    --out "$LOG/sleep_probe.json" > "$LOG/sleep_probe.out" 2>&1
)
step sleep-probe $?
course() {  # notebooks 03-05 under a cap, as a learner with that card runs them (05 deploys what 03 trained)
  mkdir -p /tmp/packs-$1
  COURSE=/tmp/course-$1 COURSE_CAP_GIB=$1 OUT=/tmp/packs-$1 \
    COURSE_NOTEBOOKS="notebooks/03_grpo_training.ipynb notebooks/04_memory_budget.ipynb notebooks/05_deployment.ipynb" \
    timeout 900 bash benchmarks/course_gpu/run.sh > "$LOG/course-$1.out" 2>&1
  step "course-03-05-$1" "$(cat /tmp/course-$1/exit_code 2>/dev/null)"
}
python3 benchmarks/capped/run.py jobs lengths-16 > "$LOG/lengths-16.out" 2>&1; step lengths-16 $?
course 16
python3 benchmarks/capped/run.py jobs bench-80 > "$LOG/bench-80.out" 2>&1; step bench-80 $?
course 32
for job in lengths-32 lengths-24; do
  python3 benchmarks/capped/run.py jobs $job > "$LOG/$job.out" 2>&1; step $job $?
done
step done 0
