"""Atomic file writes: a reader (or a rerun after a crash) never sees a half-written file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

from grassflow.errors import DiskSpaceError, no_space


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; on success fsync it and rename it into place. A full
    file system is a DiskSpaceError naming `path`: the temporary file is removed and `path`, if it
    was there, is untouched (the last complete checkpoint, table or token file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as err:
        if not no_space(err):
            raise
        free = shutil.disk_usage(path.parent).free
        raise DiskSpaceError(
            f"{path}: no space left on its file system ({free / 2**20:.1f} MiB free); "
            f"{'the complete one there is untouched; ' if path.exists() else ''}free space, "
            "then run the same command again"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# Fault injection for the tests: GRASSFLOW_KILL_WRITING=<file name> makes this process SIGKILL
# itself while writing that file, half of its bytes down — the worst moment for a reader.
KILL_WRITING = "GRASSFLOW_KILL_WRITING"


def _write_bytes(target: Path, data: bytes, name: str) -> None:
    with open(target, "wb") as f:
        if os.environ.get(KILL_WRITING) == name:
            f.write(data[: len(data) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        f.write(data)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        _write_bytes(tmp, text.encode(), Path(path).name)


def write_json(path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path, chunk=1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def spec_hash(spec: dict) -> str:
    """A spec's content hash (16 hex digits): equal specs, equal hashes, whatever their key
    order."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
