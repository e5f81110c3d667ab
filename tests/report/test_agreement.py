"""`grassflow check`: every run of a results tree, its records checked against each other
(grassflow.report.agreement), through the command line, on crafted records; a run that stopped short
with its reason recorded passes, and its table says so. The adoption's own refusals, on the demo's
records: tests/pipeline/test_finished_runs.py; through the DAG:
tests/pipeline/test_error_line.py."""

from __future__ import annotations

import json

from grassflow.cli import main
from grassflow.lm.aggregate import aggregate
from helpers.records import TEMPLATE, crafted_run
from helpers.specs import PUBLISHED


def _tree(tmp_path):
    runs = tmp_path / "results" / "crafted" / "runs"
    for model in ("transformer", "grassmann"):
        for seed in (0, 1):
            crafted_run(runs, f"table1-{model}-s{seed}", model, seed, 250.0 + seed, 240.0, epochs=3)
    return runs


def _edit(path, fn):
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def test_check_passes_a_tree_that_agrees_and_names_each_disagreement(tmp_path, capsys):
    runs = _tree(tmp_path)
    crafted_run(
        runs.parent / "pending", "table1-grassmann-s9", "grassmann", 9, 250.0, 240.0
    ).joinpath("eval.json").unlink()
    assert main(["check", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "4 evaluated run(s) under" in out and "4 agree, 0 do not; 1 not evaluated yet." in out
    # eval.json's validation PPL not the best epoch's; a completed run short of its spec's epochs
    _edit(
        runs / "table1-grassmann-s0/eval.json", lambda e: e["validation"].update(chunked_ppl=262.5)
    )
    _edit(runs / "table1-transformer-s1/run.json", lambda r: r["spec"]["train"].update(epochs=30))
    assert main(["check", str(tmp_path / "results")]) == 1
    lines = capsys.readouterr().out.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [
        f"error: {runs}/table1-grassmann-s0/eval.json: validation.chunked_ppl 262.5 is not the "
        "best epoch's val_ppl in metrics.jsonl (epoch 3: 250.0): the evaluation is not of the "
        "weights that trained to it",
        f"error: {runs}/table1-transformer-s1/run.json: epochs_completed 3 of its spec's 30 "
        "epochs, and status.state 'completed' with no status.reason saying why it stopped",
    ]
    assert lines[-1].endswith("2 agree, 2 do not; 1 not evaluated yet.")
    assert main(["check", str(tmp_path / "nosuch")]) == 1
    assert "no such directory" in capsys.readouterr().err


def test_a_run_that_says_why_it_stopped_short_passes_and_its_table_says_so(tmp_path, capsys):
    runs = _tree(tmp_path)
    # every run asked 5 epochs; one stopped after 3 saying why, the others too
    for d in runs.iterdir():
        _edit(
            d / "run.json",
            lambda r: (
                r["spec"]["train"].update(epochs=5),
                r["status"].update(reason="time limit"),
            ),
        )
    assert main(["check", str(runs)]) == 0
    out = tmp_path / "report"
    preset = {
        "data": {"source": "local", "local_dir": "/data/v1"},
        "tokenizer": {"name": "bert-base-uncased"},
        "models": ["transformer", "grassmann"],
        "seeds": [0, 1],
    }
    aggregate(
        preset,
        "crafted",
        "table1",
        sorted(map(str, runs.iterdir())),
        out,
        str(TEMPLATE / "data/unigram.json"),
        str(TEMPLATE / "data/checksums.json"),
        str(PUBLISHED),
    )
    md = (out / "table1.md").read_text()
    assert (
        "Stopped before their spec's epochs, as their records say: table1-grassmann-s0 after 3 "
        "(time limit), table1-grassmann-s1 after 3 (time limit), table1-transformer-s0 after 3"
    ) in md
