"""grpo_lab.evaluation: held-out accuracy through the rollout engine, graded by the course's one rule."""

import pytest

from grpo_lab import data, evaluation, models
from grpo_lab.errors import ConfigError
from grpo_lab.rewards import extract_answer


@pytest.fixture(scope="module")
def small_eval():
    rows = data.load_split("eval")[:4]
    return rows, evaluation.evaluate(models.TINY_MODEL_DIR, rows, num_samples=2, max_tokens=32)


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


def test_side_by_side_shows_both_directions(small_eval):
    rows, result = small_eval
    answers = [row["answer"] for row in rows]
    right = [f"#### {a}" for a in answers]
    wrong = ["#### -1"] * 4
    before = evaluation.Evaluation("m", result.report, [right[0], wrong[1], right[2], wrong[3]], 0.0, "hf", [])
    after = evaluation.Evaluation("m", result.report, [wrong[0], right[1], right[2], right[3]], 0.0, "hf", [])
    shown = evaluation.side_by_side(rows, before, after, limit=3)
    assert [s["verdict"] for s in shown] == ["wrong → right", "right → wrong", "wrong → right"]
