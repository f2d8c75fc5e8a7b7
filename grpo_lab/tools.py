"""Tools a model may call during a GRPO rollout (TRL's ``GRPOTrainer(tools=[...])``): the course's ``calculator``, a
registry of tools by name, the guard every tool runs inside, and the chat template that renders and parses the calls.

A tool is a plain Python function with type hints and a Google-style docstring: transformers turns it into the JSON
schema the chat template shows the model; TRL calls it with the model's arguments and appends what it returns, as text.
The guard (:func:`prepare`) counts every call by how it ended (:data:`CALL_KINDS`); an error re-raises, so TRL counts
it in ``tools/failure_frequency`` and hands the model ``{"error": "..."}``.

>>> calculator("2 × (3 + 4)")
'14'
>>> calculator("7 / 2")
'3.5'
>>> tools = prepare(["calculator"])
>>> tools.funcs[0](expression="60 ÷ 2"), tools.counts["ok"]
('30', 1)
"""

from __future__ import annotations

__all__ = ["CALL_KINDS", "calculator", "list_tools", "prepare", "register_tool", "use_tool_template"]

import ast
import contextlib
import functools
import inspect
import json
import operator
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

try:  # inside grpo_lab; the recipe (grpo_lab.recipe) carries the calculator into a script without the package
    from grpo_lab.errors import ConfigError, GrpoLabError
except ImportError:  # pragma: no cover - only in an exported script
    class GrpoLabError(Exception):
        """Stand-in base class where grpo_lab is not installed (an exported stock-TRL script)."""

    class ConfigError(GrpoLabError, ValueError):
        """Stand-in for grpo_lab.errors.ConfigError."""

Tool = Callable[..., Any]  # a tool in TRL's sense: a typed function with a Google-style docstring

CALL_KINDS = ("ok", "not_text", "bad_arguments", "raised", "time_limit")
"""How a call through the guard ended: ``ok``; ``not_text`` (a number or a dict, handed on as JSON text);
``bad_arguments`` (they do not fit the signature); ``raised``; ``time_limit`` (past the guard's ``time_limit_s``)."""
ERROR_KINDS = ("bad_arguments", "raised", "time_limit")
"""The kinds that re-raise: TRL counts them as failures and shows the model the error."""
TIME_LIMIT_S = 2.0  # how long one call may run before the guard stops it (:class:`GuardedTool`)


class ToolCallError(GrpoLabError, RuntimeError):
    """A tool call that did not run as written: the message names the tool, what went wrong and how to call it."""


class CalculationError(GrpoLabError, ValueError):
    """An expression the calculator refuses: the message says what it accepts."""


MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10 ** 30
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-", "（": "(", "）": ")", "＋": "+", "＊": "*",
                          "／": "/", "^": "**"})
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST) -> Fraction:
    """The value of one node of an arithmetic expression, exactly (fractions), never by ``eval``; else refused."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise CalculationError(f"only whole exponents up to {MAX_EXPONENT} are supported, got {float(right):g}")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculationError("division by zero")
        value = Fraction(_BINARY[type(node.op)](left, right))
        if abs(value) > MAX_MAGNITUDE:
            raise CalculationError(f"the result is larger than {MAX_MAGNITUDE:.0e}")
        return value
    shown = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
    raise CalculationError(f"{shown!r} is not arithmetic: use numbers, + - * / ** % and parentheses")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: Numbers with + - * / and parentheses, e.g. "(3 + 4) * 2".
    """
    if not isinstance(expression, str):
        raise CalculationError(f"expression must be text such as \"(3 + 4) * 2\", got {type(expression).__name__}")
    text = expression.translate(_SYMBOLS).strip()
    if not text:
        raise CalculationError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculationError(f"the expression has {len(text)} characters, more than {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise CalculationError(f"{expression!r} does not parse: {error.msg}") from None
    value = _evaluate(tree)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.10g}"


_REGISTRY: dict[str, Tool] = {"calculator": calculator}


def register_tool(name: str, tool: Tool, *, overwrite: bool = False) -> None:
    """Make ``TrainConfig(tools=(name,))`` train with ``tool``; its ``__name__`` is what the model calls."""
    if name in _REGISTRY and not overwrite:
        raise ConfigError(f"A tool named '{name}' is already registered; pass overwrite=True to replace it.")
    if not callable(tool) or not (tool.__doc__ or "").strip():
        raise ConfigError(f"tool '{name}' must be a function with a docstring (transformers builds the schema the "
                          f"model sees from its type hints and its Google-style docstring).")
    _REGISTRY[name] = tool


def list_tools() -> list[str]:
    """Names accepted by :func:`get_tool` and ``TrainConfig.tools``."""
    return sorted(_REGISTRY)


def get_tool(name: str) -> Tool:
    """The registered tool ``name`` (the function itself, unguarded)."""
    if name not in _REGISTRY:
        raise ConfigError(f"Unknown tool '{name}'. Known tools: {', '.join(list_tools())}. Use one of these names, "
                          f"or add yours with grpo_lab.tools.register_tool('{name}', function).")
    return _REGISTRY[name]


class _TimeLimitReached(BaseException):
    """Raised inside a tool by the timer; a BaseException so that the tool's own ``except Exception`` cannot keep it."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_TimeLimitReached` in the running code after ``seconds`` (a real-time timer: main thread only,
    where TRL calls synchronous tools; elsewhere the call runs without a limit)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(_signum, _frame):
        raise _TimeLimitReached

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def as_text(result: Any) -> str:
    """A tool's result as the text the model reads: strings as they are, anything else as JSON (else ``str``)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def _signature_hint(signature: inspect.Signature) -> str:
    return ", ".join(f"{name}: {getattr(p.annotation, '__name__', p.annotation)}" if p.annotation is not p.empty
                     else name for name, p in signature.parameters.items())


