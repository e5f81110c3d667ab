"""What every command line shares. A rule's shell runs one stage of one task as
`python -m grassflow.<task>.<stage> --...` (grassflow/lm/train.py, grassflow/snli/tokenize.py, ...):
each stage module's `main()` names its options with argparse and calls its function with
ordinary arguments, through `run`. Every job imports this module (grassflow.pipeline.staleness): it holds
nothing a job's result could depend on; the argument groups stages share live beside the code
they feed (grassflow.runs: a run's jobs; grassflow.data.stages: the tokenize stages).
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
)

JSON = "a JSON file, or JSON"
RECORD_IMPORTS = "GRASSFLOW_RECORD_IMPORTS"  # a directory: each job writes the grassflow files it loaded
# the failures a command expects (bad input, missing files): one `error:` line each, never a traceback
EXPECTED = (CommandError, DataError, ConfigError, CheckpointError, DiskSpaceError, FileNotFoundError, PreflightError, ModelFileError)


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


def parser(module: str, doc: str, prog: str | None = None) -> ArgumentParser:
    """The command line of the stage module `module` (its __name__), described by its docstring's
    first line; named `prog` where a user's verb runs it (`grassflow preflight`)."""
    return ArgumentParser(prog=prog or f"python -m {module}", description=doc.strip().split("\n")[0])


def run(fn, *args, **kwargs) -> int:
    """fn(*args, **kwargs): its exit status where it returns one (a command line's main), else 0; an
    expected failure (EXPECTED) printed as one `error:` line: 1."""
    if RECORD_IMPORTS in os.environ:  # the staleness tests: what this job loaded, written at exit
        import atexit

        atexit.register(_record_imports, os.environ[RECORD_IMPORTS])
    try:
        rc = fn(*args, **kwargs)
    except EXPECTED as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return rc if isinstance(rc, int) else 0


def _record_imports(directory: str) -> None:
    """For the staleness tests: the module this process ran (`python -m <module>`), its argv and
    the grassflow files it loaded."""
    files = sorted({m.__file__ for n, m in list(sys.modules.items())
                    if n.split(".")[0] == "grassflow" and getattr(m, "__file__", None)})
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name.removesuffix(".__main__") if spec else None
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{os.getpid()}.json").write_text(json.dumps({"module": module, "argv": sys.argv,
                                                                     "files": files}))
