"""grpo_lab.recipe: a run as one standalone stock-TRL script (and grpo_lab.carry, which writes the rewards into it).

The central check trains two tiny steps with grpo_lab, exports the run, and runs the script in a process that cannot
import grpo_lab: its first step's loss and reward must be the grpo_lab run's. Both sample with HF ``generate`` on the
CPU (the tiny profile's backend, and the script's on a machine without an accelerator), from the same seed.
"""

import ast
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_lab import cli, experiment, lora, recipe, rewards, tools
from grpo_lab import train as T
from grpo_lab.carry import CarryError, carry, run_alone
from grpo_lab.device import Machine
from grpo_lab.errors import ExistingFileError
from grpo_lab.experiment import TrainConfig
from grpo_lab.paths import TINY_MODEL_DIR

CPU = Machine("cpu", bf16=False, memory_gib=24)
TINY = dict(profile="tiny", max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=24,
            live_plot=False, save_steps=100)
# Runs the exported script with grpo_lab blocked: the checkout is an editable install, so `python -I` alone would
# still find it; a meta-path finder in front of every other refuses it, and the launcher proves it does
LAUNCHER = '''
import importlib.abc, runpy, sys

class NoGrpoLab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "grpo_lab":
            raise ModuleNotFoundError(f"No module named {name!r}: the recipe must run without grpo_lab")

sys.meta_path.insert(0, NoGrpoLab())
try:
    import grpo_lab
except ModuleNotFoundError:
    print("import grpo_lab: refused")
else:
    raise SystemExit("grpo_lab could be imported: the check means nothing")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


# --------------------------------------------------------------------------------------------------
# Carrying definitions out of a module
# --------------------------------------------------------------------------------------------------
MODULE = '''
"""A module the tests carry from."""
from __future__ import annotations

import math
import re as regex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

try:
    from grpo_lab.errors import DataError
except ImportError:
    class DataError(ValueError):
        """Stand-in."""

SCALE = 2
"""How much scaled() scales."""
UNUSED = object()
_WORD = regex.compile(r"\\w+")


def helper(text):
    return len(_WORD.findall(text)) * SCALE


def shadowed(SCALE, items):
    return [SCALE * x for x in items]  # its own SCALE, a parameter


def comprehension():
    return [helper for helper in range(2)]  # its own helper, a comprehension variable


def unrelated():
    return Mapping, UNUSED


@dataclass
class Counter:
    offset: float = 0.0

    def __call__(self, prompts, completions, **kwargs):
        if not completions:
            raise DataError("no completions")
        return [math.floor(helper(c) + self.offset) for c in completions]
