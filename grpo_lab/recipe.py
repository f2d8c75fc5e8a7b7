"""The run as plain TRL: one standalone Python script that reproduces a grpo_lab run with stock ``GRPOTrainer``.

:func:`export_recipe` (``grpo-lab export-recipe RUN_DIR``) writes a script that imports only ``datasets``,
``transformers``, ``trl``, ``peft``, ``torch`` and the standard library. It holds

* the data loading and the filters the run applied (types, languages, size), as grpo_lab reads the rows;
* the reward functions, written into it: their source and that of every module-level name they use, carried out of
  their module (:func:`carry`; ``grpo_lab/rewards.py`` is standard library only), never an import of grpo_lab;
* ``GRPOConfig`` with every field the course set: the keyword arguments :func:`grpo_lab.train.grpo_args` passes to
  TRL, recorded while it builds the run's config (:func:`grpo_kwargs`), not listed a second time here;
* the tools the model may call (``TrainConfig.tools``), carried the same way, with the course's tool chat template and
  TRL's parser for it (:func:`carry_tools`);
* PEFT's ``LoraConfig`` when the run trained LoRA (the arguments :func:`grpo_lab.lora.lora_config` passes, recorded the
  same way); QLoRA's ``BitsAndBytesConfig`` recorded the same way (:func:`quantization_kwargs`);
* at its top, in comments, what grpo_lab adds to stock ``GRPOTrainer`` and what each addition bought, with the
  measured figure and the file it comes from (:data:`ADDITIONS`).

On a machine without an accelerator the script samples with HF ``generate`` even where the run used vLLM: stock TRL's
colocated weight sync fails on vLLM-CPU hosts that repack their weights (:mod:`grpo_lab.weight_sync`), and the script
says so where it switches.

>>> from grpo_lab import recipe
>>> recipe.export_recipe("runs/grpo-tiny-20261203-101500", "recipe.py")      # doctest: +SKIP
PosixPath('recipe.py')
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import __version__, experiment, lora, runs, tools
from grpo_lab.carry import CarryError, carry, run_alone
from grpo_lab.data import SplitConfig
from grpo_lab.device import Machine
from grpo_lab.errors import ExistingFileError, GrpoLabError
from grpo_lab.experiment import TrainConfig
from grpo_lab.rewards import prepare as prepare_rewards
from grpo_lab.train import choose_backend, grpo_args

SCRIPT_PACKAGES = ("datasets", "transformers", "trl", "peft", "torch")
"""What the script may import besides the standard library."""
RECIPE_FILE = "trl_recipe.py"
"""The script's name in a run folder (``grpo-lab export-recipe RUN_DIR`` writes it there by default)."""
TRAINER_COLUMNS = ("prompt", "answer", "unit", "type", "lang")
"""The row columns grpo_lab hands TRL's trainer (:func:`grpo_lab.train.build_trainer`), where a row has them."""
GRPO_LAB_ONLY_SAMPLING: dict[str, str] = {}
"""``GRPOConfig.generation_kwargs`` entries that need grpo_lab's trainer, left out of the script, with why."""


class RecipeError(CarryError):
    """A run that cannot be written as a standalone script as it is; the message says what to change."""


@dataclass(frozen=True)
class Addition:
    """One thing grpo_lab's trainer adds to stock ``GRPOTrainer``, and what it bought."""

    name: str
    where: str
    """grpo_lab's code that does it."""
    bought: str
    """What it bought, with the measured figure."""
    source: str
    """The file the figure comes from."""


