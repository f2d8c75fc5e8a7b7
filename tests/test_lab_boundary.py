"""The lab beside the package: ``grpo_lab`` holds code, ``benchmarks/lab`` (imported as ``lab``) holds the harnesses and
the readers of committed results. ``lab`` may import ``grpo_lab``; no module of ``grpo_lab`` imports ``lab``, names a
path under ``benchmarks/`` or reads anything there, and ``pip install .`` of grpo_lab never installs the lab."""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import tomllib

import grpo_lab
import lab

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "grpo_lab"
LAB = REPO_ROOT / "benchmarks" / "lab"
BENCHMARKS_PATH = re.compile(r"(?<![\w/.])benchmarks/")
"""A path under the repository's ``benchmarks/`` (``vllm/benchmarks/serve.py`` is vLLM's, not ours)."""
def _modules(root: Path):
    for path in sorted(root.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement, or an ``import_module("...")`` / ``__import__("...")`` call, names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""] if node.level == 0 else []
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
        return [str(node.args[0].value)]
    return []


def test_no_module_of_grpo_lab_imports_the_lab():
    found = [f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {name}" for path, tree in _modules(PACKAGE)
             for node in ast.walk(tree) for name in _imported(node) if name == "lab" or name.startswith("lab.")]
    assert not found, "grpo_lab never imports the lab:\n" + "\n".join(found)


def test_no_module_of_grpo_lab_names_a_path_under_benchmarks():
    named = {str(path.relative_to(PACKAGE)) for path, _ in _modules(PACKAGE)
             if BENCHMARKS_PATH.search(path.read_text(encoding="utf-8"))}
    assert not named, f"grpo_lab reads nothing under benchmarks/: {sorted(named)}"


def test_the_lab_is_no_module_of_grpo_lab():
    moved = ("bench", "committed", "results", "verl_parity")
    assert not set(moved) & set(grpo_lab.__all__)
    assert not [name for name in moved if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()]
    assert not hasattr(importlib.import_module("grpo_lab.paths"), "BENCHMARKS_DIR")


def test_pip_install_of_grpo_lab_leaves_the_lab_out_and_make_installs_both():
    product = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert product["tool"]["setuptools"]["packages"]["find"]["include"] == ["grpo_lab*"]
    beside = tomllib.loads((REPO_ROOT / "benchmarks" / "pyproject.toml").read_text(encoding="utf-8"))
    assert beside["project"]["name"] == "grpo-lab-benchmarks"
    assert beside["tool"]["setuptools"]["packages"]["find"]["include"] == ["lab*"]
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"pip install .*-e \"\.\[.*\]\" -e benchmarks", makefile), "make install: -e . and -e benchmarks"
    assert "-e benchmarks" in (REPO_ROOT / "binder" / "postBuild").read_text(encoding="utf-8")


def test_the_lab_is_the_package_under_benchmarks():
    assert Path(lab.__file__).resolve().parent == LAB


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.walk_packages([str(LAB)], "lab.")
                                        if not m.name.endswith("__main__")))
def test_every_lab_module_imports(name):
    importlib.import_module(name)
