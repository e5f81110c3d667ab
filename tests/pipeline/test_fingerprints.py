"""Staleness from imports (grassflow.planning.staleness): each rule fingerprints the code of the
very stage module its shell runs; that code is the module's import closure, which holds everything a
real run of the job loads (recorded by grassflow.job's GRASSFLOW_RECORD_IMPORTS hook), less only the
other model kinds' code; the kernels the ops load are declared where they are loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grassflow.planning import staleness
from helpers.dag import assert_closure_holds
from helpers.rule_code import KIND_SETS, rules
from helpers.specs import LM_SPEC

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "grassflow"


def test_every_rule_fingerprints_the_job_its_shell_runs():
    """Each rule's `code` param, as Snakemake parsed it, is a fingerprint of the stage module its
    shell runs (`python -m grassflow.<...>`): a run's jobs each with its own run's model kind (every
    run job of the demo's plan), bench with every kind, the others with none; the module is a
    command line (its main() parses -h)."""
    import importlib

    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config
    from grassflow.pipeline.tasks import TASKS

    seen = {}
    for rule, r in rules().items():
        if rule == "preflight":  # a check of the machine: no fingerprint, rerun only when missing
            assert r.code is None and r.module == "grassflow.preflight"
            continue
        if r.module is None:  # a rule that runs no grassflow command (`all`, a target)
            assert r.code is None, rule
            continue
        assert r.code and None not in {k for _, k in r.code}, (
            f"rule {rule}: its code is no fingerprint of {r.module}, which its shell runs"
        )
        seen[rule] = r.code
        with pytest.raises(SystemExit) as e:
            importlib.import_module(r.module).main(["-h"])
        assert e.value.code == 0, rule
    name, preset = select_preset(load_config(ROOT, preset="demo"))
    specs = {run: spec for t in TASKS.values() for run, spec in t.specs(name, preset).items()}
    # a code per job: a run's jobs
    runs = {r for r, codes in seen.items() if codes[0][0] is not None}
    assert runs == {
        "train",
        "train_fused",
        "evaluate",
        "snli_train",
        "snli_evaluate",
        "recall_train",
        "recall_evaluate",
    }
    for rule in runs:
        for wc, kinds in seen[rule]:
            (run,) = wc.values()  # a run, or a fused group of runs
            assert {kinds} == {
                (s["model_kind"],) for r, s in specs.items() if r == run or r.startswith(f"{run}-s")
            }, (rule, run)
        assert {k for _, k in seen[rule]} == {("transformer",), ("grassmann",)}, rule
    # bench fingerprints every kind; the others, none
    assert {r: codes for r, codes in seen.items() if r not in runs and codes != [(None, ())]} == {
        "bench": [(None, ("transformer", "grassmann"))]
    }
    assert len(seen) == 26  # the rules that run a grassflow command (sweep_aggregate the newest)


def test_no_jobs_code_holds_the_planning():
    """No job's fingerprint holds a module of grassflow.pipeline or grassflow.planning, for every
    rule and model kind: no job runs the planning (its estimates beside the measured times:
    `grassflow plan
    --measured`)."""
    jobs = {r.module for r in rules().values() if r.module}
    assert len(jobs) > 20 and not {
        j for j in jobs if j.startswith(("grassflow.pipeline", "grassflow.planning"))
    }, jobs
    for module in jobs:
        for k in KIND_SETS:
            assert not {
                f
                for f in files(module, *k)
                if f.startswith(("src/grassflow/pipeline/", "src/grassflow/planning/"))
            }, (module, k)


def files(module, *kinds) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in staleness.job_files(module, kinds)}


def test_closures_hold_what_the_hand_kept_lists_missed():
    """The drift that hand-kept lists had: every task's table imports report/records.py through
    report/tables.py, and only the LM's tables hold the LM's comparability (lm/comparable.py); bench
    imports loop.py, compiled.py and bench/peer.py."""
    for module in ("lm.aggregate", "snli.aggregate", "recall.aggregate", "lm.ablations"):
        held = files(f"grassflow.{module}")
        assert "src/grassflow/report/records.py" in held, module
        assert ("src/grassflow/lm/comparable.py" in held) == module.startswith("lm."), module
    assert {
        "src/grassflow/loop.py",
        "src/grassflow/compiled.py",
        "src/grassflow/bench/peer.py",
    } <= files("grassflow.bench", "transformer", "grassmann")


def test_imports_are_found_in_every_kind_of_statement_body():
    """The import scan walks statements only (an expression holds none): an import nested in any
    statement body is found, as a walk over every node finds it."""
    import ast

    src = """
import grassflow.io
if X:
    import grassflow.runs
else:
    from grassflow import data
try:
    from grassflow.models import config
except ImportError:
    import grassflow.report
else:
    import grassflow.lm
finally:
    import grassflow.snli
with x:
    for _ in y:
        while z:
            from grassflow.ops import plucker
        else:
            import grassflow.recall
match q:
    case 1:
        import grassflow.bench
class C:
    def f(self):
        async def g():
            import grassflow.job
f = lambda: __import__("grassflow.hf")  # not an import statement: not found by either
"""
    tree = ast.parse(src)
    every_node = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert all(map(staleness.module_path, every_node)), every_node
    found = staleness.imported([tree], "grassflow.x", False)
    assert {
        "grassflow.io",
        "grassflow.runs",
        "grassflow.bench",
        "grassflow.job",
        "grassflow.snli",
        "grassflow.recall",
        "grassflow.data",
        "grassflow.models.config",
        "grassflow.ops.plucker",
    } <= found
    assert every_node <= found and "grassflow.hf" not in found


def test_a_job_holds_its_own_model_kinds_code_only():
    t, g = files("grassflow.lm.train", "transformer"), files("grassflow.lm.train", "grassmann")
    grassmann_only = {
        "src/grassflow/models/grassmann.py",
        "src/grassflow/ops/plucker/function.py",
        "kernels/plucker.cu",
        "kernels/cpu_fused/plucker_fused.cpp",
        "kernels/cpu_shim/plucker_cpu.cpp",
    }
    assert grassmann_only <= g and not grassmann_only & t
    assert (
        "src/grassflow/models/transformer.py" in t
        and "src/grassflow/models/transformer.py" not in g
    )
    assert not {"src/grassflow/models/grassmann.py", "src/grassflow/models/transformer.py"} & files(
        "grassflow.lm.download"
    )
    assert "src/grassflow/preflight.py" not in t | g | files(
        "grassflow.bench", "transformer", "grassmann"
    )
    with pytest.raises(ValueError, match="unknown model kind"):
        staleness.job_files("grassflow.lm.train", ("mamba",))
    with pytest.raises(ValueError, match="no grassflow module 'grassflow.lm.trian'"):
        staleness.job_files("grassflow.lm.trian")


def test_data_stages_do_not_import_training_or_tokenizer_code():
    d = files("grassflow.lm.download")
    assert "src/grassflow/data/tokenizers.py" not in d and "src/grassflow/loop.py" not in d
    assert "src/grassflow/data/tokenizers.py" in files("grassflow.lm.tokenize")
    # the stages of one task: the tokenizer's training is not the tokenization's code
    assert "src/grassflow/lm/train_tokenizer.py" not in files("grassflow.lm.tokenize")


def test_every_kernel_source_is_declared_where_it_is_loaded():
    declared = set()
    for py in SRC.rglob("*.py"):
        text = py.read_text()
        sources = staleness._assigned(staleness._tree(py), "KERNEL_SOURCES")
        # defines it; hashes the declared
        if "kernels_dir()" in text and py.name not in (
            "kernel_sources.py",
            "staleness.py",
        ):
            assert sources, f"{py} loads from kernels/ but declares no KERNEL_SOURCES"
        declared |= {str(Path("kernels") / s) for s in sources or ()}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "kernels").rglob("*") if p.is_file()}
    assert declared == on_disk


def _recorded(tmp_path, argv: list[str], env_extra=None) -> dict:
    """What the job `python -m <argv>` imported, run as its rule runs it."""
    rec = tmp_path / "imports"
    env = {**os.environ, "GRASSFLOW_RECORD_IMPORTS": str(rec), **(env_extra or {})}
    res = subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (one,) = rec.glob("*.json")
    out = json.loads(one.read_text())
    one.unlink()
    return out


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_what_real_commands_load_is_in_their_closure(kind, tokens, tmp_path):
    """Train, evaluate and unigram, run for real as their rules run them, record their imports."""
    spec = {
        **LM_SPEC,
        "model_kind": kind,
        "train": {**LM_SPEC["train"], "epochs": 1, "max_steps_per_epoch": 2},
    }
    run = tmp_path / "run"
    argv = [
        "grassflow.lm.train",
        "--spec",
        json.dumps(spec),
        "--train-tokens",
        str(tokens / "train.parquet"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--out-dir",
        str(run),
    ]
    assert_closure_holds(_recorded(tmp_path, argv), "grassflow.lm.train", (kind,))
    argv = [
        "grassflow.lm.evaluate",
        "--weights",
        str(run / "model.safetensors"),
        "--run-json",
        str(run / "run.json"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--test-tokens",
        str(tokens / "test.parquet"),
        "--out",
        str(run / "eval.json"),
    ]
    assert_closure_holds(_recorded(tmp_path, argv), "grassflow.lm.evaluate", (kind,))
    if kind == "transformer":
        argv = [
            "grassflow.lm.unigram",
            "--train-tokens",
            str(tokens / "train.parquet"),
            "--val-tokens",
            str(tokens / "validation.parquet"),
            "--test-tokens",
            str(tokens / "test.parquet"),
            "--out",
            str(tmp_path / "unigram.json"),
        ]
        assert_closure_holds(_recorded(tmp_path, argv), "grassflow.lm.unigram")


def test_a_hub_fetch_loads_and_holds_its_own_code_only(tmp_path):
    """What the fetch rules save feeds every LM and SNLI run: their jobs load neither the tasks'
    planning nor the CLI, and their closure holds neither
    (tests/pipeline/test_replanning.py::test_a_hub_fetch_holds_its_own_code_only: a real DAG)."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok/vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "man"]) + "\n"
    )
    argv = [
        "grassflow.data.fetch_tokenizer",
        "--tokenizer",
        json.dumps({"name": "bert-base-uncased", "path": str(tmp_path / "tok")}),
        "--out",
        str(tmp_path / "out/tokenizer.json"),
    ]
    record = _recorded(tmp_path, argv)
    assert_closure_holds(record, "grassflow.data.fetch_tokenizer")
    planning = {
        "src/grassflow/pipeline/tasks.py",
        "src/grassflow/cli.py",
        "src/grassflow/pipeline/presets.py",
    }
    for module in ("grassflow.data.fetch_tokenizer", "grassflow.snli.fetch_backbone"):
        assert not planning & files(module), module
    assert not {f for f in record["files"] if f.endswith(("/tasks.py", "/cli.py", "/config.py"))}