ADDITIONS: tuple[Addition, ...] = (
    Addition("vLLM colocate on the CPU", "grpo_lab.weight_sync.install",
             "where vLLM-CPU repacks its Linear weights (AVX-512/AMX hosts) stock TRL's first weight sync fails "
             "('Parameter' object has no attribute 'weight_loader'); grpo_lab reloads the weights through vLLM's "
             "reload_weights and re-packs a tied lm_head, and vLLM's log-probs match the trainer's after a large-lr "
             "step only with it", "tests/test_weight_sync.py, tests/test_weight_sync_layouts.py"),
    Addition("no sampled-token log-probs where nothing reads them", "GRPOLabTrainer.sampling_logprobs",
             "with vllm_importance_sampling_correction=False only (the course keeps it on): on the 0.5B shape the "
             "H200 step 5.86 -> 4.58 s median (-22 %)", "benchmarks/trainer_switches/README.md"),
    Addition("a LoRA policy's adapter handed to the engine (vllm_lora_sync='adapter')",
             "grpo_lab.weight_sync.install_adapter_sync",
             "stock TRL merges the adapter into the base for every sync, and under a 4-bit base that merge keeps 1.2 % "
             "of a 50-step adapter (CPU); with the adapter itself, vLLM-CPU's log-probs after a large-lr LoRA step "
             "are 0.020 from the trainer's, its base 1.19 (a run that kept 'merge' needs nothing of it)",
             "tests/test_adapter_sync.py, benchmarks/capped/results/probes/qlora_merge_probe.json"),
    Addition("the colocated engine lent to evaluation", "GRPOLabTrainer.lend_engine, device.COLOCATED_MAX_NUM_SEQS",
             "notebook 03 evaluates before and after training on the trainer's own engine: no second engine start "
             "and no second share of the device ('engine start 0 s' on an H200 and an H100)",
             "benchmarks/course_gpu/results/03_grpo_training.ipynb"),
    Addition("each tool call guarded", "grpo_lab.tools.prepare, GuardedTool",
             "every call's outcome counted by kind in metrics.jsonl (tools/ok, not_text, bad_arguments, raised, "
             "time_limit; TRL counts failures only), a tool that loops stopped after tools.TIME_LIMIT_S, an answer "
             "that is not text handed on as JSON text: runs with a tool", "tests/test_tools.py"),
    Addition("safety nets and timings", "GRPOLabTrainer.training_step, _calculate_rewards, _save_checkpoint",
             "a NaN loss or reward stops before the bad update; a broken reward names the function and the sample; "
             "checkpoints are renamed into place once complete, so a kill never leaves half of one; per-step "
             "generation / reward / update seconds in metrics.jsonl", "tests/test_faults.py, tests/test_train.py"),
)
"""What the script does without, in the order its header lists them."""


# --------------------------------------------------------------------------------------------------
# The reward functions, carried into the script
# --------------------------------------------------------------------------------------------------
def _constructor(reward: Any) -> tuple[str, str, types.ModuleType]:
    """``(name to carry, expression that makes the reward, its module)`` for a reward function or a dataclass
    instance (the course's rewards: ``CorrectnessReward()`` with the fields that differ from their defaults)."""
    if inspect.isfunction(reward):
        if reward.__name__ == "<lambda>" or reward.__qualname__ != reward.__name__:
            raise RecipeError(f"reward {reward!r} is a lambda or a nested function: define it at the top of a "
                              f"module (a .py file) so that its source can be written into the script")
        return reward.__name__, reward.__name__, inspect.getmodule(reward)
    cls = type(reward)
    if not dataclasses.is_dataclass(reward):
        raise RecipeError(f"reward {reward!r} is a {cls.__name__} object, not a function or a dataclass instance: "
                          f"the script could not rebuild it from its source")
    changed = [f"{f.name}={getattr(reward, f.name)!r}" for f in dataclasses.fields(reward)
               if f.init and (f.default is dataclasses.MISSING or getattr(reward, f.name) != f.default)]
    return cls.__name__, f"{cls.__name__}({', '.join(changed)})", inspect.getmodule(cls)


@dataclass(frozen=True)
class CarriedRewards:
    """The reward functions as script source: their imports, the definitions (:attr:`source`) and one expression per
    reward."""

    imports: tuple[str, ...]
    source: str
    expressions: tuple[str, ...]
    modules: tuple[str, ...]
    """The modules the definitions were carried from."""


def _carried(by_module: dict[types.ModuleType, list[str]]) -> tuple[tuple[str, ...], str]:
    """The imports and the definitions that the names of each module need (:func:`carry`), modules in order."""
    parts = [carry(list(dict.fromkeys(names)), inspect.getsource(module)) for module, names in by_module.items()]
    return tuple(dict.fromkeys(line for part in parts for line in part.imports)), "\n\n".join(p.body for p in parts)


