"""Errors the CLI reports as one `error:` line, in a module that imports nothing: the command
line catches them without loading (and so without depending on) the stages that raise them."""


class PreflightError(RuntimeError):
    pass
