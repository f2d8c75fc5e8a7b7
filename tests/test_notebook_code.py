"""A notebook's code as one program: a name a later cell defines as a function is not a value an earlier cell set.

Notebook 03's check read ``spread`` (its seeds' headline) after the KL-brake section had defined ``def spread(name)``:
the GPU run failed at its last cell. Such a clash is found here, before any run."""

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def top_level_bindings(source: str) -> tuple[set[str], set[str]]:
    """Names a program's top level binds by assignment (for loops and ``with`` included) and by ``def``/``class``."""
    assigned, defined = set(), set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                assigned.add(inner.id)
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                break
    return assigned, defined


def notebook_source(path: Path) -> str:
    cells = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    return "\n".join("\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in cell.splitlines())
                     for cell in cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_name_is_both_a_value_and_a_function(path):
    assigned, defined = top_level_bindings(notebook_source(path))
    assert not assigned & defined, f"{path.name}: {sorted(assigned & defined)} set as a value and defined as a function"


def test_the_check_finds_the_clash_it_exists_for():
    assigned, defined = top_level_bindings("spread = 1\ndef spread(name):\n    total = 2\n    return total\n")
    assert assigned & defined == {"spread"} and "total" not in assigned
