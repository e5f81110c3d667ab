"""What a table's job does with records in results/ that a full disk, an interrupted copy or an
editor damaged (grassflow.report.records): one `error:` line naming the file, exit 1, no table
written. A damaged record is never tabled."""

from __future__ import annotations

import json

import pytest

from helpers.dag import ROOT
from helpers.records import TEMPLATE, distinct_runs


def _truncate(p):
    p.write_text(p.read_text()[: len(p.read_text()) // 2])


def _key_dropped(key):
    def drop(p):
        obj = json.loads(p.read_text())
        obj.pop(key)
        p.write_text(json.dumps(obj))

    return drop


DAMAGES = [  # (file, damage, the error's words after the path)
    ("run.json", _truncate, "not JSON"),
    ("eval.json", _truncate, "not JSON"),
    ("eval.json", lambda p: p.write_bytes(b"\0" * 64), "not JSON"),
    ("run.json", lambda p: p.write_text("[]"), "not a JSON object"),
    ("run.json", lambda p: p.write_text(""), "not JSON"),
    ("eval.json", _key_dropped("weights_sha256"), "lacks 'weights_sha256'"),
    ("run.json", _key_dropped("status"), "lacks 'status'"),
    ("metrics.jsonl", _truncate, "not a JSON line"),
    ("metrics.jsonl", lambda p: p.write_text('{"val_ppl": 3.0}\n'), "not an epoch's record"),
]


@pytest.mark.parametrize(
    "name, damage, words", DAMAGES, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(DAMAGES)]
)
def test_a_damaged_record_fails_its_table_naming_the_file(name, damage, words, tmp_path, capfd):
    from grassflow import job
    from grassflow.lm.aggregate import aggregate
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    runs = distinct_runs(tmp_path)
    victim = runs["table1-grassmann-s1"]["dir"]
    damage(victim / name)
    preset_name, preset = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1")
    )
    out = tmp_path / "report"
    rc = job.run(
        aggregate,
        {**preset, "seeds": [0, 1]},
        preset_name,
        "table1",
        [str(r["dir"]) for r in runs.values()],
        out,
        str(TEMPLATE / "data/unigram.json"),
        str(TEMPLATE / "data/checksums.json"),
        str(ROOT / "workflow/resources/published.yaml"),
    )
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    named = victim if "lacks" in words else victim / name
    assert (
        err[0].startswith(f"error: {named}") and words in err[0] and "snakemake again" in err[0]
    ), err
    # no table, no figure: nothing that looks complete
    assert not out.exists() or not any(out.iterdir())
