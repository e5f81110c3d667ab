"""The full Snakemake executions a CI run makes (runs that execute jobs; a dry run makes none), each
declared here with what it is for: a test that runs the DAG again where the one demo, or a state
derived from it, would do costs minutes of CI.

Snakemake writes one log file per invocation but a dry run
(`.snakemake/log/<start time>.snakemake.log`); an execution is one whose log records a job started.
At the end of a CI run (`make test TIERS="not gpu"`, every test but the GPU's), `tests/conftest.py`
counts them under the session's temporary directory, each by the test directory that made it (a copy
of the demo carries the demo's logs: a log is its first writer's, the copy of the earliest change
time), and fails the run where a test made more or fewer than declared (`audit`).
tests/pipeline/test_executions.py tests the audit itself."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

# test (its temporary directory's name, which pytest cuts at 30 characters) -> (executions, why)
EXECUTIONS: dict[str, tuple[int, str]] = {
    "demo": (
        1,
        "the demo every DAG assertion reads (tests/conftest.py::demo), on a stand-in pool of 2 "
        "GPUs",
    ),
    "test_demo_through_slurm_profil": (
        1,
        "every rule as a SLURM job on its partition, Table 1's two runs in one allocation, "
        "preempted and then retried after its time limit (a fresh tree: the data jobs too)",
    ),
    "test_full_v1_splits_through_th": (
        1,
        "all of Wikitext-2 v1 through the DAG: the only real text in CI",
    ),
    "test_a_fourth_task_runs_throug": (
        1,
        "a toy fourth task from its own directory (another task: not the demo)",
    ),
    "test_sigkilled_pipeline_reruns": (
        2,
        "killed mid-training, then rerun to the demo's tables (from a copy of the demo)",
    ),
    "test_crafted_checkpoints_in_a_": (
        2,
        "crafted pickles fail their jobs, then the real files complete them (a copy of the demo)",
    ),
    "test_damaged_files_the_jobs_re": (
        5,
        "each batch of damaged files fails the jobs that read it (a copy of the demo)",
    ),
    "test_the_demo_runs_from_a_user": (
        2,
        "a part of the demo run from a user's directory, once with --directory and once as a "
        "catalog module: each its own results there, equal to the demo's rows",
    ),
    "test_a_lease_in_two_commands_t": (
        6,
        "the GPU window at a lease's proportions: its preparation, a preflight refused, the first "
        "command stopped at its deadline, the second resuming to Table 1 from fused seed groups (a "
        "row and record each); a third window elsewhere adopting the second's seed-0 records "
        "beside seed 1 trained (its preflight and its tables: two; the one DAG run of "
        "finished_runs)",
    ),
    "test_a_run_rerun_because_its_c": (
        1,
        "a run's training rerun after an edit of its model's code trains anew (one job, a copy of "
        "the demo)",
    ),
    "test_a_full_disk_fails_each_jo": (
        7,
        "a full disk under each kind of job that writes, each freed and rerun (data, training, "
        "evaluation, tables) to the demo's table: Table 1's Grassmann seed 0 only",
    ),
    "test_a_hub_fetch_holds_its_own": (
        1,
        "a hub tokenizer fetched and the demo tokenized with it (its data jobs only, in a scratch "
        "repository)",
    ),
    "test_a_failing_stage_says_its_": (
        2,
        "a failing adoption's error line in Snakemake's output, once redirected to a file and once "
        "through a pipe (one job each, a copy of the demo)",
    ),
    "test_under_slurm_the_line_land": (
        1,
        "a failing table job on SLURM: where its error line lands (a copy of the demo, its "
        "retries)",
    ),
    "test_a_tracker_store_damaged_m": (
        1,
        "a run whose tracker's store fails mid-run trains on and its table is written (one run of "
        "its own)",
    ),
}


def owner(log: Path, root: Path) -> str:
    """The test directory a log lies in under the session's temporary directory `root` (a worker's
    popen-gw<N>/ skipped), without pytest's numbering."""
    parts = [p for p in log.relative_to(root).parts if not p.startswith("popen-gw")]
    return re.sub(r"\d+$", "", parts[0])


JOB = re.compile(r"^(?:local)?rule \w+:$", re.M)  # a job started (Snakemake's log of it)
# its jobs' outputs touched, none run
TOUCH = re.compile(r"^  Command: .*\s(?:--touch|-t)(?:\s|$)", re.M)


def made(root: Path) -> Counter:
    """{test: executions} of the logs under `root` that record a job (not --unlock, --touch,
    --report
    or a run refused before any job), each log counted once, for its first writer."""
    first: dict[str, tuple[float, Path]] = {}
    for log in root.rglob(".snakemake/log/*.snakemake.log"):
        text = log.read_text(errors="replace")
        if not JOB.search(text) or TOUCH.search(text):
            continue
        at = log.stat().st_ctime
        if log.name not in first or at < first[log.name][0]:
            first[log.name] = (at, log)
    return Counter(owner(log, root) for _, log in first.values())


def audit(root: Path) -> list[str]:
    """The lines saying where the executions under `root` differ from EXECUTIONS (none: they
    agree)."""
    got, declared = made(root), {test: n for test, (n, _) in EXECUTIONS.items()}
    return [
        f"{test}: {got[test]} full Snakemake executions, declared {declared.get(test, 0)}"
        + (
            ""
            if test in declared
            else " (undeclared: add it to tests/helpers/executions.py with what it is for)"
        )
        for test in sorted(declared | got)
        if got[test] != declared.get(test, 0)
    ]