def carry_rewards(rewards: Sequence[Any]) -> CarriedRewards:
    """Each reward's definitions, carried out of its module (:func:`carry`), and the expression that makes it; checked
    by running the carried source on its own, without grpo_lab, and rebuilding every reward from it."""
    by_module: dict[types.ModuleType, list[str]] = {}
    expressions = []
    for reward in rewards:
        name, expression, module = _constructor(reward)
        if module is None or not getattr(module, "__file__", None):
            raise RecipeError(f"reward {name!r} is defined in {getattr(module, '__name__', 'no module')} without a "
                              f"source file (a notebook cell?): move it into a .py file, import it, and export again")
        by_module.setdefault(module, []).append(name)
        expressions.append(expression)
    imports, source = _carried(by_module)
    rebuilt = run_alone("\n".join(imports) + "\n" + source, expressions)
    for reward, copy, expression in zip(rewards, rebuilt, expressions):
        if dataclasses.is_dataclass(reward) and repr(copy) != repr(reward):
            raise RecipeError(f"{expression} does not rebuild {reward!r} from the carried source")
    return CarriedRewards(imports, source, tuple(expressions), tuple(m.__name__ for m in by_module))


@dataclass(frozen=True)
class CarriedTools:
    """A run's tools as script source: their imports, the definitions with the tool chat template and
    ``use_tool_template``, and the functions' names; empty for a run without tools."""

    imports: tuple[str, ...] = ()
    source: str = ""
    names: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


def carry_tools(names: Sequence[str]) -> CarriedTools:
    """The registered tools ``names`` (``TrainConfig.tools``) carried out of their modules, with
    :func:`grpo_lab.tools.use_tool_template` and the template it sets; checked by running the carried source alone
    (each function looked up, none called)."""
    if not names:
        return CarriedTools()
    by_module: dict[types.ModuleType, list[str]] = {tools: ["use_tool_template"]}
    functions = []
    for name in names:
        function = tools.get_tool(name)
        module = inspect.getmodule(function)
        if (not inspect.isfunction(function) or function.__qualname__ != function.__name__ or module is None
                or not getattr(module, "__file__", None)):
            raise RecipeError(f"tool {name!r} is not a function defined at the top of a .py file: define it there, "
                              f"import it, register it, and export again (its source goes into the script)")
        by_module.setdefault(module, []).append(function.__name__)
        functions.append(function.__name__)
    imports, source = _carried(by_module)
    run_alone("\n".join(imports) + "\n" + source, ["use_tool_template", *functions])
    return CarriedTools(imports, source, tuple(functions), tuple(m.__name__ for m in by_module))


# --------------------------------------------------------------------------------------------------
# TRL's and PEFT's configs, as grpo_lab builds them for the run
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _recorded(module: str, name: str) -> Iterator[list[dict[str, Any]]]:
    """While the block runs, ``module.name`` only records the keyword arguments of each call (and returns None): a
    GPU run's GRPOConfig could not even be built on a CPU machine (bf16 needs the GPU), and only its fields count."""
    owner = importlib.import_module(module)
    original, calls = getattr(owner, name), []
    setattr(owner, name, lambda *args, **kwargs: calls.append(dict(kwargs)))
    try:
        yield calls
    finally:
        setattr(owner, name, original)


def recorded_kwargs(module: str, name: str, build: Callable[[], Any]) -> dict[str, Any]:
    """The keyword arguments ``build()`` passes to ``module.name``, called once and not run: what a grpo_lab builder
    sets (``tests/test_recipe.py`` checks that the recorded fields make the builder's object)."""
    with _recorded(module, name) as calls:
        build()
    if len(calls) != 1:
        raise RecipeError(f"expected one call of {module}.{name} while building, saw {len(calls)}: the builder no "
                          f"longer looks it up in {module} when called (update grpo_lab.recipe)")
    return calls[0]


def run_rewards(config: TrainConfig, reward_funcs: Sequence[Callable] | None = None):
    """The run's reward set as :func:`grpo_lab.train.build_trainer` prepares it (functions and weights)."""
    return prepare_rewards(*experiment.reward_spec(config, reward_funcs), config.reward_errors)


