"""Every column of a table held to its source: run records whose every split and metric has a
distinct value, through the real aggregate; each cell checked against the one value it must come
from (a validation/test or chunked/strided swap in the reader fails here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from grassflow.lm.aggregate import aggregate
from grassflow.report.stats import mean_std
from grassflow.report.tables import fmt, tex_escape
from helpers.records import TEMPLATE, distinct_runs

ROOT = Path(__file__).resolve().parents[2]


def test_every_lm_table_column_comes_from_its_own_split_and_metric(tmp_path):
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    runs = distinct_runs(tmp_path)
    name, preset = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1")
    )
    preset = {**preset, "seeds": [0, 1]}
    out = tmp_path / "report"
    aggregate(
        preset,
        name,
        "table1",
        [str(r["dir"]) for r in runs.values()],
        out,
        str(TEMPLATE / "data/unigram.json"),
        str(TEMPLATE / "data/checksums.json"),
        str(ROOT / "workflow/resources/published.yaml"),
    )
    csv = pd.read_csv(out / "table1.csv").set_index("run_id")
    columns = {
        "val_ppl": ("validation", "chunked_ppl"),
        "test_ppl": ("test", "chunked_ppl"),
        "test_strided_ppl": ("test", "strided_ppl"),
        "test_word_ppl": ("test", "harness"),
    }
    for run_id, r in runs.items():
        for col, source in columns.items():
            assert csv.loc[run_id, col] == r["values"][source], (run_id, col)
        assert csv.loc[run_id, "n_params"] == r["n_params"]
    md = (out / "table1.md").read_text()
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")
        for line in md.splitlines()
        if line.startswith(("| transformer ", "| grassmann "))
    }
    for model in ("transformer", "grassmann"):
        mine = [r for r in runs.values() if r["model"] == model]
        cells = rows[model]
        expect = {
            3: ("validation", "chunked_ppl"),
            5: ("test", "chunked_ppl"),
            6: ("test", "strided_ppl"),
            7: ("test", "harness"),
        }
        for col, source in expect.items():
            assert cells[col] == fmt(*mean_std(pd.Series([r["values"][source] for r in mine]))), (
                model,
                col,
            )
        assert cells[1] == f"{mine[0]['n_params']:,}"
    tex = (out / "table1.tex").read_text()
    for model in ("transformer", "grassmann"):
        mine = [r for r in runs.values() if r["model"] == model]
        val, test = (
            tex_escape(fmt(*mean_std(pd.Series([r["values"][s, "chunked_ppl"] for r in mine]))))
            for s in ("validation", "test")
        )
        assert (
            f"{model} & {mine[0]['n_params']:,} & {val} & " in tex and f"& {test} " + "\\\\" in tex
        )
    t_val = [
        r["values"]["validation", "chunked_ppl"]
        for r in runs.values()
        if r["model"] == "transformer"
    ]
    g_val = [
        r["values"]["validation", "chunked_ppl"] for r in runs.values() if r["model"] == "grassmann"
    ]
    gap = 100 * (sum(g_val) / 2 - sum(t_val) / 2) / (sum(t_val) / 2)
    assert f"best validation PPL: **{gap:+.1f} %**" in md


@pytest.fixture(autouse=True)
def _template_present():
    if not (TEMPLATE / "runs/table1-grassmann-s0/run.json").is_file():
        pytest.fail(
            f"{TEMPLATE}: the committed records these tests take their shape from are missing"
        )


def _copies(demo, task: str, templates: dict, tmp_path, values) -> dict[str, dict]:
    """Run directories made from the demo's records of `task` ({run_id: template run_id}), each
    eval.json's numbers set by `values(i, eval.json)` (distinct per run, split and metric)."""
    out = {}
    for i, (run_id, template) in enumerate(templates.items()):
        src, d = demo / "results/demo" / task / "runs" / template, tmp_path / "runs" / run_id
        d.mkdir(parents=True)
        rec, ev = (json.loads((src / f).read_text()) for f in ("run.json", "eval.json"))
        seed = int(run_id.rsplit("-s", 1)[1])
        rec["run_id"], rec["spec"]["run_id"], rec["spec"]["seed"] = run_id, run_id, seed
        out[run_id] = {
            "dir": d,
            "values": values(i, ev),
            "model": rec["spec"].get("model_name", rec["spec"]["model_kind"]),
        }
        (d / "run.json").write_text(json.dumps(rec))
        (d / "eval.json").write_text(json.dumps(ev))
        shutil.copy(src / "metrics.jsonl", d / "metrics.jsonl")
    return out


def _md_rows(md: str, first_cells) -> dict[str, list[str]]:
    return {
        cells[0]: cells
        for line in md.splitlines()
        if line.startswith("| ")
        for cells in [line.strip("| \n").split(" | ")]
        if cells[0] in first_cells
    }


