"""TrainConfig.report_to: trackio and TensorBoard get every logged step, offline and without an account.

One tiny run (two steps, HF generate on the CPU) reports to both in a fresh process that refuses every network
connection and name lookup, with HF_HUB_OFFLINE unset (so nothing relies on it); then each tracker's local store is
read back (trackio's SQLite file, TensorBoard's event files through its own EventAccumulator) and compared with the
run's metrics.jsonl.
"""

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from grpo_lab import experiment, runs, tracking
from grpo_lab.device import Machine
from grpo_lab.errors import ConfigError
from grpo_lab.experiment import TrainConfig
from grpo_lab.tracking import TRACKERS, TRACKIO_PROJECT

NO_NETWORK = '''
import socket, sys

attempts = []

def refuse(what):
    def call(*args, **kwargs):
        attempts.append(f"{what}{args[:2]!r}")
        raise OSError(f"network refused in this test: {what}")
    return call

local = (socket.AF_UNIX,)
original_connect = socket.socket.connect
def connect(self, address):
    if self.family in local:
        return original_connect(self, address)
    return refuse("connect")(address)
socket.socket.connect = connect
socket.socket.connect_ex = connect
socket.getaddrinfo = refuse("getaddrinfo")
socket.create_connection = refuse("create_connection")

from grpo_lab import train
code = train.main(sys.argv[1:])
print("NETWORK ATTEMPTS:", attempts)
raise SystemExit(code)
'''


def test_report_to_takes_trl_s_values_and_refuses_trackers_that_need_an_account():
    assert TrainConfig(report_to="none").report_to == () and TrainConfig(report_to=None).report_to == ()
    assert TrainConfig(report_to="trackio").report_to == ("trackio",)
    assert TrainConfig(report_to=["trackio", "tensorboard"]).report_to == ("trackio", "tensorboard")
    with pytest.raises(ConfigError, match="wandb"):
        TrainConfig(report_to="wandb")
    cpu = Machine("cpu", bf16=False, memory_gib=24)
    quiet = experiment.plan(TrainConfig(profile="tiny", output_dir="runs/quiet"), cpu).trl_kwargs(use_vllm=False)
    assert quiet["report_to"] == "none" and quiet["run_name"] == "quiet" and quiet["project"] == TRACKIO_PROJECT
    assert experiment.plan(TrainConfig(profile="tiny", output_dir="x", report_to="tensorboard"), cpu).trl_kwargs(False)[
        "report_to"] == ["tensorboard"]


def test_both_trackers_store_the_run_locally_without_the_network(tmp_path):
    pytest.importorskip("trackio")
    pytest.importorskip("tensorboard")
    run_dir, store = tmp_path / "grpo-tiny-tracked", tmp_path / "trackio"
    launcher = tmp_path / "no_network.py"
    launcher.write_text(textwrap.dedent(NO_NETWORK), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(TRACKIO_DIR=str(store), HOME=str(tmp_path), MPLCONFIGDIR=str(tmp_path / "matplotlib"))
    done = subprocess.run(
        [sys.executable, str(launcher), "--profile", "tiny", "--max-steps", "2", "--per-device-train-batch-size", "8",
         "--num-generations", "4", "--max-completion-length", "24", "--output-dir", str(run_dir),
         "--report-to", "trackio,tensorboard"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "NETWORK ATTEMPTS: []" in done.stdout, done.stdout[-2000:]
    ours = {record["step"]: record for record in runs.read_metrics(run_dir / runs.METRICS_FILE)}
    assert sorted(ours) == [1, 2]

    # trackio: one SQLite file per project; each logged step a row of JSON metrics under the run's folder name
    with sqlite3.connect(store / f"{TRACKIO_PROJECT}.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = ?", (run_dir.name,)).fetchall()
    tracked = {metrics["train/global_step"]: metrics for metrics in (json.loads(text) for _, text in rows)
               if "train/loss" in metrics}
    assert sorted(tracked) == [1, 2]
    for step, record in ours.items():
        assert tracked[step]["train/loss"] == pytest.approx(record["loss"], rel=1e-6)
        assert tracked[step]["train/reward"] == pytest.approx(record["reward"], rel=1e-6)

    # TensorBoard: transformers writes event files under the trainer's output_dir (<run>/checkpoints/runs/...)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert len(events) == 1, events
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    for tag, key in (("train/loss", "loss"), ("train/reward", "reward")):
        scalars = {event.step: event.value for event in accumulator.Scalars(tag)}
        assert sorted(scalars) == [1, 2]
        for step, record in ours.items():  # stored as float32
            assert scalars[step] == pytest.approx(record[key], rel=1e-6, abs=1e-7)
    assert TRACKERS["tensorboard"].format(run_dir=run_dir) == f"tensorboard --logdir {run_dir}"


def test_trackio_starts_no_dashboard_inside_a_notebook(monkeypatch, tmp_path):
    """transformers' TrackioCallback calls trackio.init with trackio's default embed=True, which in a notebook starts a
    web server in the kernel and puts its address, a write token in it, into the cell's output; grpo_lab's trainer
    passes embed=False (the rest of the call is transformers')."""
    trackio = pytest.importorskip("trackio")
    from types import SimpleNamespace

    from transformers import TrainerState, TrainingArguments
    from transformers.integrations import TrackioCallback

    from grpo_lab.upstream.transformers import trackio_without_dashboard

    class Reached(Exception):
        pass

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        raise Reached

    monkeypatch.setattr(trackio, "init", init)
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[TrackioCallback()]))
    trackio_without_dashboard(trainer)
    callback = trainer.callback_handler.callbacks[0]
    trackio_without_dashboard(trainer)  # once is enough: a second call changes nothing
    assert trainer.callback_handler.callbacks == [callback] and isinstance(callback, TrackioCallback)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, run_name="r", project="p")
    with pytest.raises(Reached):
        callback.setup(args, TrainerState(), model=None)
    assert calls == [{**calls[0], "embed": False}] and calls[0]["project"] == "p" and calls[0]["name"] == "r"
