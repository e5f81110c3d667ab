"""What every command line shares. A rule's shell runs one stage of one task as
`python -m grassflow.<task>.<stage> --...` (grassflow/lm/train.py, grassflow/snli/tokenize.py, ...):
each stage module's `main()` names its options with argparse and calls its function with ordinary
arguments, through `run`. Every job imports this module (grassflow.planning.staleness): it holds
nothing a job's result could depend on; the argument groups stages share live beside the code they
feed (grassflow.runs: a run's jobs; grassflow.data.stages: the tokenize stages).
"""

from __future__ import annotations

import argparse
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
    no_space,
)

JSON = "a JSON file, or JSON"
# a directory: each job writes the grassflow files it loaded
RECORD_IMPORTS = "GRASSFLOW_RECORD_IMPORTS"
# the failures a command expects (bad input, missing files): one `error:` line each, never a
# traceback
EXPECTED = (
    CommandError,
    DataError,
    ConfigError,
    CheckpointError,
    DiskSpaceError,
    FileNotFoundError,
    PreflightError,
    ModelFileError,
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose refusal of a command line is one line, as every other failure's:
    `error: <prog>: <what>` (exit 2); `-h` gives the usage."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} -h)\n")


def json_arg(value: str):
    """A JSON argument: the JSON itself (`{...}`, `[...]`, `null`: what the rules pass, a job's
    params, so that its command line can be pasted to rerun it), or the path of a JSON file."""
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


def parser(module: str, doc: str, prog: str | None = None) -> ArgumentParser:
    """The command line of the stage module `module` (its __name__), described by its docstring's
    first line; named `prog` where a user's verb runs it (`grassflow preflight`)."""
    return ArgumentParser(
        prog=prog or f"python -m {module}", description=doc.strip().split("\n")[0]
    )


class _Log:
    """A job's stdout or stderr (its log, as the rule's shell redirects them) whose writes may find
    the log's file system full: they are dropped (`lost`), and the job goes on to fail where its own
    files fail, naming them, not on its progress line."""

    def __init__(self, stream):
        self.stream, self.lost = stream, False

    def write(self, text):
        try:
            return self.stream.write(text)
        except OSError as e:
            if not no_space(e):
                raise
            self.lost = True
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except OSError as e:
            if not no_space(e):
                raise
            self.lost = True

    def __getattr__(self, name):
        return getattr(self.stream, name)


# The descriptor a rule's shell hands its job for the one error line: a copy of the shell's own
# stderr, made before the job's stderr goes to its log (the Snakefile's shell.prefix: `exec 3>&2`)
ERROR_FD = "GRASSFLOW_ERROR_FD"


def say_error(line: str) -> None:
    """A job's one error line: to stderr (its log), and to the descriptor the rule's shell handed it
    (ERROR_FD) where that is another file: Snakemake's output, where the user looks, beside its
    `Error in rule` — a terminal, a pipe, or the file it was redirected to, the line written at that
    file's own offset, in one write, whole. The line reaches it also where the log cannot take it
    (the log's file system full too, as a scratch quota's is)."""
    err = sys.stderr if isinstance(sys.stderr, _Log) else _Log(sys.stderr)
    err.write(line + "\n")
    err.flush()
    try:
        fd = int(os.environ.get(ERROR_FD, ""))
        theirs, mine = os.fstat(fd), os.fstat(2)
        if (theirs.st_dev, theirs.st_ino) != (mine.st_dev, mine.st_ino):
            os.write(fd, (line + "\n").encode())
    except (
        ValueError,
        OSError,
    ):  # not handed one (a job run by hand), or it cannot take the line: the log alone
        pass


def run(fn, *args, **kwargs) -> int:
    """fn(*args, **kwargs): its exit status where it returns one (a command line's main), else 0; an
    expected failure (EXPECTED) printed as one `error:` line (say_error): 1."""
    if RECORD_IMPORTS in os.environ:  # the staleness tests: what this job loaded, written at exit
        import atexit

        atexit.register(_record_imports, os.environ[RECORD_IMPORTS])
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, _Log) else _Log(s) for s in streams)
    try:
        rc = fn(*args, **kwargs)
    except EXPECTED as e:
        say_error(f"error: {e}")
        return 1
    finally:
        sys.stdout, sys.stderr = streams
    return rc if isinstance(rc, int) else 0


def _record_imports(directory: str) -> None:
    """For the staleness tests: the module this process ran (`python -m <module>`), its argv and the
    grassflow files it loaded."""
    files = sorted(
        {
            m.__file__
            for n, m in list(sys.modules.items())
            if n.split(".")[0] == "grassflow" and getattr(m, "__file__", None)
        }
    )
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec else None
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{os.getpid()}.json").write_text(
        json.dumps({"module": module, "argv": sys.argv, "files": files})
    )
