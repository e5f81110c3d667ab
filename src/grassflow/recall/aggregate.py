"""The recall (MQAR) table and figures: `recall.md/.csv/.tex`, `recall_vs_dmodel.png`,
`recall_by_distance.png`.

Per (seq_len, kv) cell × d_model × model, the learning rate whose runs have the best mean validation
accuracy is chosen (zoology reports the best learning rate too; choosing on validation keeps test
out of the choice), and its test accuracy is reported as mean ± std over seeds, beside the model's
reach (tokens back it can see). The CSV holds one row per run, every learning rate included, with
provenance. A cell whose runs all diverged says so.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullFormatter

from grassflow import job, markdown
from grassflow.report.figures import save
from grassflow.report.stats import mean_std
from grassflow.report.tables import (
    aggregate_args,
    fmt,
    latex,
    read_runs,
    record_links,
    write_tables,
)


def load_recall_runs(run_dirs) -> pd.DataFrame:
    def columns(rec, ev, ok, val, test):
        spec = rec["spec"]
        return {
            "run_id": rec["run_id"],
            "cell": f"L{spec['cell']['seq_len']}-kv{spec['cell']['kv']}",
            "seq_len": spec["cell"]["seq_len"],
            "kv": spec["cell"]["kv"],
            "d_model": spec["model"]["d_model"],
            "model": spec["model_name"],
            "kind": spec["model_kind"],
            "lr": spec["train"]["lr"],
            "seed": spec["seed"],
            "status": rec["status"]["state"],
            "reach": ev.get("reach"),
            "val_acc": val.get("accuracy", math.nan) if ok else math.nan,
            "test_acc": test.get("accuracy", math.nan) if ok else math.nan,
            "test_answers": test.get("n"),
            "n_params": rec["n_params"],
            "test_by_distance": test.get("by_distance") if ok else None,
            "test_content_sha256": test.get("content_sha256"),
        }

    return read_runs(run_dirs, columns)


def best_lr(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell × d_model × model: the runs of the learning rate with the best mean validation
    accuracy (diverged runs count as 0 %, so a learning rate that diverges is not chosen)."""
    keys = ["cell", "d_model", "model"]
    scored = df.assign(val_score=df.val_acc.fillna(0.0))
    means = scored.groupby(keys + ["lr"], as_index=False).val_score.mean()
    pick = means.sort_values(["val_score", "lr"], ascending=[False, True]).drop_duplicates(keys)
    return df.merge(pick[keys + ["lr"]], on=keys + ["lr"])


def summarise(chosen: pd.DataFrame) -> list[dict]:
    out = []
    for (cell, d, model), g in chosen.groupby(["cell", "d_model", "model"], sort=False):
        good = g[g.status == "completed"].dropna(subset=["test_acc"])
        out.append(
            {
                "cell": cell,
                "seq_len": int(g.seq_len.iloc[0]),
                "kv": int(g.kv.iloc[0]),
                "d_model": int(d),
                "model": model,
                "lr": float(g.lr.iloc[0]),
                "reach": g.reach.iloc[0],
                "n": len(g),
                "n_ok": len(good),
                "test": mean_std(good.test_acc),
                "val": mean_std(good.val_acc),
                "records": list(g.record),
            }
        )
    return out