def test_the_check_would_catch_a_module_missing_from_the_closure(tokens, tmp_path, monkeypatch):
    """The premise of the test above: with an import the static reading cannot see (a module named
    at run time), the loaded module is reported as not fingerprinted."""
    argv = [
        "grassflow.lm.unigram",
        "--train-tokens",
        str(tokens / "train.parquet"),
        "--val-tokens",
        str(tokens / "validation.parquet"),
        "--test-tokens",
        str(tokens / "test.parquet"),
        "--out",
        str(tmp_path / "unigram.json"),
    ]
    record = _recorded(tmp_path, argv)
    # as if unigram had imported it dynamically
    record["files"].append(str(SRC / "report" / "stats.py"))
    with pytest.raises(AssertionError, match="report/stats.py"):
        assert_closure_holds(record, "grassflow.lm.unigram")


# --- what a file's fingerprint covers: code, not text ---------------------------------------------
def test_a_files_code_hash_ignores_comments_docstrings_and_formatting(tmp_path):
    f = tmp_path / "m.py"

    def code(text):
        f.write_text(text)
        return staleness.code_hash(f)

    base = code('"""Doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1\n')
    assert base == code(
        '"""Another doc."""\n# a comment\n\ndef f( x ):  # why\n    """Other."""\n\n    '
        "return (x "
        "+ 1)\n"
    )
    assert base == code("def f(x):\n    return x + 1\n")
    assert base != code("def f(x):\n    return x + 2\n")
    assert base != code("def f(x):\n    y = 'Doc.'\n    return x + 1\n")
    k = tmp_path / "k.cu"  # a kernel source: its bytes (the compilers read all of it)
    k.write_text("// a\nint x;\n")
    before = staleness.code_hash(k)
    k.write_text("// b\nint x;\n")
    assert staleness.code_hash(k) != before