@dataclass
class GuardedTool:
    """``tool`` behind the guard: :meth:`run` calls it and counts how the call ended; :attr:`function` is what TRL
    takes (the tool's name, signature and docstring), raising :class:`ToolCallError` for an error kind."""

    tool: Tool
    counts: Counter = field(default_factory=Counter)
    time_limit_s: float = TIME_LIMIT_S

    def __post_init__(self) -> None:
        self.signature = inspect.signature(self.tool)

        @functools.wraps(self.tool)
        def function(*args: Any, **kwargs: Any) -> str:
            kind, text = self.run(*args, **kwargs)
            if kind in ERROR_KINDS:  # TRL counts a failure and hands the model {"error": text}
                raise ToolCallError(text)
            return text

        self.function = function

    @property
    def name(self) -> str:
        return self.tool.__name__

    def run(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        """``(kind, text)``: how the call ended (one of :data:`CALL_KINDS`, also counted) and the text the model reads,
        the tool's answer or, for an error kind, what went wrong. Never raises."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as error:
            kind, text = "bad_arguments", (f"{self.name}({_signature_hint(self.signature)}) was called with "
                                           f"{kwargs or list(args)}: {error}")
        else:
            try:
                with _time_limit(self.time_limit_s):
                    result = self.tool(*args, **kwargs)
            except _TimeLimitReached:
                kind, text = "time_limit", f"{self.name} ran longer than {self.time_limit_s:g} s and was stopped"
            except Exception as error:
                kind, text = "raised", f"{self.name} failed: {error}"
            else:
                kind, text = ("ok", result) if isinstance(result, str) else ("not_text", as_text(result))
        self.counts[kind] += 1
        return kind, text


@dataclass
class ToolSet:
    """The tools a run trains with, guarded, and the record of their calls (:func:`prepare` makes one)."""

    guards: list[GuardedTool]
    counts: Counter  # calls so far by kind (:data:`CALL_KINDS`), every tool together

    @property
    def funcs(self) -> list[Tool]:
        """What ``GRPOTrainer(tools=...)`` and ``apply_chat_template(tools=...)`` take."""
        return [guard.function for guard in self.guards]

    @property
    def names(self) -> list[str]:
        return [guard.name for guard in self.guards]

    def check_template(self, tokenizer: Any, where: str) -> None:
        """With tools, :func:`check_tool_template`."""
        if self.guards:
            check_tool_template(tokenizer, where)

    def callbacks(self) -> list[Any]:
        """With tools, a ``TrainerCallback`` adding ``tools/<kind>`` (calls since the last log) to each logged step;
        it goes before the one that records the logs."""
        if not self.guards:
            return []
        from transformers import TrainerCallback

        counts = self.counts

        class ToolCallCounts(TrainerCallback):
            def __init__(self) -> None:
                self.logged = Counter()

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs is None or "reward" not in logs:
                    return
                for kind in CALL_KINDS:
                    logs[f"tools/{kind}"] = float(counts[kind] - self.logged[kind])
                self.logged = Counter(counts)

        return [ToolCallCounts()]


def prepare(tools: Sequence[str | Tool], time_limit_s: float = TIME_LIMIT_S) -> ToolSet:
    """Tools by registered name (or functions), each behind a :class:`GuardedTool`, all recording into one counter."""
    counts: Counter = Counter()
    guards = [GuardedTool(get_tool(t) if isinstance(t, str) else t, counts, time_limit_s) for t in tools]
    names = [guard.name for guard in guards]
    if len(set(names)) != len(names):
        raise ConfigError(f"two tools share a name in {names}: the model calls a tool by its function's name")
    return ToolSet(guards, counts)


TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}"
    "{{- 'Tools:' }}{%- for tool in tools %}{%- set fn = tool.function if tool.function is defined else tool %}"
    "{{- '\\n' + fn.name + '(' + (fn.parameters.properties | list | join(', ')) + '): ' + fn.description }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}{%- set call = call.function if call.function is defined else call %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""ChatML with Qwen2.5's tool-call and tool-response format, a short tool list and ``{% generation %}`` markers (SFT
on the assistant's tokens only). Without tools it renders what plain ChatML renders (no system turn unless given)."""


def use_tool_template(tokenizer: Any) -> Any:
    """Give ``tokenizer`` :data:`TOOL_CHAT_TEMPLATE` and, as its ``response_template``, TRL's parser for Qwen's
    ``<tool_call>`` format, checked with TRL's own tests that it can train tool calls. Returns the tokenizer."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving, qwen3_template, supports_tool_calling

    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template
    if not supports_tool_calling(tokenizer) or not is_chat_template_prefix_preserving(tokenizer):
        raise ConfigError(f"{getattr(tokenizer, 'name_or_path', 'the tokenizer')}: TRL cannot train tool calls with "
                          f"the course's tool template (it expects ChatML's <|im_start|> and <|im_end|> tokens).")
    return tokenizer


def check_tool_template(tokenizer: Any, where: str) -> None:
    """Stop early, with what to do, when ``tokenizer`` cannot render or parse tool calls (TRL would fail later)."""
    from trl.chat_template_utils import supports_tool_calling

    if getattr(tokenizer, "response_template", None) is None or not supports_tool_calling(tokenizer):
        raise ConfigError(f"{where}: its chat template cannot render or parse tool calls. Prime it first "
                          f"(grpo_lab.tool_use.prime saves the course's tool template with the model), or give its "
                          f"tokenizer one with grpo_lab.tools.use_tool_template(tokenizer).")
