"""The architecture a newcomer reads in README.md ("Architecture") is the one the code has: layers that import
only downwards (import-linter's contracts in pyproject.toml), every module placed in a layer, no import cycles, and
grpo_lab's own imports at the top of each file."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "grpo_lab"
# grpo_lab imports that stay inside a function, each for a stated reason
LAZY_ON_PURPOSE = {
    ("env.py", "grpo_lab"): "env reports even when torch is broken; grpo_lab.device imports torch",
    ("rewards.py", "grpo_lab.errors"): "rewards.py is copied alone into verl exports, where grpo_lab may be absent",
    ("tools.py", "grpo_lab.errors"): "the recipe carries the calculator out of tools.py into a script without grpo_lab",
    ("train.py", "grpo_lab.upstream.trainer"): "the trainer subclasses TRL's GRPOTrainer, whose import loads vLLM "
                                               "(seconds): grpo_lab.train's config, CLI and callbacks import without it",
    ("async_grpo.py", "grpo_lab.upstream.async_trainer"): "the trainer subclasses TRL's experimental AsyncGRPOTrainer "
                                                          "(seconds): the orchestrating process never imports it",
}


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    result = subprocess.run([lint], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_module_has_a_layer():
    contracts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = {name.strip() for layer in contracts[0]["layers"] for name in layer.split("|")}
    modules = {f"grpo_lab.{p.stem if p.is_file() else p.name}" for p in PACKAGE.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert modules == layered, f"place these in a layer: {sorted(modules - layered)}; gone: {sorted(layered - modules)}"


def test_grpo_lab_imports_sit_at_the_top_of_files():
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if module and module.startswith("grpo_lab") and (path.name, module) not in LAZY_ON_PURPOSE:
                    late.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {module}")
    assert not late, "move these to the top of their file (or state why they must wait):\n" + "\n".join(late)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package_module(dotted: str) -> bool:
    path = REPO_ROOT / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _load_time_imports(tree: ast.Module) -> list[str]:
    """The grpo_lab modules a module imports while it loads: its top-level imports (inside module-level ``if`` and
    ``try`` too, not under ``if TYPE_CHECKING``), each resolved to the module it names (``from grpo_lab import device``:
    ``grpo_lab.device``; ``from grpo_lab.deploy import X``: ``grpo_lab.deploy``, or the submodule ``X``)."""
    found, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            pending.extend(node.orelse)
        elif isinstance(node, (ast.If, ast.Try)):
            pending.extend([*node.body, *node.orelse, *getattr(node, "finalbody", []),
                            *(inner for handler in getattr(node, "handlers", []) for inner in handler.body)])
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "grpo_lab"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpo_lab":
            found += [f"{node.module}.{alias.name}" if _is_package_module(f"{node.module}.{alias.name}")
                      else node.module for alias in node.names]
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports while loading): each strongly connected
    component of more than one module, and each module that imports itself (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, ()):
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_grpo_lab_has_no_import_cycles():
    """No grpo_lab module imports, while it loads, a module that imports it back (directly or around a longer loop):
    a package's ``__init__`` that re-exports a submodule's names is imported by none of its submodules."""
    graph = {_module_name(path): set(_load_time_imports(ast.parse(path.read_text(encoding="utf-8"))))
             for path in sorted(PACKAGE.rglob("*.py"))}
    cycles = import_cycles(graph)
    assert not cycles, "break these import cycles:\n" + "\n".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_finds_what_it_exists_for():
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}) == [["a", "b", "c"], ["d"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    capacity = ast.parse("from grpo_lab.device import MemoryCap\nfrom grpo_lab import errors\n"
                         "if TYPE_CHECKING:\n    from grpo_lab.train import TrainResult\n"
                         "def f():\n    from grpo_lab import train\n")
    assert sorted(_load_time_imports(capacity)) == ["grpo_lab.device", "grpo_lab.errors"]


BUILTIN_RAISES = {"ValueError", "RuntimeError", "FileNotFoundError"}
DEVICE_KINDS = {"cpu", "cuda", "npu"}


def _scanned_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_errors_derive_from_grpo_lab_error():
    bare = [f"{path.relative_to(REPO_ROOT)}:{node.lineno} raises {node.exc.func.id}"
            for path, tree in _scanned_modules() for node in ast.walk(tree)
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name) and node.exc.func.id in BUILTIN_RAISES]
    assert not bare, ("raise a GrpoLabError subclass (grpo_lab.errors: ConfigError, DataError, MissingFileError, "
                      "or the module's own) so `except GrpoLabError` catches it:\n" + "\n".join(bare))


def _names_a_device_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in DEVICE_KINDS
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_a_device_kind(e) for e in node.elts)


def _checks_a_device_kind(node: ast.AST) -> bool:
    """``kind == "cuda"``, ``kind in ("npu", "cuda")``, ``kind.startswith("npu")``, ``case "cpu":``."""
    if isinstance(node, ast.Compare):
        return any(_names_a_device_kind(e) for e in [node.left, *node.comparators])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("startswith", "endswith") and any(_names_a_device_kind(a) for a in node.args)
    return isinstance(node, ast.MatchValue) and _names_a_device_kind(node.value)


def _is_a_device_table(node: ast.AST) -> bool:
    """A dict keyed by device kinds: ``{"npu": ..., "cuda": ...}`` (every key one) or ``dict(cpu=..., cuda=...)``."""
    if isinstance(node, ast.Dict):
        return bool(node.keys) and all(key is not None and _names_a_device_kind(key) for key in node.keys)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict"
            and bool(node.keywords) and all(k.arg in DEVICE_KINDS for k in node.keywords))


def _outside_the_device_module(found):
    return [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for path, tree in _scanned_modules()
            if path.relative_to(PACKAGE).parts[0] != "device" for node in ast.walk(tree) if found(node)]


def test_device_kinds_are_compared_only_in_the_device_module():
    found = _outside_the_device_module(_checks_a_device_kind)
    assert not found, ("ask grpo_lab.device (is_cpu, the per-device tables) instead of comparing device-kind "
                       "strings:\n" + "\n".join(found))


def test_tables_keyed_by_device_kind_live_in_the_device_module():
    """What differs per device is data in grpo_lab.device (``DIST_BACKEND = {"npu": "hccl", ...}``), not a table
    beside each caller."""
    found = _outside_the_device_module(_is_a_device_table)
    assert not found, "move these per-device tables into grpo_lab/device/:\n" + "\n".join(found)


def test_the_device_checks_catch_what_they_exist_for():
    kind_checks = ['kind == "cuda"', 'x in ("npu", "cuda")', 'kind.startswith("npu")',
                   'match kind:\n    case "cpu": pass']
    tables = ['{"npu": 1, "cuda": 2}', '{"cpu": "fp32"}.get(kind, "bf16")', "dict(npu=1, cuda=2)"]
    for code in kind_checks:
        assert any(_checks_a_device_kind(node) for node in ast.walk(ast.parse(code))), code
    for code in tables:
        assert any(_is_a_device_table(node) for node in ast.walk(ast.parse(code))), code
    others = ['{"tiny": "cpu", "gpu": "cuda", "npu": "npu"}', 'kind == other', "dict(model=1)", "{}"]
    assert not any(_checks_a_device_kind(node) or _is_a_device_table(node)  # profile names are not device kinds
                   for code in others for node in ast.walk(ast.parse(code)))


MAX_MODULE_LINES = 600
LONGER_ON_PURPOSE = {
    "rewards.py": "the verl export copies it verbatim as one file (grpo_lab_rewards.py) into a folder where grpo_lab "
                  "may be absent: its rewards, scorers and registry cannot be split across modules",
}


def test_every_module_is_short_enough_to_read_in_one_sitting():
    long = [f"{path.relative_to(REPO_ROOT)}: {lines} lines" for path in sorted(PACKAGE.rglob("*.py"))
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
            and path.relative_to(PACKAGE).as_posix() not in LONGER_ON_PURPOSE]
    assert not long, (f"split these by concept (at most {MAX_MODULE_LINES} lines a module):\n" + "\n".join(long))
    assert all((PACKAGE / name).is_file() for name in LONGER_ON_PURPOSE)


DEVICE_CALL_BYTES = 64 * 2**20
"""What one call of the lent GPU machine carries, the repository that travels with it included."""
LARGEST_PART_BYTES = 33 * 2**20
"""The GPU bundles' and the model's largest part (benchmarks/course_gpu/README.md: the bundle in 32 MiB parts since
2026-12-05, when the repository had grown to the room left beside 38 MiB ones; benchmarks/verl/build.sh; SmolLM2's
33 MiB parts)."""


def test_the_repository_leaves_room_for_a_bundle_part_in_a_device_call():
    """Every committed file travels with every GPU call, beside one part of a bundle: a repository grown past what is
    left makes the staging calls fail (it did on 2026-12-01 with 47 MiB parts). Cut smaller parts, or commit less."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    paths = [REPO_ROOT / name.decode() for name in listed.split(b"\0") if name]
    size = sum(path.stat().st_size for path in paths if path.is_file())
    room = DEVICE_CALL_BYTES - LARGEST_PART_BYTES - 2**20  # 1 MiB for the carried SHA256 and scripts
    assert size <= room, (f"the committed files take {size / 2**20:.1f} MiB; beside a {LARGEST_PART_BYTES >> 20} MiB "
                          f"part a device call has room for {room / 2**20:.1f} MiB")
