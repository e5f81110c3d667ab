"""Runs finished elsewhere join a table from their records (config finished_runs, grassflow.lm.adopt):
a GPU lease's committed runs, another allocation's, a colleague's. In a copy of the finished demo
with Table 1 and its runs removed and seed 0's records in a directory of their own, `snakemake table1`
adopts seed 0 (neither trained nor evaluated), trains and evaluates seed 1, and makes the table the
demo made itself, saying which runs came from records and at which commits. A record of another
run (its spec) or of other data is refused by name, and nothing is adopted from it."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from helpers.dag import assert_same_tables, snakemake

pytestmark = pytest.mark.slow
RUNS = [f"table1-{m}-s{s}" for m in ("transformer", "grassmann") for s in (0, 1)]
RECORDS = ("run.json", "eval.json", "metrics.jsonl")


def _jobs(log: str) -> list[tuple[str, str]]:
    """(rule, run) of each job Snakemake started that has a run wildcard."""
    jobs = []
    for block in log.split("\n\n"):
        rule, run = re.search(r"^(?:local)?rule (\w+):", block, re.M), re.search(r"wildcards: run=(\S+)", block)
        if rule and run:
            jobs.append((rule.group(1), run.group(1)))
    return sorted(jobs)


def _table(md: str) -> str:
    """A table's Markdown without what says where its runs were made and its record links."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"^Runs made at .*$", "", md, flags=re.M))


def test_a_tables_runs_finished_elsewhere_join_it_from_their_records(demo, tmp_path, capfd):
    records = tmp_path / "records"
    for run in RUNS[::2]:  # seed 0 of both models
        (records / run).mkdir(parents=True)
        for f in RECORDS:
            shutil.copy2(demo / "results/demo/runs" / run / f, records / run / f)
    work = tmp_path / "work"
    shutil.copytree(demo, work, symlinks=True)  # mtimes kept: only what is removed reruns
    for run in RUNS:  # Table 1 and its runs, as a tree that has not made them yet
        shutil.rmtree(work / "results/demo/runs" / run)
    for f in (work / "results/demo/report").glob("*table1*"):
        f.unlink()
    (work / "finished.yaml").write_text(yaml.safe_dump({"finished_runs": [str(records)]}))
    res = snakemake(work, "table1", "--configfile", "finished.yaml")
    jobs = _jobs(res.stderr)
    assert jobs == sorted([("adopt_run", r) for r in RUNS[::2]] + [("train", r) for r in RUNS[1::2]]
                                  + [("evaluate", r) for r in RUNS[1::2]]), res.stderr[-5000:]
    report, mine = work / "results/demo/report/table1.md", demo / "results/demo/report/table1.md"
    assert _table(report.read_text()) == _table(mine.read_text())
    assert_same_tables(demo, work, names=["table1"])
    assert ("From records made elsewhere (finished_runs: " + str(records) + "): table1-grassmann-s0, "
            "table1-transformer-s0; the others trained in this tree.") in report.read_text()
    for run in RUNS[::2]:
        adopted = json.loads((work / "results/demo/runs" / run / "adopted.json").read_text())
        assert adopted["source"] == str(records / run)
        assert (work / "results/demo/runs" / run / "eval.json").read_bytes() == (records / run / "eval.json").read_bytes()
    assert "adopted_from" in (work / "results/demo/report/table1.csv").read_text().splitlines()[0]

    # another run's record (its spec), then one made on other data: the adoption refuses it by name, and
    # writes nothing (the job's own command, on the demo's files)
    from grassflow.lm import adopt

    tokens = demo / "results/demo/data/tokens/trained"
    spec = json.loads((records / "table1-grassmann-s0/run.json").read_text())["spec"]
    args = ["--spec", json.dumps(spec), "--records",
            str(records / "table1-grassmann-s0"), "--train", str(tokens / "train.parquet"), "--validation",
            str(tokens / "validation.parquet"), "--test", str(tokens / "test.parquet"), "--validation-docs",
            str(tokens / "docs/validation.parquet"), "--test-docs", str(tokens / "docs/test.parquet")]
    rec_file = records / "table1-grassmann-s0/run.json"
    good = rec_file.read_text()
    for edit, said in ((lambda r: r["spec"]["train"].update(lr=1.0), "its spec differs from this preset's "
                        "table1-grassmann-s0 at train.lr (0.003 here, 1.0 there)"),
                       (lambda r: r["data"]["train"].update(file_sha256="0" * 64), "run.json's training tokens have "
                        "sha256 " + "0" * 64)):
        rec = json.loads(good)
        edit(rec)
        rec_file.write_text(json.dumps(rec))
        out = tmp_path / "refused"
        assert adopt.main([*args, "--out-dir", str(out)]) == 1
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {rec_file.parent}") and said in err[0], err
        assert not out.exists()  # nothing written: no partial adoption
