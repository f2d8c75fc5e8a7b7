"""Shared test setup: offline, caches in owned folders, accelerator-only tests skipped on CPU."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        _group_for_workers(items)
    from grpo_lab import device

    if device.detect() != "cpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU or NPU (run through the device tool)")
    for item in items:
        if "accelerator" in item.keywords:
            item.add_marker(skip)


NOTEBOOKS_GROUP = "notebooks"


def _group_for_workers(items) -> None:
    """With pytest-xdist (`make test` runs ``-n 2 --dist loadgroup``): a test module's tests stay on one worker (its
    module-scoped server or engine starts once), and the course notebooks run on one worker in their order (04, 05
    and 09 read the run 03 trained), followed by tests/test_notebook_outputs.py, which reads their executed copies."""
    for item in items:
        path = item.path
        in_notebooks = path.suffix == ".ipynb" or path.name == "test_notebook_outputs.py"
        item.add_marker(pytest.mark.xdist_group(NOTEBOOKS_GROUP if in_notebooks else path.stem))


@pytest.fixture(autouse=True, scope="module")
def restore_environment():
    """Undo what a test module leaves in os.environ (TRL's colocate mode sets RANK, MASTER_PORT and
    VLLM_ENABLE_V1_MULTIPROCESSING=0 for the whole process), so later tests and the notebook kernels that
    nbmake starts from this process see a clean environment."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
