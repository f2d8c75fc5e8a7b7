"""Notebook 04's calculator in a real browser: JupyterLab on 127.0.0.1, headless Chromium driven by Playwright.

Runs every cell, drags the micro-batch slider, and checks that the recommendation and the plot change;
saves a screenshot under ``runs/browser/``. Uses the system browser (Debian's ``chromium``), never a
downloaded one. Skipped when chromium or the ``playwright`` package is missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "04_memory_budget.ipynb"
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT_DIR = REPO / "runs" / "browser"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]

LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
                "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"}}

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """`make lab`'s server on a free port with a token, serving a copy of notebook 04 (the original stays clean)."""
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)
    # Render every cell (JupyterLab 4 otherwise renders only those near the viewport) and skip the news prompt.
    for plugin, values in LAB_SETTINGS.items():
        path = tmp_path / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.open_browser=False",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={tmp_path}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
               f"--LabApp.user_settings_dir={tmp_path / 'settings'}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _accept_dialogs(page) -> None:
    accept = page.locator(".jp-Dialog .jp-mod-accept")
    if accept.count() and accept.first.is_visible():
        accept.first.click()  # "Select Kernel": keep the notebook's own (python3)


def _wait_for_idle_kernel(page, timeout_s: float) -> None:
    """Wait until the notebook's kernel is connected and idle (the status bar says so)."""
    deadline = time.monotonic() + timeout_s
    status = page.locator("#jp-main-statusbar")
    while not re.search(r"Python 3 \(ipykernel\) \| Idle", status.inner_text()):
        _accept_dialogs(page)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no idle kernel after {timeout_s:.0f} s: {status.inner_text()!r}")
        page.wait_for_timeout(500)


def _accept_kernel_dialog_until(page, selector: str, timeout_s: float) -> None:
    """Wait until ``selector`` is in the page (JupyterLab renders only cells near the viewport, so "attached"),
    accepting the "Select Kernel" dialog a fresh JupyterLab may show first."""
    deadline = time.monotonic() + timeout_s
    while page.locator(selector).count() == 0:
        _accept_dialogs(page)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{selector} did not appear within {timeout_s:.0f} s")
        page.wait_for_timeout(500)


def _summary_and_plot(page) -> tuple[str, str]:
    summary = page.locator(".grpo-memory-summary").first.inner_text()
    plot = page.locator(".grpo-memory-plot img").first.get_attribute("src") or ""
    return summary, plot


def test_calculator_redraws_in_chromium(lab):
    if not CHROMIUM.is_file():
        pytest.skip("no system browser: install Debian's `chromium` (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the `playwright` package is not installed (pip install playwright)")
    base, token = lab
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    (SCREENSHOT_DIR / "04_memory_budget_failure.png").unlink(missing_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for()
            _wait_for_idle_kernel(page, timeout_s=120)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            _accept_kernel_dialog_until(page, ".grpo-memory-plot img", timeout_s=240)
            page.wait_for_function(
                "() => (document.querySelector('.grpo-memory-summary') || {innerText: ''}).innerText.includes('recommended')")
            page.wait_for_function(  # every queued cell has run
                "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(p => p.innerText.includes('*'))",
                timeout=180_000)
            page.locator(".grpo-memory-summary").first.scroll_into_view_if_needed()
            page.locator(".grpo-batch .noUi-handle").first.wait_for()
            before_summary, before_plot = _summary_and_plot(page)
            assert "per_device_train_batch_size=8" in before_summary

            handle = page.locator(".grpo-batch .noUi-handle").first
            track = page.locator(".grpo-batch .noUi-target").first
            handle_box, track_box = handle.bounding_box(), track.bounding_box()
            page.mouse.move(handle_box["x"] + handle_box["width"] / 2, handle_box["y"] + handle_box["height"] / 2)
            page.mouse.down()
            page.mouse.move(track_box["x"] + 0.75 * track_box["width"], track_box["y"] + track_box["height"] / 2,
                            steps=12)
            page.mouse.up()

            page.wait_for_function(
                """([before]) => {
                    const s = document.querySelector('.grpo-memory-summary');
                    return s && s.innerText !== before && !s.innerText.includes('per_device_train_batch_size=8,');
                }""", arg=[before_summary], timeout=60_000)
            page.wait_for_function(
                """([before]) => {
                    const img = document.querySelector('.grpo-memory-plot img');
                    return img && img.getAttribute('src') !== before;
                }""", arg=[before_plot], timeout=60_000)
            after_summary, after_plot = _summary_and_plot(page)
            readout = page.locator(".grpo-batch .widget-readout").first.inner_text().strip()
            page.locator(".grpo-memory-plot").first.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOT_DIR / "04_memory_budget_calculator.png"), full_page=False)
        except Exception:
            page.screenshot(path=str(SCREENSHOT_DIR / "04_memory_budget_failure.png"), full_page=False)
            raise
        finally:
            browser.close()
    assert int(readout) > 8
    assert f"per_device_train_batch_size={readout}" in after_summary
    assert after_plot != before_plot and after_plot.startswith("data:image/png")
