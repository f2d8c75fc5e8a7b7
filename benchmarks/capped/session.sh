#!/usr/bin/env bash
# One H200 session, detached (setsid), after the staging calls of ../course_gpu/README.md: the whole course under a
# 24 GiB cap first, alone (its notebook time is a claim: nothing runs beside it), then the capped jobs of this folder
# (seed-2b, qlora, lengths-16, lengths-32) side by side with the GSM8K run (../gsm8k, under a 16 GiB cap of its own:
# caps 32 + 16 + 16 + 32 + 16 = 112 GiB of the 139.8, plus the served QLoRA models).
#
#   GRPO_LAB_COMMIT=<sha> setsid bash benchmarks/capped/session.sh > /tmp/session.log 2>&1 < /dev/null &
#   bash benchmarks/course_gpu/run.sh wait                 # the course, packed into $OUT/course_gpu.tgz (+ its row)
#   bash benchmarks/capped/session.sh collect              # the rows, logs and GSM8K result into $OUT/extras.tgz
#
# /tmp/session/progress says what has finished. lengths-24 is left out so that the GSM8K run fits beside the rest.
set -u
cd "$(dirname "$0")/../.."
LOG=/tmp/session
if [ "${1:-}" = collect ]; then
  waited=0
  while ! grep -q '^done' "$LOG/progress" 2>/dev/null && [ "$waited" -lt "${SESSION_WAIT_S:-540}" ]; do
    sleep 10; waited=$((waited + 10))
  done
  cat "$LOG/progress" 2>/dev/null
  tar -C /tmp -czf "${OUT:-/tmp}/extras.tgz" session capped gsm8k 2>/dev/null
  ls -la "${OUT:-/tmp}/extras.tgz"
  exit 0
fi
mkdir -p "$LOG"
echo "started $(date +%T)" > "$LOG/progress"
COURSE_CAP_GIB=24 bash benchmarks/course_gpu/run.sh foreground-no-pack > "$LOG/course.out" 2>&1
echo "course $(cat /tmp/course-gpu/exit_code 2>/dev/null) $(date +%T)" >> "$LOG/progress"
(
  export PYTHONPATH=/tmp/grpo-gpu-site:$PWD PATH=/tmp/grpo-gpu-site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 \
    HF_HUB_OFFLINE=1 GRPO_LAB_PROFILE=gpu GRPO_LAB_MODEL=/tmp/grpo-smollm2/model GRPO_LAB_DEVICE_MEMORY_GIB=16
  python3 benchmarks/gsm8k/run.py --out /tmp/gsm8k > "$LOG/gsm8k.out" 2>&1
  echo "gsm8k $? $(date +%T)" >> "$LOG/progress"
) &
python3 benchmarks/capped/run.py jobs seed-2b qlora lengths-16 lengths-32 > "$LOG/capped.out" 2>&1
echo "capped $? $(date +%T)" >> "$LOG/progress"
wait
echo "done $(date +%T)" >> "$LOG/progress"
