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


def test_a_record_is_adopted_as_it_is_and_one_of_another_run_or_other_data_refused(
    demo, tmp_path, capfd
):
    records = tmp_path / "records" / RUN
    records.mkdir(parents=True)
    for f in adopt.RECORDS:
        shutil.copy2(demo / "results/demo/runs" / RUN / f, records / f)
    tokens = demo / "results/demo/data/tokens/trained"
    rec_file = records / "run.json"
    good = rec_file.read_text()
    args = [
        "--spec",
        json.dumps(json.loads(good)["spec"]),
        "--records",
        str(records),
        "--train",
        str(tokens / "train.parquet"),
        "--validation",
        str(tokens / "validation.parquet"),
        "--test",
        str(tokens / "test.parquet"),
        "--validation-docs",
        str(tokens / "docs/validation.parquet"),
        "--test-docs",
        str(tokens / "docs/test.parquet"),
    ]

    assert adopt.main([*args, "--out-dir", str(tmp_path / "adopted")]) == 0
    for f in adopt.RECORDS:
        assert (tmp_path / "adopted" / f).read_bytes() == (records / f).read_bytes()
    said = json.loads((tmp_path / "adopted/adopted.json").read_text())
    assert said["source"] == str(records) and said["commit"] == json.loads(good)["git"]["commit"]

    for edit, why in (
        (
            lambda r: r["spec"]["train"].update(lr=1.0),
            f"its spec differs from this preset's {RUN} at train.lr (0.003 here, 1.0 there)",
        ),
        (
            lambda r: r["data"]["train"].update(file_sha256="0" * 64),
            "run.json's training tokens have sha256 " + "0" * 64,
        ),
    ):
        rec = json.loads(good)
        edit(rec)
        rec_file.write_text(json.dumps(rec))
        out = tmp_path / "refused"
        assert adopt.main([*args, "--out-dir", str(out)]) == 1
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {records}") and why in err[0], err
        assert not out.exists()  # nothing written: no partial adoption


def _metrics_edit(n, **kw):
    """metrics.jsonl with epoch n's row (its line n) changed."""

    def edit(lines):
        rows = [json.loads(line) for line in lines]
        rows[n - 1].update(kw)
        return [json.dumps(r) for r in rows]

    return edit


# records crafted at each string a table prints and each number it reads: (file, edit, the refusal)
CRAFTED = [
    (
        "run.json",
        lambda r: r["git"].update(commit="<script>alert(1)</script>"),
        "run.json: git.commit '<script>alert(1)</script>' is not a commit id",
    ),
    (
        "run.json",
        lambda r: r["git"].update(commit="0123abc"),
        "run.json: git.commit '0123abc' is not a commit id",
    ),
    (
        "run.json",
        lambda r: r["git"].update(dirty="no"),
        "run.json: git.dirty 'no' is not true, false or null",
    ),
    (
        "run.json",
        lambda r: r["status"].update(state="completed | <b>x</b>"),
        "run.json: status.state 'completed | <b>x</b>' is not one of completed, diverged",
    ),
    (
        "run.json",
        lambda r: r.update(best_epoch=99),
        "run.json: best_epoch 99 is not a recorded epoch (1 … 3",
    ),
    (
        "run.json",
        lambda r: r.update(best_epoch=1),
        "run.json: best_epoch 1 is not the epoch of the lowest validation loss",
    ),
    (
        "run.json",
        lambda r: r.update(best_val_ppl=r["best_val_ppl"] * 0.9),
        "run.json: best_val_ppl",
    ),
    (
        "run.json",
        lambda r: r.update(epochs_completed=7),
        "run.json: epochs_completed 7 is not metrics.jsonl's 3 epochs",
    ),
    (
        "run.json",
        lambda r: r.update(wall_seconds=float("nan")),
        "run.json: wall_seconds nan is not a duration",
    ),
    (
        "run.json",
        lambda r: r.update(n_params=-1),
        "run.json: n_params -1 is not a count of parameters",
    ),
    (
        "metrics.jsonl",
        _metrics_edit(1, val_ppl=0.5),
        "metrics.jsonl: epoch 1's val_ppl 0.5 is not a perplexity",
    ),
    (
        "metrics.jsonl",
        _metrics_edit(2, epoch=5),
        "metrics.jsonl: epoch [1, 5, 3] are not the epochs 1, 2, … in order",
    ),
    (
        "eval.json",
        lambda e: e["validation"].update(chunked_ppl=float("nan")),
        "eval.json: validation.chunked_ppl nan is not a perplexity",
    ),
    (
        "eval.json",
        lambda e: e["test"].update(strided_ppl=0.99),
        "eval.json: test.strided_ppl 0.99 is not a perplexity",
    ),
    (
        "eval.json",
        lambda e: e["test"]["harness"].update(word_ppl="inf"),
        "eval.json: test.harness.word_ppl 'inf' is not a perplexity",
    ),
    # records that disagree with each other (mutations: each of report.agreement's cross-checks
    # removed)
    (  # not the best epoch's
        "eval.json",
        lambda e: e["validation"].update(chunked_ppl=e["validation"]["chunked_ppl"] * 1.05),
        "eval.json: validation.chunked_ppl",
    ),
    ("eval.json", lambda e: e.update(best_epoch=1), "eval.json: best_epoch 1 is not run.json's"),
    # both agree on a best eval.json lacks
    ("run.json+metrics.jsonl", None, "eval.json: validation.chunked_ppl"),
    # completed short, no reason
    ("spec", None, "run.json: epochs_completed 3 of its spec's 5 epochs"),
    (
        "run.json",
        lambda r: r["parts"][-1]["to"].update(epoch=2),
        "run.json: parts[-1].to.epoch 2 is not the run's last epoch",
    ),
]


