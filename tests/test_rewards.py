"""Unit tests for grpo_lab.rewards: extraction, each reward, combination, registry, verl adapters, validation."""

from __future__ import annotations

import logging
import math

import pytest

from grpo_lab import rewards as R

CHAT = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731 - what TRL passes for chat datasets


# ------------------------------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("completion", "value", "found_by"),
    [
        ("60 ÷ 2 = 30 km/h\n#### 30", 30.0, "marker"),  # the course's own format
        ("#### 30 km/h", 30.0, "marker"),
        ("The answer is 42.", 42.0, "last number"),
        ("It costs 1,234,567 dollars", 1234567.0, "last number"),  # thousands separators
        ("#### 1,200", 1200.0, "marker"),
        ("about 0.75 of it", 0.75, "last number"),  # decimal
        ("#### .5", 0.5, "marker"),
        ("It takes 3/4 hours", 0.75, "last number"),  # fraction
        ("The temperature is -7 degrees", -7.0, "last number"),  # negative
        ("#### -12.5", -12.5, "marker"),
        ("10-5=5", 5.0, "last number"),  # a minus between numbers is subtraction, not a sign
        ("area = 25 m²", 25.0, "last number"),  # a superscript unit does not read as a number
        ("We have 4 m2 of floor, total 20", 20.0, "last number"),
        ("50%", 50.0, "last number"),
        # Chinese answers, units and full-width digits
        ("速度是 60 ÷ 2 = 30 千米/小时\n#### 30", 30.0, "marker"),
        ("面积是25平方米", 25.0, "last number"),
        ("用了2.5小时", 2.5, "last number"),
        ("一共 1,200 元", 1200.0, "last number"),
        ("他走了１２公里", 12.0, "last number"),
        ("答案：１２．５公里", 12.5, "last number"),
        ("#### ３０", 30.0, "marker"),
        ("温度是－３度", -3.0, "last number"),
        ("分别是100，200，300", 300.0, "last number"),  # the full-width comma separates, never groups thousands
        # markers win over the last number
        ("#### 30\nso maybe 40 later", 30.0, "marker"),
        ("first #### 30\nthen #### 40", 40.0, "marker"),  # the last marker is the final answer
        (r"The answer is \boxed{30} (not 40)", 30.0, "boxed"),
        (r"\boxed{\frac{3}{4}}", 0.75, "boxed"),
        (r"\boxed{-\dfrac{1}{2}}", -0.5, "boxed"),
        (r"\boxed{1{,}000 \text{ km}}", 1000.0, "boxed"),
        ("#### 7\n" + r"\boxed{9}", 7.0, "marker"),  # #### outranks \boxed
    ],
)
def test_extract_answer(completion, value, found_by):
    found = R.extract_answer(completion)
    assert found.value == pytest.approx(value)
    assert found.found_by == found_by
    assert R.extract_answer(CHAT(completion)).value == pytest.approx(value)  # chat-message completions too


@pytest.mark.parametrize(
    ("completion", "problem"),
    [
        ("", "the completion is empty"),
        ("   \n ", "the completion is empty"),
        ("I think it is about thirty", "no number found in the completion"),
        ("#### \nthe answer is 5", "the marker '####' is there but no number follows it"),
        ("#### thirty", "the marker '####' is there but no number follows it"),
        (r"\boxed{x}", r"\boxed{} is there but holds no number"),
        ("1/0", "no number found in the completion"),  # a zero denominator is not a number
    ],
)
def test_extract_answer_malformed(completion, problem):
    found = R.extract_answer(completion)
    assert (found.value, found.found_by, found.problem) == (None, "none", problem)


def test_completion_text_accepts_strings_messages_and_parts():
    assert R.completion_text("x") == "x"
    assert R.completion_text(CHAT("#### 3")) == "#### 3"
    assert R.completion_text([{"role": "assistant", "content": [{"type": "text", "text": "#### 3"}]}]) == "#### 3"
    with pytest.raises(TypeError, match="string or a list of chat messages"):
        R.completion_text(3)


