"""Waiting on a child process by events (a file, a checkpoint), never by fixed sleeps; deadlines
that only catch hangs."""

from __future__ import annotations

import signal
import time

HANG = 900  # seconds: a deadline that only catches a hang, never a slow machine


def _wait_for(path, proc, timeout=HANG):
    deadline = time.time() + timeout
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is not None or path.exists(), f"no {path.name} after {timeout} s: hung"


def _version(path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _wait_for_checkpoints(path, proc, k: int, timeout=HANG) -> None:
    """Until `path` has been replaced k times (each checkpoint is a new file renamed into place), or
    the process ended."""
    deadline, seen, last = time.time() + timeout, 0, None
    while seen < k and proc.poll() is None and time.time() < deadline:
        v = _version(path)
        if v is not None and v != last:
            seen, last = seen + 1, v
        time.sleep(0.005)
    assert proc.poll() is not None or seen >= k, (
        f"{seen} of {k} checkpoints after {timeout} s: hung"
    )


def stop_then_signal(proc, sig, still=None) -> None:
    """Deliver `sig` to a frozen process: SIGSTOP, the signal, SIGCONT. Whatever it was doing when
    frozen, it handles the signal from there, so a fast run cannot finish first. `still()`: the
    state the signal is meant for, checked while it is frozen (it cannot change then): a test whose
    process got past it fails, naming that, instead of testing something else."""
    proc.send_signal(signal.SIGSTOP)
    if still is not None and not still():
        proc.send_signal(signal.SIGCONT)
        raise AssertionError(
            "the process got past the state this signal is for before it could be delivered"
        )
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)


IN_CI = __import__("os").environ.get("CI") == "true"


def needs(present: bool, reason: str):
    """A skipif marker for a feature's prerequisite (../shared's data, which CI has): skipped on a
    developer's machine without it, run in CI (CI=true), where the missing file then fails it."""
    import pytest

    return pytest.mark.skipif(not present and not IN_CI, reason=reason)


def import_or_skip(name: str, module_level: bool = False):
    """pytest.importorskip for an optional extra that CI installs: a skip elsewhere, a failure in
    CI."""
    import importlib

    import pytest

    try:
        return importlib.import_module(name)
    except ImportError as e:
        if IN_CI:
            pytest.fail(f"in CI this cannot be skipped: no {name} ({e})", pytrace=False)
        pytest.skip(f"no {name} ({e})", allow_module_level=module_level)


def skip_or_fail_in_ci(reason: str) -> None:
    """For a skip that would mean the thing under test is broken (the gpu extra's wheels do not
    install, SLURM does not start): a skip on a developer's machine, a failure in CI (CI=true),
    where it must never hide. Skips that mean "not applicable here" (no GPU, no ../shared) stay
    plain pytest skips."""
    import os

    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"in CI this cannot be skipped: {reason}")
    pytest.skip(reason)
