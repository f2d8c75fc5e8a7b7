"""Server processes: start one in its own process group, wait for ``/health``, read its log, always stop it.

vLLM's OpenAI server (:mod:`grpo_lab.deploy`) and TRL's rollout server (:mod:`grpo_lab.scale`) are both started
through :class:`ServerProcess`, and the trainer that ``accelerate launch`` starts is stopped with
:func:`stop_process_group`. A server runs in a session of its own, so stopping it ends its whole process group
(API server, engine core, workers), also after an error or a notebook interrupt.

>>> from grpo_lab.servers import free_port, port_is_free
>>> port_is_free(free_port())
True
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo_lab.errors import ConfigError, GrpoLabError

LOG_TAIL_LINES = 30
HEALTH_POLL_S = 1.0


# --------------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port``. ``SO_REUSEADDR`` lets a port whose last connection is still in
    TIME_WAIT count as free, as it is for a server that sets the same option (vLLM's does)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def require_free_port(port: int | None, host: str = "127.0.0.1", name: str = "port") -> None:
    """Raise :class:`ConfigError` when ``port`` is taken (None means "a free one" and always passes)."""
    if port is not None and not port_is_free(port, host):
        raise ConfigError(f"{name}={port} on {host} is already in use (another server, or one left running?): stop "
                          f"it, pick another port, or leave {name}=None to take a free one.")


# --------------------------------------------------------------------------------------------------
# Process groups
# --------------------------------------------------------------------------------------------------
def group_alive(pgid: int) -> bool:
    """True while any process of the process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_gone(process: subprocess.Popen, timeout_s: float) -> bool:
    """Reap the leader and wait until no process of its group is left; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process.poll()
        if not group_alive(process.pid):
            return True
        time.sleep(0.2)
    return False


def stop_process_group(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the group led by ``process``, SIGKILL what is left after ``timeout_s``; reap the leader."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        if _group_gone(process, wait):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def log_tail(path: str | Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (what an error message shows)."""
    if path is None or not Path(path).is_file():
        return "(no log written)"
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def wait_until_healthy(process: subprocess.Popen, base_url: str, timeout_s: float) -> int | None:
    """Poll ``base_url/health`` until it answers 200: None when ready, the exit code if the process ended first;
    :class:`TimeoutError` when neither happens within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process.returncode
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(HEALTH_POLL_S)
    raise TimeoutError(f"{base_url}/health did not answer within {timeout_s:.0f} s")


# --------------------------------------------------------------------------------------------------
# A server
# --------------------------------------------------------------------------------------------------
class ServerProcess:
    """One HTTP server as a child process group: started, waited for, watched and stopped the same way everywhere.

    ``name`` is how messages call it ("the vLLM server", "the rollout server"); ``error`` is the error type raised
    when it does not start (each caller's own, e.g. ``DeployError``).
    """

    def __init__(self, command: Sequence[str], env: Mapping[str, str], log_path: str | Path, base_url: str,
                 name: str = "the server", error: type[GrpoLabError] = GrpoLabError):
        self.command = [str(part) for part in command]
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.base_url = base_url
        self.name = name
        self.error = error
        self.process: subprocess.Popen | None = None
        self.start_seconds = float("nan")
        self._started = 0.0

    @property
    def pgid(self) -> int:
        """The process group of the server (its leader's pid)."""
        if self.process is None:
            raise self.error(f"{self.name} was never started")
        return self.process.pid

    def start(self, startup_timeout_s: float, wait: bool = True) -> ServerProcess:
        """Start it in its own session and (unless ``wait=False``: then call :meth:`wait_ready` later) wait for
        ``/health``; on any failure stop it and raise with the log's tail."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._started = time.perf_counter()
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        if wait:
            self.wait_ready(startup_timeout_s)
        return self

    @property
    def ready(self) -> bool:
        """True once ``/health`` answered (``start_seconds`` is then how long that took)."""
        return not math.isnan(self.start_seconds)

    def wait_ready(self, startup_timeout_s: float) -> ServerProcess:
        """Wait until ``/health`` answers, at most ``startup_timeout_s`` after the start; on any failure stop the
        server and raise with the log's tail."""
        if self.process is None:
            raise self.error(f"{self.name} was never started")
        if self.ready:
            return self
        try:
            remaining = max(1.0, startup_timeout_s - (time.perf_counter() - self._started))
            exit_code = wait_until_healthy(self.process, self.base_url, remaining)
            if exit_code is not None:
                raise self.error(f"{self.name} exited with code {exit_code} while starting. Its log is "
                                 f"{self.log_path}; last lines:\n{self.log_tail()}")
        except TimeoutError:
            self.stop()
            raise self.error(f"{self.name} did not answer {self.base_url}/health within {startup_timeout_s:.0f} s "
                             f"(startup_timeout_s). Read its log, {self.log_path}, then raise startup_timeout_s if it "
                             f"was still loading. Last lines:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - self._started
        return self

    def alive(self) -> bool:
        """True while the server's leader process runs."""
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the whole process group (SIGTERM, then SIGKILL after ``timeout_s``). Safe to call twice."""
        if self.process is not None:
            stop_process_group(self.process, timeout_s)
