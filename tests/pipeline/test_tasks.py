"""A task is its package and its rule file: a toy fourth task, copied into a scratch repository's
src/grassflow/toy/ and workflow/rules/toy.smk, one include line added to the Snakefile, is validated
(its part's schema and checks), planned, estimated, run and tabled by the DAG; and the shared
contracts of the tasks' declarations hold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from grassflow.pipeline.tasks import TASKS
from helpers.dag import copy_repo, job_stats, pipeline_env, plan_rows, snakemake

TOY = Path(__file__).parents[1] / "data" / "toy_task"
TOY_PRESET = {
    "description": "a toy fourth task",
    "toy": {
        "data": {"seq_len": 32, "kv": 4, "examples": {"train": 256, "validation": 64, "test": 64}},
        "models": ["transformer", "grassmann"],
        "seeds": [0],
        "epochs": 2,
        "batch_size": 32,
        "train": {"device": "cpu", "eval_batch_size": 64, "lr": 3.0e-3},
    },
}


def _grassflow(work, *argv, check=True):
    res = subprocess.run(
        [sys.executable, "-m", "grassflow", *argv],
        cwd=work,
        capture_output=True,
        text=True,
        env=pipeline_env(work),
    )
    assert not check or res.returncode == 0, res.stderr[-3000:]
    return res


def _overlay(work, name, preset) -> str:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"presets": {name: preset}}))
    return str(path)


@pytest.mark.slow
def test_a_fourth_task_runs_through_the_dag_from_its_own_directory(tmp_path):
    work = copy_repo(tmp_path)
    # the only changes to the repository: its package, its row in the tasks' table (and its import),
    # its rule file, the line that includes it, its target in `all`
    shutil.copytree(TOY, work / "src" / "grassflow" / "toy", ignore=shutil.ignore_patterns("*.smk"))
    tasks = work / "src/grassflow/pipeline/tasks.py"
    table = tasks.read_text()
    assert (
        table.count("\n    )\n}\n") == 1
        and table.count("from grassflow.snli import grid as snli\n") == 1
    )
    tasks.write_text(
        table.replace(
            "from grassflow.snli import grid as snli\n",
            "from grassflow.snli import grid as snli\nfrom grassflow.toy import toy\n",
        ).replace(
            "\n    )\n}\n",
            '\n        Task("toy", "toy", toy.runs, toy.estimate, toy.check, schema=toy.SCHEMA),'
            "\n    )\n}\n",
        )
    )
    shutil.copy(TOY / "toy.smk", work / "workflow" / "rules" / "toy.smk")
    snakefile = work / "Snakefile"
    snakefile.write_text(
        snakefile.read_text()
        .replace(
            'include: "workflow/rules/recall.smk"\n',
            'include: "workflow/rules/recall.smk"\ninclude: "workflow/rules/toy.smk"\n',
        )
        .replace(
            "        rules.recall.input,\n",
            "        rules.recall.input,\n        rules.toy.input,\n",
        )
    )
    toy = _overlay(work, "toy", TOY_PRESET)

    # its table's job: its own stage module's command line
    res = subprocess.run(
        [sys.executable, "-m", "grassflow.toy.toy", "--help"],
        cwd=work,
        capture_output=True,
        text=True,
        env=pipeline_env(work),
    )
    assert res.returncode == 0 and "--runs" in res.stdout, res.stderr[-2000:]
    # its part of the config: checked by its schema and its own check, each naming the key
    bad = _overlay(work, "bad", {"toy": {**TOY_PRESET["toy"], "epochs": 0}})
    res = snakemake(work, "-n", "--configfile", bad, preset="bad", check=False)
    assert res.returncode != 0 and "presets.bad.toy.epochs" in res.stderr, res.stderr[-2000:]
    odd = _overlay(
        work,
        "odd",
        {"toy": {**TOY_PRESET["toy"], "data": {**TOY_PRESET["toy"]["data"], "seq_len": 31}}},
    )
    res = snakemake(work, "-n", "--configfile", odd, preset="odd", check=False)
    assert res.returncode != 0 and "presets.odd.toy.data: seq_len must be even" in res.stderr, (
        res.stderr[-2000:]
    )

    # planned: its data job, a train and an evaluate job per run, its table
    stats = job_stats(snakemake(work, "-n", "--configfile", toy, preset="toy").stdout)
    assert {r: stats[r] for r in ("toy_data", "toy_train", "toy_evaluate", "toy_aggregate")} == {
        "toy_data": 1,
        "toy_train": 2,
        "toy_evaluate": 2,
        "toy_aggregate": 1,
    }
    assert not {r for r in stats if r.startswith(("snli", "recall")) or r in ("train", "download")}
    # estimated before it runs
    plan = _grassflow(work, "plan", "--preset", "toy", "--configfile", toy).stdout
    assert "toy_train" in plan and "toy_evaluate" in plan

    # run and tabled
    snakemake(work, "--configfile", toy, preset="toy")
    res_dir = work / "results" / "toy"
    table = pd.read_csv(res_dir / "report" / "toy.csv")
    assert (
        sorted(table.model) == ["grassmann", "transformer"]
        and table.test_accuracy.between(0, 100).all()
    )
    for run in ("transformer-s0", "grassmann-s0"):
        record = json.loads((res_dir / "toy" / "runs" / run / "run.json").read_text())
        assert record["spec"]["task"] == "toy" and record["status"]["state"] == "completed"
    # its jobs' measured times beside their estimates, read back from its benchmark files
    measured = plan_rows(
        _grassflow(work, "plan", "--preset", "toy", "--configfile", toy, "--measured").stdout
    )
    assert all(float(measured[r][-1]) > 0 for r in ("toy_train", "toy_evaluate")), measured
    # its target, and nothing left to do
    out = snakemake(work, "-n", "--configfile", toy, preset="toy").stdout
    assert "Nothing to be done" in out, out[-2000:]
    assert (
        "Nothing to be done"
        in snakemake(work, "-n", "toy", "--configfile", toy, preset="toy").stdout
    )


def test_every_tasks_declaration_keeps_the_shared_contracts():
    """Every spec names its task and model kind; a task is named after its package; the built-in
    tasks come first, the LM's first of all."""
    from grassflow.pipeline.preview import load_config

    assert list(TASKS)[:3] == ["lm", "snli", "recall"]
    config = load_config(Path(__file__).resolve().parents[2], preset="demo")
    preset = config["presets"]["demo"]
    for task in TASKS.values():
        specs = task.specs("demo", preset)
        assert specs and task.runs.__module__ == f"grassflow.{task.name}.grid", task.name
        for run_id, spec in specs.items():
            assert spec["task"] == task.name and spec["model_kind"] in (
                "transformer",
                "grassmann",
            ), run_id
            assert spec["run_id"] == run_id and "train" in spec


