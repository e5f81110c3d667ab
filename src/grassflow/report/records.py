"""The records a table reads back from a results tree (run.json, eval.json, metrics.jsonl), read as
data and checked. A file that a full disk, an interrupted copy or an editor damaged is refused with
one line naming it and what to do, before any table is written; it is never tabled."""

from __future__ import annotations

import json
from pathlib import Path

from grassflow.errors import DataError

REDO = (
    "remove it and run snakemake again: the job that wrote it runs again (for run.json, "
    "config.json or metrics.jsonl, the training)"
)


def read_record(path) -> dict:
    """A JSON object from `path` (run.json, eval.json), or a DataError naming the file."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not JSON ({e}): damaged? {REDO}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a JSON object: damaged? {REDO}")
    return obj


def require(obj: dict, path, keys) -> dict:
    """`obj` (a record read from `path`), or a DataError naming the file and the keys (dotted:
    within a section) it lacks: a record that parses but is not the record a job needs."""

    def has(key):
        node = obj
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = [k for k in keys if not has(k)]
    if missing:
        raise DataError(
            f"{path}: lacks {', '.join(missing)} (damaged, or another program's record): {REDO}"
        )
    return obj


def read_metrics(path, keys=("epoch",)) -> list[dict]:
    """Each epoch's row of a metrics.jsonl (one JSON object per line, holding `keys`), or a
    DataError naming the file and the line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not a JSON line ({e}): damaged? {REDO}") from None
        if not isinstance(row, dict) or any(k not in row for k in keys):
            raise DataError(
                f"{path}:{n}: not an epoch's record (needs {list(keys)}): damaged? {REDO}"
            )
        rows.append(row)
    return rows


def fields(run_dir, read):
    """read() on a run's records, a missing or mistyped field refused naming the run's records."""
    try:
        return read()
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(
            f"{run_dir}: its run.json or eval.json lacks {e} (damaged, or another program's "
            f"record): remove the damaged one and run snakemake again: the job that wrote it runs "
            f"again (for run.json, the training)"
        ) from None
