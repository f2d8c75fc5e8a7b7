"""Child processes that die with their owner. Every long-lived child runs through :func:`start_process_group` in a
session of its own, led by a watchdog (``python -m grpo_lab.servers --owner PID -- CMD``) that ends the whole group
when the owner stops it (also at exit and on SIGTERM), when the owner is gone, when the command exits, and (Linux's
parent-death signal) when the watchdog is killed. Children vLLM starts itself get :func:`guard_processes`.

>>> from grpo_lab.servers import free_port, port_is_free
>>> port_is_free(free_port())
True
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from grpo_lab.errors import ConfigError, GrpoLabError

LOG_TAIL_LINES = 30
HEALTH_POLL_S = 1.0
WATCH_POLL_S = 0.5
"""How often the watchdog checks that its owner is alive: the longest a group outlives a killed owner, plus
:data:`GRACE_S`."""
GRACE_S = 5.0
"""Seconds a group gets to stop after SIGTERM when its owner is gone or is being terminated, before SIGKILL."""
PR_SET_PDEATHSIG = 1  # Linux prctl(2): the signal a process gets when its parent dies


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``host:port`` (a port in TIME_WAIT counts as free, as to vLLM's server)."""
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


def _processes() -> list[tuple[int, str, int, int]]:
    """``(pid, state, parent pid, process group)`` of every process, read from Linux's ``/proc``."""
    found = []
    for entry in os.scandir("/proc"):
        with contextlib.suppress(OSError):  # a process that ended while we looked
            if entry.name.isdigit():
                stat = Path(entry.path, "stat").read_text()
                state, ppid, group = stat[stat.rindex(")") + 2:].split()[:3]
                found.append((int(entry.name), state, int(ppid), int(group)))
    return found


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes of the process group ``pgid``."""
    return [pid for pid, state, _, group in _processes() if group == pgid and state not in "ZX"]


def _with_descendants(pids: Sequence[int]) -> list[int]:
    """``pids`` that are alive (not zombies), and their live descendants."""
    children: dict[int, list[int]] = {}
    alive = set()
    for pid, state, ppid, _ in _processes():
        if state not in "ZX":
            children.setdefault(ppid, []).append(pid)
            alive.add(pid)
    found, stack = [], [pid for pid in pids if pid in alive]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def end_with_descendants(pids: Sequence[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM ``pids`` and their descendants, SIGKILL what is left after ``grace_s``, wait up to ``grace_s`` more."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _with_descendants(pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _with_descendants(pids):
            time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when it has no process left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
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


_LIVE: dict[int, subprocess.Popen] = {}
"""Groups this process started and has not stopped yet, by process group id: what ``atexit`` and SIGTERM stop."""


def stop_process_group(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM the group led by ``process``, SIGKILL what is left after ``timeout_s``, reap the leader (safe twice)."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        if not _signal_group(process.pid, sig) or _group_gone(process, wait):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    _LIVE.pop(process.pid, None)


def _forget_ended() -> None:
    """Drop the groups that ended by themselves from :data:`_LIVE`."""
    for pgid, process in list(_LIVE.items()):
        if process.poll() is not None and not group_alive(pgid):
            del _LIVE[pgid]


def stop_all(timeout_s: float = GRACE_S) -> None:
    """Stop every group this process started and has not stopped (``atexit`` and the SIGTERM handler call this)."""
    _forget_ended()
    for process in list(_LIVE.values()):
        stop_process_group(process, timeout_s)


def _stop_children_then_terminate(signum: int, frame: object) -> None:
    """The owner's SIGTERM handler: stop the children gracefully, then end by SIGTERM as without a handler."""
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_handler() -> None:
    """Stop the children on SIGTERM, from the main thread and where SIGTERM has no handler yet."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _stop_children_then_terminate)


atexit.register(stop_all)


def start_process_group(command: Sequence[str], env: Mapping[str, str], stdout: IO | int | None = None,
                        stderr: IO | int | None = None, text: bool = False) -> subprocess.Popen:
    """Start ``command`` in a session of its own under the watchdog, which ends the whole group when this process is
    gone; returns the watchdog (pid: the group's id; exit code: the command's, or minus its signal, or 127)."""
    _install_sigterm_handler()
    _forget_ended()
    watched = [sys.executable, "-m", "grpo_lab.servers", "--owner", str(os.getpid()), "--", *map(str, command)]
    process = subprocess.Popen(watched, stdout=stdout, stderr=stderr, env=dict(env), text=text, start_new_session=True)
    _LIVE[process.pid] = process
    return process


def run_process_group(command: Sequence[str], env: Mapping[str, str], timeout_s: float
                      ) -> subprocess.CompletedProcess:
    """``subprocess.run(capture_output=True, text=True)`` as a watched group: a failure here stops all of it."""
    process = start_process_group(command, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        stop_process_group(process, GRACE_S)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def log_tail(path: str | Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (what an error message shows)."""
    if path is None or not Path(path).is_file():
        return "(no log written)"
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")
NOT_AN_ERROR = re.compile(r"\b(DEBUG|INFO|WARNING)\b")  # e.g. an optional import that failed, logged and passed


