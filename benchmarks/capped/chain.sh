#!/usr/bin/env bash
# One GPU session (an H200, or an H100: every cap here but bench-80's is below 79 GiB) for issue 42's rows, each ALONE on
# the machine (side by side, vLLM 0.26's start asserted while another process freed memory, and jobs raced for TRL's
# port: README.md, 2026-12-03), shortest first, after the staging calls of ../course_gpu/README.md, SmolLM2's included
# (bench-80's random-weight shape takes its tokenizer):
#
#   bench-80 (4 min; on an H100, the 80 GB card itself) -> notebooks 03-05 under 16 GiB (9 min)
#   (both ran on 2026-12-07, bench-80 on an H100 and 05 alone under 16 GiB: the default runs them again, 05 after the
#   03 it deploys)
#   (seed-2b-sleep, sleep mode on a device with 32 GiB free beside ballast.py, ran on 2026-12-06: CHAIN_STEPS names it)
#   (course-32, notebooks 03-05 under 32 GiB, and qlora-adapter, learns then served, ran on 2026-12-06 and are not in
#   the default any more: CHAIN_STEPS names them to run again)
#
# The sleep probe, lengths-16/24/32 and qlora (TRL's merge: it did not learn) ran on 2026-12-05 (README.md); `sleep_probe.py`
# and `run.py jobs <name>` still run them alone.
#
#   GRPO_LAB_COMMIT=<sha> setsid bash benchmarks/capped/chain.sh > /tmp/chain.log 2>&1 < /dev/null &
#   bash benchmarks/capped/chain.sh collect     # waits <= CHAIN_WAIT_S (540), tars what has finished into $OUT
#   (in the call that assembled the model and started the chain: CHAIN_WAIT_S=420, or the call runs past 600 s)
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
  target=${OUT:-/tmp/out}  # the device tool brings back at most 8 files: one tarball, plus one per capped course
  mkdir -p "$target"
  folders=$(cd /tmp && for f in chain capped/rows capped/logs capped/bench; do [ -d "$f" ] && echo "$f"; done)
  tar -C /tmp -czf "$target/chain.tgz" $folders
  for course in /tmp/course-[0-9]*; do
    [ -d "$course" ] || continue
    tar -C "$course" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='*.pth' \
      --exclude='checkpoints' --exclude='model' --exclude='final' -czf "$target/$(basename "$course").tgz" .
  done
  ls -la "$target"
  exit 0
fi
# CHAIN_STEPS: the steps to run, in this order (default: the two still missing), e.g. "qlora-adapter course-16"
STEPS=" ${CHAIN_STEPS:-bench-80 course-16} "
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
mkdir -p "$LOG"
echo "started $(date +%T): $STEPS" > "$LOG/progress"
step() { echo "$1 $2 $(date +%T)" >> "$LOG/progress"; }
bash benchmarks/course_gpu/run.sh compile > "$LOG/compile.out" 2>&1
for job in seed-2b-sleep qlora-adapter; do
  if wanted $job; then python3 benchmarks/capped/run.py jobs $job > "$LOG/$job.out" 2>&1; step $job $?; fi
done
course() {  # notebooks 03-05 under a cap, as a learner with that card runs them (05 deploys what 03 trained)
  mkdir -p /tmp/packs-$1
  COURSE=/tmp/course-$1 COURSE_CAP_GIB=$1 OUT=/tmp/packs-$1 \
    COURSE_NOTEBOOKS="notebooks/03_grpo_training.ipynb notebooks/04_memory_budget.ipynb notebooks/05_deployment.ipynb" \
    timeout 900 bash benchmarks/course_gpu/run.sh > "$LOG/course-$1.out" 2>&1
  step "course-03-05-$1" "$(cat /tmp/course-$1/exit_code 2>/dev/null)"
}
if wanted bench-80; then
  python3 benchmarks/capped/run.py jobs bench-80 > "$LOG/bench-80.out" 2>&1; step bench-80 $?
fi
if wanted course-32; then course 32; fi
if wanted course-16; then course 16; fi
step done 0