# ------------------------------------------------------------------------------------------ correctness


def test_correctness_reward_scores_and_explains():
    reward = R.get_reward("correctness")
    completions = ["60 ÷ 2 = 30 km/h\n#### 30", CHAT("#### 25"), "no idea", "３０千米/小时"]
    assert reward(prompts=["q"] * 4, completions=completions, answer=["30"] * 4) == [1.0, 0.0, 0.0, 1.0]
    reasons = [c.reason for c in reward.explain(completions, answer=["30"] * 4)]
    assert reasons == [
        "correct: 30 (after the marker)",
        "wrong value: found 25 (after the marker), expected 30",
        "no number found in the completion",
        "correct: 30 (last number in the text)",
    ]


def test_correctness_tolerance_and_reference_forms():
    assert R.check_answer("#### 0.3333333", "1/3", abs_tol=1e-6).score == 1.0
    assert R.check_answer("#### 0.33", "1/3").score == 0.0
    assert R.check_answer("#### 0.33", "1/3", abs_tol=0.01).score == 1.0
    assert R.check_answer("#### 1200", "1,200").score == 1.0
    assert R.check_answer("#### 1000001", "1000000").score == 0.0  # default tolerance is near-exact


def test_correctness_require_marker():
    reward = R.CorrectnessReward(require_marker=True)
    assert reward(prompts=["q", "q"], completions=["so 30", "#### 30"], answer=["30", "30"]) == [0.0, 1.0]
    assert R.why("so 30", "30", require_marker=True) == "marker '####' missing (found 30 as the last number)"


def test_correctness_needs_an_answer_column_with_numbers():
    reward = R.get_reward("correctness")
    with pytest.raises(ValueError, match="needs the dataset column 'answer'"):
        reward(prompts=["q"], completions=["#### 1"])
    with pytest.raises(ValueError, match="holds no number"):
        reward(prompts=["q"], completions=["#### 1"], answer=["n/a"])


# ------------------------------------------------------------------------------------------ other rules


def test_format_reward_wants_exactly_one_marker_with_a_number():
    reward = R.get_reward("format")
    completions = ["x\n#### 30", "30", "#### 30\n#### 30", "#### ", "#### ３０ 元", "######## 3"]
    assert reward(prompts=[""] * 6, completions=completions) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_length_window_reward():
    reward = R.get_reward("length_window", min_chars=5, max_chars=10)
    assert reward(prompts=[""] * 4, completions=["1234", "12345", "1234567890", "12345678901"]) == [0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="min_chars <= max_chars"):
        R.LengthWindowReward(min_chars=10, max_chars=5)


def test_keyword_reward_is_the_fraction_present():
    reward = R.get_reward("keyword", keywords=("####", "km/h"))
    assert reward(prompts=[""] * 3, completions=["#### 3 KM/H", "#### 3", "3"]) == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="non-empty tuple"):
        R.KeywordReward(keywords="####")


def test_contains_answer_reward_is_gameable_and_correctness_is_not():
    spam = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32"
    columns = dict(prompts=["q"], completions=[spam], answer=["30"])
    assert R.get_reward("contains_answer")(**columns) == [1.0]
    assert R.get_reward("correctness")(**columns) == [0.0]


def test_repetition_penalty():
    reward = R.get_reward("repetition_penalty", ngram_size=2, max_penalty=-1.0)
    fresh, looping = "60 ÷ 2 = 30 km/h\n#### 30", "30 30 30 30 30 30"
    scores = reward(prompts=["", "", ""], completions=[fresh, looping, "30"])
    assert scores[0] == 0.0 and scores[2] == 0.0  # no repeated bigram; too short to judge
    assert scores[1] == pytest.approx(-0.8)  # 5 bigrams, 1 distinct
    zh = R.RepetitionPenalty(ngram_size=2).score("好的好的好的")  # CJK characters are tokens of their own
    assert zh == pytest.approx(-(1 - 2 / 5))
    with pytest.raises(ValueError, match="max_penalty must be <= 0"):
        R.RepetitionPenalty(max_penalty=0.5)


