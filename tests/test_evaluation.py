"""grpo_lab.evaluation: held-out accuracy through the rollout engine, graded by the course's one rule."""

import math

import pytest

from grpo_lab import data, evaluation, models
from grpo_lab.errors import ConfigError
from grpo_lab.rewards import extract_answer


@pytest.fixture(scope="module")
def small_eval():
    rows = data.load_split("eval")[:4]
    return rows, evaluation.evaluate(models.TINY_MODEL_DIR, rows, num_samples=2, max_tokens=32, backend="hf")


def test_tiny_model_greedy_generates_a_final_answer(small_eval):
    rows, result = small_eval
    for text in result.greedy_texts:
        assert extract_answer(text).found_by == "marker"
    with pytest.raises(ConfigError, match="greedy decoding gives one completion"):
        evaluation.evaluate(models.TINY_MODEL_DIR, rows, num_samples=2, temperature=0.0)


def test_evaluate_accuracy_report(small_eval):
    _, result = small_eval
    report = result.report
    assert report.count == 4 and report.k == 2 and result.backend == "hf"
    assert 0.0 <= report.greedy <= 1.0 and report.sampled_pass_at_1 <= report.pass_at_k
    assert sum(m["count"] for m in report.per_type.values()) == 4 and "all" in report.table()
    assert [len(samples) for samples in result.sampled_texts] == [2] * 4


def test_greedy_only_decodes_the_same_greedy_answers_and_no_samples(small_eval):
    rows, sampled = small_eval
    greedy = evaluation.evaluate(models.TINY_MODEL_DIR, rows, num_samples=0, max_tokens=32, backend="hf")
    assert greedy.greedy_texts == sampled.greedy_texts and greedy.report.greedy == sampled.report.greedy
    assert greedy.sampled_texts == [[]] * 4 and greedy.report.k == 0
    assert math.isnan(greedy.report.sampled_pass_at_1) and math.isnan(greedy.report.pass_at_k)
    with pytest.raises(ConfigError, match="num_samples=-1"):
        evaluation.evaluate(models.TINY_MODEL_DIR, rows, num_samples=-1)


def test_side_by_side_shows_both_directions(small_eval):
    rows, result = small_eval
    answers = [row["answer"] for row in rows]
    right = [f"#### {a}" for a in answers]
    wrong = ["#### -1"] * 4
    before = evaluation.Evaluation("m", result.report, [right[0], wrong[1], right[2], wrong[3]], 0.0, "hf", [])
    after = evaluation.Evaluation("m", result.report, [wrong[0], right[1], right[2], right[3]], 0.0, "hf", [])
    shown = evaluation.side_by_side(rows, before, after, limit=3)
    assert [s["verdict"] for s in shown] == ["wrong → right", "right → wrong", "wrong → right"]


def _report(per_type):
    """An AccuracyReport from {type: (count, greedy, pass@1, pass@k)}."""
    rows = {t: {"count": c, "greedy": g, "sampled_pass_at_1": p1, "pass_at_k": pk} for t, (c, g, p1, pk) in per_type.items()}
    total = sum(c for c, *_ in per_type.values())
    overall = {key: sum(r[key] * r["count"] for r in rows.values()) / total
               for key in ("greedy", "sampled_pass_at_1", "pass_at_k")}
    return evaluation.AccuracyReport(**overall, k=8, temperature=1.0, count=total, per_type=rows)


def test_changes_are_computed_from_the_reports_in_both_directions():
    before = _report({"a": (40, 0.30, 0.228, 0.65), "b": (40, 0.25, 0.20, 0.55), "c": (40, 0.20, 0.18, 0.60)})
    after = _report({"a": (40, 0.425, 0.416, 0.56), "b": (40, 0.105, 0.12, 0.30), "c": (40, 0.205, 0.185, 0.60)})
    found = evaluation.changes(before, after, ["a"])
    assert found["trained"]["sampled_pass_at_1"]["points"] == 18.8
    assert found["untrained"]["greedy"] == pytest.approx({"before": 0.225, "after": 0.155, "points": -7.0})
    assert evaluation.describe_change("x", 0.30, 0.305) == "x did not move (30.0% → 30.5%)"
    assert evaluation.describe_change("entropy", 0.2, 0.1, percent=False) == "entropy fell from 0.2 to 0.1"
    assert evaluation.describe_change("entropy", 0.2, 0.205, percent=False) == "entropy stayed near 0.2 (0.2 → 0.205)"


def test_verdict_counts(small_eval):
    rows, result = small_eval
    right = [f"#### {row['answer']}" for row in rows]
    before = evaluation.Evaluation("m", result.report, [right[0], "#### -1", right[2], "#### -1"], 0.0, "hf", [])
    after = evaluation.Evaluation("m", result.report, ["#### -1", right[1], right[2], "#### -1"], 0.0, "hf", [])
    assert evaluation.verdict_counts(rows, before, after) == {"wrong → right": 1, "right → wrong": 1,
                                                              "right → right": 1, "wrong → wrong": 1}


