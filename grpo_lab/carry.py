r"""Carrying definitions out of a module: the source a file needs so that some of a module's functions, classes or
constants work without the module (:func:`carry`), and the check that they do (:func:`run_alone`).

The recipe writes reward functions into a script that must not import grpo_lab: it carries ``CorrectnessReward`` out
of :mod:`grpo_lab.rewards` with every module-level name it uses and nothing else. Names are followed through the code's
scopes, so a function's locals never pull in a module-level name they happen to share.

>>> carried = carry(["double"], "import math\nSCALE = 2\ndef double(x):\n    return SCALE * x\n")
>>> print(carried.text)
SCALE = 2
<BLANKLINE>
<BLANKLINE>
def double(x):
    return SCALE * x
<BLANKLINE>
"""

from __future__ import annotations

import ast
import sys
import textwrap
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_lab.errors import GrpoLabError


class CarryError(GrpoLabError, ValueError):
    """Definitions that cannot be carried out of their module as asked; the message says why and what to do."""


def _is_package_import(node: ast.stmt, package: str) -> bool:
    """Whether ``node`` imports ``package`` or one of its modules."""
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == package for alias in node.names)
    return isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == package


def _top_level(tree: ast.Module, package: str) -> list[ast.stmt]:
    """The module's statements, where a ``try: <import of package> except ImportError: <stand-ins>`` contributes its
    stand-ins: the file's own way to run without the package (rewards.py has one for grpo_lab.errors)."""
    statements: list[ast.stmt] = []
    for node in tree.body:
        fallback = [handler for handler in getattr(node, "handlers", ())
                    if isinstance(handler.type, ast.Name) and handler.type.id in ("ImportError", "ModuleNotFoundError")]
        if isinstance(node, ast.Try) and fallback and any(_is_package_import(n, package) for n in node.body):
            statements.extend(stmt for handler in fallback for stmt in handler.body)
        else:
            statements.append(node)
    return statements


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    args = node.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a)]


def _stored(nodes: Sequence[ast.AST]) -> set[str]:
    """Names a scope's own statements bind (assignments, loops, imports, ``except … as``, nested definitions), not
    looking into the nested scopes themselves."""
    bound: set[str] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            continue
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(_alias_name(alias) for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        pending.extend(ast.iter_child_nodes(node))
    return bound


def _used_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads from the module: every name it loads, less those its own scopes bind (parameters,
    locals, comprehension variables). A class body's names count as read (more than needed, never less)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        parameters = _parameters(node)
        outside = [*getattr(node, "decorator_list", ()), *node.args.defaults, *node.args.kw_defaults,
                   getattr(node, "returns", None), *(a.annotation for a in parameters)]
        body = node.body if isinstance(node.body, list) else [node.body]
        inside = set().union(*(_used_names(stmt) for stmt in body)) - {a.arg for a in parameters} - _stored(body)
        return inside.union(*(_used_names(part) for part in outside if part is not None))
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        targets = _stored([generator.target for generator in node.generators])
        return set().union(*(_used_names(child) for child in ast.iter_child_nodes(node))) - targets
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    return set().union(*(_used_names(child) for child in ast.iter_child_nodes(node)))


def _alias_name(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


@dataclass(frozen=True)
class Carried:
    """Definitions carried out of a module: the import statements they need and their source."""

    imports: tuple[str, ...]
    body: str

    @property
    def text(self) -> str:
        """The imports, then the definitions: a module of its own."""
        return "\n".join(self.imports) + "\n\n\n" + self.body if self.imports else self.body


def carry(names: Sequence[str], source: str, package: str = "grpo_lab") -> Carried:
    """What a file needs so that ``names`` (module-level definitions of the module whose ``source`` this is) work
    without the module: their definitions and every module-level definition they use, in the module's order, and the
    imports they use (each cut to the names used). A name bound in several places brings each of them; a ``try`` that
    imports ``package`` contributes its ``except ImportError`` stand-ins, never the import."""
    tree = ast.parse(source)
    lines = source.splitlines()
    statements = _top_level(tree, package)
    defined: dict[str, list[int]] = {}
    imported: dict[str, tuple[int, ast.alias]] = {}
    for index, node in enumerate(statements):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                for alias in node.names:
                    imported[_alias_name(alias)] = (index, alias)
            continue
        for name in _bound_names(node):
            defined.setdefault(name, []).append(index)
    missing = [name for name in names if name not in defined]
    if missing:
        raise CarryError(f"{missing} are not defined at the top level of the module: only module-level functions, "
                          f"classes and constants can be written into a script")
    needed: set[int] = set()
    used_imports: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in imported:
            used_imports.add(name)
        for index in defined.get(name, ()):
            if index not in needed:
                needed.add(index)
                pending.extend(_used_names(statements[index]) - {name})
    bad = sorted(name for name in used_imports if _is_package_import(statements[imported[name][0]], package))
    if bad:
        raise CarryError(f"the functions use {bad}, imported from {package}: a script without {package} cannot "
                          f"carry them (define them in the reward's own module)")
    imports = [_import_line(statements[index], [alias for _, alias in sorted(
        (imported[n] for n in used_imports if imported[n][0] == index), key=lambda item: item[1].name)])
               for index in sorted({imported[name][0] for name in used_imports})]
    body = "\n\n\n".join(_statement_source(statements, index, lines) for index in sorted(needed))
    return Carried(tuple(imports), body + "\n")


def _import_line(node: ast.stmt, aliases: list[ast.alias]) -> str:
    names = ", ".join(alias.name + (f" as {alias.asname}" if alias.asname else "") for alias in aliases)
    return f"from {node.module} import {names}" if isinstance(node, ast.ImportFrom) else f"import {names}"


def _statement_source(statements: list[ast.stmt], index: int, lines: list[str]) -> str:
    """A statement's lines, decorators included, with the string that documents it when one follows it (an
    attribute docstring), dedented (a stand-in from an ``except`` block is indented)."""
    node = statements[index]
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    last = node.end_lineno
    following = statements[index + 1] if index + 1 < len(statements) else None
    if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)):
        last = following.end_lineno
    return textwrap.dedent("\n".join(lines[first - 1:last]))


def run_alone(source: str, expressions: Sequence[str] = ()) -> list[Any]:
    """Run ``source`` as a module of its own, then evaluate ``expressions`` in it: the check that carried definitions
    need nothing else (a dataclass looks its module up in ``sys.modules`` while it is defined, so one is there)."""
    module = types.ModuleType("grpo_lab_recipe_check")
    sys.modules[module.__name__] = module
    try:
        exec(compile("from __future__ import annotations\n" + source, "<carried rewards>", "exec"), module.__dict__)
        return [eval(expression, module.__dict__) for expression in expressions]  # noqa: S307 - our own expressions
    except Exception as error:  # noqa: BLE001 - any failure means the carried source is not standalone
        raise CarryError(f"the carried source does not run on its own: {type(error).__name__}: {error}") from error
    finally:
        del sys.modules[module.__name__]