# ------------------------------------------------------------------------------------------ combination and registry


def test_weighted_sum_follows_trl_nansum():
    assert R.weighted_sum([1.0, 0.5], [1.0, 2.0]) == 2.0
    assert R.weighted_sum([1.0, None], [1.0, 2.0]) == 1.0  # None is NaN, and nansum skips it
    assert R.weighted_sum([1.0, math.nan], [1.0, 2.0]) == 1.0
    assert R.weighted_sum([None, None], [1.0, 2.0]) is None  # unscorable: TRL gives it NaN and advantage 0
    with pytest.raises(ValueError, match="one weight per reward function"):
        R.weighted_sum([1.0], [1.0, 2.0])


def test_weighted_reward_and_score_all():
    def only_zh(prompts, completions, lang, **kwargs):
        return [1.0 if x == "zh" else None for x in lang]

    combined = R.WeightedReward([R.get_reward("correctness"), only_zh], weights=[1.0, 0.5])
    columns = dict(prompts=["q", "q"], completions=["#### 3", "#### 4"], answer=["3", "3"], lang=["en", "zh"])
    assert combined.__name__ == "weighted"
    assert combined(**columns) == [1.0, 0.5]
    table = combined.table(**columns)
    assert table.names == ["correctness", "only_zh"]
    assert table.values == [[1.0, None], [0.0, 1.0]]
    assert table.rows()[1] == {"correctness": 0.0, "only_zh": 1.0, "total": 0.5}
    with pytest.raises(ValueError, match="must match number of reward functions"):
        R.WeightedReward([only_zh], weights=[1.0, 2.0])


def test_registry():
    assert {"correctness", "format", "length_window", "keyword", "repetition_penalty"} <= set(R.list_rewards())
    assert R.get_reward("correctness").__name__ == "correctness"
    assert R.get_reward("correctness", name="answer_ok").__name__ == "answer_ok"  # TRL logs rewards/answer_ok/mean
    with pytest.raises(ValueError, match="Unknown reward 'corectness'. Known rewards: contains_answer"):
        R.get_reward("corectness")
    R.register_reward("always_one_test", lambda: (lambda prompts, completions, **kw: [1.0] * len(completions)))
    try:
        assert R.get_reward("always_one_test")(prompts=[""], completions=["x"]) == [1.0]
        with pytest.raises(ValueError, match="already registered"):
            R.register_reward("always_one_test", R.FormatReward)
    finally:
        R._REGISTRY.pop("always_one_test")