def test_every_snli_table_column_comes_from_its_own_split_and_metric(demo, tmp_path):
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config
    from grassflow.snli.aggregate import aggregate_snli
    from grassflow.snli.synthetic import LABELS

    def values(i, ev):  # validation, test and each class's test accuracy: distinct everywhere
        v = {("validation", "accuracy"): 40.0 + i, ("test", "accuracy"): 50.0 + i}
        v.update({("test", c): 60.0 + 10 * k + i for k, c in enumerate(LABELS)})
        ev["validation"]["accuracy"], ev["test"]["accuracy"] = (
            v["validation", "accuracy"],
            v["test", "accuracy"],
        )
        ev["test"]["per_class_accuracy"] = {c: v["test", c] for c in LABELS}
        return v

    templates = {
        f"table3-{m}-s{s}": f"table3-{m}-s0" for m in ("transformer", "grassmann") for s in (0, 1)
    }
    runs = _copies(demo, "snli", templates, tmp_path, values)
    name, preset = select_preset(load_config(ROOT, preset="demo"))
    preset = {
        **preset,
        "snli": {
            **preset["snli"],
            "seeds": [0, 1],
            "experiments": {"table3": preset["snli"]["experiments"]["table3"]},
        },
    }
    aggregate_snli(preset, name, [str(r["dir"]) for r in runs.values()], tmp_path / "report")
    csv = pd.read_csv(tmp_path / "report/snli_table3.csv").set_index("run_id")
    for run_id, r in runs.items():
        assert csv.loc[run_id, "val_acc"] == r["values"]["validation", "accuracy"]
        assert csv.loc[run_id, "test_acc"] == r["values"]["test", "accuracy"]
        for c in LABELS:
            assert csv.loc[run_id, f"test_acc_{c}"] == r["values"]["test", c], (run_id, c)
    rows = _md_rows((tmp_path / "report/snli_table3.md").read_text(), ("transformer", "grassmann"))
    for model in ("transformer", "grassmann"):
        mine = [r["values"] for r in runs.values() if r["model"] == model]
        val, test = (
            fmt(*mean_std(pd.Series([v[key] for v in mine])), digits=2)
            for key in (("validation", "accuracy"), ("test", "accuracy"))
        )
        assert rows[model][3] == val and rows[model][5] == test
        assert rows[model][7] == " / ".join(
            fmt(mean_std(pd.Series([v["test", c] for v in mine]))[0], float("nan")) for c in LABELS
        )


def test_every_recall_table_column_comes_from_its_own_split(demo, tmp_path):
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config
    from grassflow.recall.aggregate import aggregate_recall

    def values(i, ev):
        v = {("validation", "accuracy"): 10.0 + i, ("test", "accuracy"): 30.0 + i}
        ev["validation"]["accuracy"], ev["test"]["accuracy"] = (
            v["validation", "accuracy"],
            v["test", "accuracy"],
        )
        return v

    templates = {
        f"L32-kv4-d32-{m}-lr0.001-s{s}": f"L32-kv4-d32-{m}-lr0.001-s0"
        for m in ("transformer", "grassmann")
        for s in (0, 1)
    }
    runs = _copies(demo, "recall", templates, tmp_path, values)
    name, preset = select_preset(load_config(ROOT, preset="demo"))
    aggregate_recall(
        {**preset, "recall": {**preset["recall"], "seeds": [0, 1]}},
        name,
        [str(r["dir"]) for r in runs.values()],
        tmp_path / "report",
    )
    csv = pd.read_csv(tmp_path / "report/recall.csv").set_index("run_id")
    for run_id, r in runs.items():
        assert csv.loc[run_id, "val_acc"] == r["values"]["validation", "accuracy"]
        assert csv.loc[run_id, "test_acc"] == r["values"]["test", "accuracy"]
    md = (tmp_path / "report/recall.md").read_text()
    for model in ("transformer", "grassmann"):
        mine = [r["values"] for r in runs.values() if r["model"] == model]
        row = next(
            line.strip("| ").split(" | ") for line in md.splitlines() if f"| {model} |" in line
        )
        assert row[6] == fmt(*mean_std(pd.Series([v["validation", "accuracy"] for v in mine])))
        assert row[7] == fmt(*mean_std(pd.Series([v["test", "accuracy"] for v in mine])))


