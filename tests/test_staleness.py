"""Staleness from imports (grassflow.staleness): each rule fingerprints the code of the very
command its shell runs; that code is the command's import closure, which holds everything a
real run of the command loads (recorded by the CLI's GRASSFLOW_RECORD_IMPORTS hook), less only
the other model kinds' code; the kernels the ops load are declared where they are loaded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grassflow import staleness
from specs import LM_SPEC

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "grassflow"


def rule_blocks():
    for smk in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        for block in re.split(r"(?m)^(?=rule )", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            if m:
                yield m.group(1), block


def test_every_rule_fingerprints_the_command_its_shell_runs():
    """Each rule's `code` param hashes the command its shell runs: the CLI's or the hub fetches'
    (`{params.gf} <command>`), or a task's stage (`python -m grassflow.stage <task> <stage>`, whose
    command is `<task>-<stage>`, the LM's without a prefix); a run's stage with the run's model kind."""
    from grassflow.tasks import TASKS

    seen, stages = {}, set()
    for rule, block in rule_blocks():
        gf = re.search(r"\{params\.gf\} ([a-z-]+)", block)
        stage = re.search(r"python -m grassflow\.stage (\w+) (\w+) ", block)
        code = re.search(r'code=(?:lambda wc: )?code_of\(\s*"([a-z-]+)"(.*?)\),?\n', block, re.S)
        if rule == "preflight":  # a check of the machine: no fingerprint, rerun only when missing
            assert code is None
            continue
        if gf is None and stage is None:  # a rule that runs no grassflow command (`all`, a target)
            assert code is None, rule
            continue
        assert code, f"rule {rule} runs a grassflow command but fingerprints no code"
        if stage:
            task, name = stage.groups()
            assert code.group(1) == TASKS[task].command(name), rule
            # a run's jobs: the code of the run's own model kind
            assert ("model_kind" in code.group(2)) == (name in ("train", "train_fused", "evaluate")), rule
            stages.add((task, name))
            continue
        assert code.group(1) == gf.group(1), rule
        # through the command line whose slice the fingerprint holds: the CLI's, or the hub fetches' own
        dispatcher = {"grassflow.cli": "gf=CLI,", "grassflow.fetch": "gf=FETCH,"}[staleness._dispatcher(gf.group(1))[1]]
        assert dispatcher in block, (rule, dispatcher)
        seen[rule] = code.group(2).strip()
    # bench fingerprints every kind; the CLI's other rules, none
    assert {r: k for r, k in seen.items() if k} == {"bench": ", *MODEL_KINDS"} and len(seen) == 8
    # every built-in task's run stages, and the text corpora's data stages
    assert {(t, s) for t in ("lm", "snli", "recall") for s in ("train", "evaluate")} <= stages
    assert {("lm", "download"), ("lm", "tokenize"), ("snli", "tokenize"), ("recall", "data"), ("lm", "train_fused")} <= stages
    assert staleness._dispatcher("snli-train")[1] == "grassflow.stage"


def files(command, *kinds) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in staleness.command_files(command, kinds)}


def test_closures_hold_what_the_hand_kept_lists_missed():
    """The drift that hand-kept lists had: the SNLI and recall tables import report/setup.py
    through report/aggregate.py; bench imports loop.py, compiled.py and bench/peer.py."""
    for command in ("aggregate", "snli-aggregate", "recall-aggregate", "ablations"):
        assert "src/grassflow/report/setup.py" in files(command), command
    assert {"src/grassflow/loop.py", "src/grassflow/compiled.py", "src/grassflow/bench/peer.py"} <= files(
        "bench", "transformer", "grassmann")


