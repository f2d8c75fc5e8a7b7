"""Shared test setup: offline, caches in owned folders, accelerator-only tests skipped on CPU."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


class SharedRolloutServer:
    """One TRL vLLM server on the CPU for the server-mode run (tests/test_scale.py) and the asynchronous run
    (tests/test_async_grpo.py): each run pushes its weights before it first generates, so what the server held before
    never matters, and one engine start is saved (about 50 s on 2 cores). Each run reads the server's log and counts
    from where it began (:meth:`mark`, :meth:`log_since`); :meth:`stop` ends the server early, for the test that
    checks that nothing is left running (the session's end stops it otherwise)."""

    def __init__(self, folder):
        from grpo_lab import scale
        from grpo_lab.experiment import TrainConfig

        self.config = scale.ServerModeConfig(device="cpu", cpu_kvcache_gib=0.5, startup_timeout_s=480,
                                             train_timeout_s=400, extra_server_args=("--enforce-eager",))
        self._train_config = scale.server_train_config(TrainConfig(profile="tiny", output_dir=str(folder / "server")))
        self._start()

    def _start(self) -> None:
        from grpo_lab import scale

        self._context = scale.launch_rollout_server(self.config, self._train_config, wait=False)
        self.server = self._context.__enter__()  # the first run's trainer loads while it starts
        self.processes: list = []

    def mark(self) -> tuple[int, dict[str, float]]:
        """Where a run begins: the log's length and the server's counts (none yet while it starts: the first run's
        trainer then waits for it). A server stopped by an earlier test (the modules ran in another order) is started
        again."""
        if self.processes:
            self._start()
        if not self.server.ready:
            return 0, {}
        return self.server.log_path.stat().st_size, self.server.stats()

    def counts_since(self, before: dict[str, float]) -> dict[str, float]:
        return {key: value - before.get(key, 0.0) for key, value in self.server.stats().items()}

    def log_since(self, offset: int) -> str:
        return self.server.log_path.read_text()[offset:]

    def server_tree(self) -> list:
        """The server's processes now (its process group's leader and everything under it)."""
        import psutil

        root = psutil.Process(self.server.pgid)
        return root.children(recursive=True) + [root]

    def stop(self) -> list:
        """Stop the server (once); return the processes it had, to check that they are gone."""
        if not self.processes and self.server.process.poll() is None:
            self.processes = self.server_tree()
            self._context.__exit__(None, None, None)
        return self.processes


@pytest.fixture(scope="session")
def shared_rollout_server(tmp_path_factory):
    shared = SharedRolloutServer(tmp_path_factory.mktemp("shared-rollout-server"))
    yield shared
    shared.stop()
