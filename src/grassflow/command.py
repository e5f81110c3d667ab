"""What the two command lines share (grassflow.cli: `grassflow <command>`; grassflow.stage: a
task's job): JSON arguments, calling a function by its parameters' names, one `error:` line for
an expected failure, and the record of what a command imported (for the staleness tests).
Every job imports this module: it holds nothing a job's result could depend on but the call."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from pathlib import Path

from grassflow.errors import (
    CheckpointError,
    CommandError,
    ConfigError,
    DataError,
    DiskSpaceError,
    ModelFileError,
    PreflightError,
)

JSON = "a JSON file, or JSON"
PARSER_KEYS = {"cmd", "fn", "entry", "task"}  # what the parsers set besides the command's arguments
RECORD_IMPORTS = "GRASSFLOW_RECORD_IMPORTS"  # a directory: each command writes the grassflow files it loaded


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose refusal of a command line is one line, as every other failure's:
    `error: <prog>: <what>` (exit 2); `-h` gives the usage."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} -h)\n")


def json_arg(value: str):
    """A JSON argument: the path of a JSON file (what the rules pass: a job's spec file, so its
    command line can be pasted to rerun it), or the JSON itself (`{...}`, `[...]`, `null`)."""
    text = value.strip()
    if text[:1] in ("{", "[") or text == "null":
        source = "the argument"
    else:
        source, path = value, Path(value)
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{value}: no such JSON file (and not JSON)")
        text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{source} is not valid JSON: {e}") from None


def required(*names, **kw):
    """An argument group: each --<name> required, with add_argument's other keywords `kw`."""
    return lambda p: [p.add_argument(f"--{n}", required=True, **kw) for n in names]


def call(a):
    """A command that is one function (`a.entry`, "module:function"): called with the parsed
    arguments its parameters are named after (`--out-dir`: out_dir). An argument no parameter
    takes is refused, before any work: dropped, it would silently change what runs."""
    from grassflow.declaration import entry

    fn = entry(a.entry)
    params = inspect.signature(fn).parameters
    unused = sorted(set(vars(a)) - PARSER_KEYS - set(params))
    if unused:
        raise CommandError(f"grassflow {a.cmd}: {a.entry} has no parameter for "
                           + ", ".join(f"--{k.replace('_', '-')} ({k})" for k in unused))
    return fn(**{k: getattr(a, k) for k in params if hasattr(a, k)})


def record(argv: list[str]) -> None:
    """With GRASSFLOW_RECORD_IMPORTS set (the staleness tests), write at exit what this command imported."""
    if RECORD_IMPORTS in os.environ:
        import atexit

        atexit.register(_record_imports, os.environ[RECORD_IMPORTS], argv)


# the failures a command expects (bad input, missing files): one `error:` line each, never a traceback
EXPECTED = (CommandError, DataError, ConfigError, CheckpointError, DiskSpaceError, FileNotFoundError, PreflightError,
            ModelFileError)


def run(args) -> int:
    """Run the parsed command `args.fn(args)`: an expected failure is one `error:` line, exit 1."""
    return run_expected(args.fn, args)


def run_expected(fn, *args) -> int:
    """fn(*args), an expected failure (EXPECTED) printed as one `error:` line: exit 1; else 0."""
    try:
        fn(*args)
    except EXPECTED as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _record_imports(directory: str, argv: list[str]) -> None:
    """For the staleness tests: what this command actually imported, beside its argv."""
    files = sorted({m.__file__ for n, m in list(sys.modules.items())
                    if n.split(".")[0] == "grassflow" and getattr(m, "__file__", None)})
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{os.getpid()}.json").write_text(json.dumps({"argv": argv, "files": files}))