def test_a_job_holds_its_own_model_kinds_code_only():
    t, g = files("train", "transformer"), files("train", "grassmann")
    grassmann_only = {"src/grassflow/models/grassmann.py", "src/grassflow/ops/plucker/function.py", "kernels/plucker.cu",
                      "kernels/cpu_fused/plucker_fused.cpp", "kernels/cpu_shim/plucker_cpu.cpp"}
    assert grassmann_only <= g and not grassmann_only & t
    assert "src/grassflow/models/transformer.py" in t and "src/grassflow/models/transformer.py" not in g
    assert not {"src/grassflow/models/grassmann.py", "src/grassflow/models/transformer.py"} & files("download")
    assert "src/grassflow/preflight.py" not in t | g | files("bench", "transformer", "grassmann")
    with pytest.raises(ValueError, match="unknown model kind"):
        staleness.command_files("train", ("mamba",))
    with pytest.raises(ValueError, match="no grassflow command 'trian'"):
        staleness.command_files("trian")


def test_data_stages_do_not_import_training_or_tokenizer_code():
    d = files("download")
    assert "src/grassflow/data/tokenizers.py" not in d and "src/grassflow/loop.py" not in d
    assert "src/grassflow/data/tokenizers.py" in files("tokenize")


def test_every_kernel_source_is_declared_where_it_is_loaded():
    declared = set()
    for py in SRC.rglob("*.py"):
        text = py.read_text()
        sources = staleness._literal(py, "KERNEL_SOURCES")
        if "kernels_dir()" in text and py.name != "kernel_stages.py":  # kernel_stages defines it
            assert sources, f"{py} loads from kernels/ but declares no KERNEL_SOURCES"
        declared |= {str(Path("kernels") / s) for s in sources or ()}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "kernels").rglob("*") if p.is_file()}
    assert declared == on_disk


def _recorded(tmp_path, argv: list[str], env_extra=None) -> dict:
    """What `argv` imported, run as its rule runs it: a task's stage as its job (grassflow.stage)."""
    rec = tmp_path / "imports"
    env = {**os.environ, "GRASSFLOW_RECORD_IMPORTS": str(rec), **(env_extra or {})}
    if argv[0] in staleness.TASK_COMMANDS:
        task, stage, _ = staleness.TASK_COMMANDS[argv[0]]
        argv = ["grassflow.stage", task.name, stage, *argv[1:]]
    else:
        module = staleness._dispatcher(argv[0])[1]  # the CLI's, as its rules run it, or the fetches'
        argv = ["grassflow" if module == "grassflow.cli" else module, *argv]
    res = subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (one,) = rec.glob("*.json")
    out = json.loads(one.read_text())
    one.unlink()
    return out


def command_of(argv: list[str]) -> str:
    """The command a recorded argv ran: a task's job records `<task> <stage>` (grassflow.stage)."""
    from grassflow.tasks import TASKS

    return TASKS[argv[0]].command(argv[1]) if argv[0] in TASKS else argv[0]


