"""`make lab` starts JupyterLab on 127.0.0.1 with the package importable; its HTTP API lists the notebooks."""

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_the_notebooks(tmp_path):
    port, token = free_port(), secrets.token_hex(8)
    log = open(tmp_path / "lab.log", "w")
    # -o install: the test session already runs inside the installed venv.
    proc = subprocess.Popen(
        ["make", "-s", "-o", "install", "lab", f"LAB_PORT={port}",
         f"LAB_ARGS=--IdentityProvider.token={token}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
             "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
        deadline, listing = time.time() + 120, None
        while time.time() < deadline and listing is None:
            assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
            except OSError:
                time.sleep(1)
        assert listing is not None, "JupyterLab did not answer within 120 s"
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "notebooks").glob("*.ipynb")} <= names
        assert "00_environment.ipynb" in names
        # Bound to loopback only.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5) as r:
            assert r.status == 200
        # The server's Python imports grpo_lab (kernels start from it).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs?token={token}", timeout=5) as r:
            assert "python3" in json.load(r)["kernelspecs"]
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """Stop make and the server it started (they share a process group)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