def test_a_files_code_hash_ignores_the_wording_of_a_raised_message(tmp_path):
    """A reworded error reruns nothing (#70 reworded two messages in data/sources.py, which every
    job's closure holds: a results tree from before it replanned all 15 runs of #69's grid from the
    download). What the message formats, the exception's type and any other string still count."""
    f = tmp_path / "m.py"

    def code(body):
        f.write_text(f"def f(x, e):\n    if x < 0:\n        {body}\n    return run('mode-a')\n")
        return staleness.code_hash(f)

    base = code('raise ValueError(f"{x}: not readable ({type(e).__name__}: {e})")')
    assert base == code(
        'raise ValueError(f"{x}: not a parquet file ({type(e).__name__}: {e}); remove it")'
    )
    assert code('raise ValueError("negative")') == code('raise ValueError("x must be >= 0")')
    assert code('raise ValueError("negative") from None') != code('raise ValueError("negative")')
    # the type
    assert base != code('raise TypeError(f"{x}: not readable ({type(e).__name__}: {e})")')
    # a value
    assert base != code('raise ValueError(f"{x + 1}: not readable ({type(e).__name__}: {e})")')
    # not a message
    assert code("raise SystemExit(main('a'))") != code("raise SystemExit(main('b'))")
    assert code('y = ValueError("a")') != code('y = ValueError("b")')  # not raised
    f.write_text("def f(x):\n    raise ValueError('a')\n    return run('mode-a')\n")
    before = staleness.code_hash(f)
    f.write_text("def f(x):\n    raise ValueError('a')\n    return run('mode-b')\n")
    assert staleness.code_hash(f) != before


