"""TRL's tool loop played on a rollout engine (greedy turns parsed by TRL's ``parse_response``, calls run through
:mod:`grpo_lab.tools`' guard, answers appended as ``GRPOTrainer`` appends them), and the evaluation of tool use."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError
from grpo_lab.evaluation import Gain, interval_text
from grpo_lab.rewards import is_correct
from grpo_lab.rollout import RolloutEngine, Sampling, open_engine
from grpo_lab.rollout.backends import load_tokenizer
from grpo_lab.tools import GuardedTool, ToolSet, use_tool_template
from grpo_lab.tools import prepare as prepare_tools

CALL_OPEN = "<tool_call>"
"""What every call starts with in Qwen's format: a turn that holds it but parses to no call is a malformed call."""
EVAL_ERROR_KINDS = ("unparsed", "unknown_tool", "bad_arguments", "raised", "time_limit")
"""How a call the model wrote can fail: it does not parse, names no offered tool, or fails in the guard."""


@dataclass
class Conversation:
    """One greedy answer to one problem, turn by turn, and what its calls did."""

    answer: list[dict[str, Any]] = field(default_factory=list)
    """The messages after the prompt, as TRL hands them to reward functions (assistant turns and tool answers)."""
    calls: int = 0
    """Calls the model wrote (each ``<tool_call>`` it opened), parsed or not."""
    ran: int = 0
    """Calls that ran and returned an answer."""
    errors: Counter = field(default_factory=Counter)
    """Failed calls by kind (:data:`EVAL_ERROR_KINDS`)."""
    capped: bool = False
    """Still calling when ``max_tool_calling_iterations`` ran out."""
    tokens: int = 0
    """Tokens of the whole answer (the model's and the tools'), as TRL counts them against max_completion_length."""
    correct: bool = False
    kind: str = ""
    """The problem's ``type``."""


def mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (sample standard deviation / sqrt(n))."""
    n = len(values)
    if not n:
        raise ConfigError("no values to average")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / max(1, n - 1)
    return mean, math.sqrt(variance / n)


PER_PROBLEM = {"called": lambda c: c.calls > 0, "correct": lambda c: c.correct, "capped": lambda c: c.capped}
"""The 0/1 measures of one problem's answer: it wrote a call, it is right, it was still calling at the cap."""


@dataclass
class ToolUseReport:
    """Tool use and accuracy over held-out problems (one greedy :class:`Conversation` each), shares with their
    standard errors."""

    label: str
    offered: bool
    """Whether the tools were listed in the prompt."""
    conversations: list[Conversation]
    seconds: float

    @property
    def count(self) -> int:
        return len(self.conversations)

    def where(self, keep: Callable[[Conversation], bool], label: str) -> ToolUseReport:
        """The conversations ``keep`` accepts, as a report of their own."""
        return ToolUseReport(label, self.offered, [c for c in self.conversations if keep(c)], self.seconds)

    def per_problem(self, measure: str) -> list[float]:
        """0/1 per problem for a measure of :data:`PER_PROBLEM`."""
        if measure not in PER_PROBLEM:
            raise ConfigError(f"measure={measure!r}: use one of {', '.join(PER_PROBLEM)}")
        return [float(PER_PROBLEM[measure](c)) for c in self.conversations]

    def share(self, measure: str) -> tuple[float, float]:
        """``(share, standard error)`` of a per-problem measure."""
        return mean_and_error(self.per_problem(measure))

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.conversations)

    def ran_share(self) -> tuple[float, float]:
        """``(share, standard error)`` of the written calls that parsed and ran; (0, 0) without calls."""
        ran = sum(c.ran for c in self.conversations)
        return mean_and_error([1.0] * ran + [0.0] * (self.calls - ran)) if self.calls else (0.0, 0.0)

    def errors(self) -> Counter:
        """Failed calls by kind, every problem together."""
        return sum((c.errors for c in self.conversations), Counter())

    def to_dict(self) -> dict[str, Any]:
        (called, called_se), (correct, correct_se), (ran, ran_se) = (self.share("called"), self.share("correct"),
                                                                       self.ran_share())
        return {"label": self.label, "offered": self.offered, "problems": self.count, "seconds": round(self.seconds, 1),
                "tool_call_share": called, "tool_call_share_se": called_se, "calls": self.calls,
                "calls_ran_share": ran, "calls_ran_share_se": ran_se, "tool_errors": dict(self.errors()),
                "capped": int(sum(self.per_problem("capped"))), "accuracy": correct, "accuracy_se": correct_se}

    def summary(self) -> str:
        """One line: the call share, the calls that ran, the errors by kind, accuracy; each share with its 95 %
        interval (Wilson's, which holds at 0 % and 100 %)."""
        d = self.to_dict()
        errors = ", ".join(f"{kind} {n}" for kind, n in sorted(d["tool_errors"].items())) or "none"
        ran = f"{d['calls_ran_share']:.1%} {interval_text(d['calls_ran_share'], d['calls'])}" if d["calls"] else "none"
        return (f"{self.label} ({'tool offered' if self.offered else 'no tool'}, {self.count} problems): calls the "
                f"tool {d['tool_call_share']:.1%} {interval_text(d['tool_call_share'], self.count)}; {d['calls']} "
                f"calls, {ran} parsed and ran; tool errors: {errors}; {d['capped']} capped; accuracy "
                f"{d['accuracy']:.1%} {interval_text(d['accuracy'], self.count)}")


