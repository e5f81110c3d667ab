"""SNLI tables (paper Table 3 and the from-scratch variant): Markdown, CSV, LaTeX, curves.

Per experiment: `snli_<exp>.csv` holds one row per run with its provenance (record, commit, data,
backbone and checkpoint hashes); `snli_<exp>.md`/`.tex` hold accuracy (mean ± std over seeds) beside
the paper's, per-class test accuracy, and the Grassmann − Transformer difference with a 95 % CI.
Diverged runs are listed and left out of the means.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from grassflow import job, markdown
from grassflow.io import write_text
from grassflow.report import figures
from grassflow.report.stats import diff_ci, mean_std
from grassflow.report.tables import (
    MODELS,
    aggregate_args,
    by_model,
    fmt,
    latex,
    no_gap_reason,
    read_runs,
    record_links,
    write_tables,
)
from grassflow.snli.synthetic import LABELS


def load_snli_runs(run_dirs) -> pd.DataFrame:
    def columns(rec, ev, ok, val, test):
        spec, per_class = rec["spec"], test.get("per_class_accuracy") or {}
        return {
            "run_id": rec["run_id"],
            "experiment": spec["experiment"],
            "model": spec["model_kind"],
            "seed": spec["seed"],
            "status": rec["status"]["state"],
            "best_epoch": rec["best_epoch"],
            "val_acc": val.get("accuracy", math.nan) if ok else math.nan,
            "test_acc": test.get("accuracy", math.nan) if ok else math.nan,
            **{
                f"test_acc_{c}": (
                    per_class.get(c) if ok and per_class.get(c) is not None else math.nan
                )
                for c in LABELS
            },
            "test_pairs": test.get("n"),
            "n_params": rec["n_params"],
            "features": rec["features"]["kind"],
            "backbone_sha256": rec["features"].get("weights_sha256"),
        }

    return read_runs(run_dirs, columns)


def summarise(df: pd.DataFrame, exp: dict) -> dict:
    out, paper = {"models": {}}, exp.get("paper_acc", {})
    keys = ["val_acc", "test_acc"] + [f"test_acc_{c}" for c in LABELS]
    for model, (sub, good) in by_model(df, "val_acc").items():
        out["models"][model] = {
            "n": len(sub),
            "n_ok": len(good),
            "n_params": int(sub.n_params.iloc[0]),
            "stats": {k: mean_std(good[k].dropna()) for k in keys},
            "values": {k: list(good[k]) for k in ("val_acc", "test_acc")},
            "diverged": sorted(sub[sub.status == "diverged"].run_id),
            "paper": paper.get(model, {}),
            "records": list(sub.record),
        }
    m = out["models"]
    if all(k in m and m[k]["n_ok"] for k in MODELS):
        out["diff"] = {
            split: diff_ci(m["grassmann"]["values"][split], m["transformer"]["values"][split])
            for split in ("val_acc", "test_acc")
        }
    if all(paper.get(k, {}).get("test") is not None for k in MODELS):
        out["paper_diff"] = paper["grassmann"]["test"] - paper["transformer"]["test"]
    return out


def _verdict(d: dict) -> str:
    if math.isnan(d["ci_low"]):
        return "no CI (one seed per head)"
    if d["ci_low"] > 0:
        return "Grassmann head better at 95 %"
    if d["ci_high"] < 0:
        return "Transformer head better at 95 %"
    return "no significant difference at 95 %"


def _paper(paper: dict, split: str) -> str:
    return f"{paper[split]:.2f}" if paper.get(split) is not None else "—"


def markdown_table(exp_name, exp, s, out_dir) -> str:
    what = (
        "frozen backbone features"
        if exp["features"] == "backbone"
        else "from scratch (trainable embeddings)"
    )
    rows = []
    for model, m in s["models"].items():
        st, paper = m["stats"], m["paper"]
        div = f" ({len(m['diverged'])} diverged)" if m["diverged"] else ""
        rows.append(
            [
                model,
                f"{m['n_params']:,}",
                f"{m['n_ok']}/{m['n']}{div}",
                fmt(*st["val_acc"], digits=2),
                _paper(paper, "validation"),
                fmt(*st["test_acc"], digits=2),
                _paper(paper, "test"),
                " / ".join(fmt(st[f"test_acc_{c}"][0], math.nan) for c in LABELS),
                record_links(m["records"], out_dir),
            ]
        )
    lines = [
        f"### SNLI {exp_name}: {what}, {exp['epochs']} epochs, batch {exp['batch_size']}",
        "",
        *markdown.table(
            [
                "head",
                "trainable params",
                "runs ok",
                "val acc (ours)",
                "paper val",
                "test acc (ours)",
                "paper test",
                "test acc E / N / C",
                "provenance",
            ],
            rows,
        ),
        "",
    ]
    if "diff" in s:
        parts = []
        for split, name in (("val_acc", "validation"), ("test_acc", "test")):
            d = s["diff"][split]
            ci = (
                ""
                if math.isnan(d["ci_low"])
                else f" (95 % CI {d['ci_low']:+.2f} … {d['ci_high']:+.2f})"
            )
            parts.append(f"{name} **{d['diff']:+.2f}** points{ci}: {_verdict(d)}")
        paper = f" Paper (test): {s['paper_diff']:+.2f} points." if "paper_diff" in s else ""
        lines.append("Grassmann − Transformer accuracy: " + "; ".join(parts) + "." + paper)
    else:
        lines.append(f"Difference not computed: {no_gap_reason(s['models'], 'head')}.")
    return "\n".join(lines) + "\n"


def latex_table(exp_name, exp, s) -> str:
    rows = [
        [
            model,
            f"{m['n_params']:,}",
            fmt(*m["stats"]["val_acc"], digits=2),
            _paper(m["paper"], "validation"),
            fmt(*m["stats"]["test_acc"], digits=2),
            _paper(m["paper"], "test"),
        ]
        for model, m in s["models"].items()
    ]
    return latex(
        ["Head", "Params", "Val (ours)", "Val (paper)", "Test (ours)", "Test (paper)"],
        rows,
        f"SNLI {exp_name} ({exp['features']}): accuracy (%), mean ± std over seeds.",
    )


def aggregate_snli(preset: dict, preset_name: str, runs, out_dir) -> None:
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    snli = preset["snli"]
    df = load_snli_runs(runs)
    src = snli["data"]["source"]
    head = (
        f"Preset **{preset_name}**: SNLI "
        + (
            "from SYNTHETIC pairs with a RANDOM tiny backbone — not comparable to the paper"
            if src == "synthetic"
            else f"{snli['data']['dataset']} ({src}, revision {snli['data'].get('revision')})"
        )
        + f"; tokenizer {snli['tokenizer']['name']}."
    )
    summary = [f"# grassflow SNLI results — preset `{preset_name}`", "", head, ""]
    for exp_name, exp in snli["experiments"].items():
        sub = df[df.experiment == exp_name].sort_values(["model", "seed"])
        s = summarise(sub, exp)
        md = markdown_table(exp_name, exp, s, out)
        write_tables(
            out,
            f"snli_{exp_name}",
            head,
            md,
            sub.assign(preset=preset_name, data_source=src),
            latex_table(exp_name, exp, s),
        )
        figures.curves(
            sub,
            f"SNLI {exp_name}",
            preset_name,
            out / f"snli_curves_{exp_name}.png",
            key="val_acc",
            ylabel="validation accuracy (%)",
            log=False,
        )
        summary += [md, ""]
    write_text(out / "snli_summary.md", "\n".join(summary) + "\n")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    aggregate_args(p)
    a = p.parse_args(argv)
    return job.run(aggregate_snli, a.preset, a.preset_name, a.runs, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