'''


def test_carry_takes_what_is_used_and_nothing_else():
    carried = carry(["Counter", "shadowed", "comprehension"], MODULE)
    assert carried.imports == ("import math", "import re as regex", "from dataclasses import dataclass")
    body = carried.body
    for needed in ("class Counter", "def helper", "SCALE = 2", '"""How much scaled() scales."""', "_WORD =",
                   "class DataError(ValueError)", "@dataclass"):
        assert needed in body, needed
    for left_out in ("UNUSED", "def unrelated", "grpo_lab", "Mapping", "Sequence", "__future__"):
        assert left_out not in body and left_out not in carried.imports, left_out
    assert run_alone(carried.text, ["Counter(offset=0.5)(prompts=['p'], completions=['two words'])",
                                    "shadowed(3, [1, 2])", "comprehension()"]) == [[4], [3, 6], [0, 1]]
    with pytest.raises(CarryError, match="no completions"):  # the stand-in error class came along
        run_alone(carried.text, ["Counter()(prompts=[], completions=[])"])


def test_carry_refuses_what_it_cannot_carry():
    with pytest.raises(CarryError, match="top level"):
        carry(["missing"], MODULE)
    uses_package = "from grpo_lab.rewards import get_reward\n\ndef f():\n    return get_reward('format')\n"
    with pytest.raises(CarryError, match="imported from grpo_lab"):
        carry(["f"], uses_package)
    with pytest.raises(recipe.RecipeError, match="lambda"):
        recipe.carry_rewards([lambda prompts, completions, **kwargs: [0.0] * len(completions)])


COMPLETIONS = ["3 × 4 = 12\n#### 12", "so it is 12", "#### １２ 元", r"\boxed{\frac{24}{2}}", "#### 12\n#### 13", "",
               [{"role": "assistant", "content": "速度是 ６０ ÷ ５ = １２\n#### １２"}], "12 12 12 12 12 12 12 12"]


@pytest.mark.parametrize("name", rewards.list_rewards())
def test_every_registered_reward_scores_the_same_when_carried(name):
    reward = rewards.get_reward(name)
    carried = recipe.carry_rewards([reward])
    assert "grpo_lab" not in "\n".join(carried.imports) and "import grpo_lab" not in carried.source
    copy, = run_alone("\n".join(carried.imports) + "\n" + carried.source, carried.expressions)
    columns = {"answer": ["12"] * len(COMPLETIONS)}
    assert copy(prompts=["q"] * len(COMPLETIONS), completions=COMPLETIONS, **columns) == \
        reward(prompts=["q"] * len(COMPLETIONS), completions=COMPLETIONS, **columns)
    assert copy.__name__ == reward.__name__  # the name TRL logs it under


def test_a_reward_with_options_is_rebuilt_with_them():
    carried = recipe.carry_rewards([rewards.get_reward("correctness", require_marker=True),
                                    rewards.get_reward("format")])
    assert carried.expressions == ("CorrectnessReward(require_marker=True)", "FormatReward()")
    assert carried.source.count("class CorrectnessReward") == 1


# --------------------------------------------------------------------------------------------------
# The configs: the plan's one translation to TRL, in the planned card's units
# --------------------------------------------------------------------------------------------------
def test_the_script_s_grpo_config_is_the_one_grpo_lab_trains_with(tmp_path):
    from trl import GRPOConfig

    config = TrainConfig(**TINY, output_dir=str(tmp_path / "run"), report_to="tensorboard")
    built = recipe.build_recipe(experiment.plan(config, CPU))
    trained = experiment.plan(config, CPU).grpo_config(use_vllm=False)
    assert GRPOConfig(**built.grpo_config).to_dict() == trained.to_dict()
    assert built.grpo_config_call().startswith("GRPOConfig(\n    output_dir=")  # notebook 03 prints it
    assert built.grpo_config["report_to"] == ["tensorboard"] and "tensorboard" in built.packages


def test_a_gpu_lora_run_planned_for_a_smaller_card_carries_that_card_s_share(tmp_path):
    machine = Machine("cuda", bf16=True, memory_gib=16, device_gib=80)  # a 16 GiB card stood in for by an 80 GiB one
    step = experiment.plan(TrainConfig(profile="gpu", use_peft=True, output_dir=str(tmp_path / "gpu-run")), machine)
    built = recipe.build_recipe(step)
    assert built.grpo_config["use_vllm"] and built.grpo_config["bf16"] and built.grpo_config["beta"] == 0.04
    assert built.grpo_config["vllm_gpu_memory_utilization"] == step.vllm_share  # of the 16 GiB card, as planned
    assert step.trl_kwargs(use_vllm=True)["vllm_gpu_memory_utilization"] < step.vllm_share  # what the trainer passed
    assert built.packages[:4] == recipe.BASE_PACKAGES and {"peft", "vllm"} <= set(built.packages)
    script = recipe.render(built, tmp_path / "out" / recipe.RECIPE_FILE)
    assert f"vllm_gpu_memory_utilization={step.vllm_share}" in script and "16 GiB cuda device" in script
    namespace: dict = {}
    exec(script[script.index("LORA_CONFIG = {"):script.index("QUANTIZATION =")], namespace)
    from peft import LoraConfig
    assert LoraConfig(**namespace["LORA_CONFIG"]) == lora.lora_config(step.config)


def test_the_script_resolves_its_paths_against_its_own_folder_and_takes_a_free_port(tmp_path):
    built = recipe.build_recipe(experiment.plan(TrainConfig(**TINY, output_dir=str(tmp_path / "run")), CPU))
    script = recipe.render(built, tmp_path / "deep" / "er" / recipe.RECIPE_FILE)
    namespace: dict = {"__file__": str(tmp_path / "deep" / "er" / recipe.RECIPE_FILE)}
    exec(script[:script.index("# ---- The reward functions")], namespace)
    assert not namespace["MODEL"].startswith("/") and namespace["MODEL"].startswith("../../")
    assert (tmp_path / "deep" / "er" / namespace["DATA_FILE"]).resolve() == built.data_file.resolve()
    path = recipe.write_recipe(built, tmp_path / "deep" / "er" / recipe.RECIPE_FILE)
    import runpy
    body = runpy.run_path(str(path), run_name="recipe_body")  # defines, does not train
    assert Path(body["local"](namespace["MODEL"])).resolve() == Path(built.config.model).resolve()
    port = int(body["free_port"]())
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))  # nobody listens there
    assert "os.environ.setdefault(\"MASTER_PORT\", free_port())" in script


def test_a_quantized_recipe_renders_its_bits_and_bytes_config(tmp_path):
    built = recipe.build_recipe(TrainConfig(**TINY, output_dir=str(tmp_path / "run")).resolve(CPU))
    script = recipe.render(dataclasses.replace(built, quantization={"load_in_4bit": True,
                                                                     "bnb_4bit_quant_type": "nf4"}))
    assert "QUANTIZATION = {'load_in_4bit': True, 'bnb_4bit_quant_type': 'nf4'}" in script
    assert "quantization_config=BitsAndBytesConfig(**QUANTIZATION) if QUANTIZATION else None" in script


def test_a_qlora_run_carries_the_bits_and_bytes_config_grpo_lab_builds(tmp_path):
    """A QLoRA run (``load_in_4bit``, CUDA) exported on a CPU: the fields TRL's builder gets from grpo_lab.lora."""
    from transformers import BitsAndBytesConfig

    from grpo_lab.device import Machine

    gpu = Machine("cuda", True, 16, "a 16 GiB GPU")
    config = TrainConfig(profile="gpu", use_peft=True,
                         load_in_4bit=True, output_dir=str(tmp_path / "run")).resolve(gpu)
    fields = lora.quantization_kwargs(config)
    assert fields["load_in_4bit"] and fields["bnb_4bit_quant_type"] == "nf4"
    assert BitsAndBytesConfig(**fields).to_dict() == lora.quantization_config(config).to_dict()
    assert lora.quantization_kwargs(dataclasses.replace(config, load_in_4bit=False)) is None
    assert "bitsandbytes" in recipe.packages(config, use_vllm=True)


def test_a_tool_run_carries_its_tools_and_their_chat_template(tmp_path, monkeypatch):
    """A run with ``tools=("calculator",)``: the script defines the calculator and the course's tool template from
    grpo_lab.tools' own source, hands TRL ``tools=TOOLS`` and sets the tokenizer up as grpo_lab's trainer does; the
    carried calculator computes and refuses as the package's does, in a namespace that has no grpo_lab."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import supports_tool_calling

    config = TrainConfig(**TINY, tools=("calculator",), max_tool_calling_iterations=2,
                         output_dir=str(tmp_path / "run")).resolve(CPU)
    built = recipe.build_recipe(config)
    assert built.tools.expressions == ("calculator",) and built.grpo_config["max_tool_calling_iterations"] == 2
    script = recipe.render(built)
    assert "def calculator(expression: str) -> str:" in script and "TOOLS = [calculator]" in script
    assert "tools=TOOLS or None" in script and "tokenizer = use_tool_template(tokenizer)" in script
    namespace: dict = {}
    start = script.index("# ---- The tools the model may call")
    exec("from __future__ import annotations\n" + "\n".join(built.tools.imports) + "\n"  # noqa: S102
         + script[start:script.index("# ---- TRL's GRPOConfig")], namespace)
    assert "tools" not in namespace and namespace["TOOL_CHAT_TEMPLATE"] == tools.TOOL_CHAT_TEMPLATE
    for text in ["2 × (3 + 4)", "7 / 2", "(60 - 28) * 3"]:
        assert namespace["calculator"](text) == tools.calculator(text)
    with pytest.raises(ValueError, match="is not arithmetic"):
        namespace["calculator"]("__import__('os')")
    tokenizer = namespace["use_tool_template"](AutoTokenizer.from_pretrained(TINY_MODEL_DIR))
    assert supports_tool_calling(tokenizer) and tokenizer.chat_template == tools.TOOL_CHAT_TEMPLATE
    plain = recipe.render(recipe.build_recipe(TrainConfig(**TINY, output_dir=str(tmp_path / "plain")).resolve(CPU)))
    assert "TOOLS = []" in plain and "def calculator" not in plain
    def nested(expression: str) -> str:
        """A tool defined inside a function (a notebook's helper, say): its source cannot be carried."""
        return expression

    monkeypatch.setitem(tools._REGISTRY, "nested", nested)
    with pytest.raises(recipe.RecipeError, match="top of a .py file"):
        recipe.carry_tools(["nested"])


def test_the_script_imports_only_the_stock_packages(tmp_path):
    built = recipe.build_recipe(TrainConfig(**TINY, output_dir=str(tmp_path / "run")).resolve(CPU))
    script = recipe.render(built)
    tree = ast.parse(script)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) == {"torch", "datasets", "transformers", "trl"}  # no LoRA: no peft
    assert built.packages == recipe.BASE_PACKAGES and f"It needs: {', '.join(built.packages)}." in script
    assert "liger-kernel" in recipe.packages(dataclasses.replace(built.config, use_liger_kernel=True), False)
    with pytest.raises(recipe.RecipeError, match="grpo_lab"):
        recipe.check_script(script + "\nimport grpo_lab\n")


# --------------------------------------------------------------------------------------------------
# The script trains without grpo_lab, and its first step is the grpo_lab run's
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two tiny steps with grpo_lab (HF generate on the CPU, seed 0)."""
    folder = tmp_path_factory.mktemp("recipe")
    result = T.train(TrainConfig(**TINY, output_dir=str(folder / "grpo-tiny-run")), machine=CPU)
    return result


def _clean_environment(home: Path) -> dict[str, str]:
    """No PYTHONPATH and no grpo_lab variables: only the caches, offline, and the thread count the run had."""
    keep = ("PATH", "HF_HOME", "TMPDIR", "LANG")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    return {**env, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "MPLCONFIGDIR": str(home / "matplotlib"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def test_the_exported_script_trains_without_grpo_lab_and_matches_the_first_step(tiny_run, tmp_path):
    script = tmp_path / "elsewhere" / "trl_recipe.py"
    assert cli.main(["export-recipe", str(tiny_run.run_dir), "--out", str(script)]) == 0
    launcher = tmp_path / "elsewhere" / "launch.py"
    launcher.write_text(textwrap.dedent(LAUNCHER), encoding="utf-8")
    out = tmp_path / "elsewhere" / "out"
    done = subprocess.run([sys.executable, "-I", str(launcher), str(script), "--output-dir", str(out)],
                          cwd=script.parent, env=_clean_environment(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "import grpo_lab: refused" in done.stdout
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    stock = [entry for entry in history if "reward" in entry]
    ours = tiny_run.metrics
    assert [entry["step"] for entry in stock] == [1, 2] and (out / "final" / "model.safetensors").is_file()
    # Both processes sample the same completions: the same weights, prompts (TRL's sampler, seed 0) and RNG draws of
    # HF generate, on the same kernels and thread count. So the reward, a mean of 0/1 scores over 8 completions, is
    # equal exactly, and the loss up to float summation order; 1e-6 is far below what one different completion would
    # change (1/8 of the reward, about 1e-2 of the loss). Measured here: bit-identical, both steps.
    assert stock[0]["reward"] == ours[0]["reward"]
    assert stock[0]["completions/mean_length"] == ours[0]["completions/mean_length"]
    assert stock[0]["loss"] == pytest.approx(ours[0]["loss"], abs=1e-6)


def test_export_from_a_config_names_the_run_and_refuses_to_overwrite(tiny_run, tmp_path):
    path = recipe.export_recipe(tiny_run.config, tmp_path / "recipe.py")
    text = path.read_text()
    assert f"GRPO run {tiny_run.run_dir.name} as plain TRL" in text and "python recipe.py" in text
    assert f"TRAIN_TYPES = {tuple(tiny_run.config.train_types)!r}" in text
    # the columns the script hands TRL are those grpo_lab's trainer got
    assert f"COLUMNS = {tuple(sorted(tiny_run.trainer.train_dataset.column_names))!r}" in text
    with pytest.raises(ExistingFileError):
        recipe.export_recipe(tiny_run.config, path)

