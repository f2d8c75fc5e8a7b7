"""The package's errors: every error grpo_lab raises on purpose derives from :class:`GrpoLabError`, and the specific
classes also from the built-in a caller would expect (``ValueError``, ``RuntimeError``, ``FileNotFoundError``). Each
message says what was wrong and what to do."""

from __future__ import annotations

__all__ = [
    "ConfigError", "DataError", "DeployError", "DeviceError", "ExistingFileError", "GrpoLabError", "MissingFileError",
    "ServerDied", "TrainingDivergedError",
]


class GrpoLabError(Exception):
    """Base of every error grpo_lab raises on purpose."""


class ConfigError(GrpoLabError, ValueError):
    """A setting that is unknown, out of range or inconsistent; raised before anything starts."""


class DataError(GrpoLabError, ValueError):
    """Input data that cannot be used as given: a prompt, a JSONL row, rewards or lengths that do not line up."""


class MissingFileError(GrpoLabError, FileNotFoundError):
    """A file or folder the call needs is not there: a data split, a model folder, a config.json."""


class ExistingFileError(GrpoLabError, FileExistsError):
    """A folder the call would write already holds something it must not replace; nothing was written."""


NAN_ADVICE = ("What to do: train in bf16 rather than fp16 (fp16 overflows), check every reward function for "
              "inf/NaN (wrap it with grpo_lab.rewards.validate_reward), and lower learning_rate. Nothing was written "
              "for this step; resume from the last good checkpoint with resume_from_checkpoint.")


class TrainingDivergedError(GrpoLabError, RuntimeError):
    """The loss or a reward became NaN/inf; training stopped before the bad update was applied (its message ends with
    :data:`NAN_ADVICE`)."""


class DeviceError(GrpoLabError, RuntimeError):
    """A device was asked for that is unknown or not present, or a memory cap it cannot stand for."""


class DeployError(GrpoLabError, RuntimeError):
    """An export, a folder or a server that is not usable; the message says what to do."""


class ServerDied(DeployError):
    """The server process is not running (it died or was stopped) while a client needed it."""