def paired_gain(what: str, before: ToolUseReport, after: ToolUseReport, measure: str) -> Gain:
    """The change of a per-problem yes/no measure over the same problems (:meth:`Gain.from_pairs`)."""
    old, new = before.per_problem(measure), after.per_problem(measure)
    if len(old) != len(new):
        raise ConfigError(f"{before.label} has {len(old)} problems and {after.label} {len(new)}: compare the same ones")
    return Gain.from_pairs(what, list(zip(old, new)))


def tool_suffix_text(tokenizer: Any, tool_messages: Sequence[dict[str, Any]]) -> str:
    """The text TRL appends after a turn that called tools (the answers and the next assistant header), cut from the
    chat template as ``GRPOTrainer._get_tool_suffix_ids`` cuts it."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = tokenizer.apply_chat_template(head, tokenize=False)
    full = tokenizer.apply_chat_template(head + list(tool_messages), add_generation_prompt=True, tokenize=False)
    prefix = prefix[:prefix.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]
    if not full.startswith(prefix):
        raise ConfigError("the chat template is not prefix-preserving: a conversation's start renders differently "
                          "once tool messages follow (TRL needs it to append tool results)")
    return full[len(prefix):]


def run_call(call: dict[str, Any], tools: dict[str, GuardedTool], conversation: Conversation) -> dict[str, Any]:
    """Run one parsed call as TRL runs it (``tool(**arguments)``), record how it ended, return the tool message TRL
    would hand the model."""
    function = call.get("function", call)
    name, arguments = function.get("name", "unknown"), function.get("arguments")
    if name not in tools:
        kind, text = "unknown_tool", f"Tool {name} not found."
    elif not isinstance(arguments, dict):  # TRL's `tool(**arguments)` fails before the tool runs
        kind, text = "bad_arguments", f"argument after ** must be a mapping, not {type(arguments).__name__}"
    else:
        kind, text = tools[name].run(**arguments)
    if kind in ("ok", "not_text"):
        conversation.ran += 1
        return {"role": "tool", "name": name, "content": text}
    conversation.errors[kind] += 1
    return {"role": "tool", "name": name, "content": str({"error": text})}


def turn_batches(prompt_tokens: Sequence[int], budgets: Sequence[int], window: int) -> list[tuple[list[int], int]]:
    """One turn's rows as ``(rows, max_tokens)`` generate calls that fit the context ``window`` (``max_tokens``: the
    largest budget of the call's rows, capped where a prompt leaves less room); rows with no room left are left out,
    as TRL ends an overlong answer."""
    batches: list[tuple[list[int], int]] = []
    longest = 0
    for row in sorted(range(len(budgets)), key=lambda k: -budgets[k]):
        if budgets[row] <= 0:
            continue
        if batches and max(longest, prompt_tokens[row]) + batches[-1][1] <= window:
            batches[-1][0].append(row)
            longest = max(longest, prompt_tokens[row])
        elif min(budgets[row], window - prompt_tokens[row]) > 0:
            batches.append(([row], min(budgets[row], window - prompt_tokens[row])))
            longest = prompt_tokens[row]
    return batches


def play_tool_loop(engine: RolloutEngine, prompts: Sequence[str], tool_set: ToolSet | None,
                   max_completion_length: int, max_tool_calling_iterations: int | None = None) -> list[Conversation]:
    """Greedy answers to rendered ``prompts``, with TRL's tool loop when ``tool_set`` is given: at most
    ``max_tool_calling_iterations`` rounds of calls (None: until it stops calling), ``max_completion_length`` tokens."""
    tokenizer = engine.tokenizer
    tools = {guard.name: guard for guard in tool_set.guards} if tool_set else {}
    conversations = [Conversation() for _ in prompts]
    texts, active, rounds = list(prompts), list(range(len(prompts))), 0
    while active:
        budgets = [max_completion_length - conversations[i].tokens for i in active]
        lengths = [len(tokenizer(texts[i], add_special_tokens=True)["input_ids"]) for i in active]
        going_on = []
        for rows, max_tokens in turn_batches(lengths, budgets, engine.config.max_model_len):
            result = engine.generate([texts[active[k]] for k in rows],
                                     Sampling(n=1, max_tokens=max_tokens, temperature=0.0))
            for k, output in zip(rows, result.outputs):
                ids = list(output.completions[0].token_ids[:budgets[k]])
                if take_turn(conversations[active[k]], tokenizer, ids, list(output.prompt_token_ids), tool_set,
                             tools, rounds, max_tool_calling_iterations, max_completion_length, texts, active[k]):
                    going_on.append(active[k])
        active, rounds = sorted(going_on), rounds + 1
    return conversations


def take_turn(conversation: Conversation, tokenizer: Any, ids: list[int], prompt_ids: list[int],
              tool_set: ToolSet | None, tools: dict[str, GuardedTool], rounds: int, max_rounds: int | None,
              max_completion_length: int, texts: list[str], index: int) -> bool:
    """Record one generated turn (parsed as TRL parses it) and run its calls; True when the model goes on with the
    tools' answers appended to ``texts[index]``."""
    from trl.chat_template_utils import parse_response

    conversation.tokens += len(ids)
    if getattr(tokenizer, "response_template", None) is not None:
        message = parse_response(tokenizer, ids, prefix=prompt_ids, tools=tool_set.funcs if tool_set else None)
    else:  # TRL decodes the text when the tokenizer has no parser
        message = {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
    calls = message.get("tool_calls") or []
    unparsed = message["content"].count(CALL_OPEN)
    conversation.calls += len(calls) + unparsed
    if unparsed:
        conversation.errors["unparsed"] += unparsed
    conversation.answer.append(message)
    texts[index] += tokenizer.decode(ids, skip_special_tokens=False)
    if calls and not tools:  # a call without the tool offered: nothing can run it
        conversation.errors["unknown_tool"] += len(calls)
    if not calls or not tools:
        return False
    if max_rounds is not None and rounds >= max_rounds:
        conversation.capped = True
        return False
    answers = [run_call(call, tools, conversation) for call in calls]
    suffix = tool_suffix_text(tokenizer, answers)
    suffix_tokens = len(tokenizer(suffix, add_special_tokens=False)["input_ids"])
    if conversation.tokens + suffix_tokens > max_completion_length:  # TRL drops answers that do not fit
        return False
    conversation.answer += answers
    conversation.tokens += suffix_tokens
    texts[index] += suffix
    return True


def render_prompts(tokenizer: Any, rows: Sequence[dict[str, Any]], tools: Sequence[Any] | None) -> list[str]:
    """Each row's prompt as the model sees it, with the tools listed (None: the plain chat prompt)."""
    return [tokenizer.apply_chat_template(row["prompt"], tools=list(tools) if tools else None,
                                          add_generation_prompt=True, tokenize=False) for row in rows]


def evaluate_tool_use(model: str | Path, rows: Sequence[dict[str, Any]], tools: Sequence[Any] | None,
                      max_completion_length: int, max_tool_calling_iterations: int | None = None, label: str = "",
                      engine: RolloutEngine | None = None, backend: str = "auto",
                      **engine_settings: Any) -> ToolUseReport:
    """Greedy tool use and accuracy of ``model`` on ``rows`` with ``tools`` offered (None: the plain prompt). A
    tokenizer without a tool template gets the course's, so a base model is asked as the primed one will be.
    ``engine``: one running ``model``'s weights, left running; else one is opened (``backend``, ``engine_settings``)."""
    if not rows:
        raise ConfigError("no rows to evaluate")
    started = time.perf_counter()
    tool_set = prepare_tools(tools) if tools else None
    own = engine is None
    tokenizer = load_tokenizer(str(model)) if own else engine.tokenizer
    templated = bool(tool_set) and getattr(tokenizer, "response_template", None) is None
    if templated:
        use_tool_template(tokenizer)
    prompts = render_prompts(tokenizer, rows, tool_set and tool_set.funcs)
    if own:
        engine = open_engine(str(model), backend=backend, n=1, max_tokens=max_completion_length, temperature=0.0,
                             prompts=prompts, **engine_settings)
        if templated:
            use_tool_template(engine.tokenizer)
    try:
        conversations = play_tool_loop(engine, prompts, tool_set, max_completion_length, max_tool_calling_iterations)
    finally:
        if own:
            engine.stop()
    for conversation, row in zip(conversations, rows):
        conversation.correct, conversation.kind = is_correct(conversation.answer, row["answer"]), row.get("type", "")
    return ToolUseReport(label or Path(str(model)).name, tool_set is not None, conversations,
                         time.perf_counter() - started)
