"""Parity between verl and the course, on the CPU, without verl running.

Rewards: the export's ``compute_score`` (loaded by path, as verl loads it) equals grpo_lab's rewards
(``prepare(...).score`` totals) on awkward completions, exactly. Advantages: grpo_lab's ``group_advantages`` with
verl's epsilon equals verl 0.9.1's own ``compute_grpo_outcome_advantage``, and the documented differences (epsilon,
a group of one, a completion no reward applies to) are what they are said to be. verl's function comes from an
importable verl, else from the verl wheel or checkout that ``GRPO_LAB_VERL_SOURCE`` names (its source, compiled
alone: the CPU venv lacks verl's Ray/tensordict imports); without either the advantage tests skip.
"""

import importlib.util
import json
import math
import os
import random
from typing import Any

import numpy as np
import pytest
import torch

from grpo_lab import rewards as R
from grpo_lab import verl_export as V
from grpo_lab.advantages import EPSILON, VERL_EPSILON, group_advantages
from grpo_lab.experiment import TrainConfig
from lab import verl_parity as P

REWARD_SETS = {
    "correctness": (("correctness",), None),
    "weighted": (("correctness", "format", "repetition_penalty"), (1.0, 0.2, 0.5)),
}

# completion text, ground truth: right, wrong, no marker, empty, Chinese, full-width digits, fractions, LaTeX ...
COMPLETIONS = [
    ("12 + 30 = 42\n#### 42", "42"),
    ("12 + 30 = 41\n#### 41", "42"),
    ("the answer is 42", "42"),
    ("", "42"),
    ("   \n", "7"),
    ("答案是 ４２ 个苹果。\n#### ４２", "42"),
    ("小明有 15 个苹果，吃了 3 个，还剩 12 个。#### 12", "12"),
    ("#### ３／４", "0.75"),
    ("#### 3/4", "0.75"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("#### -17", "-17"),
    ("#### 1,234", "1234"),
    ("#### 1234.0000", "1234"),
    ("#### 99999999999999999999", "99999999999999999999"),
    ("#### 42 #### 43", "42"),
    ("7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 #### 7", "7"),
    ("#### 42<|im_end|>", "42"),
    ("####", "0"),
    ("#### NaN", "0"),
    ("#### 1e3", "1000"),
]


@pytest.fixture(scope="module", params=sorted(REWARD_SETS))
def export(request, tmp_path_factory):
    rewards, weights = REWARD_SETS[request.param]
    folder = tmp_path_factory.mktemp("parity") / request.param
    config = TrainConfig(profile="tiny", rewards=rewards, reward_weights=weights)
    V.export_verl(folder, config, V.VerlTarget(device="cuda", n_gpus_per_node=1), validate=False)
    return V.load_export(folder)


# --------------------------------------------------------------------------------------------------
# Rewards: the export's compute_score == grpo_lab's rewards
# --------------------------------------------------------------------------------------------------
def test_compute_score_equals_grpo_lab_rewards_on_awkward_completions(export):
    row = export.train_rows[0]
    reward_set = export.reward_set()
    scored = [export.compute_score(row["data_source"], text, answer, {**row["extra_info"], "num_turns": None})
              for text, answer in COMPLETIONS]
    table = reward_set.score([row["extra_info"]["question"]] * len(COMPLETIONS), [t for t, _ in COMPLETIONS],
                             answer=[a for _, a in COMPLETIONS])
    expected = [0.0 if total is None else total for total in table.totals]
    diffs = [abs(s["score"] - e) for s, e in zip(scored, expected)]
    assert max(diffs) == 0.0
    for name, values in zip(table.names, zip(*table.values)):
        assert [s[name] for s in scored] == [0.0 if v is None else v for v in values]
    assert {s["score"] for s in scored} != {0.0}  # the set holds right answers as well as wrong ones
    assert any(s["correctness"] == 1.0 for s in scored[5:8])  # Chinese text, full-width digits


def _dump(records_by_group: dict[str, list[dict[str, Any]]], step: int = 1) -> list[dict[str, Any]]:
    """Records as verl's V1 trainer dumps them: sorted by uid key, score stored as float32."""
    out = []
    for uid, group in records_by_group.items():
        for session, record in enumerate(group):
            out.append({"input": record.get("input", "Q"), "output": record["output"], "gts": record["gts"],
                        "score": P.as_float32(record["score"]), "step": step, "uid": f"{uid}_{session}_0"})
    return out


def test_reward_parity_over_a_dump_is_exact(export):
    row = export.train_rows[0]
    records = [{"output": text, "gts": answer,
                "score": export.compute_score(row["data_source"], text, answer, row["extra_info"])["score"]}
               for text, answer in COMPLETIONS]
    dumped = _dump({"11111111-aaaa": records[:10], "22222222-bbbb": records[10:]})
    parity = P.reward_parity(dumped, export.reward_set())
    assert parity.completions == len(COMPLETIONS) and parity.steps == [1]
    assert parity.max_abs_diff == 0.0 and parity.equal and parity.mismatches == []
    wrong = [dict(r, score=1.0 - r["score"]) if i == 3 else r for i, r in enumerate(dumped)]
    broken = P.reward_parity(wrong, export.reward_set())
    assert not broken.equal and broken.max_abs_diff > 0 and broken.mismatches[0]["output"] == COMPLETIONS[3][0]


def test_reward_parity_rounds_like_verls_float32_scores():
    reward_set = R.prepare(["format"], [0.2])
    text = "#### 5"
    total = reward_set.score([""], [text], answer=["5"]).totals[0]
    assert total == 0.2 and P.as_float32(total) != total
    parity = P.reward_parity([{"output": text, "gts": "5", "score": P.as_float32(total), "step": 3}], reward_set)
    assert parity.max_abs_diff == 0.0 and 0 < parity.max_abs_diff_float64 < 1e-7


def test_a_completion_no_reward_applies_to_scores_zero_in_verl_and_none_in_grpo_lab(tmp_path):
    def sometimes(prompts, completions, **kwargs):
        return [None if c == "skip" else 1.0 for c in completions]

    reward_set = R.prepare([sometimes])
    compute_score = reward_set.to_verl()
    assert compute_score("src", "skip", "1")["score"] == 0.0 and reward_set.score([""], ["skip"]).totals == [None]
    parity = P.reward_parity([{"output": "skip", "gts": "1", "score": 0.0}, {"output": "x", "gts": "1", "score": 1.0}],
                             reward_set)
    assert parity.equal and parity.unscorable == 1


# --------------------------------------------------------------------------------------------------
# Advantages: grpo_lab vs verl's compute_grpo_outcome_advantage
# --------------------------------------------------------------------------------------------------
verl_advantage, VERL_ORIGIN = P.load_verl_grpo_advantage(os.environ.get(V.VERL_SOURCE_ENV))
needs_verl_function = pytest.mark.skipif(verl_advantage is None, reason=(
    f"verl's GRPO advantage not found: {VERL_ORIGIN} (set {V.VERL_SOURCE_ENV} to a verl wheel: "
    "pip download verl --no-deps)"))


def _verl(scores, index, epsilon=VERL_EPSILON, norm=True):
    t = torch.tensor(scores, dtype=torch.float32).unsqueeze(-1)
    out, returns = verl_advantage(token_level_rewards=t, response_mask=torch.ones_like(t),
                                  index=np.array(index, dtype=object), epsilon=epsilon, norm_adv_by_std_in_grpo=norm)
    assert torch.equal(out, returns)  # GRPO: advantages are the returns
    return out[:, 0].tolist()


def _batch(seed, groups=6, n=8, binary=True):
    rng = random.Random(seed)
    scores = [[float(rng.random() < 0.3) if binary else round(rng.uniform(-1, 2), 3) for _ in range(n)]
              for _ in range(groups)]
    scores[0] = [1.0] * n  # a zero-variance group: no learning signal
    return scores


@needs_verl_function
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("norm", [True, False])
def test_group_advantages_with_verls_epsilon_equal_verls_function(binary, norm):
    for seed in range(5):
        groups = _batch(seed, binary=binary)
        # verl groups by uid wherever the rows are: shuffle them
        flat = [(f"uid-{g}", s) for g, scores in enumerate(groups) for s in scores]
        order = list(range(len(flat)))
        random.Random(seed).shuffle(order)
        theirs = dict(zip(order, _verl([flat[i][1] for i in order], [flat[i][0] for i in order], norm=norm)))
        ours = [a for scores in groups for a in group_advantages(
            scores, scale_rewards="group" if norm else "none", epsilon=VERL_EPSILON).advantages]
        assert max(abs(ours[i] - theirs[i]) for i in range(len(flat))) <= 1e-6
        assert all(abs(theirs[i]) < 1e-6 for i in range(8))  # the zero-variance group


@needs_verl_function
def test_the_course_epsilon_differs_from_verls_by_the_documented_amount():
    scores = [1.0, 0.0, 0.0, 0.0]  # std 0.5
    theirs = _verl(scores, ["a"] * 4)
    ours = group_advantages(scores, epsilon=EPSILON).advantages
    assert theirs[0] == pytest.approx(0.75 / (0.5 + 1e-6), abs=1e-6) and ours[0] == pytest.approx(0.75 / (0.5 + 1e-4))
    assert round(ours[0], 5) == 1.4997 and round(theirs[0], 6) == 1.499997
    assert abs(ours[0] - theirs[0]) == pytest.approx(0.75 * (1e-4 - 1e-6) / 0.5 ** 2, rel=1e-2)


@needs_verl_function
def test_a_group_of_one_keeps_its_raw_score_in_verl_and_gets_zero_in_grpo_lab():
    theirs = _verl([0.7, 1.0, 0.0], ["single", "pair", "pair"])
    assert theirs[0] == pytest.approx(0.7 / (1 + 1e-6)) and group_advantages([0.7], 1).advantages == [0.0]
    assert theirs[1:] == pytest.approx(group_advantages([1.0, 0.0], epsilon=VERL_EPSILON).advantages, abs=1e-6)


@needs_verl_function
def test_an_unscorable_completion_counts_as_zero_in_verl_and_is_left_out_by_grpo_lab():
    trl_view = [1.0, None, 0.0, 0.0]
    verl_view = [1.0, 0.0, 0.0, 0.0]  # the export's compute_score wrote 0.0 for the None
    theirs = _verl(verl_view, ["g"] * 4)
    ours = group_advantages(trl_view, epsilon=VERL_EPSILON)
    assert ours.advantages[1] == 0.0 and ours.group_mean[0] == pytest.approx(1 / 3)
    assert theirs[1] < 0 and theirs[0] != pytest.approx(ours.advantages[0], abs=1e-3)
    assert theirs == pytest.approx(group_advantages(verl_view, epsilon=VERL_EPSILON).advantages, abs=1e-6)


@needs_verl_function
def test_advantage_parity_of_a_dumped_batch():
    groups = _batch(7)
    records = _dump({f"{g:08d}-uuid": [{"output": "", "gts": "1", "score": s} for s in scores]
                     for g, scores in enumerate(groups)}, step=4)
    random.Random(0).shuffle(records)  # groups come from the uid, not from the order
    ours = [a for scores in groups for a in group_advantages(scores, epsilon=VERL_EPSILON).advantages]
    logged = {"step": 4, "critic/advantages/max": max(ours), "critic/advantages/min": min(ours)}
    parity = P.advantage_parity(records, verl_advantage, metrics=logged)
    assert parity.step == 4 and parity.group_sizes == [8] * 6 and parity.completions == 48
    assert parity.max_abs_diff_vs_verl_function <= 1e-6 and parity.max_abs_diff_vs_logged_range <= 1e-6
    assert parity.agrees() and 1e-6 < parity.max_abs_diff_course_epsilon < 1e-3
    off = P.advantage_parity(records, verl_advantage, metrics={**logged, "critic/advantages/max": 9.0})
    assert not off.agrees()


def test_advantage_parity_without_verl_still_checks_the_logged_range():
    records = _dump({"g1": [{"output": "", "gts": "1", "score": s} for s in (1.0, 0.0, 0.0, 0.0)]})
    parity = P.advantage_parity(records, metrics={"critic/advantages/max": 1.5, "critic/advantages/min": -0.5})
    assert parity.max_abs_diff_vs_verl_function is None and parity.max_abs_diff_vs_logged_range < 1e-5
    assert parity.agrees()


def test_legacy_dumps_without_uid_group_by_runs_of_the_same_prompt():
    records = [{"input": q, "output": "", "gts": "1", "score": s}
               for q, s in [("a", 1.0), ("a", 0.0), ("b", 0.0), ("b", 0.0), ("a", 1.0), ("a", 1.0)]]
    assert [len(g) for g in P.group_records(records)] == [2, 2, 2]


# --------------------------------------------------------------------------------------------------
# Reading a run back
# --------------------------------------------------------------------------------------------------
def test_rollouts_and_metrics_read_back(tmp_path):
    dumps = tmp_path / "rollouts"
    dumps.mkdir()
    for step in (1, 2, 10):
        (dumps / f"{step}.jsonl").write_text("\n".join(json.dumps(
            {"input": "Q", "output": "#### 1", "gts": "1", "score": 1.0, "step": step, "uid": f"u_{i}_0"})
            for i in range(4)) + "\n")
    (dumps / "notes.jsonl").write_text("{}\n")
    assert list(P.read_rollouts(dumps)) == [1, 2, 10] and len(P.read_rollouts(dumps)[10]) == 4

    lines = [{"step": 0, "data": {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.1}}]
    for step in range(1, 6):
        lines.append({"step": step, "data": {"critic/score/mean": step / 10, "timing_s/gen": 1.0 + step,
                                             "timing_s/reward": 0.1, "timing_s/update_actor": 0.5,
                                             "timing_s/step": 3.0 + step, "critic/advantages/max": 1.0}})
    lines.append({"step": 5, "data": {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.3}})
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n" + '{"step": 6, "data": {"critic/sc')
    metrics = P.read_metrics(path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4, 5]
    assert P.reward_curve(metrics) == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5)]
    assert P.validation_scores(metrics) == {0: {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.1},
                                            5: {"val-core/grpo_lab/arithmetic/acc/mean@1": 0.3}}
    timings = P.step_timings(metrics, skip_first=2)
    assert timings["steps_in_median"] == [3, 4, 5] and timings["median"]["gen"] == 5.0
    assert timings["median"]["step_s"] == 7.0 and timings["median"]["update_like"] == pytest.approx(7.0 - 5.0 - 0.1)
    assert timings["per_step"][0] == {"step": 1, "gen": 2.0, "reward": 0.1, "update_actor": 0.5, "step_s": 4.0,
                                      "update_like": pytest.approx(1.9)}
    assert P.read_metrics(tmp_path / "missing.jsonl") == [] and math.isnan(P.reward_parity([], None).max_abs_diff)


