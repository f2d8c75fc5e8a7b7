"""Experiment tracking through TRL's ``report_to`` (``TrainConfig.report_to``): the trackers the course supports, how
to look at each, and the one thing grpo_lab changes in how transformers starts trackio.

Both keep their data on the machine that trains, with no account and no network: trackio one SQLite file per project
under ``$TRACKIO_DIR`` (default ``$HF_HOME/trackio``), TensorBoard event files under ``<run>/checkpoints/runs/``;
transformers' own callbacks do the logging; in a notebook the trainer keeps trackio from starting its dashboard
(:func:`grpo_lab.upstream.transformers.trackio_without_dashboard`).
"""

from __future__ import annotations

__all__ = ["TRACKERS"]


TRACKIO_PROJECT = "grpo-lab"
"""The trackio project every run reports to (TRL's ``project``); each run is named after its folder (``run_name``)."""
TRACKERS = {"trackio": f"trackio show --project {TRACKIO_PROJECT}",
            "tensorboard": "tensorboard --logdir {run_dir}"}
"""The trackers ``report_to`` may name, each with the command that opens its dashboard on the machine that trained
(``{run_dir}``: the run folder)."""

