"""Read a verl run of the exported experiment back, and check that verl scored and weighed it as the course does.

verl (``python3 -m verl.trainer.main_ppo``, launched with a :mod:`grpo_lab.verl_export` folder) leaves:

* **rollout dumps** (``trainer.rollout_data_dir=DIR``): ``DIR/<step>.jsonl``, one line per completion with ``input``
  and ``output`` (decoded with ``skip_special_tokens=True``: the very string ``compute_score`` was given), ``gts``
  (the ground truth), ``score`` (the reward the advantage used, summed over the response in float32), ``step``, and
  with the V1 trainer (verl 0.9's default) ``uid`` = ``"{prompt uid}_{session}_{index}"``: the prompt uid is the
  GRPO group;
* **metrics** (``trainer.logger=[console,file]`` with ``VERL_FILE_LOGGER_PATH``): one JSON line per step,
  ``{"step": N, "data": {"critic/score/mean": ..., "timing_s/gen": ..., ...}}``; validation before training is
  logged as step 0.

:func:`reward_parity` re-scores every logged ``output`` with grpo_lab's own rewards (the export's reward set) and
compares with verl's ``score``; :func:`advantage_parity` recomputes one logged batch's GRPO advantages with
:mod:`grpo_lab.advantages` and compares them with verl's ``compute_grpo_outcome_advantage`` (passed in: grpo_lab
never imports verl) and with the range verl logged; :func:`step_timings` summarises verl's per-step timings.

One concern a module, each importing only from those listed after it: ``results`` (the committed runs of
``benchmarks/verl`` as records, and what notebook 07 computes from them); ``check`` (:func:`check_run`);
``metrics`` (curves, validation, timings, the side-by-side with TRL) and ``parity`` (the files read back, rewards
and advantages recomputed). Every name imports from ``lab.verl_parity``.

>>> records = [{"uid": f"p{g}_{s}_0", "score": float(s == 0), "output": "", "gts": "1", "input": "", "step": 1}
...            for g in range(2) for s in range(4)]
>>> from lab.verl_parity import advantage_parity
>>> [round(a, 4) for a in advantage_parity(records).advantages[:4]]
[1.5, -0.5, -0.5, -0.5]
"""

from lab.verl_parity.check import RunCheck, check_run
from lab.verl_parity.metrics import (
    COURSE_METRIC_NAMES,
    SCORE_KEY,
    STEP_PARTS,
    TIMING_PREFIX,
    as_course_records,
    reward_curve,
    side_by_side,
    side_by_side_table,
    step_timings,
    training_records,
    validation_metric,
    validation_scores,
)
from lab.verl_parity.parity import (
    ADVANTAGE_RANGE_KEYS,
    CORE_ALGOS,
    VERL_ADVANTAGE_FUNCTION,
    AdvantageParity,
    RewardParity,
    advantage_parity,
    as_float32,
    group_key,
    group_records,
    load_verl_grpo_advantage,
    read_metrics,
    read_rollouts,
    reward_parity,
)
from lab.verl_parity.results import (
    TRL_SMOLLM2,
    VERL_RESULTS,
    VERL_RUNS,
    Change,
    MergedModel,
    StepParts,
    VerlConfiguration,
    VerlResults,
    changes_table,
    committed_check,
    committed_side_by_side,
    configuration_changes,
    configurations_table,
    difference_z,
    read_verl_results,
    reward_change,
    smollm2_configurations,
    smollm2_validation,
    step_ratio,
    trl_smollm2_greedy_before,
)

__all__ = [
    "ADVANTAGE_RANGE_KEYS", "CORE_ALGOS", "COURSE_METRIC_NAMES", "SCORE_KEY", "STEP_PARTS", "TIMING_PREFIX",
    "TRL_SMOLLM2", "VERL_ADVANTAGE_FUNCTION", "VERL_RESULTS", "VERL_RUNS", "AdvantageParity", "Change", "MergedModel",
    "RewardParity", "RunCheck", "StepParts", "VerlConfiguration", "VerlResults", "advantage_parity",
    "as_course_records", "as_float32", "changes_table", "check_run", "committed_check", "committed_side_by_side",
    "configuration_changes", "configurations_table", "difference_z", "group_key", "group_records",
    "load_verl_grpo_advantage", "read_metrics", "read_rollouts", "read_verl_results", "reward_change", "reward_curve",
    "reward_parity", "side_by_side", "side_by_side_table", "smollm2_configurations", "smollm2_validation", "step_ratio",
    "step_timings", "training_records", "trl_smollm2_greedy_before", "validation_metric", "validation_scores",
]