def grpo_kwargs(config: TrainConfig, use_vllm: bool, weights: Sequence[float] | None = None) -> dict[str, Any]:
    """Every field :func:`grpo_lab.train.grpo_args` sets on TRL's ``GRPOConfig`` for the resolved ``config`` (the
    reward ``weights`` as the trainer's builder passes them), in the order it passes them."""
    if weights is not None:
        config = dataclasses.replace(config, reward_weights=tuple(weights))
    return recorded_kwargs("trl", "GRPOConfig", lambda: grpo_args(config, use_vllm))


def lora_kwargs(config: TrainConfig) -> dict[str, Any] | None:
    """The ``LoraConfig`` fields :func:`grpo_lab.lora.lora_config` sets for the run (None without LoRA)."""
    if not config.use_peft:
        return None
    return recorded_kwargs("peft", "LoraConfig", lambda: lora.lora_config(
        config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules))


def quantization_kwargs(config: TrainConfig) -> dict[str, Any] | None:
    """The ``BitsAndBytesConfig`` fields of a QLoRA run (``load_in_4bit``) as :func:`grpo_lab.lora.quantization_config`
    has TRL build them (``trl.get_quantization_config``), recorded; None for any other run."""
    if not config.load_in_4bit:
        return None
    fields = recorded_kwargs("trl.trainer.utils", "BitsAndBytesConfig", lambda: lora.quantization_config(config))
    return {name: str(value).removeprefix("torch.") if name.endswith("_dtype") else value
            for name, value in fields.items() if value is not None}


# --------------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------------
def _comment(text: str, indent: str = "") -> str:
    return "\n".join(textwrap.wrap(text, 116 - len(indent), initial_indent=f"{indent}# ",
                                   subsequent_indent=f"{indent}#   "))


def _mapping(name: str, values: dict[str, Any] | None, dropped: dict[str, str]) -> str:
    """``NAME = {...}`` one field per line, or ``NAME = None``; a dropped entry stays visible as a comment."""
    if values is None:
        return f"{name} = None"
    lines = [f"{name} = {{"]
    for key, value in values.items():
        lines.append(f"    {key!r}: {value!r},")
    lines += [_comment(f"left out: {key} ({why})", "    ") for key, why in dropped.items()]
    return "\n".join([*lines, "}"])


