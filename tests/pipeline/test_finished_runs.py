"""Runs finished elsewhere join a table from their records (config finished_runs, rule adopt_run,
grassflow.lm.adopt): a GPU lease's committed runs, another allocation's, a colleague's. Through the
DAG, a table half adopted and half trained: the GPU window's third lease
(tests/gpu/test_paper_window.py), which adopts seed 0 from the second's records, trains seed 1 and
makes the second's table. Here the adoption's own command, on the demo's files: the demo's record is
adopted as it is, and a record of another run (its spec) or of other data is refused by name, with
nothing written."""

from __future__ import annotations

import json
import shutil

from grassflow.lm import adopt

RUN = "table1-grassmann-s0"


def test_a_record_is_adopted_as_it_is_and_one_of_another_run_or_other_data_refused(demo, tmp_path, capfd):
    records = tmp_path / "records" / RUN
    records.mkdir(parents=True)
    for f in adopt.RECORDS:
        shutil.copy2(demo / "results/demo/runs" / RUN / f, records / f)
    tokens = demo / "results/demo/data/tokens/trained"
    rec_file = records / "run.json"
    good = rec_file.read_text()
    args = ["--spec", json.dumps(json.loads(good)["spec"]), "--records", str(records),
            "--train", str(tokens / "train.parquet"), "--validation", str(tokens / "validation.parquet"),
            "--test", str(tokens / "test.parquet"), "--validation-docs", str(tokens / "docs/validation.parquet"),
            "--test-docs", str(tokens / "docs/test.parquet")]

    assert adopt.main([*args, "--out-dir", str(tmp_path / "adopted")]) == 0
    for f in adopt.RECORDS:
        assert (tmp_path / "adopted" / f).read_bytes() == (records / f).read_bytes()
    said = json.loads((tmp_path / "adopted/adopted.json").read_text())
    assert said["source"] == str(records) and said["commit"] == json.loads(good)["git"]["commit"]

    for edit, why in ((lambda r: r["spec"]["train"].update(lr=1.0), "its spec differs from this preset's "
                       f"{RUN} at train.lr (0.003 here, 1.0 there)"),
                      (lambda r: r["data"]["train"].update(file_sha256="0" * 64), "run.json's training tokens have "
                       "sha256 " + "0" * 64)):
        rec = json.loads(good)
        edit(rec)
        rec_file.write_text(json.dumps(rec))
        out = tmp_path / "refused"
        assert adopt.main([*args, "--out-dir", str(out)]) == 1
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {records}") and why in err[0], err
        assert not out.exists()  # nothing written: no partial adoption
