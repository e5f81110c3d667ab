"""CONTRIBUTING.md's "Where to change what", each row checked: its edit reaches exactly the jobs its
"Reruns" cell names, by the code fingerprints the rules carry (each rule's
`code_of(<stage module>, <kinds>)`: grassflow.planning.staleness). What then reruns downstream (a
table after its runs) is Snakemake's, and the staleness tests run such edits on the demo."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers import ROOT
from helpers.rule_code import rule_codes

KINDS = ("transformer", "grassmann")
TASKS = ("lm", "snli", "recall")
BENCH = "grassflow.bench[*]"
LM_TABLES = {
    "grassflow.lm.aggregate",
    "grassflow.lm.summary",
    "grassflow.lm.ablations",
    "grassflow.lm.sweep",
}
TABLES = LM_TABLES | {"grassflow.snli.aggregate", "grassflow.recall.aggregate"}
# the tables that judge a setup
LM_JUDGED = {
    "grassflow.lm.aggregate",
    "grassflow.lm.ablations",
    "grassflow.lm.sweep",
}


def runs(*kinds):
    return {
        f"grassflow.{t}.{stage}[{k}]"
        for t in TASKS
        for stage in ("train", "evaluate")
        for k in kinds
    }


# the table's rows: {To change: its Reruns cell}, and the edits that check the cell: (a file or
# directory, relative to the repository; the jobs its edit must reach)
RERUNS = {
    "one model (Grassmann, Transformer)": "that kind's training and evaluation in every task, "
    "and the benchmark",
    "what the two models share": "every run's training and evaluation, and the benchmark",
    "the Plücker op": "Grassmann's training and evaluation in every task, and the benchmark",
    "the training loop or step": "every run's training and evaluation, and the benchmark",
    "a task's stage: data, training, evaluation, table": (
        "that stage's jobs, then what reads their outputs; and a stage that imports it: SNLI's and "
        "recall's evaluation their training, the LM's evaluation and documents its tokenizing, the "
        "benchmark the LM's training; the LM's table modules (`lm/aggregate.py`, `comparable.py`, "
        "`figures.py`, `sweep.py`): its tables, no other task's"
    ),
    "the LM's rows and token files": (
        "the LM's download, training, evaluation and unigram baseline, and the benchmark; no table "
        "job imports it (a table reads its runs' records)"
    ),
    "the tables' and figures' shared code": "every task's tables, no run",
    "how records are read back": (
        "every run's training and evaluation (an evaluation reads them, in the module training "
        "shares), every table, the benchmark, the adoption of runs finished elsewhere"
    ),
    "a preset, a run grid": "the runs whose spec changed; an edit of the planning code itself: "
    "nothing",
    "a rule": "what its params or command change",
    "the cluster": "nothing",
    "a new model kind": (
        "every job that builds or reads a model, once (`models/__init__.py` is their code): every "
        "run, the LM's tables (their comparability reads the model's defaults), the benchmark"
    ),
    "a new task": "no other task's job",
}
ROWS = {
    "one model (Grassmann, Transformer)": [
        ("src/grassflow/models/grassmann.py", runs("grassmann") | {BENCH}),
        ("src/grassflow/models/transformer.py", runs("transformer") | {BENCH}),
    ],
    "what the two models share": [("src/grassflow/models/layers.py", runs(*KINDS) | {BENCH})],
    "the Plücker op": [
        ("src/grassflow/ops/plucker/", runs("grassmann") | {BENCH}),
        ("kernels/plucker.cu", runs("grassmann") | {BENCH}),
    ],
    "the training loop or step": [
        (f"src/grassflow/{f}", runs(*KINDS) | {BENCH})
        for f in ("loop.py", "train_step.py", "runs.py")
    ],
    "a task's stage: data, training, evaluation, table": [
        (
            "src/grassflow/lm/train.py",
            {"grassflow.lm.train[transformer]", "grassflow.lm.train[grassmann]", BENCH},
        ),
        (
            "src/grassflow/lm/evaluate.py",
            {"grassflow.lm.evaluate[transformer]", "grassflow.lm.evaluate[grassmann]"},
        ),
        (
            "src/grassflow/lm/tokenize.py",
            {
                "grassflow.lm.tokenize",
                "grassflow.lm.documents",
                BENCH,
                "grassflow.lm.evaluate[transformer]",
                "grassflow.lm.evaluate[grassmann]",
            },
        ),
        ("src/grassflow/lm/unigram.py", {"grassflow.lm.unigram"}),
        ("src/grassflow/lm/aggregate.py", LM_JUDGED),
        ("src/grassflow/lm/comparable.py", LM_JUDGED),
        ("src/grassflow/lm/figures.py", LM_TABLES),
        (
            "src/grassflow/snli/train.py",
            {f"grassflow.snli.{s}[{k}]" for s in ("train", "evaluate") for k in KINDS},
        ),
        (
            "src/grassflow/recall/train.py",
            {f"grassflow.recall.{s}[{k}]" for s in ("train", "evaluate") for k in KINDS},
        ),
        ("src/grassflow/snli/tokenize.py", {"grassflow.snli.tokenize"}),
        ("src/grassflow/snli/aggregate.py", {"grassflow.snli.aggregate"}),
        ("src/grassflow/recall/aggregate.py", {"grassflow.recall.aggregate"}),
    ],
    "the LM's rows and token files": [
        (
            "src/grassflow/lm/data.py",
            {f"grassflow.lm.{s}[{k}]" for s in ("train", "evaluate") for k in KINDS}
            | {"grassflow.lm.download", "grassflow.lm.unigram", BENCH},
        )
    ],
    "the tables' and figures' shared code": [
        ("src/grassflow/report/tables.py", TABLES - {"grassflow.lm.summary"}),
        *((f"src/grassflow/report/{f}", TABLES) for f in ("figures.py", "stats.py")),
    ],
    "how records are read back": [
        ("src/grassflow/report/records.py", runs(*KINDS) | TABLES | {BENCH, "grassflow.lm.adopt"})
    ],
    "a preset, a run grid": [
        (f"src/grassflow/{f}", set())
        for f in (
            "pipeline/presets.py",
            "planning/sections.py",
            "pipeline/tasks.py",
            "lm/grid.py",
            "snli/grid.py",
            "recall/grid.py",
        )
    ],
    # the rule's own params and command: Snakemake's to compare (tests/pipeline/test_replanning.py)
    "a rule": [],
    "the cluster": [("profiles/slurm/", set())],
    "a new model kind": [("src/grassflow/models/__init__.py", runs(*KINDS) | LM_JUDGED | {BENCH})],
    "a new task": [],  # test_a_new_tasks_package_reaches_no_other_tasks_job, below
}


def _jobs(src: Path) -> dict[str, set[str]]:
    """{job: the files of its code, relative to the repository} for every rule's code_of call, a job
    per model kind where the rule runs one kind, `[*]` where it runs them all."""
    from grassflow.planning import staleness

    out = {}
    for module, kinds in rule_codes().values():
        for name, ks in (
            [(f"{module}[*]", KINDS)]
            if kinds == "*"
            else [(f"{module}[{k}]", (k,)) for k in KINDS]
            if kinds == "run"
            else [(module, ())]
        ):
            out[name] = {
                p.resolve().relative_to(src.parent).as_posix()
                for p in staleness.job_files(module, ks)
            }
    return out


def _reached(jobs, edited: str) -> set[str]:
    return {
        job
        for job, files in jobs.items()
        if any(f == edited or f.startswith(edited) for f in files)
    }


def _table() -> dict[str, str]:
    """CONTRIBUTING.md's rows: {To change: Reruns}."""
    text = (
        (ROOT / "CONTRIBUTING.md")
        .read_text()
        .split("## Where to change what", 1)[1]
        .split("\n## ", 1)[0]
    )
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ")
    ]
    return {r[0]: r[2] for r in rows[1:]}


def test_every_row_of_contributing_reaches_the_jobs_it_names():
    assert _table() == RERUNS and list(RERUNS) == list(ROWS)
    jobs = _jobs(ROOT / "src")
    assert len(jobs) > 25 and BENCH in jobs
    for row, edits in ROWS.items():
        for edited, want in edits:
            assert _reached(jobs, edited) == want, (
                row,
                edited,
                sorted(_reached(jobs, edited) ^ want),
            )


def test_a_new_tasks_package_reaches_no_other_tasks_job(tmp_path, monkeypatch):
    """The toy fourth task's package beside the built-in ones: no job of theirs holds its files."""
    import sys

    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "tests/data/toy_task", src / "grassflow/toy", ignore=shutil.ignore_patterns("*.smk")
    )
    for name in [m for m in sys.modules if m == "grassflow" or m.startswith("grassflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(src))
    jobs = _jobs(src)
    assert _reached(jobs, "src/grassflow/toy/") == set()