def markdown_table(rows: list[dict], n_lrs: int, out_dir) -> str:
    lines = markdown.table(
        [
            "cell",
            "d_model",
            "model",
            "reach (tokens)",
            "best lr",
            "runs ok",
            "val acc %",
            "test acc %",
            "provenance",
        ],
        [
            [
                r["cell"],
                r["d_model"],
                r["model"],
                r["reach"],
                f"{r['lr']:g}",
                f"{r['n_ok']}/{r['n']}",
                fmt(*r["val"]),
                fmt(*r["test"]),
                record_links(r["records"], out_dir),
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        f"Accuracy: exact match at the answer positions. Each row: the learning rate (of {n_lrs}) "
        "with the best mean validation accuracy, its test accuracy as mean ± std over seeds. "
        "Reach: how many tokens back the last layer can see (Grassmann: the sum over layers of "
        "the largest offset; a windowed Transformer: layers × window; full attention: the whole "
        "context).",
    ]
    return "\n".join(lines) + "\n"


def _log2_axis(ax, ticks) -> None:
    """A log axis labelled only at the given integers: matplotlib's own log labels collide (minor
    labels like 6×10¹ next to 64) on the narrow ranges these figures span."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def figure_vs_dmodel(rows: list[dict], preset: str, path) -> None:
    cells = sorted({(r["seq_len"], r["kv"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4 * len(cells), 3.5), squeeze=False)
    for ax, (L, kv) in zip(axes[0], cells):
        for model in dict.fromkeys(r["model"] for r in rows):
            pts = sorted(
                (r["d_model"], r["test"][0])
                for r in rows
                if (r["seq_len"], r["kv"], r["model"]) == (L, kv, model)
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=model)
        ax.set(
            title=f"L={L}, kv={kv}", xlabel="d_model", ylabel="test accuracy (%)", ylim=(-2, 102)
        )
        _log2_axis(ax, sorted({r["d_model"] for r in rows}))
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"MQAR accuracy vs model width — preset {preset}")
    save(fig, path)


def figure_by_distance(chosen: pd.DataFrame, preset: str, path) -> None:
    """Test accuracy by key–query distance, per model, at each cell's largest d_model; each model's
    reach drawn as a dashed line in its colour."""
    cells = sorted({(r.seq_len, r.kv) for r in chosen.itertuples()})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.5 * len(cells), 3.5), squeeze=False)
    for ax, (L, kv) in zip(axes[0], cells):
        sub = chosen[(chosen.seq_len == L) & (chosen.kv == kv)]
        sub = sub[sub.d_model == sub.d_model.max()]
        for i, (model, g) in enumerate(sub.groupby("model", sort=False)):
            color = f"C{i}"
            buckets = {}
            for by in g.test_by_distance.dropna():
                for b in by:
                    if b["accuracy"] is not None:
                        buckets.setdefault(math.sqrt(b["lo"] * b["hi"]), []).append(b["accuracy"])
            xs = sorted(buckets)
            ax.plot(
                xs,
                [sum(buckets[x]) / len(buckets[x]) for x in xs],
                marker="o",
                color=color,
                label=model,
            )
            if g.reach.notna().any():
                ax.axvline(float(g.reach.iloc[0]), color=color, ls="--", lw=1)
        ax.set(
            title=f"L={L}, kv={kv}, d_model={int(sub.d_model.max()) if len(sub) else '?'}",
            xlabel="key–query distance (tokens; points at bucket centres)",
            ylabel="test accuracy (%)",
            ylim=(-2, 102),
        )
        _log2_axis(ax, [2**k for k in range(int(L).bit_length())])  # the distance buckets' edges
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"MQAR accuracy by distance (dashed: each model's reach) — preset {preset}")
    save(fig, path)


def aggregate_recall(preset: dict, preset_name: str, runs, out_dir) -> None:
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    r = preset["recall"]
    # the rows in the order of their keys: cell, width, the preset's models, learning rate, seed
    order = {m: i for i, m in enumerate(r["models"])}
    df = load_recall_runs(runs)
    df = (
        df.assign(_model=df.model.map(order))
        .sort_values(["seq_len", "kv", "d_model", "_model", "lr", "seed"], kind="stable")
        .drop(columns="_model")
        .reset_index(drop=True)
    )
    chosen = best_lr(df)
    rows = summarise(chosen)
    head = (
        f"Preset **{preset_name}**: multi-query associative recall (MQAR, zoology's generator), "
        f"vocabulary {r['data']['vocab']}, {r['data']['examples']['train']:,} training examples "
        f"per cell, {r['n_layers']} layers, {len(r['seeds'])} seed(s)."
    )
    md = markdown_table(rows, len(r["lrs"]), out)
    tex = latex(
        ["Cell", "d", "Model", "Reach", "lr", "Test acc"],
        [
            [x["cell"], x["d_model"], x["model"], x["reach"], f"{x['lr']:g}", fmt(*x["test"])]
            for x in rows
        ],
        "MQAR test accuracy (%), best learning rate by validation accuracy, mean ± std over seeds.",
    )
    write_tables(
        out,
        "recall",
        head,
        md,
        df.drop(columns=["test_by_distance"]).assign(preset=preset_name),
        tex,
    )
    figure_vs_dmodel(rows, preset_name, out / "recall_vs_dmodel.png")
    figure_by_distance(chosen, preset_name, out / "recall_by_distance.png")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    aggregate_args(p)
    a = p.parse_args(argv)
    return job.run(aggregate_recall, a.preset, a.preset_name, a.runs, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