def assert_closure_holds(record: dict, command: str, kinds=()) -> None:
    """What the command loaded ⊆ its closure, less the other kinds' code and what only that
    code imports (loaded with the models package, never run by this job), and for a CLI command
    the tasks' declarations (grassflow.tasks loads them all to list the commands; a task's job
    loads its own task's only: grassflow.stage)."""
    others = [k for k in staleness.kind_code() if k not in kinds]
    theirs = staleness.closure([m for k in others for m in staleness.kind_code()[k]], others)
    if command not in staleness.TASK_COMMANDS:
        theirs |= staleness.closure([f"grassflow.{pkg}.task" for pkg in staleness.declarations()], others)
    loaded = {Path(f).resolve() for f in record["files"]}
    owned = {p for p in loaded if staleness._owned_by(staleness.module_name(p), others)}
    missing = loaded - owned - theirs - set(staleness.command_files(command, kinds))
    assert not missing, f"{command} {kinds}: loaded but not fingerprinted: {sorted(map(str, missing))}"


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_what_real_commands_load_is_in_their_closure(kind, tokens, tmp_path):
    """Train, evaluate and unigram, run for real through the CLI, record their imports."""
    spec = {**LM_SPEC, "model_kind": kind, "train": {**LM_SPEC["train"], "epochs": 1, "max_steps_per_epoch": 2}}
    run = tmp_path / "run"
    argv = ["train", "--spec", json.dumps(spec), "--train-tokens", str(tokens / "train.parquet"),
            "--val-tokens", str(tokens / "validation.parquet"), "--out-dir", str(run)]
    assert_closure_holds(_recorded(tmp_path, argv), "train", (kind,))
    argv = ["evaluate", "--weights", str(run / "model.safetensors"), "--run-json", str(run / "run.json"),
            "--val-tokens", str(tokens / "validation.parquet"), "--test-tokens", str(tokens / "test.parquet"),
            "--out", str(run / "eval.json")]
    assert_closure_holds(_recorded(tmp_path, argv), "evaluate", (kind,))
    if kind == "transformer":
        argv = ["unigram", "--train-tokens", str(tokens / "train.parquet"), "--val-tokens",
                str(tokens / "validation.parquet"), "--test-tokens", str(tokens / "test.parquet"),
                "--out", str(tmp_path / "unigram.json")]
        assert_closure_holds(_recorded(tmp_path, argv), "unigram")


def test_a_hub_fetch_loads_and_holds_its_own_code_only(tmp_path):
    """What the fetch rules save feeds every LM and SNLI run: their command line (grassflow.fetch)
    loads neither the tasks' planning nor the other stages' handlers, and their closure holds neither
    (tests/test_pipeline_staleness.py::test_a_hub_fetch_holds_its_own_code_only: a real DAG)."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok/vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "man"]) + "\n")
    argv = ["fetch-tokenizer", "--tokenizer", json.dumps({"name": "bert-base-uncased", "path": str(tmp_path / "tok")}),
            "--out", str(tmp_path / "out/tokenizer.json")]
    record = _recorded(tmp_path, argv)
    assert_closure_holds(record, "fetch-tokenizer")
    planning = {"src/grassflow/tasks.py", "src/grassflow/stage.py", "src/grassflow/cli.py", "src/grassflow/config.py"}
    for command in ("fetch-tokenizer", "snli-fetch-backbone"):
        assert not planning & files(command), command
    assert not {f for f in record["files"] if f.endswith(("/tasks.py", "/stage.py", "/cli.py"))}


def test_the_check_would_catch_a_module_missing_from_the_closure(tokens, tmp_path, monkeypatch):
    """The premise of the test above: with an import the static reading cannot see (a module
    named at run time), the loaded module is reported as not fingerprinted."""
    argv = ["unigram", "--train-tokens", str(tokens / "train.parquet"), "--val-tokens",
            str(tokens / "validation.parquet"), "--test-tokens", str(tokens / "test.parquet"),
            "--out", str(tmp_path / "unigram.json")]
    record = _recorded(tmp_path, argv)
    record["files"].append(str(SRC / "report" / "stats.py"))  # as if unigram had imported it dynamically
    with pytest.raises(AssertionError, match="report/stats.py"):
        assert_closure_holds(record, "unigram")


# --- what a file's fingerprint covers: code, not text ------------------------------------------------
def test_a_files_code_hash_ignores_comments_docstrings_and_formatting(tmp_path):
    f = tmp_path / "m.py"

    def code(text):
        f.write_text(text)
        return staleness.code_hash(f)

    base = code('"""Doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1\n')
    assert base == code('"""Another doc."""\n# a comment\n\ndef f( x ):  # why\n    """Other."""\n\n    return (x + 1)\n')
    assert base == code("def f(x):\n    return x + 1\n")
    assert base != code("def f(x):\n    return x + 2\n")
    assert base != code("def f(x):\n    y = 'Doc.'\n    return x + 1\n")
    k = tmp_path / "k.cu"  # a kernel source: its bytes (the compilers read all of it)
    k.write_text("// a\nint x;\n")
    before = staleness.code_hash(k)
    k.write_text("// b\nint x;\n")
    assert staleness.code_hash(k) != before