def test_prepare_is_the_one_entry_point():
    """Names and functions in, guarded functions and one weight each out (what training and verl use)."""
    def mine(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    prepared = R.prepare(["correctness", "format", mine], [1.0, 0.2, 0.5], errors="skip")
    assert prepared.names == ["correctness", "format", "mine"] and prepared.weights == [1.0, 0.2, 0.5]
    assert all(isinstance(f, R.ValidatedReward) and f.mode == "skip" for f in prepared.funcs)
    assert R.prepare(["correctness"]).weights == [1.0]
    with pytest.raises(R.RewardValidationError, match=r"2 reward_weights for 1 rewards"):
        R.prepare(["correctness"], [1.0, 0.5])
    with pytest.raises(ValueError, match="Unknown reward 'nope'"):
        R.prepare(["nope"])


def test_a_registered_reward_is_prepared_by_name_next_to_the_shipped_ones():
    R.register_reward("always_half_test", lambda: (lambda prompts, completions, **kw: [0.5] * len(completions)))
    try:
        prepared = R.prepare(["always_half_test", "correctness"], [1.0, 0.2])
        assert prepared.names == ["<lambda>", "correctness"] and prepared.weights == [1.0, 0.2]
        assert prepared.score([""], ["#### 3"], answer=["3"]).totals == [0.7]
    finally:
        R._REGISTRY.pop("always_half_test")


# ------------------------------------------------------------------------------------------ verl adapters


def verl_gsm8k_like(data_source, solution_str, ground_truth, extra_info=None):
    """A compute_score in verl's custom-reward signature, returning a dict as verl allows."""
    found = R.extract_answer(solution_str).value
    return {"score": float(found == float(ground_truth)), "seen": (data_source, (extra_info or {}).get("lang"))}


def test_from_verl_makes_a_trl_reward():
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return 1.0 if solution_str.endswith(ground_truth) else 0.0

    reward = R.from_verl(compute_score)
    out = reward(
        prompts=["p0", "p1"], completions=[CHAT("#### 3"), "#### 5"], answer=["3", "4"], lang=["en", "zh"],
        completion_ids=[[1], [2]], trainer_state=object(),
    )
    assert out == [1.0, 0.0] and reward.__name__ == "compute_score"
    assert calls[0] == ("grpo_lab", "#### 3", "3", {"prompt": "p0", "lang": "en"})  # TRL internals stay out
    dict_reward = R.from_verl(verl_gsm8k_like)
    assert dict_reward(prompts=["p"], completions=["#### 3"], answer=["3"], data_source=["gsm8k"]) == [1.0]
    bad = R.from_verl(lambda data_source, solution_str, ground_truth, extra_info=None: {"acc": 1.0}, name="bad")
    with pytest.raises(ValueError, match="without a 'score' key"):
        bad(prompts=["p"], completions=["x"], answer=["1"])


def test_to_verl_makes_a_compute_score():
    compute_score = R.to_verl(R.get_reward("correctness"))
    assert compute_score.__name__ == "correctness"
    assert compute_score("gsm8k", "so #### 30", "30") == 1.0
    assert compute_score(data_source="gsm8k", solution_str="#### 31", ground_truth="30", extra_info={"index": 3}) == 0.0

    def zh_only(prompts, completions, lang, **kwargs):  # extra_info entries arrive as columns
        return [None if lang[0] != "zh" else 1.0]

    assert R.to_verl(zh_only)("d", "x", "1", extra_info={"lang": "zh"}) == 1.0
    assert R.to_verl(zh_only)("d", "x", "1", extra_info={"lang": "en"}) == 0.0  # None → none_score


def test_verl_round_trip_gives_the_same_scores():
    reward = R.get_reward("correctness")
    back = R.from_verl(R.to_verl(reward))
    columns = dict(prompts=["q"] * 3, completions=["#### 3", "4", "x"], answer=["3", "4", "5"])
    assert back(**columns) == reward(**columns) == [1.0, 1.0, 0.0]


# ------------------------------------------------------------------------------------------ validation


def good(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def test_validate_keeps_name_and_passes_good_output():
    safe = R.validate_reward(good)
    assert safe.__name__ == "good" and safe.__wrapped__ is good
    assert safe(prompts=["a", "b"], completions=["x", "y"], answer=["1", "2"]) == [1.0, 1.0]
    assert safe.issues == []


def test_validate_rejects_a_signature_without_kwargs():
    def no_kwargs(prompts, completions):
        return [0.0] * len(completions)

    for mode in ("raise", "skip"):
        expected = r"'no_kwargs' does not accept \*\*kwargs.*def no_kwargs\(prompts, completions, \*\*kwargs\)"
        with pytest.raises(R.RewardSignatureError, match=expected):
            R.validate_reward(no_kwargs, mode=mode)
    with pytest.raises(ValueError, match=r"reward_errors='ignore': use 'raise'"):
        R.validate_reward(good, mode="ignore")


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def not_a_list(prompts, completions, **kwargs):
    return 1.0


def text_values(prompts, completions, **kwargs):
    return ["1.0" if i == 1 else 1.0 for i in range(len(completions))]


def nan_values(prompts, completions, **kwargs):
    return [math.nan if i == 2 else 0.0 for i in range(len(completions))]


def inf_values(prompts, completions, **kwargs):
    return [-math.inf if i == 0 else 0.0 for i in range(len(completions))]


def crashes_on_empty(prompts, completions, **kwargs):
    return [1.0 / len(c) for c in completions]


def crashes_in_batch_only(prompts, completions, **kwargs):
    if len(completions) > 1:
        raise RuntimeError("batch too large")
    return [1.0]


CASES = [
    # (function, expected message pieces, output in "skip" mode)
    (wrong_length, ["'wrong_length' failed on the batch: it returned 1 values for 3 completions", "exactly one float"],
     [None] * 3),
    (not_a_list, ["'not_a_list' failed on the batch: it returned 1.0 (float) instead of a list", "a list of floats"],
     [None] * 3),
    (text_values, ["'text_values' failed on sample 1: it returned '1.0' (str), not a number", "return a float"],
     [1.0, None, 1.0]),
    (nan_values, ["'nan_values' failed on sample 2: it returned nan", "guard divisions"], [0.0, 0.0, None]),
    (inf_values, ["'inf_values' failed on sample 0: it returned -inf", "guard divisions"], [None, 0.0, 0.0]),
    (crashes_on_empty, ["'crashes_on_empty' failed on sample 1: it raised ZeroDivisionError: float division by zero "
                        "(completion: '')", "handle this input"], [1.0, None, 0.5]),
    (crashes_in_batch_only, ["'crashes_in_batch_only' failed on the batch: it raised RuntimeError: batch too large, "
                             "although each sample alone works", "handle this input"], [None] * 3),
]


@pytest.mark.parametrize(("fn", "pieces", "skipped"), CASES, ids=[c[0].__name__ for c in CASES])
def test_validate_raise_mode_names_function_sample_and_fix(fn, pieces, skipped):
    with pytest.raises(R.RewardValidationError) as error:
        R.validate_reward(fn, mode="raise")(prompts=["a", "b", "c"], completions=["x", "", "yy"])
    for piece in pieces:
        assert piece in str(error.value)
    assert "Fix:" in str(error.value)


@pytest.mark.parametrize(("fn", "pieces", "skipped"), CASES, ids=[c[0].__name__ for c in CASES])
def test_validate_skip_mode_records_none_and_logs(fn, pieces, skipped, caplog):
    safe = R.validate_reward(fn, mode="skip")
    with caplog.at_level(logging.WARNING, logger="grpo_lab.rewards"):
        out = safe(prompts=["a", "b", "c"], completions=["x", "", "yy"])
    assert out == skipped
    assert len(safe.issues) == 1 and pieces[0] in safe.issues[0].message
    assert pieces[0] in caplog.text and "Recorded None" in caplog.text


def test_validate_accepts_numpy_like_numbers_and_none():
    class Scalar:  # e.g. numpy.float32 or a 0-d tensor: anything float() accepts
        def __float__(self):
            return 0.25

    safe = R.validate_reward(lambda prompts, completions, **kw: [Scalar(), None, True])
    assert safe(prompts=[""] * 3, completions=["a", "b", "c"]) == [0.25, None, 1.0]


def test_a_tool_call_costs_and_a_text_answer_does_not():
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 × 7"}}}
    conversation = [{"role": "assistant", "content": "", "tool_calls": [call, call]},
                    {"role": "tool", "name": "calculator", "content": "42"}, {"role": "assistant", "content": "#### 42"}]
    cost = R.get_reward("tool_call_cost")
    assert cost(prompts=["q"] * 3, completions=[conversation, [{"role": "assistant", "content": "#### 42"}], "42"]) == \
        [pytest.approx(-0.2), 0.0, 0.0]
    with pytest.raises(R.ConfigError, match="cost must be >= 0"):
        R.get_reward("tool_call_cost", cost=-1)
