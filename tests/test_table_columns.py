"""Every column of a table held to its source: run records whose every split and metric has a
distinct value, through the real aggregate; each cell checked against the one value it must come
from (a validation/test or chunked/strided swap in the reader fails here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from grassflow.report.aggregate import _fmt, aggregate, mean_std, tex_escape

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "reports/wikitext2-v1-laptop"  # real records of a finished run: their shape
# a distinct value per (split, metric): validation's and test's chunked, strided and word-level
OFFSETS = {("validation", "chunked_ppl"): 1, ("validation", "strided_ppl"): 2, ("validation", "word_ppl"): 3,
           ("test", "chunked_ppl"): 4, ("test", "strided_ppl"): 5, ("test", "word_ppl"): 6}


def _runs(tmp_path) -> dict[str, dict]:
    """Two seeds per model, each run's values 100·(its index + 1) + the (split, metric) offset."""
    out = {}
    for i, (model, seed) in enumerate((m, s) for m in ("transformer", "grassmann") for s in (0, 1)):
        run_id, d = f"table1-{model}-s{seed}", tmp_path / "runs" / f"table1-{model}-s{seed}"
        d.mkdir(parents=True)
        src = TEMPLATE / "runs" / f"table1-{model}-s0"
        rec, ev = (json.loads((src / f).read_text()) for f in ("run.json", "eval.json"))
        rec["run_id"], rec["spec"]["seed"], rec["spec"]["run_id"] = run_id, seed, run_id
        rec["n_params"] = 1000 + i
        values = {}
        for (split, metric), off in OFFSETS.items():
            ev[split][metric] = values[split, metric] = 100.0 * (i + 1) + off
        (d / "run.json").write_text(json.dumps(rec))
        (d / "eval.json").write_text(json.dumps(ev))
        shutil.copy(src / "metrics.jsonl", d / "metrics.jsonl")
        out[run_id] = {"dir": d, "model": model, "values": values, "n_params": 1000 + i}
    return out


def test_every_lm_table_column_comes_from_its_own_split_and_metric(tmp_path):
    from grassflow.config import select_preset
    from grassflow.plan import load_config

    runs = _runs(tmp_path)
    name, preset = select_preset(load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1"))
    preset = {**preset, "seeds": [0, 1]}
    out = tmp_path / "report"
    aggregate(preset, name, "table1", [str(r["dir"]) for r in runs.values()], out,
              str(TEMPLATE / "data/unigram.json"), str(TEMPLATE / "data/checksums.json"),
              str(ROOT / "workflow/resources/published.yaml"))
    csv = pd.read_csv(out / "table1.csv").set_index("run_id")
    columns = {"val_ppl": ("validation", "chunked_ppl"), "test_ppl": ("test", "chunked_ppl"),
               "test_strided_ppl": ("test", "strided_ppl"), "test_word_ppl": ("test", "word_ppl")}
    for run_id, r in runs.items():
        for col, source in columns.items():
            assert csv.loc[run_id, col] == r["values"][source], (run_id, col)
        assert csv.loc[run_id, "n_params"] == r["n_params"]
    md = (out / "table1.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in md.splitlines()
            if line.startswith(("| transformer ", "| grassmann "))}
    for model in ("transformer", "grassmann"):
        mine = [r for r in runs.values() if r["model"] == model]
        cells = rows[model]
        expect = {3: ("validation", "chunked_ppl"), 5: ("test", "chunked_ppl"), 6: ("test", "strided_ppl"),
                  7: ("test", "word_ppl")}
        for col, source in expect.items():
            assert cells[col] == _fmt(*mean_std(pd.Series([r["values"][source] for r in mine]))), (model, col)
        assert cells[1] == f"{mine[0]['n_params']:,}"
    tex = (out / "table1.tex").read_text()
    for model in ("transformer", "grassmann"):
        mine = [r for r in runs.values() if r["model"] == model]
        val, test = (tex_escape(_fmt(*mean_std(pd.Series([r["values"][s, "chunked_ppl"] for r in mine]))))
                     for s in ("validation", "test"))
        assert f"{model} & {mine[0]['n_params']:,} & {val} & " in tex and f"& {test} " + "\\\\" in tex
    t_val = [r["values"]["validation", "chunked_ppl"] for r in runs.values() if r["model"] == "transformer"]
    g_val = [r["values"]["validation", "chunked_ppl"] for r in runs.values() if r["model"] == "grassmann"]
    gap = 100 * (sum(g_val) / 2 - sum(t_val) / 2) / (sum(t_val) / 2)
    assert f"best validation PPL: **{gap:+.1f} %**" in md


@pytest.fixture(autouse=True)
def _template_present():
    if not (TEMPLATE / "runs/table1-grassmann-s0/run.json").is_file():
        pytest.fail(f"{TEMPLATE}: the committed records these tests take their shape from are missing")