def first_error(path: str | Path | None) -> str | None:
    """The first ``SomeError: message`` line of a log not at DEBUG/INFO/WARNING (a vLLM crash's cause), or None."""
    if path is None or not Path(path).is_file():
        return None
    for line in Path(path).read_text(errors="replace").splitlines():
        found = None if NOT_AN_ERROR.search(line) else ERROR_LINE.search(line)
        if found:
            return f"{found.group(1)}: {found.group(2).strip()}"
    return None


PROMETHEUS_SAMPLE = re.compile(r"^([\w:]+)(?:\{[^}]*\})?\s+([-+\deE.naif]+)$")


def metric_totals(base_url: str, names: Sequence[str], timeout_s: float = 5.0) -> dict[str, float]:
    """Totals of ``names`` in a server's Prometheus ``/metrics`` (summed over labels); OSError if it is down."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = PROMETHEUS_SAMPLE.match(line)
        if match and match.group(1) in names:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(2))
    return totals


def log_file_level(asked: str | None) -> str:
    """vLLM's log level for a server logging to a file: DEBUG when asked for, else INFO (quiet notebooks included)."""
    level = (asked or "INFO").upper()
    return level if level in ("DEBUG", "INFO") else "INFO"


def ranked_prompt_tokens(prompt_logprobs: Sequence[Mapping[str, Mapping[str, float]] | None]
                         ) -> list[dict[int, tuple[float, int]]]:
    """vLLM's ``prompt_logprobs`` (``/v1/completions`` with ``prompt_logprobs=k``) as ``{token id: (log-prob,
    rank)}`` per prompt position: the token there and the ``k`` most likely (the first position: empty)."""
    return [{int(token): (float(entry["logprob"]), int(entry["rank"])) for token, entry in (position or {}).items()}
            for position in prompt_logprobs]