def test_the_task_table_holds_every_tasks_planning_by_its_imports():
    """The tasks' table imports each task's planning statically: its closure holds every grid, seen
    by the imports alone (no module is loaded by name)."""
    held = {str(p.relative_to(ROOT)) for p in staleness.closure(["grassflow.pipeline.tasks"])}
    assert {f"src/grassflow/{t}/grid.py" for t in ("lm", "snli", "recall")} <= held


def test_a_jobs_closure_holds_no_planning_code_and_no_other_tasks_code():
    """Config loading, the run grids, the checks, the estimates, where the tasks' files and rules
    are (grassflow.pipeline.tasks) and the CLI are planning: what they decide reaches a job through
    its spec file and its command line. A job holds its own task's code only."""
    planning = {
        "src/grassflow/pipeline/presets.py",
        "src/grassflow/planning/estimate.py",
        "src/grassflow/pipeline/preview.py",
        "src/grassflow/recall/grid.py",
        "src/grassflow/snli/grid.py",
        "src/grassflow/lm/grid.py",
        "src/grassflow/pipeline/tasks.py",
        "src/grassflow/cli.py",
    }
    lm = files("grassflow.lm.train", "grassmann") | files("grassflow.lm.evaluate", "transformer")
    assert not planning & lm
    assert not {f for f in lm if f.startswith(("src/grassflow/recall/", "src/grassflow/snli/"))}, lm
    recall = files("grassflow.recall.train", "grassmann")
    assert "src/grassflow/recall/train.py" in recall and not planning & recall
    assert not {f for f in recall if f.startswith(("src/grassflow/snli/", "src/grassflow/lm/"))}, (
        recall
    )
    assert not {f for f in files("grassflow.lm.tokenize") if "models/" in f or "ops/" in f}