def test_every_ablation_table_column_comes_from_its_own_split(tmp_path):
    from grassflow.lm.ablations import aggregate_ablations
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    runs = distinct_runs(tmp_path)
    name, preset = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1")
    )
    wider = []  # an r: 64 variant's Grassmann runs: more parameters
    for run_id in [r for r in runs if "-grassmann-" in r]:
        twin = tmp_path / "runs" / run_id.replace("table1", "table1_r64")
        shutil.copytree(runs[run_id]["dir"], twin)
        rec = json.loads((twin / "run.json").read_text())
        rec["run_id"] = rec["spec"]["run_id"] = twin.name
        rec["n_params"] = 2 * runs[run_id]["n_params"]
        (twin / "run.json").write_text(json.dumps(rec))
        wider.append(twin.name)
    preset = {
        **preset,
        "seeds": [0, 1],
        "ablations": {
            "base": "table1",
            "seeds": [0, 1],
            "variants": {"laptop": {}, "r64": {"r": 64}},
        },
    }
    grid = {
        "laptop": {m: [r for r in runs if f"-{m}-" in r] for m in ("transformer", "grassmann")},
        "r64": {"transformer": [r for r in runs if "-transformer-" in r], "grassmann": wider},
    }
    aggregate_ablations(
        preset,
        name,
        grid,
        str(tmp_path / "runs"),
        str(TEMPLATE / "data/unigram.json"),
        str(TEMPLATE / "data/checksums.json"),
        str(ROOT / "workflow/resources/published.yaml"),
        tmp_path / "report",
    )
    csv = pd.read_csv(tmp_path / "report/ablations.csv")
    # a shared run is listed under each variant
    csv = csv[csv.variant == "laptop"].set_index("run_id")
    for run_id, r in runs.items():
        assert csv.loc[run_id, "val_ppl"] == r["values"]["validation", "chunked_ppl"]
        assert csv.loc[run_id, "test_ppl"] == r["values"]["test", "chunked_ppl"]
    row = next(
        line.strip("| ").split(" | ")
        for line in (tmp_path / "report/ablations.md").read_text().splitlines()
        if line.startswith("| laptop |")
    )
    cells = {
        (m, s): fmt(
            *mean_std(
                pd.Series([r["values"][s, "chunked_ppl"] for r in runs.values() if r["model"] == m])
            )
        )
        for m in ("transformer", "grassmann")
        for s in ("validation", "test")
    }
    assert row[2:6] == [
        cells["transformer", "validation"],
        cells["transformer", "test"],
        cells["grassmann", "validation"],
        cells["grassmann", "test"],
    ]
    wide = next(
        line.strip("| ").split(" | ")
        for line in (tmp_path / "report/ablations.md").read_text().splitlines()
        if line.startswith("| r64 |")
    )
    base_params = runs["table1-grassmann-s0"]["n_params"]
    # the Grassmann params column
    assert (row[9], wide[9]) == (
        f"{base_params:,}",
        f"{2 * base_params:,} (+100.0 %)",
    )


def test_the_ablation_table_reads_its_settings_from_the_runs_records(tmp_path):
    """N, L, B and epochs, and the model a receptive field is of, as the runs ran them, not as the
    preset says: records whose every run has N=3 and B=7 make the header, the comparability and the
    receptive field say so; one record that disagrees is refused, naming the setting."""
    from grassflow.errors import DataError
    from grassflow.lm.ablations import aggregate_ablations
    from grassflow.pipeline.presets import select_preset
    from grassflow.pipeline.preview import load_config

    runs = distinct_runs(tmp_path)
    for r in runs.values():
        rec = json.loads((r["dir"] / "run.json").read_text())
        rec["spec"]["model"]["n_layers"], rec["spec"]["train"]["batch_size"] = 3, 7
        (r["dir"] / "run.json").write_text(json.dumps(rec))
    name, preset = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1")
    )
    assert (
        preset["experiments"]["table1"]["n_layers"],
        preset["experiments"]["table1"]["batch_size"],
    ) != (3, 7)
    preset = {
        **preset,
        "seeds": [0, 1],
        "ablations": {"base": "table1", "seeds": [0, 1], "variants": {"laptop": {}}},
    }
    grid = {"laptop": {m: [r for r in runs if f"-{m}-" in r] for m in ("transformer", "grassmann")}}

    def table():
        aggregate_ablations(
            preset,
            name,
            grid,
            str(tmp_path / "runs"),
            str(TEMPLATE / "data/unigram.json"),
            str(TEMPLATE / "data/checksums.json"),
            str(ROOT / "workflow/resources/published.yaml"),
            tmp_path / "report",
        )
        return (tmp_path / "report/ablations.md").read_text()

    md = table()
    assert "### Ablations of table1: N=3, L=64, B=7, 1 epochs" in md, md
    assert "n_layers 3 (paper 6)" in md  # the comparability judged on the records' N
    row = next(
        line.strip("| ").split(" | ") for line in md.splitlines() if line.startswith("| laptop |")
    )
    assert row[10] == str(3 * 16)  # three layers, each reaching back 16 tokens
    odd = runs["table1-grassmann-s1"]["dir"] / "run.json"
    rec = json.loads(odd.read_text())
    rec["spec"]["model"]["n_layers"] = 4
    odd.write_text(json.dumps(rec))
    with pytest.raises(DataError, match="disagree on n_layers"):
        table()