def wait_until_healthy(process: subprocess.Popen, base_url: str, timeout_s: float) -> int | None:
    """Poll ``base_url/health``: None once it answers 200, the exit code if the process ended; else TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process.returncode
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            if response.status == 200:
                return None
        time.sleep(HEALTH_POLL_S)
    raise TimeoutError(f"{base_url}/health did not answer within {timeout_s:.0f} s")


def guard_processes(pids: Sequence[int]) -> subprocess.Popen:
    """A watchdog for children vLLM started (an in-process engine's core and workers): it ends them and their
    children when this process is gone, and exits once they have ended (reap it with :func:`stop_process_group`)."""
    return subprocess.Popen([sys.executable, "-m", "grpo_lab.servers", "--owner", str(os.getpid()), "--pids",
                             ",".join(map(str, pids))], start_new_session=True)


class ServerProcess:
    """One HTTP server as a child process group: started, waited for, watched and stopped the same way everywhere
    (``name``: what messages call it; ``error``: the error type raised when it does not start)."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], log_path: str | Path, base_url: str,
                 name: str = "the server", error: type[GrpoLabError] = GrpoLabError):
        self.command, self.env, self.log_path = [str(part) for part in command], dict(env), Path(log_path)
        self.base_url, self.name, self.error = base_url, name, error
        self.process: subprocess.Popen | None = None
        self.start_seconds, self._started = float("nan"), 0.0

    @property
    def pgid(self) -> int:
        if self.process is None:
            raise self.error(f"{self.name} was never started")
        return self.process.pid

    def start(self, startup_timeout_s: float, wait: bool = True) -> ServerProcess:
        """Start it as a watched group and wait for ``/health`` (``wait=False``: call :meth:`wait_ready` later)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._started = time.perf_counter()
        with self.log_path.open("w") as log:
            self.process = start_process_group(self.command, self.env, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(startup_timeout_s)
        return self

    @property
    def ready(self) -> bool:
        """True once ``/health`` answered (``start_seconds`` is then how long that took)."""
        return not math.isnan(self.start_seconds)

    def wait_ready(self, startup_timeout_s: float) -> ServerProcess:
        """Wait for ``/health`` until ``startup_timeout_s`` from the start; else stop it, raise with its log."""
        if self.process is None:
            raise self.error(f"{self.name} was never started")
        if self.ready:
            return self
        try:
            remaining = max(1.0, startup_timeout_s - (time.perf_counter() - self._started))
            exit_code = wait_until_healthy(self.process, self.base_url, remaining)
            if exit_code is not None:
                cause = first_error(self.log_path)
                raise self.error(f"{self.name} exited with code {exit_code} while starting"
                                 + (f", first error in its log: {cause}" if cause else "")
                                 + f". Its log is {self.log_path}; last lines:\n{self.log_tail()}")
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
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the whole process group (SIGTERM, SIGKILL after ``timeout_s``); safe twice."""
        if self.process is not None:
            stop_process_group(self.process, timeout_s)


def _end_others(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, then SIGKILL the members other than this process that are left after ``grace_s``."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and set(group_members(pgid)) - {os.getpid()}:
        time.sleep(0.1)
    for pid in set(group_members(pgid)) - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ignore(signum: int, frame: object) -> None:
    """The watchdog waits for its command (a handler, not SIG_IGN, which the command would inherit)."""


def _terminate_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGTERM the command when the watchdog ``parent`` dies (killing the leader ends the server)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def watch(owner: int, command: Sequence[str], poll_s: float = WATCH_POLL_S, grace_s: float = GRACE_S) -> int:
    """Run ``command`` as a child of this process (the group's leader) until it exits; end the whole group when
    ``owner`` is no longer this process's parent. Returns the command's exit code (negative: its signal)."""
    pgid = os.getpgrp()
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    try:
        child = subprocess.Popen(list(command), preexec_fn=_terminate_with(os.getpid()))
    except OSError as error:
        print(f"grpo_lab.servers: cannot start {command[0]!r}: {error}", file=sys.stderr, flush=True)
        return 127
    while True:
        if os.getppid() != owner:  # the owner is gone, however it ended
            _end_others(pgid, grace_s)
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=poll_s)
            break
    _end_others(pgid, grace_s)  # what the command left behind (vLLM's engine core, workers)
    return child.returncode


def guard(owner: int, pids: Sequence[int], poll_s: float = WATCH_POLL_S, grace_s: float = GRACE_S) -> int:
    """Wait while any of ``pids`` lives; once ``owner`` is no longer the parent, :func:`end_with_descendants` them."""
    while _with_descendants(pids):
        if os.getppid() != owner:
            end_with_descendants(pids, grace_s)
            return 0
        time.sleep(poll_s)
    return 0


USAGE = ("usage: python -m grpo_lab.servers --owner PID -- COMMAND [ARGS...]   (start_process_group)\n"
         "       python -m grpo_lab.servers --owner PID --pids PID,PID...       (guard_processes)")


def main(argv: list[str] | None = None) -> int:
    """The watchdog's entry: :func:`watch` a command (exiting as it did) or :func:`guard` running processes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["--owner"] or len(argv) < 4 or argv[2] not in ("--", "--pids"):
        print(USAGE, file=sys.stderr)
        return 2
    if argv[2] == "--pids":
        return guard(int(argv[1]), [int(pid) for pid in argv[3].split(",") if pid])
    code = watch(int(argv[1]), argv[3:])
    if code < 0:  # die of the same signal, so the owner sees what killed the command
        with contextlib.suppress(OSError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code

if __name__ == "__main__":
    raise SystemExit(main())
