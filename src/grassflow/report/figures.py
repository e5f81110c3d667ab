"""Figures: validation curves, best perplexity per model with seed spread, scaling."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grassflow.io import atomic_path  # noqa: E402
from grassflow.report.records import read_metrics  # noqa: E402

COLORS = {"transformer": "tab:blue", "grassmann": "tab:orange"}


def _save(fig, path):
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def curves(df, exp_name, preset, path, key="val_ppl", ylabel="validation perplexity (chunked)", log=True):
    fig, ax = plt.subplots(figsize=(6, 4))
    for _, run in df.iterrows():
        rows = read_metrics(run.metrics, ("epoch", key))
        if rows:
            ax.plot([r["epoch"] for r in rows], [r[key] for r in rows], marker="o", ms=3,
                    color=COLORS.get(run.model), alpha=0.8, label=f"{run.model} s{run.seed}")
    ax.set(xlabel="epoch", ylabel=ylabel, yscale="log" if log else "linear",
           title=f"{exp_name} — preset {preset}")
    ax.legend(fontsize=7)
    _save(fig, path)


def best_bars(df, paper, exp_name, preset, path):
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for i, model in enumerate(m for m in COLORS if m in set(df.model)):
        vals = df[(df.model == model) & (df.status == "completed")].val_ppl.dropna()
        if len(vals):
            ax.bar(i, vals.mean(), color=COLORS[model], alpha=0.6, label=f"{model} (ours)")
            ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        if paper.get(model) and preset == "paper":
            ax.scatter([i], [paper[model]], marker="_", s=400, color="red", zorder=4,
                       label="paper" if i == 0 else None)
    ax.set_xticks(range(len(COLORS)), list(COLORS))
    ax.set(ylabel="best validation perplexity", title=f"{exp_name} — preset {preset}")
    ax.legend(fontsize=7)
    _save(fig, path)


def scaling(bench: dict, preset, path):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    series = sorted({(r["model"], r.get("backend")) for r in bench["step_rows"]}, key=str)
    for i, (model, backend) in enumerate(series):
        rows = sorted((r for r in bench["step_rows"] if (r["model"], r.get("backend")) == (model, backend)
                       and r["head"]), key=lambda r: r["L"])
        label, style = (model if backend is None else f"{model} ({backend})"), ("o-", "s--", "^:")[i % 3]
        if rows:
            a1.plot([r["L"] for r in rows], [r["seconds"] for r in rows], style, color=COLORS[model], label=label)
            a2.plot([r["L"] for r in rows], [r["peak_mem_mb"] for r in rows], style, color=COLORS[model], label=label)
    kind = bench["step_rows"][0]["peak_mem_kind"] if bench["step_rows"] else ""
    a1.set(xscale="log", xlabel="sequence length L", ylabel="training step (s)",
           title=f"{bench['tokens']} tokens/step — {bench['device']}")
    a2.set(xscale="log", xlabel="sequence length L", ylabel=f"peak memory (MB, {kind})",
           title=f"preset {preset}" + (" — quick (smoke) sizes" if bench.get("quick") else ""))
    a1.legend()
    a2.legend()
    _save(fig, path)


def ablation_gaps(rows, paper_gap, preset, path):
    """Grassmann − Transformer gap (%) per ablation variant, with its 95 % CI where there is one."""
    import math

    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows)), 4))
    xs = list(range(len(rows)))
    for x, r in zip(xs, rows):
        g = r.get("gap")
        if not g:
            continue
        err = None if math.isnan(g["ci_low"]) else [[g["gap_pct"] - g["ci_low"]], [g["ci_high"] - g["gap_pct"]]]
        ax.errorbar([x], [g["gap_pct"]], yerr=err, fmt="o", capsize=4, color=COLORS["grassmann"])
    ax.axhline(0, color="grey", lw=0.8)
    if paper_gap is not None:
        ax.axhline(paper_gap, color="tab:red", ls="--", lw=1, label=f"paper {paper_gap:+.1f} %")
        ax.legend()
    ax.set_xticks(xs, [r["variant"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="gap in best val PPL, G − T (%)", title=f"Ablations — preset {preset} (95 % CI where ≥ 2 seeds)")
    _save(fig, path)
