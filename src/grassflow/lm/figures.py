"""The LM's figures: the gap over training, best perplexity per model with seed spread, scaling, the
ablation gaps (the shared colours and writer: grassflow.report.figures)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from grassflow.report.figures import COLORS, save
from grassflow.report.records import read_metrics
from grassflow.report.stats import gap_ci


def gap_by_epoch(df) -> dict:
    """The table's gap (grassflow.report.stats.gap_ci: Grassmann − Transformer in % of the mean best
    validation perplexity, its 95 % interval) after each epoch, each run's best so far (its
    metrics.jsonl's validation perplexity, the minimum up to that epoch), over the completed runs
    that reached it; and each model's curves: {"epochs", "gap": [gap_ci per epoch], "runs": {model:
    {seed: [val_ppl per epoch]}}}."""
    runs = {}
    for _, run in df[df.status == "completed"].iterrows():
        rows = read_metrics(run.metrics, ("epoch", "val_ppl"))
        runs.setdefault(run.model, {})[run.seed] = [
            r["val_ppl"] for r in sorted(rows, key=lambda r: r["epoch"])
        ]
    epochs = max((len(c) for m in runs.values() for c in m.values()), default=0)
    gaps = []
    for e in range(1, epochs + 1):
        best = {m: [min(c[:e]) for c in runs.get(m, {}).values() if len(c) >= e] for m in COLORS}
        gaps.append(gap_ci(best["grassmann"], best["transformer"]) if all(best.values()) else None)
    return {"epochs": list(range(1, epochs + 1)), "gap": gaps, "runs": runs}


def gap(df, paper_gap, exp_name, preset, path, skip=2) -> dict:
    """Two panels: the gap after each epoch (best so far against best so far, as the table) with its
    95 % interval as a band, the paper's gap and zero as lines; each model's validation perplexity
    per epoch, every seed thin and the mean thick, on a scale set by the epochs after the first
    `skip` (an untrained model's first epochs are orders of magnitude above the rest). Returns what
    it plots (gap_by_epoch)."""
    import math

    data = gap_by_epoch(df)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    pts = [(e, g) for e, g in zip(data["epochs"], data["gap"]) if g]
    if pts:
        xs = [e for e, _ in pts]
        a1.plot(
            xs,
            [g["gap_pct"] for _, g in pts],
            "o-",
            ms=3,
            color=COLORS["grassmann"],
            label="G − T (ours)",
        )
        band = [(e, g) for e, g in pts if not math.isnan(g["ci_low"])]
        if band:
            a1.fill_between(
                [e for e, _ in band],
                [g["ci_low"] for _, g in band],
                [g["ci_high"] for _, g in band],
                color=COLORS["grassmann"],
                alpha=0.25,
                label="95 % interval",
            )
        later = [
            v
            for e, g in pts
            if e > skip
            for v in (g["gap_pct"], g["ci_low"], g["ci_high"])
            if not math.isnan(v)
        ]
        if later:  # the scale of the epochs after the first few, as the right panel's
            lo, hi = min(later + [0.0, paper_gap or 0.0]), max(later + [0.0, paper_gap or 0.0])
            a1.set_ylim(lo - 0.08 * (hi - lo) - 1, hi + 0.08 * (hi - lo) + 1)
    a1.axhline(0, color="grey", lw=0.8)
    if paper_gap is not None:
        a1.axhline(paper_gap, color="tab:red", ls="--", lw=1, label=f"paper {paper_gap:+.1f} %")
    a1.set(
        xlabel="epoch",
        ylabel="gap in best val PPL so far, G − T (%)",
        title=f"{exp_name} — preset {preset}",
    )
    a1.legend(fontsize=7)
    shown = []
    for model, seeds in data["runs"].items():
        for _, c in sorted(seeds.items()):
            a2.plot(range(1, len(c) + 1), c, lw=0.7, alpha=0.6, color=COLORS.get(model))
        n = min(len(c) for c in seeds.values())
        mean = [sum(c[i] for c in seeds.values()) / len(seeds) for i in range(n)]
        a2.plot(
            range(1, n + 1),
            mean,
            lw=2.2,
            color=COLORS.get(model),
            label=f"{model} (mean of {len(seeds)})",
        )
        shown += [v for c in seeds.values() for v in c[skip:]]
    if shown:
        a2.set_ylim(min(shown) * 0.97, max(shown) * 1.03)
        a2.set_xlim(skip + 0.5, max(data["epochs"]) + 0.5)
    a2.set(
        xlabel="epoch",
        ylabel="validation perplexity (chunked)",
        yscale="log",
        title=f"validation perplexity, epochs {skip + 1}+ (seeds thin, mean thick)",
    )
    a2.legend(fontsize=7)
    fig.tight_layout()
    save(fig, path)
    return data


def best_bars(df, paper, exp_name, preset, path):
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for i, model in enumerate(m for m in COLORS if m in set(df.model)):
        vals = df[(df.model == model) & (df.status == "completed")].val_ppl.dropna()
        if len(vals):
            ax.bar(i, vals.mean(), color=COLORS[model], alpha=0.6, label=f"{model} (ours)")
            ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        if paper.get(model) and preset == "paper":
            ax.scatter(
                [i],
                [paper[model]],
                marker="_",
                s=400,
                color="red",
                zorder=4,
                label="paper" if i == 0 else None,
            )
    ax.set_xticks(range(len(COLORS)), list(COLORS))
    ax.set(ylabel="best validation perplexity", title=f"{exp_name} — preset {preset}")
    ax.legend(fontsize=7)
    save(fig, path)


def scaling(bench: dict, preset, path):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    series = sorted({(r["model"], r.get("backend")) for r in bench["step_rows"]}, key=str)
    for i, (model, backend) in enumerate(series):
        rows = sorted(
            (
                r
                for r in bench["step_rows"]
                if (r["model"], r.get("backend")) == (model, backend) and r["head"]
            ),
            key=lambda r: r["L"],
        )
        label, style = (
            (model if backend is None else f"{model} ({backend})"),
            ("o-", "s--", "^:")[i % 3],
        )
        if rows:
            a1.plot(
                [r["L"] for r in rows],
                [r["seconds"] for r in rows],
                style,
                color=COLORS[model],
                label=label,
            )
            a2.plot(
                [r["L"] for r in rows],
                [r["peak_mem_mb"] for r in rows],
                style,
                color=COLORS[model],
                label=label,
            )
    kind = bench["step_rows"][0]["peak_mem_kind"] if bench["step_rows"] else ""
    a1.set(
        xscale="log",
        xlabel="sequence length L",
        ylabel="training step (s)",
        title=f"{bench['tokens']} tokens/step — {bench['device']}",
    )
    a2.set(
        xscale="log",
        xlabel="sequence length L",
        ylabel=f"peak memory (MB, {kind})",
        title=f"preset {preset}" + (" — quick (smoke) sizes" if bench.get("quick") else ""),
    )
    a1.legend()
    a2.legend()
    save(fig, path)


def ablation_gaps_over_training(per_run, paper_gap, preset, path) -> dict:
    """Each ablation variant's gap after every epoch (gap_by_epoch of its runs: best so far against
    best so far, as the table), its 95 % interval as a band, the paper's gap and zero as lines.
    Returns {variant: gap_by_epoch}."""
    import math

    fig, ax = plt.subplots(figsize=(7, 4))
    data = {}
    for i, (variant, runs) in enumerate(per_run.groupby("variant", sort=False)):
        d = data[variant] = gap_by_epoch(runs)
        pts = [(e, g) for e, g in zip(d["epochs"], d["gap"]) if g]
        if not pts:
            continue
        color = plt.get_cmap("tab10")(i % 10)
        ax.plot(
            [e for e, _ in pts],
            [g["gap_pct"] for _, g in pts],
            "o-",
            ms=3,
            color=color,
            label=variant,
        )
        band = [(e, g) for e, g in pts if not math.isnan(g["ci_low"])]
        if band:
            ax.fill_between(
                [e for e, _ in band],
                [g["ci_low"] for _, g in band],
                [g["ci_high"] for _, g in band],
                color=color,
                alpha=0.15,
            )
    ax.axhline(0, color="grey", lw=0.8)
    if paper_gap is not None:
        ax.axhline(paper_gap, color="tab:red", ls="--", lw=1, label=f"paper {paper_gap:+.1f} %")
    ax.set(
        xlabel="epoch",
        ylabel="gap in best val PPL so far, G − T (%)",
        title=f"Ablations over training — preset {preset} (95 % CI bands)",
    )
    ax.legend(fontsize=7)
    save(fig, path)
    return data


def ablation_gaps(rows, paper_gap, preset, path):
    """Grassmann − Transformer gap (%) per ablation variant, with its 95 % CI where there is one."""
    import math

    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows)), 4))
    xs = list(range(len(rows)))
    for x, r in zip(xs, rows):
        g = r.get("gap")
        if not g:
            continue
        err = (
            None
            if math.isnan(g["ci_low"])
            else [[g["gap_pct"] - g["ci_low"]], [g["ci_high"] - g["gap_pct"]]]
        )
        ax.errorbar([x], [g["gap_pct"]], yerr=err, fmt="o", capsize=4, color=COLORS["grassmann"])
    ax.axhline(0, color="grey", lw=0.8)
    if paper_gap is not None:
        ax.axhline(paper_gap, color="tab:red", ls="--", lw=1, label=f"paper {paper_gap:+.1f} %")
        ax.legend()
    ax.set_xticks(xs, [r["variant"] for r in rows], rotation=30, ha="right")
    ax.set(
        ylabel="gap in best val PPL, G − T (%)",
        title=f"Ablations — preset {preset} (95 % CI where ≥ 2 seeds)",
    )
    save(fig, path)
