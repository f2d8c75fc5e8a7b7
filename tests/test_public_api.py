"""What users import is a promise: ``grpo_lab.__all__`` names the public modules (each with its own ``__all__``) and
a few top-level names, at most 250 names in all, each one existing and documented; every name a notebook takes from
grpo_lab is among them; ``import grpo_lab`` stays cheap; the version is pyproject's; README's example runs as printed.
Internal modules (``grpo_lab.upstream``, ``servers``, ...) and the measurement lab (``lab``) are outside it."""

import ast
import dataclasses
import functools
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import grpo_lab

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_PUBLIC_NAMES = 250
INTERNAL = ("upstream", "carry", "servers", "callbacks", "tiny_model")
# Internal code a notebook shows (its source, folded with widgets.folded_source) without calling it: module -> why.
SHOWN = {"grpo_lab.upstream": "notebook 03 shows where grpo_lab meets vLLM's internals"}


def _is_module(dotted: str) -> bool:
    path = REPO_ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _public_modules() -> list[str]:
    return [f"grpo_lab.{name}" for name in grpo_lab.__all__ if _is_module(f"grpo_lab.{name}")]


@functools.cache
def public_names() -> frozenset[tuple[str, str]]:
    """``(module, name)`` for every public name, the top level's included."""
    names = {("grpo_lab", name) for name in grpo_lab.__all__}
    for module in _public_modules():
        names |= {(module, name) for name in importlib.import_module(module).__all__}
    return frozenset(names)


def test_the_public_api_has_at_most_250_names():
    count = len(grpo_lab.__all__) + sum(len(importlib.import_module(m).__all__) for m in _public_modules())
    assert count <= MAX_PUBLIC_NAMES, f"{count} public names: make some private (at most {MAX_PUBLIC_NAMES})"


def test_internal_modules_stay_importable_but_not_public():
    for name in INTERNAL:
        assert name not in grpo_lab.__all__, name
        importlib.import_module(f"grpo_lab.{name}")
    assert "lab" not in grpo_lab.__all__


def test_the_top_level_loads_its_names_and_modules_on_first_use():
    assert set(grpo_lab.__all__) <= set(dir(grpo_lab))
    assert grpo_lab.TrainConfig is importlib.import_module("grpo_lab.experiment").TrainConfig
    assert grpo_lab.Machine is importlib.import_module("grpo_lab.device").Machine
    assert grpo_lab.train.train.__module__ == "grpo_lab.train"  # `train` is the module, as the notebooks use it
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        grpo_lab.nope  # noqa: B018


def _module_path(module: str) -> Path:
    path = REPO_ROOT / module.replace(".", "/")
    return path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")


def _data_documented(module: str, name: str) -> bool:
    """A value's documentation: a string right after its top-level assignment (an attribute docstring) or a comment
    right above it, in the module that assigns it (re-exports are followed)."""
    source = _module_path(module).read_text(encoding="utf-8")
    lines, body = source.splitlines(), ast.parse(source).body
    for index, node in enumerate(body):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            after = body[index + 1] if index + 1 < len(body) else None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value,
                                                                                                     str):
                return True
            return node.lineno > 1 and lines[node.lineno - 2].lstrip().startswith("#")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_lab"):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _data_documented(node.module, alias.name)
    return False


def _documented(module: str, name: str) -> bool:
    value = getattr(importlib.import_module(module), name)
    if inspect.isclass(value):  # its own: not a base class's, nor the signature a dataclass or NamedTuple gets
        doc = (value.__dict__.get("__doc__") or "").strip()
        return bool(doc) and not doc.startswith(f"{value.__name__}(")
    if inspect.ismodule(value) or inspect.isroutine(value):
        return bool((value.__doc__ or "").strip())
    return _data_documented(module, name)


@pytest.mark.parametrize("module", ["grpo_lab", *_public_modules()])
def test_every_public_name_exists_and_is_documented(module):
    imported = importlib.import_module(module)
    listed = list(imported.__all__)
    assert len(listed) == len(set(listed)), f"{module}.__all__ lists a name twice"
    missing = [name for name in listed if not hasattr(imported, name)]
    assert not missing, f"{module}.__all__ lists names it does not have: {missing}"
    undocumented = [name for name in listed if not _documented(module, name)]
    assert not undocumented, f"give these a docstring (a value: a string after it or a comment above): {undocumented}"


def test_the_documentation_check_catches_what_it_exists_for():
    assert _documented("grpo_lab.paths", "MODEL_CONFIGS_DIR")  # a string after the assignment
    assert not _documented("grpo_lab.paths", "REPO_ROOT")
    assert _documented("grpo_lab.memory", "GIB")  # re-exported: documented where it is assigned
    assert not _documented("grpo_lab.memory", "CONFIG_DIR")
    assert _BARE.__doc__.startswith("_BARE(") and not _documented(__name__, "_BARE")  # dataclasses' signature


_BARE = dataclasses.make_dataclass("_BARE", ["x"])