def _import_graph(planted: dict[str, str] | None = None) -> dict[str, set[str]]:
    """grassflow module -> the grassflow modules it imports (with their packages, whose __init__
    runs), at any depth of its source: every import that can run; `planted`: {module: a line added
    to its source}."""
    import ast

    from grassflow.planning import staleness as st

    files = [p for p in st.PKG.rglob("*.py") if "__pycache__" not in p.parts]
    mods = {st.module_name(p) for p in files}
    graph = {}
    for p in files:
        m = st.module_name(p)
        source = p.read_text() + "\n" + (planted or {}).get(m, "")
        names = st.imported([ast.parse(source)], m, p.name == "__init__.py")
        edges = {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}
        graph[m] = (edges & mods) - {m}
    return graph


def _cycles(graph) -> list[str]:
    """The imports of a planning module (grassflow.pipeline) whose target imports it back."""

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for e in graph.get(todo.pop(), ()):
                if e not in seen:
                    seen.add(e)
                    todo.append(e)
        return seen

    return [
        f"{p} -> {q} -> ... -> {p}"
        for p in sorted(graph)
        if p.startswith("grassflow.pipeline.")
        for q in sorted(graph[p])
        if not q.startswith("grassflow.pipeline.") and p in reach(q)
    ]


def test_no_planning_module_is_imported_back_by_what_it_imports():
    """A config value's way is one-directional (docs/develop/development.md): no module of
    grassflow.pipeline imports a module (a task's grid, say) that imports it back; a task's grid
    that imported the tasks' table back, even inside a function, would be one."""
    assert _cycles(_import_graph()) == []
    planted = _cycles(
        _import_graph(
            {"grassflow.lm.grid": "def f():\n    from grassflow.pipeline.tasks import TASKS\n"}
        )
    )
    assert (
        "grassflow.pipeline.tasks -> grassflow.lm.grid -> ... -> grassflow.pipeline.tasks"
        in planted
    ), planted


# The house, from the ground up, by folder: the shared library (models, ops, data, io, loop, report,
# ...),
# then the tasks' stages (grassflow/<task>/), then the planning every task's planning reads
# (grassflow/planning/: sections, estimate, schema, staleness), then each task's planning (its
# grid.py, layout.py), then what reads every task (grassflow/pipeline/: the tasks' table, the
# config's checks, the plan verb) and the user's tools (cli, decode, export, hf, harness, bench,
# preflight). A module imports its own floor or the floors below it, never one above.
TOOLS = ("__main__", "cli", "decode", "export", "hf", "harness", "bench", "lease", "preflight")
PLANNING = ("grid", "layout")


def floor(module: str) -> int:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in (*TOOLS, "pipeline"):
        return 4
    if parts[0] in TASKS and parts[-1] in PLANNING:
        return 3
    if parts[0] == "planning":
        return 2
    return 1 if parts[0] in TASKS else 0


def test_no_import_runs_back_up_the_house():
    """docs/develop/development.md's value path has no backward hop: no module imports one on a
    floor above its own (a table's settings reach it through its runs' records, not the task's
    code)."""
    graph = _import_graph()
    up = [
        f"{m} -> {n}" for m, ns in sorted(graph.items()) for n in sorted(ns) if floor(n) > floor(m)
    ]
    assert up == [], "\n".join(up)
    assert [
        floor(f"grassflow.{m}")
        for m in ("report.tables", "lm.data", "planning.estimate", "lm.grid", "pipeline.tasks")
    ] == [0, 1, 2, 3, 4]
    # a planted import up, by folder: the shared planning reading the tasks' table
    planted_up = _import_graph(
        {
            "grassflow.planning.estimate": "def f():\n    from grassflow.pipeline.tasks import "
            "TASKS\n"
        }
    )
    assert "grassflow.planning.estimate -> grassflow.pipeline.tasks" in [
        f"{m} -> {n}" for m, ns in planted_up.items() for n in ns if floor(n) > floor(m)
    ]
    # an import inside a function runs too: a task's grid reading the config's checks is one floor
    # up
    planted = _import_graph(
        {
            "grassflow.snli.grid": "def f():\n    from grassflow.pipeline.presets import "
            "check_preset\n"
        }
    )
    assert "grassflow.snli.grid -> grassflow.pipeline.presets" in [
        f"{m} -> {n}" for m, ns in planted.items() for n in ns if floor(n) > floor(m)
    ]