def test_greedy_followed_names_the_types_where_it_did_not():
    def report(greedy_a, pass_a, greedy_b, pass_b):
        per_type = {"a": {"count": 40, "greedy": greedy_a, "sampled_pass_at_1": pass_a, "pass_at_k": 0.5},
                    "b": {"count": 40, "greedy": greedy_b, "sampled_pass_at_1": pass_b, "pass_at_k": 0.5}}
        return evaluation.AccuracyReport(0.0, 0.0, 0.0, 8, 1.0, 80, per_type)

    before, after = report(0.2, 0.2, 0.35, 0.3), report(0.4, 0.5, 0.2, 0.4)
    lines = evaluation.greedy_followed(before, after, ["a", "b"])
    assert lines[0] == "greedy accuracy followed pass@1 on 1 of 2 trained types (a)"
    assert lines[1] == ("on b it did not: pass@1 rose 10.0 points (30.0% → 40.0%), greedy accuracy fell 15.0 points "
                        "(35.0% → 20.0%)")
    assert evaluation.greedy_followed(before, before, ["a"]) == ["greedy accuracy followed pass@1 on 1 of 1 trained "
                                                                 "types (a)"]


def test_describe_reward_gap_gives_the_reasons_that_apply():
    seen = evaluation.describe_reward_gap(0.602, 0.228, True, True, 1.0, 1.0)
    assert seen.startswith("training reward at the start 0.602") and "fine-tuned on exactly these" in seen
    other = evaluation.describe_reward_gap(0.1, 0.05, False, False, 0.7, 1.0)
    assert "not a share of right answers" in other and "T=0.7" in other and "fine-tuned" not in other
    assert "should be close" in evaluation.describe_reward_gap(0.2, 0.2, False, True, 1.0, 1.0)


def _evaluation(rows, greedy, sampled):
    report = evaluation.accuracy_report(rows, greedy, sampled, 1.0)
    return evaluation.Evaluation("m", report, greedy, 0.0, "hf", sampled)


def test_conclusions_tell_the_problems_the_run_trained_on_from_the_others():
    """A run that trained on the English rows of every type: its conclusions name the English problems as trained
    (not "the trained types", which would be every type and both languages) and the Chinese ones apart."""
    rows = [{"type": t, "lang": lang, "answer": "1"} for t in ("a", "b") for lang in ("en", "zh")]
    trained = [row["lang"] == "en" for row in rows]
    before = _evaluation(rows, ["#### 2"] * 4, [["#### 2", "#### 2"]] * 4)
    after = _evaluation(rows, ["#### 1", "#### 2", "#### 1", "#### 2"], [["#### 1", "#### 2"]] * 4)
    english = evaluation.subset(rows, after, trained)
    assert english.report.count == 2 and english.report.greedy == 1.0 and english.greedy_texts == ["#### 1"] * 2
    lines = evaluation.trained_conclusions(rows, before, after, trained, "every type, in en")
    assert lines[0] == ("greedy accuracy on the 2 problems of the kind it trained on (every type, in en) rose 100.0 "
                        "points (0.0% → 100.0%)")
    assert "greedy accuracy on the 2 problems it did not train on did not move (0.0% → 0.0%)" in lines
    assert "greedy accuracy on all 4 problems rose 50.0 points (0.0% → 50.0%)" in lines
    assert "pass@1 on their b problems rose 50.0 points (0.0% → 50.0%)" in lines
    everything = evaluation.trained_conclusions(rows, before, after, [True] * 4, "every type, every language")
    assert not any("did not train on" in line or "all 4" in line for line in everything)  # nothing to tell apart
    with pytest.raises(ConfigError, match="one flag per evaluated row"):
        evaluation.subset(rows, after, [False] * 4)


def test_a_change_is_weighed_by_its_paired_counts_and_holds_at_0_and_100_percent():
    """0 % -> 100 % over 200 problems: the normal approximation's standard error is zero there, so the gain is weighed
    by the paired counts (McNemar's z) and each share gets a Wilson interval, never 'infinitely many' errors."""
    every = evaluation.Gain.from_pairs("tool-call share", [(0.0, 1.0)] * 200)
    assert (every.up, every.down) == (200, 0) and every.standard_errors == pytest.approx(200 ** 0.5)
    assert "200 up, 0 down" in every.describe() and "inf" not in every.describe()
    low, high = evaluation.wilson_interval(0.0, 200)
    assert low == 0.0 and 0.01 < high < 0.03
    assert evaluation.wilson_interval(1.0, 200)[1] == 1.0 and evaluation.wilson_interval(1.0, 200)[0] > 0.97
    same = evaluation.Gain.from_pairs("accuracy", [(1.0, 1.0)] * 60 + [(0.0, 0.0)] * 140)
    assert same.standard_errors == 0.0 and (same.before, same.after) == (0.3, 0.3)
    mixed = evaluation.Gain.from_pairs("accuracy", [(0.0, 1.0)] * 16 + [(1.0, 0.0)] * 4 + [(0.0, 0.0)] * 80)
    assert mixed.standard_errors == pytest.approx(12 / 20 ** 0.5) and mixed.points == pytest.approx(12.0)
