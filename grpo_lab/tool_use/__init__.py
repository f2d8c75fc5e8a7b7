"""Teaching a model to call a tool: tool-call traces from the course's own problems, a short supervised priming
through TRL's ``SFTTrainer``, GRPO with ``tools=[calculator]`` through :mod:`grpo_lab.train`, and an evaluation of tool
use with standard errors, before and after, with the tool offered and without it.

What it trains and asks (:mod:`.tasks`): priming and GRPO see some problem types; every evaluation asks types whose
calculation forms training never shows, and problems whose answer the question states, where the calculator cannot
help. The reward is correctness less a small cost per call, so GRPO can learn *when* a call pays.

Why a priming step: a model that has never seen a tool call almost never writes a well-formed one, so every group of
a GRPO step would score alike. Each training problem knows its calculation (``"60 ÷ 2 = 30 km/h"``), so a trace writes
itself: the call ``calculator(expression="60 ÷ 2")``, the answer ``30``, then ``#### 30``. The priming mixes such
traces with direct answers (with and without the tool offered): the model learns the format and that calling is
*possible*; GRPO then learns *when* it pays, from the correctness reward alone.

The evaluation plays TRL's tool loop on a rollout engine: each turn parsed by TRL's ``parse_response``, each call run
through the guard of :mod:`grpo_lab.tools`, at most ``max_tool_calling_iterations`` rounds within
``max_completion_length`` tokens, tool answers included.

Modules: :mod:`.tasks`, :mod:`.traces`, :mod:`.priming` (the SFT step), :mod:`.loop` (the tool loop and its report),
:mod:`.lesson` (the settings, the changes reported and the verdict). Its public names
(``__all__``) import from ``grpo_lab.tool_use``.
"""

from __future__ import annotations

__all__ = ["CHECKED", "LESSONS", "PARTS", "STAGES", "evaluate_tool_use", "expression_form", "grpo_learned",
           "lesson_gains", "model_rows", "part", "prime", "trace"]

# What user code may use is __all__ above; the other names imported here serve the package's own modules, its tests and
# the lab, and may change without notice.
from grpo_lab.tool_use.lesson import (
    CHECKED,
    GAINS,
    LESSONS,
    PARTS,
    STAGES,
    ToolLesson,
    grpo_learned,
    lesson_gains,
    model_rows,
    part,
)
from grpo_lab.tool_use.loop import (
    CALL_OPEN,
    EVAL_ERROR_KINDS,
    Conversation,
    ToolUseReport,
    evaluate_tool_use,
    mean_and_error,
    paired_gain,
    play_tool_loop,
    render_prompts,
    run_call,
    tool_suffix_text,
    turn_batches,
)
from grpo_lab.tool_use.priming import TOOL_TOKENS, PrimedModel, PrimingConfig, add_tool_tokens, prime
from grpo_lab.tool_use.traces import expression_of, priming_rows, trace
from grpo_lab.tool_use.tasks import (
    STATED_TYPE,
    UNSEEN_TYPES,
    LessonProblems,
    expression_form,
    lesson_problems,
    stated_rows,
)
