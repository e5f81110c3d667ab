"""The audit of CI's full Snakemake executions (tests/helpers/executions.py): each counted once, for
the test that made it, against the declared list; and how CI spreads the tests over its workers
(tests/helpers/workers.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import executions

TESTS = Path(__file__).resolve().parents[1]


def _log(
    test_dir: Path,
    name: str,
    job: str = "localrule download:",
    command: str = "snakemake --cores 2",
) -> Path:
    log = test_dir / "work/.snakemake/log" / f"{name}.snakemake.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"  Command: {command}\nBuilding DAG of jobs...\n{job}\n    jobid: 1\n")
    return log


@pytest.fixture
def tree(tmp_path):
    """A directory for crafted logs, removed afterwards: the audit at the end of CI's session reads
    every log under the session's temporary directory, and these are not executions."""
    yield tmp_path / "session"
    shutil.rmtree(tmp_path / "session", ignore_errors=True)


def test_each_execution_counts_once_for_the_test_that_made_it(tree, monkeypatch):
    """A copy of the demo carries its log: still the demo's, not the copier's; a worker's directory
    is skipped, pytest's numbering dropped; a log without a job (--unlock), or whose jobs were only
    touched (--touch), is no execution; too many, too few and undeclared are each named."""
    demo = tree / "demo"
    _log(demo, "2026-01-01T000000.000001")
    time.sleep(0.05)
    copier = tree / "popen-gw1/test_sigkilled_pipeline_rerun0"
    shutil.copytree(demo / "work", copier / "work")  # the demo's log, now in the copy too
    _log(copier, "2026-01-01T000100.000001")
    _log(copier, "2026-01-01T000200.000001")
    _log(tree / "popen-gw0/test_other0", "2026-01-01T000300.000001")
    _log(tree / "popen-gw0/test_dry0", "x").unlink()  # a dry run leaves no log
    _log(
        tree / "popen-gw0/test_unlock0",
        "2026-01-01T000400.000001",
        job="Unlocked working directory.",
    )
    _log(
        tree / "popen-gw0/test_touch0",
        "2026-01-01T000500.000001",
        command="snakemake --cores 2 --touch",
    )
    assert executions.made(tree) == {
        "demo": 1,
        "test_sigkilled_pipeline_rerun": 2,
        "test_other": 1,
    }

    monkeypatch.setattr(
        executions,
        "EXECUTIONS",
        {
            "demo": (1, "the demo"),
            "test_sigkilled_pipeline_rerun": (1, "k"),
            "test_gone": (1, "no longer made"),
        },
    )
    assert executions.audit(tree) == [
        "test_gone: 0 full Snakemake executions, declared 1",
        "test_other: 1 full Snakemake executions, declared 0 (undeclared: add it to "
        "tests/helpers/executions.py with what it is for)",
        "test_sigkilled_pipeline_rerun: 2 full Snakemake executions, declared 1",
    ]
    monkeypatch.setattr(
        executions,
        "EXECUTIONS",
        {"demo": (1, "d"), "test_sigkilled_pipeline_rerun": (2, "k"), "test_other": (1, "o")},
    )
    assert executions.audit(tree) == []


def test_every_declared_execution_names_a_test_and_says_what_it_is_for():
    """Each entry is a test of the suite (or the demo fixture) by its directory's name, with a count
    and a reason."""
    names = {
        node.name[:30]
        for f in TESTS.rglob("test_*.py")
        for node in ast.parse(f.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    for test, (n, why) in executions.EXECUTIONS.items():
        assert test == "demo" or test in names, test
        assert n >= 1 and len(why) > 20, test


def test_the_slurm_tests_get_a_worker_of_their_own_where_the_workers_outnumber_the_cores(tmp_path):
    """helpers.workers' scheduler in a real pytest-xdist run, 3 workers on 2 cores (CI's): the SLURM
    group's tests all on one worker, which runs nothing else; the demo group's all on one other."""
    groups = {
        "test_d.py::test_a": "demo",
        "test_d.py::test_b": "demo",
        "test_s.py::test_a": "slurm",
        "test_s.py::test_b": "slurm",
    }
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom helpers.workers import "
        "scheduler\n\n\ndef pytest_xdist_make_scheduler(config, log):\n    return "
        f"scheduler(config, log, {groups!r}, cores=2)\n"
    )
    for name in ("d", "s", "x", "y", "z"):  # each test writes down its worker
        (tmp_path / f"test_{name}.py").write_text(
            "".join(
                f"def test_{t}():\n    import os, pathlib\n    pathlib.Path({str(tmp_path)!r}, "
                "'ran', "
                f"'test_{name}.py::test_{t}').write_text(os.environ['PYTEST_XDIST_WORKER'])\n\n\n"
                for t in "ab"
            )
        )
    (tmp_path / "ran").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # not CI's own options
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider", "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = {p.name: p.read_text() for p in (tmp_path / "ran").iterdir()}
    assert len(ran) == 10, ran
    (slurm,) = {w for t, w in ran.items() if groups.get(t) == "slurm"}
    (demo,) = {w for t, w in ran.items() if groups.get(t) == "demo"}
    assert demo != slurm and {t for t, w in ran.items() if w == slurm} == {
        "test_s.py::test_a",
        "test_s.py::test_b",
    }, ran
