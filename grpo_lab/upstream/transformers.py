"""What grpo_lab relies on in transformers beyond its documented API (:data:`TRANSFORMERS_INTERNALS`), and trackio
without its dashboard (:func:`trackio_without_dashboard`)."""

from __future__ import annotations

from typing import Any

from transformers.integrations import TrackioCallback

from grpo_lab import env
from grpo_lab.upstream import UpstreamName

__all__ = ["TRANSFORMERS_INTERNALS", "quiet_progress", "trackio_without_dashboard"]

CHECKED = "transformers 5.17.0"
_STAGED = "transformers' Trainer writes a checkpoint under a temporary name and renames it into place once complete"
TRANSFORMERS_INTERNALS: tuple[UpstreamName, ...] = (
    UpstreamName("method", "transformers.Trainer", "_save_checkpoint", "staged under .partial/, then renamed", CHECKED,
                 _STAGED),
    UpstreamName("method", "transformers.Trainer", "_get_output_dir", "the staging folder", CHECKED, _STAGED),
    UpstreamName("module", "transformers.trainer_utils", "rotate_checkpoints", "save_total_limit after a rename",
                 CHECKED, _STAGED),
    UpstreamName("attribute", "transformers.integrations.TrackioCallback", "_trackio", "its init gets embed=False",
                 CHECKED, "TrackioCallback passes an embed setting to trackio.init"),
)


class _TrackioWithoutEmbed:
    """The ``trackio`` module as ``TrackioCallback`` uses it, with ``init(..., embed=False)``."""

    def __init__(self, trackio: Any):
        self._trackio = trackio

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trackio, name)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        return self._trackio.init(*args, **{**kwargs, "embed": False})


class TrackioWithoutDashboard(TrackioCallback):
    """transformers' ``TrackioCallback``, whose ``trackio.init`` starts no dashboard; logging is unchanged."""

    def __init__(self):
        super().__init__()
        self._trackio = _TrackioWithoutEmbed(self._trackio)


def trackio_without_dashboard(trainer: Any) -> None:
    """Swap the trainer's ``TrackioCallback`` for :class:`TrackioWithoutDashboard`: in a notebook ``trackio.init``
    would start a web server in the kernel and embed it in the output, a write token in its address."""
    callbacks = trainer.callback_handler.callbacks
    for index, callback in enumerate(callbacks):
        if type(callback) is TrackioCallback:
            callbacks[index] = TrackioWithoutDashboard()


def quiet_progress(trainer) -> None:
    """In a terminal: keep the step progress bar but drop its per-step dict printout (metrics.jsonl and the plot have
    them). In a notebook: no progress bar and no 'Training Loss' table at all; the live plot shows the run."""
    from transformers.trainer_callback import ProgressCallback

    class QuietProgressCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs and "train_runtime" in logs:
                self.training_bar.write(f"trained {state.global_step} steps in {logs['train_runtime']:.0f} s")

    # transformers' notebook table (its module needs IPython, so it is found by name, never imported here)
    table = next((c for c in trainer.callback_handler.callbacks if type(c).__name__ == "NotebookProgressCallback"),
                 None)
    removed = [trainer.pop_callback(table) if table else None, trainer.pop_callback(ProgressCallback)]
    if any(callback is not None for callback in removed) and env.show_progress():
        trainer.add_callback(QuietProgressCallback)
