#!/usr/bin/env bash
# On the GPU machine, after the bundle and the model are staged (benchmarks/course_gpu/README.md's calls): from a copy
# of the project, detached, the deliverable rows under a 16 GiB card (run.py), then notebooks 03-05 (or every notebook:
# DELIVERABLE_NOTEBOOKS=all) under the same cap (benchmarks/course_gpu/run.sh); `wait` collects both into $OUT.
#
#   GRPO_LAB_COMMIT=<sha> bash benchmarks/deliverable/gpu.sh start
#   DELIVERABLE_COURSE=0 DELIVERABLE_ARGS="--eval-size 200" ... start   # the rows alone, 200 held-out problems
#   bash benchmarks/deliverable/gpu.sh wait        # waits up to DELIVERABLE_WAIT_S (540 s), then packs what is there
set -uo pipefail
cd "$(dirname "$0")/../.."
WORK=/tmp/deliverable-gpu
CAP=${DELIVERABLE_CAP_GIB:-16}
# the course's notebooks after the rows: 03-05 (05 deploys what 03 trained), or DELIVERABLE_NOTEBOOKS=all: every one
NOTEBOOKS=${DELIVERABLE_NOTEBOOKS:-notebooks/03_grpo_training.ipynb notebooks/04_memory_budget.ipynb notebooks/05_deployment.ipynb}
[ "$NOTEBOOKS" = all ] && NOTEBOOKS=
case ${1:-} in
  start)
    rm -rf /tmp/repo-run "$WORK" && mkdir -p /tmp/repo-run "$WORK" && cp -a . /tmp/repo-run/ && rm -rf /tmp/repo-run/.wheels
    cd /tmp/repo-run
    mkdir -p /tmp/grpo-lab-path && ln -sfn /tmp/repo-run/benchmarks/lab /tmp/grpo-lab-path/lab
    setsid bash -c "
      export PYTHONPATH=/tmp/grpo-gpu-site:/tmp/repo-run:/tmp/grpo-lab-path PATH=/tmp/grpo-gpu-site/bin:\$PATH \
        VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 MPLBACKEND=Agg \
        GRPO_LAB_PROFILE=gpu GRPO_LAB_MODEL=/tmp/grpo-smollm2/model GRPO_LAB_DEVICE_MEMORY_GIB=$CAP
      recipe_steps=4
      for kind in ${DELIVERABLE_KINDS:-qlora lora}; do  # each row in a process of its own: nothing of one run stays
        python3 benchmarks/deliverable/run.py --out $WORK/rows --kinds \$kind --recipe-steps \$recipe_steps \
          ${DELIVERABLE_ARGS:-} >> $WORK/rows.log 2>&1
        echo \"\$kind \$?\" >> $WORK/rows.exit; recipe_steps=0
      done
      if [ \"${DELIVERABLE_COURSE:-1}\" = 0 ]; then echo done > $WORK/done; exit 0; fi
      COURSE=$WORK/course COURSE_CAP_GIB=$CAP COURSE_NOTEBOOKS='$NOTEBOOKS' bash benchmarks/course_gpu/run.sh foreground-no-pack
      recipe=\$(ls -t $WORK/course/grpo-*/trl_recipe.py 2>/dev/null | head -1)
      if [ -n \"\$recipe\" ]; then  # notebook 03's run as stock TRL, where grpo_lab cannot be imported
        (cd / && env -u GRPO_LAB_DEVICE_MEMORY_GIB PYTHONPATH=/tmp/grpo-gpu-site python3 -c 'import grpo_lab' \
           > $WORK/course-recipe.log 2>&1; echo \"grpo_lab importable: exit \$?\" >> $WORK/course-recipe.log
         env -u GRPO_LAB_DEVICE_MEMORY_GIB PYTHONPATH=/tmp/grpo-gpu-site timeout 600 python3 \"\$recipe\" \
           --max-steps 4 --output-dir $WORK/course-recipe-run >> $WORK/course-recipe.log 2>&1
         echo \"exit \$?\" >> $WORK/course-recipe.log; cp \"\$recipe\" $WORK/course-trl_recipe.py)
      fi
      if [ \"${DELIVERABLE_EXTRA:-1}\" = 1 ]; then  # then, under the same cap: the tool lesson, GSM8K SFT then RL
        python3 benchmarks/tools_smollm2/run.py --out $WORK/tools --work /tmp/tools-smollm2 > $WORK/tools.log 2>&1
        echo \$? > $WORK/tools.exit
        python3 benchmarks/gsm8k/run.py --sft-epochs 1 --out $WORK/gsm8k-sft > $WORK/gsm8k-sft.log 2>&1
        echo \$? > $WORK/gsm8k-sft.exit
      fi
      echo done > $WORK/done
    " > "$WORK/driver.log" 2>&1 < /dev/null &
    echo "started; follow $WORK/rows.log and $WORK/course/course.log" ;;
  wait)
    waited=0
    while [ ! -f "$WORK/done" ] && [ "$waited" -lt "${DELIVERABLE_WAIT_S:-540}" ]; do sleep 10; waited=$((waited + 10)); done
    [ -f "$WORK/done" ] && echo "finished" || echo "still running after ${waited} s: call wait again"
    tail -3 "$WORK/rows.log" 2>/dev/null; tail -3 "$WORK/course/course.log" 2>/dev/null; tail -2 "$WORK/tools.log" "$WORK/gsm8k-sft.log" 2>/dev/null
    tar -C "$WORK" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude='*.pth' \
      --exclude='checkpoints' --exclude='*.jsonl.xz' -czf "${OUT:-/tmp}/deliverable_gpu.tgz" . ;;
  *) echo "usage: gpu.sh start|wait"; exit 2 ;;
esac