def _stock_sampling(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The GRPOConfig fields for stock TRL: generation_kwargs without what only grpo_lab's trainer reads."""
    sampling = kwargs.get("generation_kwargs")
    if not sampling:
        return kwargs, {}
    dropped = {key: GRPO_LAB_ONLY_SAMPLING[key] for key in sampling if key in GRPO_LAB_ONLY_SAMPLING}
    kept = {key: value for key, value in sampling.items() if key not in GRPO_LAB_ONLY_SAMPLING}
    return {**kwargs, "generation_kwargs": kept or None}, {f"generation_kwargs[{k!r}]": v for k, v in dropped.items()}


@dataclass(frozen=True)
class Recipe:
    """Everything the script is made of, for one resolved run."""

    config: TrainConfig
    run_name: str
    backend: str
    """How the run sampled (grpo_lab.train.choose_backend's reason, or the run folder's record)."""
    grpo_config: dict[str, Any]
    dropped: dict[str, str]
    lora_config: dict[str, Any] | None
    quantization: dict[str, Any] | None
    rewards: CarriedRewards
    tools: CarriedTools
    data_file: Path
    columns: tuple[str, ...]
    run_dir: Path | None = None
    """The run folder it was read from (None: made from a config)."""

    def grpo_config_call(self) -> str:
        """The ``GRPOConfig(...)`` call the script makes on a machine like the run's, one field per line."""
        fields = "".join(f"\n    {key}={value!r}," for key, value in self.grpo_config.items())
        return f"GRPOConfig({fields}\n)"


def build_recipe(config: TrainConfig, run_name: str | None = None, backend: str | None = None,
                 reward_funcs: Sequence[Callable] | None = None) -> Recipe:
    """The script's parts for a resolved ``config`` (a config that is not resolved is resolved for this machine)."""
    if not config.is_resolved:
        config = config.resolve(Machine.detect())
    run_name = run_name or (Path(config.output_dir).name if config.output_dir else f"grpo-{config.profile}")
    if config.output_dir is None:
        config = dataclasses.replace(config, output_dir=run_name)
    use_vllm, why = choose_backend(config)
    if use_vllm:  # choose_backend's words would describe this machine's vLLM, not the one the run is for
        why = "vLLM colocated with the trainer" if config.vllm_mode == "colocate" else "a vLLM server (TRL server mode)"
    reward_set = run_rewards(config, reward_funcs)
    kwargs, dropped = _stock_sampling(grpo_kwargs(config, use_vllm, reward_set.weights))
    rows = experiment.load_train_rows(config)
    columns = tuple(sorted({key for row in rows for key in row} & set(TRAINER_COLUMNS)))
    data_file = Path(config.dataset) if config.dataset else SplitConfig().path("train")
    rewards = carry_rewards([getattr(fn, "fn", fn) for fn in reward_set.funcs])
    return Recipe(config, run_name, backend or why, kwargs, dropped, lora_kwargs(config), quantization_kwargs(config),
                  rewards, carry_tools(config.tools), data_file.resolve(), columns)


def _header(recipe: Recipe, name: str) -> str:
    config = recipe.config
    step = (f"{config.num_prompts_per_step} prompts x {config.num_generations} completions per step, "
            f"{config.max_steps} steps, lr {config.learning_rate:g}, beta {config.beta:g}")
    rows = (f"types {list(config.train_types) or 'all'}, languages {list(config.train_languages) or 'all'}"
            + (f", at most {config.train_size} rows" if config.train_size else ""))
    additions = "\n#\n".join(_comment(f"{a.name} ({a.where}): {a.bought}. [{a.source}]") for a in ADDITIONS)
    return f'''#!/usr/bin/env python3
"""GRPO run {recipe.run_name} as plain TRL: stock trl.GRPOTrainer, nothing from grpo_lab.

Written by `grpo-lab export-recipe` (grpo_lab {__version__}). It needs datasets, transformers, trl and peft (and torch):

    python {name} [--output-dir DIR] [--max-steps N] [--model MODEL] [--data-file ROWS.jsonl]

{textwrap.fill(f"The run: the {config.profile} profile on {config.device}, {Path(config.model).name}, {step}; rows of "
                f"{rows}; rewards {list(config.rewards)} with weights {list(config.reward_weights)}. It sampled with "
                f"{recipe.backend}.", 116)}
"""
# What grpo_lab adds to stock GRPOTrainer, and what each addition bought (the measured figure and where it is
# recorded, in the grpo-lab repository). This script has none of them: the same loss and rewards, with TRL's own
# speed, checks and checkpointing.
#
{additions}
#
{_comment("grpo_lab.train also chose settings that this script takes as plain numbers: vllm_gpu_memory_utilization and "
          "the micro-batch from its memory planner (notebook 04), and it checked every prompt against "
          "max_prompt_length before training (TRL never truncates prompts).")}
'''


def _imports(recipe: Recipe) -> str:
    """The script's imports: the standard library's (its own and the carried rewards'), then the packages'."""
    standard = {"import argparse", "import importlib.util", "import json", "from pathlib import Path",
                *recipe.rewards.imports, *recipe.tools.imports}
    ordered = sorted(standard, key=lambda line: (line.startswith("from "), line.split()[1]))
    return "\n".join(["from __future__ import annotations", "", *ordered, "", "import torch",
                      "from datasets import Dataset", "from peft import LoraConfig",
                      "from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig",
                      "from trl import GRPOConfig, GRPOTrainer"])


_BODY = '''

def load_rows(path: str) -> Dataset:
    """The training rows as grpo_lab reads them (one JSON object per line; a plain-string prompt becomes one user
    message, the answer a string), filtered as the run was: languages, then types, then at most TRAIN_SIZE rows."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                if isinstance(row["prompt"], str):
                    row["prompt"] = [{"role": "user", "content": row["prompt"]}]
                row["answer"] = str(row["answer"])
                rows.append(row)
    rows = [row for row in rows if not TRAIN_LANGUAGES or row.get("lang") in TRAIN_LANGUAGES]
    rows = [row for row in rows if not TRAIN_TYPES or row.get("type") in TRAIN_TYPES]
    rows = rows[:TRAIN_SIZE]
    return Dataset.from_list([{column: row.get(column) for column in COLUMNS} for row in rows])


def for_this_machine(settings: dict) -> dict:
    """The run's GRPOConfig on the machine this script runs on: the device, bf16 and the rollout backend follow it."""
    if torch.accelerator.is_available():
        settings["use_cpu"] = False
        if settings.get("use_vllm") and importlib.util.find_spec("vllm") is None:
            print("vLLM is not installed here: sampling with HF generate instead (install vLLM to use colocate)")
            settings.update(use_vllm=False, generation_kwargs=None)
        return settings
    # No accelerator: train on the CPU in fp32, without the CUDA-only kernels and sleep mode.
    settings.update(use_cpu=True, bf16=False, use_liger_kernel=False, vllm_enable_sleep_mode=False)
    if settings.get("use_vllm"):
        # Stock TRL's colocated weight sync copies each parameter into vLLM with load_weights. vLLM-CPU repacks its
        # Linear weights after loading on AVX-512/AMX hosts and keeps an empty Parameter without a weight_loader, so
        # the first sync fails ('Parameter' object has no attribute 'weight_loader'); grpo_lab syncs through vLLM's
        # reload_weights instead (grpo_lab/weight_sync.py), which stock TRL does not. So on the CPU this script
        # samples with HF generate, as grpo_lab's CPU profile does for small models anyway.
        print("no accelerator: sampling with HF generate (stock TRL's vLLM weight sync fails on vLLM-CPU)")
        settings.update(use_vllm=False, generation_kwargs=None)
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=OUTPUT_DIR, help="checkpoints and final/ (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=GRPO_CONFIG["max_steps"])
    parser.add_argument("--model", default=MODEL, help="a model folder or hub id (default: the run's)")
    parser.add_argument("--data-file", default=DATA_FILE, help="JSONL rows (default: the run's)")
    args = parser.parse_args()
    settings = for_this_machine({**GRPO_CONFIG, "output_dir": args.output_dir, "max_steps": args.max_steps,
                                 "run_name": Path(args.output_dir).name})
    # fp32 master weights as grpo_lab holds them (bf16=True autocasts): lr-sized updates vanish in pure bf16 weights
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, use_safetensors=True,
        quantization_config=BitsAndBytesConfig(**QUANTIZATION) if QUANTIZATION else None)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if TOOLS:  # the tool template: Qwen2.5's call format in compact ChatML, parsed by TRL's parser for that format
        tokenizer = use_tool_template(tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=REWARD_FUNCS, args=GRPOConfig(**settings),
                          train_dataset=load_rows(args.data_file), processing_class=tokenizer,
                          peft_config=LoraConfig(**LORA_CONFIG) if LORA_CONFIG else None, tools=TOOLS or None)
    trainer.train()
    trainer.save_model(str(Path(args.output_dir) / "final"))
    tokenizer.save_pretrained(str(Path(args.output_dir) / "final"))


if __name__ == "__main__":
    main()
'''


def _tools_section(carried: CarriedTools) -> str:
    """The script's tools (TRL's ``GRPOTrainer(tools=...)``) with their chat template, or ``TOOLS = []``."""
    if not carried.names:
        return ("TOOLS = []  # the run called no tools\n"
                "use_tool_template = None  # so the tokenizer keeps the model's own chat template")
    return (f"\n# ---- The tools the model may call, carried from {', '.join(carried.modules)}, and the chat template "
            f"----\n\n\n{carried.source.rstrip()}\n\n\nTOOLS = [{', '.join(carried.names)}]")


def render(recipe: Recipe, name: str = RECIPE_FILE) -> str:
    """The script's text (``name``: its file name, for the usage line), checked to compile and to import nothing
    beyond :data:`SCRIPT_PACKAGES` and the standard library."""
    config = recipe.config
    settings = f'''

MODEL = {config.model!r}
DATA_FILE = {str(recipe.data_file)!r}
TRAIN_LANGUAGES = {tuple(config.train_languages or ())!r}  # the run's languages (empty: every language)
TRAIN_TYPES = {tuple(config.train_types or ())!r}  # the run's problem types (empty: every type)
TRAIN_SIZE = {config.train_size!r}  # at most this many rows after the filters (None: all)
COLUMNS = {recipe.columns!r}  # the row columns TRL gets: the prompt, and what the rewards read
OUTPUT_DIR = {recipe.run_name + "-trl"!r}

# ---- The reward functions, carried from {", ".join(recipe.rewards.modules)} with every definition they use ----


{recipe.rewards.source.rstrip()}


REWARD_FUNCS = [{", ".join(recipe.rewards.expressions)}]
{_tools_section(recipe.tools)}

# ---- TRL's GRPOConfig: every field grpo_lab.train.grpo_args set for the run (for_this_machine adapts a few) ----
{_mapping("GRPO_CONFIG", {k: v for k, v in recipe.grpo_config.items() if k != "output_dir"}, recipe.dropped)}

# ---- PEFT's LoraConfig (None: every weight trains) and QLoRA's 4-bit loading (None: not quantized) ----
{_mapping("LORA_CONFIG", recipe.lora_config, {})}
QUANTIZATION = {recipe.quantization!r}
'''
    script = _header(recipe, name) + "\n" + _imports(recipe) + settings + _BODY
    check_script(script)
    return script


def check_script(script: str) -> None:
    """Raise :class:`RecipeError` unless ``script`` compiles and imports only the standard library and
    :data:`SCRIPT_PACKAGES`."""
    tree = ast.parse(script)
    compile(tree, RECIPE_FILE, "exec")
    allowed = set(sys.stdlib_module_names) | set(SCRIPT_PACKAGES) | {"__future__"}
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    foreign = sorted(m for m in modules if m.split(".")[0] not in allowed)
    if foreign:
        raise RecipeError(f"the script would import {foreign}: it may import only {', '.join(SCRIPT_PACKAGES)} and "
                          f"the standard library")


def recipe_for(source: TrainConfig | str | Path, reward_funcs: Sequence[Callable] | None = None) -> Recipe:
    """The recipe of a run folder (or ``"latest"``, or a run's name under the runs root) or of a :class:`TrainConfig`.
    A run trained with your own ``reward_funcs`` needs them again here: its folder records only reward names."""
    if isinstance(source, TrainConfig):
        return build_recipe(source, reward_funcs=reward_funcs)
    run = runs.find_run(source, finished=False)
    record = run.record
    built = build_recipe(TrainConfig.from_dict(record["config"]), run.name, record.get("backend"), reward_funcs)
    return dataclasses.replace(built, run_dir=run.path)


def write_recipe(recipe: Recipe, path: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write the script (default: ``<run>/trl_recipe.py``, or ``trl_recipe.py`` here for a config); returns its path."""
    target = Path(path or (recipe.run_dir / RECIPE_FILE if recipe.run_dir else RECIPE_FILE))
    if target.exists() and not overwrite:
        raise ExistingFileError(f"{target} exists: pass overwrite=True (--overwrite) or another path")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(recipe, target.name), encoding="utf-8")
    return target


def export_recipe(source: TrainConfig | str | Path, path: str | Path | None = None,
                  reward_funcs: Sequence[Callable] | None = None, overwrite: bool = False) -> Path:
    """:func:`recipe_for` ``source``, written by :func:`write_recipe`: the standalone TRL script of a run."""
    return write_recipe(recipe_for(source, reward_funcs), path, overwrite)


def main(argv: list[str] | None = None) -> int:
    """``grpo-lab export-recipe RUN_DIR [--out FILE] [--overwrite]``: write the run as a stock-TRL script."""
    parser = argparse.ArgumentParser(prog="grpo-lab export-recipe", description="Write a run as one standalone "
                                     "Python script for stock TRL (datasets, transformers, trl, peft).")
    parser.add_argument("run", help="a run folder, its name under the runs root, or 'latest'")
    parser.add_argument("--out", default=None, help=f"the script to write (default: RUN_DIR/{RECIPE_FILE})")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing script")
    args = parser.parse_args(argv)
    try:
        path = export_recipe(args.run, args.out, overwrite=args.overwrite)
    except GrpoLabError as error:
        print(f"grpo-lab export-recipe: {error}")
        return 2
    print(f"wrote {path}: run it with `python {path}` (datasets, transformers, trl and peft; no grpo_lab)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
