"""grpo_lab.tools and grpo_lab.tool_use (notebook 10): the calculator, the guard's record of every bad tool and bad
call, the chat template TRL parses, TRL's own tool loop with the guard inside it (the run goes on, the cap holds, each
case lands in the step's metrics), the evaluation's tool loop, the priming, the lesson's settings and the GPU
benchmark's CPU-runnable parts."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_lab import experiment, tool_use, tools
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import TrainConfig, check_prompt_lengths
from grpo_lab.paths import REPO_ROOT, TINY_MODEL_DIR
from grpo_lab.rollout import Completion, PromptRollout, RolloutResult
from lab import tool_lesson

CPU = Machine("cpu", False, 24)


# --------------------------------------------------------------------------------------------------
# The calculator
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [("2 × (3 + 4)", "14"), ("7 / 2", "3.5"), ("60 ÷ 2", "30"), ("-3 + 5", "2"),
                                         ("2 ** 10", "1024"), ("10 % 4", "2"), ("1 / 3", "0.3333333333"),
                                         ("(1 + 2) * 3.5", "10.5"), ("2^3", "8"), ("7 // 2", "3")])
def test_the_calculator_evaluates_arithmetic(text, value):
    assert tools.calculator(text) == value


@pytest.mark.parametrize("text, reason", [
    ("__import__('os').system('ls')", "not arithmetic"), ("x + 1", "not arithmetic"), ("(1).real", "not arithmetic"),
    ("True + 1", "not arithmetic"), ("'a' * 3", "not arithmetic"), ("[1, 2]", "not arithmetic"),
    ("lambda: 1", "not arithmetic"), ("2 ** 1000", "exponents"), ("9 ** 9 ** 9", "exponents"), ("2 ** 0.5", "whole"),
    ("10 ** 40", "larger than"), ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("", "empty"),
    ("1 +", "does not parse"), ("1" * 300, "characters")])
def test_the_calculator_refuses_what_is_not_small_arithmetic(text, reason):
    with pytest.raises(tools.CalculationError, match=reason):
        tools.calculator(text)


def test_the_calculator_never_evaluates_code():
    source = Path(tools.__file__).read_text(encoding="utf-8")
    assert "eval(" not in source.replace("_evaluate(", "").replace("literal_eval", "") and "exec(" not in source
    with pytest.raises(tools.CalculationError, match="must be text"):
        tools.calculator(42)


# --------------------------------------------------------------------------------------------------
# Tools by name, in TrainConfig under TRL's names
# --------------------------------------------------------------------------------------------------
def test_tools_are_named_in_the_config_and_reach_trl():
    from trl import GRPOConfig


    config = TrainConfig(profile="tiny", tools="calculator", max_tool_calling_iterations=3, output_dir="run").resolve(CPU)
    assert config.tools == ("calculator",)
    assert experiment.plan(config, CPU).grpo_config(use_vllm=False).max_tool_calling_iterations == 3
    assert isinstance(experiment.plan(config, CPU).grpo_config(use_vllm=False), GRPOConfig)
    assert TrainConfig.from_dict(config.to_dict()).tools == ("calculator",)
    with pytest.raises(ConfigError, match="Unknown tool 'abacus'.*calculator"):
        TrainConfig(tools=("abacus",))
    with pytest.raises(ConfigError, match="no tools are named"):
        TrainConfig(max_tool_calling_iterations=2)
    with pytest.raises(ConfigError, match="positive integer"):
        TrainConfig(tools=("calculator",), max_tool_calling_iterations=0)
    with pytest.raises(ConfigError, match="already registered"):
        tools.register_tool("calculator", tools.calculator)
    with pytest.raises(ConfigError, match="docstring"):
        tools.register_tool("nameless", lambda expression: expression)
    with pytest.raises(ConfigError, match="share a name"):
        tools.prepare(["calculator", tools.calculator])


# --------------------------------------------------------------------------------------------------
# The guard: each bad tool recorded by kind, the text the model reads, a looping tool stopped
# --------------------------------------------------------------------------------------------------
def boom(expression: str) -> str:
    """Always fails.

    Args:
        expression: Anything.
    """
    raise ConnectionError("the service is down")


def number(expression: str) -> float:
    """Returns a number, not text.

    Args:
        expression: Anything.
    """
    return 42.0


def spin(expression: str) -> str:
    """Never returns.

    Args:
        expression: Anything.
    """
    while True:
        pass


def again() -> str:
    """Asks to be called again."""
    return "call again"


def test_the_guard_records_each_bad_tool_and_hands_text_on():
    from transformers.utils import get_json_schema

    guarded = tools.prepare([tools.calculator, boom, number, spin], time_limit_s=0.3)
    calc, boom_, number_, spin_ = (guard.function for guard in guarded.guards)
    assert get_json_schema(calc) == get_json_schema(tools.calculator)  # the model sees the tool's own schema
    assert calc(expression="6 × 7") == "42"
    assert number_(expression="x") == "42.0"
    assert tools.as_text({"a": [1, 2]}) == '{"a": [1, 2]}'
    for call, match in [(lambda: calc(expr="6"), "called with"), (lambda: calc(), "missing"),
                        (lambda: calc("1", "2"), "too many"), (lambda: boom_(expression="x"), "service is down"),
                        (lambda: calc(expression="1 / 0"), "division by zero")]:
        with pytest.raises(tools.ToolCallError, match=match):
            call()
    started = time.perf_counter()
    with pytest.raises(tools.ToolCallError, match="longer than 0.3 s"):
        spin_(expression="x")
    assert time.perf_counter() - started < 2
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)
    assert guarded.counts == Counter(ok=1, not_text=1, bad_arguments=3, raised=2, time_limit=1)


def test_the_callback_puts_each_steps_calls_into_its_logs():
    guarded = tools.prepare(["calculator"])
    callback, = guarded.callbacks()
    assert tools.prepare([]).callbacks() == []
    guarded.funcs[0](expression="1 + 1")
    logs = {"reward": 0.5}
    callback.on_log(None, None, None, logs=logs)
    assert logs["tools/ok"] == 1.0 and logs["tools/raised"] == 0.0
    logs = {"reward": 0.5}
    callback.on_log(None, None, None, logs=logs)
    assert logs["tools/ok"] == 0.0  # calls since the previous log


# --------------------------------------------------------------------------------------------------
# The chat template TRL parses
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return tools.use_tool_template(AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR)))


def test_the_template_passes_trls_tests_and_changes_nothing_without_tools(tokenizer):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_stop_token_trained, parse_response

    own = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    question = [{"role": "user", "content": "What is 6 × 7?"}]
    assert tokenizer.apply_chat_template(question, tokenize=False) == own.apply_chat_template(question, tokenize=False)
    assert is_chat_template_stop_token_trained(tokenizer)
    prompt = tokenizer.apply_chat_template(question, tools=[tools.calculator], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    assert "calculator(expression)" in tokenizer.decode(prompt)
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 × 7"}}\n</tool_call><|im_end|>'
    parsed = parse_response(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], prefix=prompt)
    assert parsed["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "6 × 7"}}
    with pytest.raises(ConfigError, match="Prime it first"):
        tools.check_tool_template(own, "tiny-qwen2")


def test_the_tool_suffix_is_what_trl_appends(tokenizer):
    from trl import GRPOTrainer

    answers = [{"role": "tool", "name": "calculator", "content": "42"}]
    owner = SimpleNamespace(processing_class=tokenizer, chat_template=None, chat_template_kwargs={}, _is_vlm=False,
                            _tokenizer=tokenizer)
    assert tokenizer.decode(GRPOTrainer._get_tool_suffix_ids(owner, answers)) == tool_use.tool_suffix_text(tokenizer,
                                                                                                           answers)


def test_the_prompt_length_check_counts_the_tool_list(tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "What is 6 × 7?"}]}]
    plain = check_prompt_lengths(rows, tokenizer, 512)
    listed = check_prompt_lengths(rows, tokenizer, 512, tools=[tools.calculator])
    assert listed > plain
    with pytest.raises(ConfigError, match="max_prompt_length"):
        check_prompt_lengths(rows, tokenizer, plain, tools=[tools.calculator])


# --------------------------------------------------------------------------------------------------
# TRL's own tool loop, the guard inside it: a scripted model writes every bad call in one GRPO step
# --------------------------------------------------------------------------------------------------
def call_text(name: str, arguments) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


FIRST_TURNS = [
    call_text("boom", {"expression": "1"}),             # the tool raises
    call_text("number", {"expression": "1"}),           # it returns a number
    call_text("calculator", {"expr": "6 × 7"}),         # a wrong argument name
    call_text("calculator", "6 × 7"),                   # arguments that are not an object: TRL fails first
    call_text("calculator", {"expression": "6 × 7"})[:-14],  # broken JSON: it does not parse, nothing runs
    call_text("again", {}),                             # the model keeps calling
    call_text("spin", {"expression": "1"}),             # the tool loops
    call_text("calculator", {"expression": "6 × 7"}),   # a good call
]


@pytest.fixture
def tool_model(tmp_path):
    """The tiny model with the course's tool template and Qwen2.5's tool tokens, as the priming saves it (untrained)."""
    from grpo_lab.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(TINY_MODEL_DIR))
    tools.use_tool_template(tokenizer)
    tool_use.add_tool_tokens(model, tokenizer)
    model.save_pretrained(str(tmp_path / "tool-model"))
    tokenizer.save_pretrained(str(tmp_path / "tool-model"))
    return tmp_path / "tool-model"


@pytest.fixture
def test_tools():
    for tool in (boom, number, spin, again):
        tools.register_tool(tool.__name__, tool, overwrite=True)
    yield ("calculator", "boom", "number", "spin", "again")
    for tool in (boom, number, spin, again):
        tools._REGISTRY.pop(tool.__name__)


def test_trls_tool_loop_records_every_bad_call_goes_on_and_holds_the_cap(tool_model, test_tools, tmp_path,
                                                                        monkeypatch):
    from grpo_lab.train import prepare

    monkeypatch.setenv("GRPO_LAB_RUN_DIR", str(tmp_path / "runs"))
    config = TrainConfig(profile="tiny", model=str(tool_model), tools=test_tools, max_tool_calling_iterations=2,
                         max_prompt_length=240, max_completion_length=180, num_generations=2,
                         per_device_train_batch_size=8, max_steps=1, output_dir=str(tmp_path / "run"),
                         live_plot=False, save_steps=100)
    run = prepare(config, machine=CPU)
    trainer = run.trainer
    tokenizer = trainer.processing_class
    turns = Counter()

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The first turn writes FIRST_TURNS in order; after a tool's answer the model calls `again` again if that
        was its answer, else it answers."""
        texts = []
        for ids in prompt_ids:
            seen = tokenizer.decode(ids)
            turns["first" if "<tool_response>" not in seen else "later"] += 1
            if "<tool_response>" not in seen:
                texts.append(FIRST_TURNS[(turns["first"] - 1) % len(FIRST_TURNS)])
            else:
                texts.append(call_text("again", {}) if seen.rstrip().endswith(
                    "call again\n</tool_response><|im_end|>\n<|im_start|>assistant") else "#### 42")
        return [tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"] for text in texts], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted)
    result = run.train()
    step = result.metrics[-1]
    assert result.global_step == 1  # the run went on
    assert step["tools/raised"] == 1 and step["tools/not_text"] == 1 and step["tools/time_limit"] == 1
    assert step["tools/bad_arguments"] == 1  # the wrong name; the string arguments fail in TRL, before the guard
    assert step["tools/ok"] == 2 + 1  # `again` ran exactly max_tool_calling_iterations times, the calculator once
    calls = 1 + 1 + 1 + 1 + 2 + 1 + 1  # every parsed call TRL ran (the broken JSON never parsed)
    assert step["tools/call_frequency"] == pytest.approx(calls / 8)
    assert step["tools/failure_frequency"] == pytest.approx(4 / calls)  # boom, the wrong name, not an object, spin
    assert step["completions/max_length"] <= config.max_completion_length  # the planner's sequence length holds


# --------------------------------------------------------------------------------------------------
# The evaluation's tool loop, on a scripted engine
# --------------------------------------------------------------------------------------------------
class ScriptedEngine:
    """A rollout engine whose model answers from a script: ``script(conversation_text) -> completion text``."""

    def __init__(self, tokenizer, script, max_model_len=512):
        self.tokenizer, self.script = tokenizer, script
        self.config = SimpleNamespace(max_model_len=max_model_len)
        self.calls = []

    def generate(self, prompts, sampling):
        outputs = []
        self.calls.append((len(prompts), sampling.max_tokens))
        for prompt in prompts:
            ids = self.tokenizer(self.script(prompt) + "<|im_end|>", add_special_tokens=False)["input_ids"]
            prompt_ids = tuple(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            outputs.append(PromptRollout(prompt, prompt_ids, (Completion("", tuple(ids[:sampling.max_tokens]),
                                                                         "stop"),)))
        return RolloutResult("scripted", tuple(outputs), sampling, 0.0, 0.0)


def test_the_evaluation_plays_trls_loop_and_counts_every_failure(tokenizer):
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}"}], "answer": "42"} for i in range(6)]
    first = {0: call_text("calculator", {"expression": "6 × 7"}), 1: call_text("calculator", {"expr": "6"}),
             2: call_text("calculator", "6 × 7"), 3: call_text("abacus", {"expression": "6"}),
             4: call_text("calculator", {"expression": "6 × 7"})[:-14], 5: call_text("again", {})}

    def script(text):
        if "<tool_response>" not in text:
            return first[int(text.split("Question ")[1][0])]
        return call_text("again", {}) if "call again" in text.rsplit("<tool_response>", 1)[1] else "#### 42"

    engine = ScriptedEngine(tokenizer, script)
    tool_set = tools.prepare([tools.calculator, again])
    prompts = tool_use.render_prompts(tokenizer, rows, tool_set.funcs)
    conversations = tool_use.play_tool_loop(engine, prompts, tool_set, 300, max_tool_calling_iterations=2)
    errors = [dict(c.errors) for c in conversations]
    assert errors == [{}, {"bad_arguments": 1}, {"bad_arguments": 1}, {"unknown_tool": 1}, {"unparsed": 1}, {}]
    assert [c.ran for c in conversations] == [1, 0, 0, 0, 0, 2]
    assert conversations[5].capped and conversations[5].calls == 3 and not conversations[0].capped
    assert all(c.tokens <= 300 for c in conversations)
    report = tool_use.ToolUseReport("scripted", True, conversations, 0.0)
    for conversation, row in zip(conversations, rows):
        conversation.correct = tool_use.loop.is_correct(conversation.answer, row["answer"])
    assert report.share("called")[0] == 1.0 and report.share("correct")[0] == pytest.approx(4 / 6)
    assert report.ran_share()[0] == pytest.approx(3 / 8) and report.errors()["bad_arguments"] == 2
    assert "calls the tool 100.0%" in report.summary()
    short = tool_use.play_tool_loop(ScriptedEngine(tokenizer, script), prompts[:1], tool_set, 80)
    assert short[0].calls == 1 and short[0].tokens <= 80 and len(short[0].answer) == 1  # the answer did not fit


def test_turns_are_batched_within_the_engines_window():
    assert tool_use.turn_batches([100, 300, 120], [50, 40, 0], 400) == [([0, 1], 50)]
    assert tool_use.turn_batches([100, 380], [50, 40], 400) == [([0], 50), ([1], 20)]
    assert tool_use.turn_batches([400], [10], 400) == []


def test_a_paired_gain_counts_the_problems_that_moved():
    def report(called):
        return tool_use.ToolUseReport("r", True, [tool_use.Conversation(calls=c) for c in called], 0.0)

    gain = tool_use.paired_gain("calls", report([0, 0, 0, 0]), report([1, 1, 0, 1]), "called")
    assert (gain.before, gain.after, gain.count) == (0.0, 0.75, 4)
    assert (gain.up, gain.down) == (3, 0) and gain.standard_errors == pytest.approx(3 ** 0.5)
    with pytest.raises(ConfigError, match="same ones"):
        tool_use.paired_gain("calls", report([0]), report([1, 1]), "called")


# --------------------------------------------------------------------------------------------------
# Traces and the priming
# --------------------------------------------------------------------------------------------------
def test_traces_come_from_each_problems_own_calculation():
    from grpo_lab.data import load_split

    rows = load_split("train")[:40]
    for row in rows:
        call = tool_use.trace(row, call_tool=True)["completion"]
        assert tools.calculator(call[0]["tool_calls"][0]["function"]["arguments"]["expression"]) == row["answer"]
        assert call[1]["content"] == row["answer"] and call[2]["content"] == f"#### {row['answer']}"
    mixed = tool_use.priming_rows(rows, tool_share=0.5, plain_share=0.25)
    assert sum(not t["tools"] for t in mixed) == 10 and sum(len(t["completion"]) == 3 for t in mixed) == 15
    assert all(len(t["completion"]) == 1 for t in mixed if not t["tools"])
    with pytest.raises(ConfigError, match="share"):
        tool_use.priming_rows(rows, tool_share=1.5)


def test_the_primed_model_carries_its_template_and_parser(tmp_path, monkeypatch):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from grpo_lab.data import load_split
    from grpo_lab.models import read_manifest, verify_model_dir

    monkeypatch.setenv("GRPO_LAB_RUN_DIR", str(tmp_path))
    config = tool_use.PrimingConfig(num_train_rows=8, per_device_train_batch_size=8)
    primed = tool_use.prime(TINY_MODEL_DIR, load_split("train"), tmp_path / "primed", config)
    assert primed.steps == 1 and primed.traces == 8
    saved = AutoTokenizer.from_pretrained(str(primed.path))
    assert saved.response_template is not None and supports_tool_calling(saved)
    assert is_chat_template_prefix_preserving(saved) and "<tool_call>" in saved.get_vocab()
    assert json.loads((primed.path / "config.json").read_text())["vocab_size"] == len(saved)
    verify_model_dir(primed.path)
    assert read_manifest(primed.path).languages == () and primed.config["added_tokens"] == list(tool_use.TOOL_TOKENS)
    with pytest.raises(ConfigError, match="more rows"):
        tool_use.prime(TINY_MODEL_DIR, load_split("train")[:4], tmp_path / "x", config)


# --------------------------------------------------------------------------------------------------
# The lesson's settings and the GPU benchmark
# --------------------------------------------------------------------------------------------------
def test_every_profiles_lesson_resolves(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_LAB_RUN_DIR", str(tmp_path))
    tiny = tool_use.LESSONS["tiny"].config(TINY_MODEL_DIR, profile="tiny").resolve(CPU)
    assert tiny.max_model_len <= 512 and tiny.max_prompt_length + 2 * tiny.max_completion_length <= 512  # HF's turn
    assert Path(tiny.output_dir).parent == tmp_path / "tools"
    gpu = tool_use.LESSONS["gpu"].config("Qwen/Qwen2.5-0.5B-Instruct", profile="gpu").resolve(Machine("cuda", True, 140))
    assert gpu.use_vllm and gpu.tools == ("calculator",) and gpu.rewards == ("correctness", "tool_call_cost")
    with pytest.deprecated_call(match="LESSONS"):
        assert len(tool_use.model_rows(TINY_MODEL_DIR, "eval", 10)) == 10  # the shim still returns what it did
    problems = tool_use.LESSONS["tiny"].problems(())
    assert len(problems.unseen) == 64 and {row["lang"] for row in problems.unseen} == {"en", "zh"}


@pytest.mark.parametrize("profile", sorted(tool_use.LESSONS))
def test_the_lesson_never_trains_on_what_it_evaluates(profile):
    lesson = tool_use.LESSONS[profile]
    languages = experiment.PROFILES[profile]["train_languages"]
    problems = lesson.problems(languages)
    assert not problems.unseen_forms_in_training()
    trained_forms = {tool_use.expression_form(row) for row in problems.train if row["type"] != tool_use.STATED_TYPE}
    unseen_forms = {tool_use.expression_form(row) for row in problems.unseen}
    assert unseen_forms and not trained_forms & unseen_forms, (trained_forms, unseen_forms)
    assert {row["type"] for row in problems.unseen} <= set(tool_use.UNSEEN_TYPES)
    asked = [row["prompt"][0]["content"] for row in problems.evaluation]
    assert len(set(asked)) == len(asked) and not set(asked) & {row["prompt"][0]["content"] for row in problems.train}
    assert len(problems.unseen) == lesson.eval_size
    assert len(problems.stated) == round(lesson.stated_share * lesson.eval_size)
    assert all(row["lang"] in (languages or ("en", "zh")) for row in problems.train + problems.evaluation)
    stated = problems.stated[0]
    assert stated["answer"] in stated["prompt"][0]["content"] and tool_use.trace(stated, call_tool=True)[
        "completion"][1]["content"] == stated["answer"]  # a stated problem's call: the number the question gives
    with pytest.raises(ConfigError, match="unseen types"):
        lesson_problems = tool_use.lesson_problems(("en",), 10_000)
        del lesson_problems


def lesson_reports(stages: dict[str, tuple[list[int], list[int]]], stated: int = 0) -> dict:
    """Reports whose problems are unseen ones (``(called, correct)`` per problem), then ``stated`` stated ones."""
    def conversations(called, correct):
        return [tool_use.Conversation(calls=a, ran=a, correct=bool(b),
                                      kind=tool_use.STATED_TYPE if i >= len(called) - stated else "average")
                for i, (a, b) in enumerate(zip(called, correct))]

    return {stage: tool_use.ToolUseReport(stage, tool_use.STAGES[stage][1], conversations(*values), 1.0)
            for stage, values in stages.items()}


def shares(count, called, correct):  # 0/1 per problem: the first ``called`` call, the last ``correct`` are right
    return [1] * called + [0] * (count - called), [0] * (count - correct) + [1] * correct


def test_the_check_fails_where_grpo_did_not_beat_priming():
    # the CPU run the check once passed: primed 19 of 80 called and 2 right, after GRPO 16 called and 3 right
    worse = lesson_reports({"primed": shares(80, 19, 2), "trained": shares(80, 16, 3)})
    assert not tool_use.grpo_learned(tool_use.lesson_gains(worse))
    primed_only = lesson_reports({"primed": shares(80, 40, 30), "trained": shares(80, 40, 30)})  # GRPO changed nothing
    assert not tool_use.grpo_learned(tool_use.lesson_gains(primed_only))
    learned = lesson_reports({"primed": shares(80, 40, 20), "trained": shares(80, 70, 40)})
    gains = tool_use.lesson_gains(learned)
    assert tool_use.grpo_learned(gains) and gains[tool_use.CHECKED].up == 20
    all_right = lesson_reports({"primed": shares(20, 20, 0), "trained": shares(20, 20, 20)})  # 0 % -> 100 %
    assert tool_use.grpo_learned(tool_use.lesson_gains(all_right))


def test_each_part_of_an_evaluation_is_reported_apart():
    reports = lesson_reports({"primed": shares(10, 10, 0), "trained": ([1] * 6 + [0] * 4, [1] * 6 + [1] * 4)},
                             stated=4)
    gains = tool_use.lesson_gains(reports)
    stated = gains["tool-call share where no call is needed (primed → after GRPO)"]
    assert (stated.count, stated.before, stated.after, stated.down) == (4, 1.0, 0.0, 4)
    assert gains[tool_use.CHECKED].count == 6 and gains[tool_use.CHECKED].after == 1.0
    assert tool_use.part(reports["trained"], "stated").count == 4
    no_stated = tool_use.lesson_gains(lesson_reports({"primed": shares(4, 1, 1), "trained": shares(4, 1, 1)}))
    assert "tool-call share where no call is needed (primed → after GRPO)" not in no_stated
    assert "95 %: 0.0..49.0 %" in tool_use.part(reports["trained"], "stated").summary()  # no zero-width interval


def test_the_benchmark_writes_what_its_reader_reads(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks" / "tools_smollm2"))
    try:
        import run as benchmark
    finally:
        sys.path.pop(0)
    small = benchmark.smoke_lesson(tool_use.LESSONS["gpu"])
    assert small.eval_size == 20 and small.train["max_steps"] == 2 and small.priming.num_train_rows == 40

    def report(label, called, correct):
        return tool_use.ToolUseReport(label, True, [tool_use.Conversation(calls=a, ran=a, correct=bool(b))
                                                    for a, b in zip(called, correct)], 1.0)

    reports = lesson_reports({stage: ([0, 1, 1, 0], [1, 0, 0, 1]) for stage in tool_use.STAGES}, stated=1)
    result = SimpleNamespace(metrics=[{"tools/ok": 2.0, "reward": 0.5}], global_step=1, backend="vLLM colocate",
                             config=TrainConfig(model="/m/model", tools=("calculator",)),
                             mean=lambda key, first=None, last=None: 0.5)
    primed = SimpleNamespace(config={"tool_share": 0.5}, steps=3, train_loss=1.0, traces=40, calling_traces=16)
    record = tool_lesson.LessonRun(reports, primed, result, {"total": 12.0}).record("python3 run.py --out X", "H200")
    (tmp_path / "results.json").write_text(json.dumps(record))
    run = tool_lesson.committed_tool_run(tmp_path / "results.json")
    assert run.model == "model" and run.provenance.device == "H200" and set(run.reports) == set(tool_use.STAGES)
    assert run.gains[tool_use.CHECKED].gain.standard_errors == 0.0 and run.unseen and run.learned is False
    assert record["parts"]["trained"]["stated"]["problems"] == 1 and record["train"]["calls_by_kind"]["ok"] == 2.0


def test_the_course_record_is_what_the_course_run_printed():
    """benchmarks/tools_smollm2/course_record.json is read from the executed notebook 10 of the GPU course at
    6cce9ba (the lesson before it held problem types out; kept beside the record): written again from the committed
    copy it is the same record, and every change it holds is a line that copy printed."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks" / "tools_smollm2"))
    try:
        import from_course
    finally:
        sys.path.pop(0)
    course = REPO_ROOT / "benchmarks" / "tools_smollm2" / "course_6cce9ba"  # that course's 10, run.json, summary
    body = from_course.record(course, REPO_ROOT / "benchmarks" / "tools_smollm2" / "course_run", "SmolLM2-135M-Instruct")
    recorded = REPO_ROOT / "benchmarks" / "tools_smollm2" / "course_record.json"
    assert json.loads(json.dumps(body)) == json.loads(recorded.read_text(encoding="utf-8"))
    printed = {line for _, line in from_course.printed_lines(json.loads((course / from_course.NOTEBOOK).read_text()))}
    run = tool_lesson.committed_tool_run(recorded)
    assert not run.unseen and run.learned is None  # a run of the lesson before it held problem types out
    for gain in run.gains.values():  # a record of before the paired counts: each share as that copy printed it
        assert gain.gain is None and any(line.startswith(gain.what) for line in printed), gain.what
        assert "standard errors" not in gain.describe() and "interval" in gain.describe()


def test_the_committed_gpu_run_is_of_the_lesson_as_it_is():
    """results.json (run.py on a GPU) evaluated the unseen and the stated problems apart, with every change's counts."""
    run = tool_lesson.committed_tool_run()
    assert run.unseen and run.learned is not None and set(run.gains) == set(tool_use.GAINS)
    assert all(gain.gain is not None for gain in run.gains.values())
    checked = run.gains[tool_use.CHECKED].gain
    assert run.learned == (checked.up > checked.down and checked.standard_errors >= 2)
