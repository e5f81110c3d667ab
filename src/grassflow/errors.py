"""Errors the CLI reports as one `error:` line, in a module that imports nothing but errno: the
command line catches them without loading (and so without depending on) the stages that raise
them."""

import errno


def no_space(err: BaseException) -> bool:
    """Whether `err` is a write that found its file system full (or its quota spent), as Python,
    pyarrow and safetensors say it."""
    return getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
        s in str(err) for s in ("No space left on device", "os error 28", "Disk quota exceeded")
    )


class PreflightError(RuntimeError):
    pass


class ConfigError(ValueError):
    """A bad configuration value; the message names the key and what is allowed."""


class DataError(RuntimeError):
    """Bad or unavailable data; the message names the file or source and the fix."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted; the message names the file."""


class DiskSpaceError(RuntimeError):
    """Too little free disk for the checkpoints a run will write."""


class CommandError(ValueError):
    """A command line the command cannot honour (an argument no parameter takes)."""


class ModelFileError(ValueError):
    """A model directory (an export, a run's) whose files do not make the model they describe; the
    message names the file and the key or tensor."""


class MissingExtra(ImportError):
    """An optional extra that a command needs is not installed; the message names the install."""
