"""Tolerance checks that remember how close they came: `within(err, tol, what)` asserts err ≤ tol
and records err / tol under the running test (set by conftest's seed fixture), so that `pytest
--seeds N` can print each randomized test's worst margin over N seeds."""

from __future__ import annotations

import math
import re
from collections import defaultdict

# test (no seed id) -> [(err/tol, seed)]
RECORDED: dict[str, list[tuple[float, int]]] = defaultdict(list)
_running = ["?", 0]


def begin(nodeid: str, seed: int) -> None:
    _running[:] = [re.sub(r"seed\d+-?|-?seed\d+", "", nodeid).replace("[]", ""), seed]


def within(err: float, tol: float, what: str = "") -> None:
    ratio = err / tol if tol else math.inf
    RECORDED[_running[0]].append((ratio, _running[1]))
    assert err <= tol, f"{what}: error {err:.4g} > tolerance {tol:.3g}"


def summary() -> str:
    """Per test function: its worst margin over every case and seed, and where it was."""
    worst: dict[str, tuple[float, int, str, int]] = {}
    for test, rows in RECORDED.items():
        fn = test.split("[")[0]
        ratio, seed = max(rows)
        n = worst.get(fn, (0, 0, "", 0))[3] + len(rows)
        if fn not in worst or ratio > worst[fn][0]:
            worst[fn] = (ratio, seed, test[len(fn) :], n)
        else:
            worst[fn] = (*worst[fn][:3], n)
    lines = [
        "",
        (
            "worst margin (error / tolerance; < 1 passes) per randomized test, over its cases and "
            "seeds:"
        ),
        f"{'margin':>8}  {'checks':>6}  {'worst seed':>10}  test [worst case]",
    ]
    for fn, (ratio, seed, case, n) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{ratio:8.3f}  {n:6d}  {seed:>10}  {fn}{case}")
    return "\n".join(lines)


def running() -> str:
    """The running test's node id without its seed id: what GRASSFLOW_TEST_SEED replays."""
    return _running[0]


def rel_err(x, y) -> float:
    """max |x − y| / max |y|: an error on the scale of the reference's largest element."""
    return ((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-300)).item()


def close(x, y, tol: float, what: str = "") -> None:
    within(rel_err(x, y), tol, what)