def test_import_grpo_lab_is_cheap():
    code = ("import sys, grpo_lab; heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm') if m in sys.modules];"
            "print(','.join(heavy) or 'none')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"


def test_version_is_pyprojects():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert grpo_lab.__version__ == project["version"] == "0.3.0"
    assert f"## [{grpo_lab.__version__}]" in (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


# --- What the notebooks use -------------------------------------------------------------------------------------------
def _code(notebook: dict) -> str:
    """A notebook's code cells as one Python source, IPython's ``%magic`` and ``!shell`` lines blanked."""
    cells = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", cell, flags=re.MULTILINE) for cell in cells)


def grpo_lab_uses(source: str) -> set[tuple[str, str, bool]]:
    """``(module, name, shown)`` for each grpo_lab name ``source`` takes: ``from grpo_lab.x import y``, ``import
    grpo_lab.x``, and attribute chains on a module it imported (``x.y``, ``grpo_lab.x.y``); ``shown``: the use sits
    in the arguments of a ``folded_source(...)`` call (its source is shown, not called)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the grpo_lab module it is
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpo_lab":
            for alias in node.names:
                uses.add((node.module, alias.name, False))
                if _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "grpo_lab":
                    parts = alias.name.split(".")
                    uses |= {(".".join(parts[:i]), parts[i], False) for i in range(1, len(parts))}
                    modules[alias.asname or "grpo_lab"] = alias.name if alias.asname else "grpo_lab"
    shown = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id == "folded_source" for arg in node.args for inner in ast.walk(arg)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not (isinstance(base, ast.Name) and base.id in modules) or not isinstance(node.ctx, ast.Load):
            continue
        module = modules[base.id]
        for name in chain:  # grpo_lab.x.y.z: x and y while they are modules, then the first name that is not
            uses.add((module, name, id(node) in shown))
            if not _is_module(f"{module}.{name}"):
                break
            module = f"{module}.{name}"
    return uses


def test_the_notebook_scan_finds_what_it_exists_for():
    source = ("from grpo_lab import data, train as grpo\nfrom grpo_lab.rollout import open_engine\nimport grpo_lab\n"
              "from grpo_lab.upstream import vllm as internals\nfrom grpo_lab.widgets import folded_source\n"
              "data.load_split('eval')\ngrpo.TrainConfig()\ngrpo_lab.memory.plan_memory\n"
              "folded_source(internals.reload_weights, summary='x')\n")
    uses = grpo_lab_uses(source)
    assert {("grpo_lab", "data", False), ("grpo_lab.data", "load_split", False), ("grpo_lab.train", "TrainConfig", False),
            ("grpo_lab.rollout", "open_engine", False), ("grpo_lab", "memory", False),
            ("grpo_lab.memory", "plan_memory", False), ("grpo_lab.upstream", "vllm", False),
            ("grpo_lab.upstream.vllm", "reload_weights", True)} <= uses
    assert _allowed("grpo_lab.upstream", "vllm", False) and _allowed("grpo_lab.upstream.vllm", "reload_weights", True)
    assert not _allowed("grpo_lab.upstream.vllm", "reload_weights", False)  # called, not shown
    assert not _allowed("grpo_lab.train", "TrainConfig", False) and not _allowed("grpo_lab", "upstream", False)


def _notebooks() -> list[Path]:
    return sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", _notebooks(), ids=lambda path: path.stem)
def test_every_name_a_notebook_uses_is_public(path):
    """What a notebook takes from grpo_lab is public (the measurement lab is imported from ``lab``); internal code it
    only shows (``SHOWN``) is imported and passed to ``folded_source``, never called."""
    uses = grpo_lab_uses(_code(json.loads(path.read_text(encoding="utf-8"))))
    private = sorted(f"{module}.{name}" for module, name, shown in uses if not _allowed(module, name, shown))
    assert not private, f"{path.name} uses names outside grpo_lab's public API: {private}"


def _allowed(module: str, name: str, shown: bool) -> bool:
    """Public; or, inside a module of ``SHOWN``, a submodule imported or a name shown by ``folded_source``."""
    if (module, name) in public_names():
        return True
    inside = f"{module}.{name}".startswith(tuple(f"{shown_module}." for shown_module in SHOWN))
    return inside and (shown or _is_module(f"{module}.{name}"))


# --- README's example -------------------------------------------------------------------------------------------------
def readme_example() -> str:
    section = (REPO_ROOT / "README.md").read_text(encoding="utf-8").split("## Use grpo_lab in your own notebook")[1]
    return re.search(r"```python\n(.*?)```", section.split("\n## ")[0], re.DOTALL).group(1)


def test_readme_example_uses_only_public_names():
    uses = grpo_lab_uses(readme_example())
    assert uses and not sorted(f"{module}.{name}" for module, name, _ in uses if (module, name) not in public_names())


def test_readme_example_runs_as_printed(tmp_path):
    """Extracted from README.md and run as a script on the CPU, its run folder under ``tmp_path``: it trains a few
    steps of the tiny profile with a reward of your own beside a registered one."""
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    env = {**os.environ, "GRPO_LAB_DEVICE": "cpu", "GRPO_LAB_RUN_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in ("GRPO_LAB_PROFILE", "GRPO_LAB_MODEL", "GRPO_LAB_DEVICE_MEMORY_GIB"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "fits" in result.stdout and str(tmp_path / "runs") in result.stdout
    assert (tmp_path / "my_data.jsonl").is_file()
    run = next((tmp_path / "runs").glob("grpo-tiny-*"))
    recorded = json.loads((run / "config.json").read_text())["config"]
    assert list(recorded["rewards"]) == ["close_enough", "format"] and recorded["max_steps"] == 2, recorded
