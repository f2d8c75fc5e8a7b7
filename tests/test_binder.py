"""binder/ follows repo2docker's conventions and installs the verified cpu stack."""

import os
from pathlib import Path

from grpo_lab import env

BINDER = Path(__file__).resolve().parent.parent / "binder"


def test_binder_uses_the_cpu_stack():
    cpu = env.load_stack("cpu")
    requirements = (BINDER / "requirements.txt").read_text()
    assert f"torch=={cpu.pins['torch']}" in requirements
    post_build = (BINDER / "postBuild").read_text()
    assert "-c grpo_lab/stacks/cpu.txt" in post_build and ".[cpu,notebooks]" in post_build
    assert "pip uninstall -y torchvision" in post_build


def test_binder_scripts_are_executable_and_select_tiny():
    for name in ("postBuild", "start"):
        assert os.access(BINDER / name, os.X_OK), f"binder/{name} must be executable"
    assert "GRPO_LAB_PROFILE=tiny" in (BINDER / "start").read_text()
    assert (BINDER / "runtime.txt").read_text().strip().startswith("python-3.")
