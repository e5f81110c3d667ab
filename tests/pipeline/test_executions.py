"""The audit of CI's full Snakemake executions (tests/helpers/executions.py): each counted once, for
the test that made it, against the declared list."""

from __future__ import annotations

import ast
import shutil
import time
from pathlib import Path

import pytest

from helpers import executions

TESTS = Path(__file__).resolve().parents[1]


def _log(test_dir: Path, name: str, job: str = "localrule download:", command: str = "snakemake --cores 2") -> Path:
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
    touched (--touch), is no execution; too many,
    too few and undeclared are each named."""
    demo = tree / "demo"
    _log(demo, "2026-01-01T000000.000001")
    time.sleep(0.05)
    copier = tree / "popen-gw1/test_sigkilled_pipeline_rerun0"
    shutil.copytree(demo / "work", copier / "work")  # the demo's log, now in the copy too
    _log(copier, "2026-01-01T000100.000001")
    _log(copier, "2026-01-01T000200.000001")
    _log(tree / "popen-gw0/test_other0", "2026-01-01T000300.000001")
    _log(tree / "popen-gw0/test_dry0", "x").unlink()  # a dry run leaves no log
    _log(tree / "popen-gw0/test_unlock0", "2026-01-01T000400.000001", job="Unlocked working directory.")
    _log(tree / "popen-gw0/test_touch0", "2026-01-01T000500.000001", command="snakemake --cores 2 --touch")
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
