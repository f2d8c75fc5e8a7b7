"""Shared test setup: offline, caches in owned folders, accelerator-only tests skipped on CPU."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """The notebooks that nbmake runs from this process wait for kernel messages in short polls (course.py says why)."""
    from grpo_lab.course import poll_in_slices

    poll_in_slices()


def pytest_collection_modifyitems(config, items):
    from grpo_lab import device

    if device.detect() != "cpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU or NPU (run through the device tool)")
    for item in items:
        if "accelerator" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def restore_environment():
    """Undo what a test module leaves in os.environ (TRL's colocate mode sets RANK, MASTER_PORT and
    VLLM_ENABLE_V1_MULTIPROCESSING=0 for the whole process), so later tests and the notebook kernels that
    nbmake starts from this process see a clean environment."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
