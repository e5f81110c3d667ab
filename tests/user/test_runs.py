"""`grassflow runs` and `grassflow diff` on the finished demo, through the CLI: a row per run with a
record, equal to the records (status, epochs, parts, figures, commit); the settings that differ across
the runs listed, as dotted spec keys; --preset and --where filter, --csv writes CSV; `diff` says a spec
edit as its dotted key with both values, the hashes and the curves; a damaged record is refused in
one line naming it."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys

import pytest

from helpers.dag import pipeline_env

pytestmark = pytest.mark.slow  # reads the finished demo


def _grassflow(*args, cwd):
    return subprocess.run([sys.executable, "-m", "grassflow", *args], cwd=cwd, capture_output=True, text=True,
                          env=pipeline_env(cwd))


def test_runs_lists_every_run_as_its_records_say(demo):
    res = _grassflow("runs", "results", "--preset", "demo", "--csv", cwd=demo)
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    records = sorted(demo.glob("results/demo/**/run.json"))
    assert len(rows) == len(records) > 10  # every task's runs: LM, SNLI, recall
    by_run = {r["run"]: r for r in rows}
    for f in records:
        rec = json.loads(f.read_text())
        row = by_run[str(f.parent.relative_to(demo))]
        assert row["status"] == rec["status"]["state"] and int(row["epochs"]) == rec["epochs_completed"]
        assert int(row["parts"]) == len(rec["parts"]) and row["seed"] == str(rec["spec"]["seed"])
        if rec["spec"]["task"] == "lm" and row["status"] == "completed":
            ev = json.loads((f.parent / "eval.json").read_text())
            assert float(row["best_val"]) == ev["validation"]["chunked_ppl"]
            assert float(row["test"]) == ev["test"]["chunked_ppl"]
    # the settings that differ: columns of their own, dotted (the ablation's pre-norm runs, the tables' depths)
    assert {"model.norm", "model.n_layers"} <= set(rows[0]), sorted(rows[0])
    # by columns: Table 1's Grassmann runs, the demo's two seeds and the ablation's pre-norm run (its base is
    # table1); and by a dotted spec key: Table 1's pre-norm runs, the variant's, both models
    md = _grassflow("runs", "--where", "table=table1", "--where", "model=grassmann", cwd=demo)
    assert md.returncode == 0, md.stderr
    lines = [line for line in md.stdout.splitlines() if line.startswith("| demo | table1 | grassmann |")]
    assert len(lines) == 3 and md.stdout.startswith("3 run(s).") and "table1\\_pre\\_norm-grassmann-s0" in md.stdout, \
        md.stdout
    pre = _grassflow("runs", "--where", "table=table1", "--where", "model.norm=pre", "--csv", cwd=demo)
    assert sorted(r["run"].rsplit("/", 1)[1] for r in csv.DictReader(io.StringIO(pre.stdout))) == [
        "table1_pre_norm-grassmann-s0", "table1_pre_norm-transformer-s0"], pre.stdout


def test_diff_says_a_spec_edit_as_its_key_and_a_damaged_record_by_name(demo, tmp_path):
    a = demo / "results/demo/runs/table1-grassmann-s0"
    b = tmp_path / "edited"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("*.safetensors", "*.pt"))
    rec = json.loads((b / "run.json").read_text())
    rec["spec"]["train"]["lr"] = 1e-3
    (b / "run.json").write_text(json.dumps(rec))
    res = _grassflow("diff", str(a), str(b), cwd=demo)
    assert res.returncode == 0, res.stderr
    assert "| train.lr | 0.003 | 0.001 |" in res.stdout, res.stdout
    assert "The same spec." not in res.stdout and "| weights\\_sha256 |" in res.stdout
    assert "## Validation curves (val_ppl)" in res.stdout and "| 3 |" in res.stdout
    (b / "run.json").write_text("{not json")
    res = _grassflow("diff", str(a), str(b), cwd=demo)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"error: {b / 'run.json'}: not JSON"), res.stderr
    res = _grassflow("runs", str(tmp_path), cwd=demo)
    assert res.returncode == 1 and res.stderr.startswith(f"error: {b / 'run.json'}: not JSON"), res.stderr
