"""Experiment tracking through TRL's ``report_to`` (``TrainConfig.report_to``): the trackers the course supports, how
to look at each, and the one thing grpo_lab changes in how transformers starts trackio.

Both keep their data on the machine that trains, with no account and no network: trackio one SQLite file per project
under ``$TRACKIO_DIR`` (default ``$HF_HOME/trackio``), TensorBoard event files under ``<run>/checkpoints/runs/``;
transformers' own callbacks do the logging.
"""

from __future__ import annotations

from typing import Any

from grpo_lab.upstream import UpstreamName

TRACKIO_PROJECT = "grpo-lab"
"""The trackio project every run reports to (TRL's ``project``); each run is named after its folder (``run_name``)."""
TRACKERS = {"trackio": f"trackio show --project {TRACKIO_PROJECT}",
            "tensorboard": "tensorboard --logdir {run_dir}"}
"""The trackers ``report_to`` may name, each with the command that opens its dashboard on the machine that trained
(``{run_dir}``: the run folder)."""


TRANSFORMERS_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("attribute", "transformers.integrations.TrackioCallback", "_trackio",
                 "the trackio module the callback logs through, wrapped by without_dashboard"),
)


class _TrackioWithoutDashboard:
    """The ``trackio`` module as transformers' ``TrackioCallback`` uses it, with ``init(..., embed=False)``."""

    def __init__(self, trackio: Any):
        self._trackio = trackio

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trackio, name)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        return self._trackio.init(*args, **{**kwargs, "embed": False})


def without_dashboard(trainer: Any) -> None:
    """Keep trackio from starting its dashboard inside a notebook. There ``trackio.init`` launches a local web server
    (127.0.0.1:7860) in the kernel and embeds it in the cell's output, a write token in its address; the course
    prints the command that opens the dashboard instead (:data:`TRACKERS`). Logging is unchanged."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TrackioCallback" and not isinstance(callback._trackio, _TrackioWithoutDashboard):
            callback._trackio = _TrackioWithoutDashboard(callback._trackio)