def _edited_copy(monkeypatch, tmp_path, attr: str, old: str, new: str):
    """cli.py or stage.py (staleness.CLI, .STAGE) edited, in a copy: the command tables are read
    from its syntax tree."""
    edited = tmp_path / getattr(staleness, attr).name
    text = getattr(staleness, attr).read_text()
    assert old in text
    edited.write_text(text.replace(old, new, 1))
    monkeypatch.setattr(staleness, attr, edited)
    staleness.cli_slice.cache_clear()


UNCALLED = "\ndef _nobody_calls():\n    return 1\n\n"
OTHER_COMMANDS_EDITS = {  # a function nobody calls; another command's row; another command's handler
    "CLI": (("\ndef build_parser", UNCALLED + "\ndef build_parser"),
            ('("ablations", "the ablation table', '("ablations", "the ablation tables'),
            ("def _baseline_args(p):\n", "def _baseline_args(p):\n    _edited = 1\n")),
    "STAGE": (("\ndef parser(", UNCALLED + "\ndef parser("),
              ('"data": ("its train/validation/test parquet files"', '"data": ("its parquet files"'),
              ("def _tokenize(a):\n", "def _tokenize(a):\n    _edited = 1\n")),
}


@pytest.mark.parametrize("command", ["train", "recall-evaluate", "unigram", "bench"])
def test_a_commands_part_of_its_command_line_leaves_out_the_other_commands(command, monkeypatch, tmp_path):
    """cli_slice: a function nobody calls, and another command's row or handler, are not in a
    command's part of its command line (stage.py for a task's job, else cli.py); main() is in
    every command's."""
    attr = "STAGE" if command in staleness.TASK_COMMANDS else "CLI"
    before = staleness.code_hash(getattr(staleness, attr), command)
    for old, new in OTHER_COMMANDS_EDITS[attr]:
        _edited_copy(monkeypatch, tmp_path, attr, old, new)
        assert staleness.code_hash(getattr(staleness, attr), command) == before, (command, new)
        monkeypatch.undo()
    _edited_copy(monkeypatch, tmp_path, attr, "    argv = sys.argv[1:] if argv is None else list(argv)\n",
                 "    argv = sys.argv[1:] if argv is None else list(argv)\n    _edited = 1\n")
    assert staleness.code_hash(getattr(staleness, attr), command) != before
    monkeypatch.undo()
    staleness.cli_slice.cache_clear()


def test_a_jobs_closure_holds_no_planning_code_and_no_other_tasks_code():
    """Config loading, the run grids, the checks, the estimates, where the tasks' files and rules are
    (grassflow.tasks) and the CLI's dispatch are planning: what they decide reaches a job through
    its spec file and its command line. A job holds its own task's code only."""
    planning = {"src/grassflow/config.py", "src/grassflow/estimate.py", "src/grassflow/plan.py",
                "src/grassflow/recall/grid.py", "src/grassflow/snli/grid.py", "src/grassflow/tasks.py",
                "src/grassflow/cli.py"}
    lm = files("train", "grassmann") | files("evaluate", "transformer")
    assert not planning & lm
    assert not {f for f in lm if f.startswith(("src/grassflow/recall/", "src/grassflow/snli/"))}, lm
    recall = files("recall-train", "grassmann")
    assert "src/grassflow/recall/train.py" in recall and not planning & recall
    assert not {f for f in recall if f.startswith(("src/grassflow/snli/", "src/grassflow/lm/"))}, recall
    assert not {f for f in files("tokenize") if "models/" in f or "ops/" in f}
    # the estimates report reads every task's estimate: their declarations and planning code are its code
    assert {"src/grassflow/recall/task.py", "src/grassflow/snli/grid.py"} <= files("estimates")