def test_verl_function_origin_is_reported():
    # not a check of verl: says in the test log which verl the advantage tests used (or why they skipped)
    print(f"verl's GRPO advantage: {VERL_ORIGIN}")
    assert VERL_ORIGIN
    assert importlib.util.find_spec("lab.verl_parity") is not None


def test_verls_function_loads_from_a_checkout_folder_and_says_why_not(tmp_path):
    fn, why = P.load_verl_grpo_advantage(tmp_path)
    assert (fn is None and "holds no" in why) or why.startswith("import verl")
    if verl_advantage is None or VERL_ORIGIN.startswith("import verl"):
        pytest.skip("needs verl's source (GRPO_LAB_VERL_SOURCE) and a verl that does not import here")
    import zipfile

    with zipfile.ZipFile(os.environ[V.VERL_SOURCE_ENV]) as wheel:
        wheel.extract(P.CORE_ALGOS, tmp_path / "checkout")
    fn, origin = P.load_verl_grpo_advantage(tmp_path / "checkout")
    assert fn is not None and str(tmp_path / "checkout") in origin
    scores = torch.tensor([[1.0], [0.0]])
    advantages, _ = fn(scores, torch.ones_like(scores), np.array(["a", "a"], dtype=object))
    assert advantages[:, 0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_the_committed_h200_run_checks_again_and_a_changed_score_is_caught(tmp_path):
    """Notebook 07 re-checks verl's H200 run from its committed files; one score changed in a dump must show."""
    import shutil

    from lab.committed import BENCHMARKS_DIR

    files = BENCHMARKS_DIR / "verl" / "results" / "tiny"
    manifest, overrides = files / "export_export.json", files / "export_verl_overrides.yaml"
    check = P.check_run(files, manifest, overrides)
    assert check.rewards.equal and check.rewards.max_abs_diff == 0.0 and check.rewards.completions == 640
    assert check.advantage_max_abs_diff < 1e-5 and sorted(check.advantages) == list(range(1, 21))
    assert set(check.accuracy()) == {0, 20} and [r["step"] for r in check.records] == list(range(1, 21))
    assert all({"reward", "timing/generation_s", "timing/update_s", "completions/mean_length"} <= set(r)
               for r in check.records)

    changed = tmp_path / "run"
    shutil.copytree(files, changed)
    dump = changed / "rollouts" / "7.jsonl"
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    lines[3]["score"] = 1.0 - float(lines[3]["score"])
    dump.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    again = P.check_run(changed, manifest, overrides)
    assert not again.rewards.equal and again.rewards.max_abs_diff == 1.0
    with pytest.raises(FileNotFoundError, match="no verl metrics"):
        P.check_run(tmp_path / "nothing", manifest, overrides)


def test_side_by_side_compares_the_steps_both_runs_logged_after_the_warmup():
    verl = [{"step": 0, "val-core/s/acc/mean@1": 0.1, "val-aux/s/format/mean@1": 0.2}] + [  # as read_metrics gives
        {"step": step, "timing_s/step": 10.0 + step, "timing_s/gen": 4.0, "timing_s/testing": 1.0,
         "critic/score/mean": 0.5} for step in range(1, 6)]
    trl = [{"step": step, "step_time": 1.0 * step, "timing/generation_s": 0.5, "timing/update_s": 0.25,
            "timing/reward_s": 0.01} for step in range(1, 5)]  # no step 5: only steps 3 and 4 compare
    comparison = P.side_by_side(verl, trl)
    assert comparison["steps"] == [3, 4]
    parts = comparison["parts"]
    assert parts["step"] == {"verl_s": 13.5, "trl_s": 3.5} and parts["generation"] == {"verl_s": 4.0, "trl_s": 0.5}
    assert parts["update"] == {"verl_s": 8.5, "trl_s": 0.25} and parts["reward"]["verl_s"] is None
    table = P.side_by_side_table(comparison).splitlines()
    assert table[0].startswith("| median of steps 3–4 |") and "| step | 13.50 s | 3.50 s | 3.9× |" in table
    assert "| reward | not logged | 0.01 s | – |" in table
    validation = P.validation_scores(verl)
    assert P.validation_metric(validation, "acc") == {0: 0.1} and P.validation_metric(validation, "format") == {0: 0.2}
    with pytest.raises(ValueError, match="share no step"):
        P.side_by_side(verl, trl[:2])


# --------------------------------------------------------------------------------------------------
# The committed verl runs, read as records (notebook 07 prints these and checks its prose against them)
# --------------------------------------------------------------------------------------------------
def test_verl_results_reader_gives_the_committed_run():
    results = P.read_verl_results()
    merged = results.merged
    assert results.verl_version == "0.9.1" and results.provenance.device == "NVIDIA H200"
    assert results.provenance.command.startswith("python benchmarks/verl/run.py env tiny merge deploy")
    assert (merged.step, round(merged.merge_seconds), round(merged.server_start_s)) == (20, 14, 54)
    assert merged.verified and merged.answered and merged.export_ok and merged.same_tensors
    assert (merged.tensors_changed, merged.tensors_compared, merged.answer_key) == (38, 38, "7")
    assert results.smollm2_checkpoint_step == 14 and results.smollm2_step.ref_s is not None
    assert results.tiny_step.describe("step_s", "generation_s") == "whole step 3.09 s, generation 2.12 s"
    assert results.smollm2_step.describe("old_log_prob_s", "ref_s") == "old log-probs 1.94 s, reference log-probs 1.78 s"


def test_committed_runs_give_what_notebook_07_printed():
    tiny = P.committed_check("tiny")
    quarter, reward = P.reward_change(tiny.records, 4)
    assert (quarter, round(reward.before, 4), round(reward.after, 5)) == (5, 0.4, 0.63125)
    assert tiny.test_rows == 200 and round(P.step_ratio(P.committed_side_by_side("tiny")), 1) == 16.3
    smollm2 = P.committed_check("smollm2")
    validation = P.smollm2_validation(smollm2)
    assert (validation["acc"].before, validation["acc"].after) == (0.0525, 0.0925)
    assert (validation["format"].before, validation["format"].after) == (0.1025, 0.3125)
    assert smollm2.test_rows == 400 and P.trl_smollm2_greedy_before() == 0.015
    assert round(P.step_ratio(P.committed_side_by_side("smollm2")), 1) == 9.5
    assert round(P.difference_z(validation["acc"].before, validation["acc"].after, smollm2.test_rows), 1) == 2.2


def test_difference_z_is_the_difference_in_standard_errors():
    assert P.difference_z(0.3, 0.3, 100) == 0.0
    assert P.difference_z(0.2, 0.4, 100) == -P.difference_z(0.4, 0.2, 100)
    # p = 0.5 on both sides: the standard error of the difference is sqrt(0.5/n)
    assert math.isclose(P.difference_z(0.5, 0.5 + 0.1, 50), 0.1 / math.sqrt((0.25 + 0.24) / 50))
    assert P.difference_z(0.1, 0.2, 400) > P.difference_z(0.1, 0.2, 100)  # more prompts, more standard errors


def test_reward_change_uses_whole_parts_of_the_steps():
    records = [{"reward": float(r)} for r in range(10)]
    assert P.reward_change(records, 3) == (3, P.Change(1.0, 8.0))
    assert P.reward_change(records[:2], 4) == (1, P.Change(0.0, 1.0))


def test_the_committed_verl_configurations_on_smollm2_and_what_changed_between_them():
    """Issue 26: verl constrained to fit a device call, then at its own settings (once with padding removal wrongly
    off, then corrected); each with its start apart from its steps, and the settings that changed read from the
    overrides each run was given."""
    from lab import verl_parity

    runs = verl_parity.smollm2_configurations()
    constrained, padded, best = runs["smollm2"], runs["smollm2_best_padded"], runs["smollm2_best"]
    assert constrained.steps_logged == constrained.steps_asked == 14
    assert padded.steps_logged == 9 and padded.steps_asked == 10  # stopped at its time limit during step 10
    assert best.steps_logged == best.steps_asked == 8
    for run in (constrained, padded, best):
        assert 0 < run.steps_s < run.wall_s and run.startup_s == run.wall_s - run.steps_s
    changes = {key: (old, new) for key, old, new, _ in verl_parity.configuration_changes(constrained, best)}
    assert changes["actor_rollout_ref.rollout.enforce_eager"] == (True, False)
    assert changes["actor_rollout_ref.model.enable_gradient_checkpointing"] == (True, False)  # the export's value
    assert "actor_rollout_ref.model.use_remove_padding" not in changes  # verl's default in both: on
    assert not any(key.startswith("trainer.") for key in changes)
    mistake = {key: (old, new) for key, old, new, _ in verl_parity.configuration_changes(best, padded)}
    assert mistake == {"actor_rollout_ref.model.use_remove_padding": ("verl's default", False)}
    assert best.step.generation_s < constrained.step.generation_s  # CUDA graphs in the rollout


def test_the_verl_configuration_tables_show_every_part_and_every_changed_setting():
    from lab import verl_parity

    runs = verl_parity.smollm2_configurations()
    table = verl_parity.configurations_table(runs, {"smollm2": "constrained", "smollm2_best_padded": "own, padded",
                                                    "smollm2_best": "own"})
    assert table.splitlines()[0] == "| | constrained | own, padded | own |"
    assert "| generation, median | 6.06 s | 2.07 s | 2.07 s |" in table
    assert "| steps logged (of asked) | 14 of 14 | 9 of 10 | 8 of 8 |" in table
    changes = verl_parity.changes_table(runs["smollm2"], runs["smollm2_best"]).splitlines()
    assert len(changes) == 2 + len(verl_parity.configuration_changes(runs["smollm2"], runs["smollm2_best"]))
    assert "| `actor_rollout_ref.rollout.enforce_eager` | True | False |" in changes[3]