def _agreeing_on_another_best(good: dict, best: int) -> dict:
    """run.json and metrics.jsonl both saying the best epoch's validation PPL is 1 % lower than the
    evaluation's: they agree with each other, not with it."""
    rows = [json.loads(line) for line in good["metrics.jsonl"].splitlines()]
    rows[best - 1]["val_ppl"] *= 0.99
    rec = json.loads(good["run.json"])
    rec["best_val_ppl"] = rows[best - 1]["val_ppl"]
    return {
        "metrics.jsonl": "\n".join(json.dumps(r) for r in rows) + "\n",
        "run.json": json.dumps(rec),
    }


def test_records_that_claim_what_they_are_not_are_refused_by_file_and_key(demo, tmp_path, capfd):
    """What a table prints or reads from an adopted record is checked for what it claims, through
    the adoption's command: each crafted record refused in one line naming its file and key, nothing
    written."""
    records = tmp_path / "records" / RUN
    records.mkdir(parents=True)
    for f in adopt.RECORDS:
        shutil.copy2(demo / "results/demo/runs" / RUN / f, records / f)
    good = {f: (records / f).read_text() for f in adopt.RECORDS}
    tokens = demo / "results/demo/data/tokens/trained"
    args = [
        "--spec",
        json.dumps(json.loads(good["run.json"])["spec"]),
        "--records",
        str(records),
        "--train",
        str(tokens / "train.parquet"),
        "--validation",
        str(tokens / "validation.parquet"),
        "--test",
        str(tokens / "test.parquet"),
        "--validation-docs",
        str(tokens / "docs/validation.parquet"),
        "--test-docs",
        str(tokens / "docs/test.parquet"),
    ]
    rec = json.loads(good["run.json"])
    best = rec["best_epoch"]
    assert rec["epochs_completed"] == 3 and best != 1, (
        "the crafted records below assume the demo's 3 epochs, best after 1"
    )
    for name, edit, why in CRAFTED:
        for f in adopt.RECORDS:
            (records / f).write_text(good[f])
        spec = json.loads(good["run.json"])["spec"]
        if name == "run.json+metrics.jsonl":
            for f, text in _agreeing_on_another_best(good, best).items():
                (records / f).write_text(text)
        # this tree's preset asks 5 epochs, and so does the record's spec; it trained 3
        elif name == "spec":
            spec["train"]["epochs"] = 5
            obj = json.loads(good["run.json"])
            obj["spec"] = spec
            (records / "run.json").write_text(json.dumps(obj))
        elif name == "metrics.jsonl":
            (records / name).write_text("\n".join(edit(good[name].splitlines())) + "\n")
        else:
            obj = json.loads(good[name])
            edit(obj)
            (records / name).write_text(json.dumps(obj))
        out = tmp_path / "refused"
        assert adopt.main(["--spec", json.dumps(spec), *args[2:], "--out-dir", str(out)]) == 1, why
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {records}/") and why in err[0], (
            why,
            err,
        )
        assert err[0].endswith(": not adopted"), err
        assert not out.exists()
