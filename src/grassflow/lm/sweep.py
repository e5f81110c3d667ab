"""The sweep's table: each model at its own best value of one setting (the learning rate first).

`sweep.md/.csv/.tex` and `sweep.png`: per value of the swept key, both models' best validation and
test perplexity (mean ± std over seeds, runs ok / all, diverged) and the gap on test perplexity at
that shared value; each model's chosen value, the one of the lowest mean validation perplexity over
its seeds (a value where a run diverged or has no validation figure cannot be chosen); and, where
both choices are bracketed (neither the first nor the last value tried), the tuned gap: the
Grassmann model at its chosen value against the Transformer at its own, on test perplexity, with its
95 % interval at the chosen values (the uncertainty of the choice itself is not in it). A model
whose best is at an edge is said to be not bracketed, with the end to extend, and no tuned gap is
stated. Chosen on validation, reported on test: the number that picked a value does not also score
it. The CSV has one row per value × run with the run's provenance (a run shared by another table
appears here too).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import NullLocator

from grassflow import job, markdown
from grassflow.lm.aggregate import (
    baseline_line,
    cannot_compare,
    load_runs,
    made_line,
    provenance_line,
    run_settings,
    run_specs,
)
from grassflow.lm.comparable import (
    load_checksums,
    load_published,
    not_comparable,
    ran_settings,
    verdict_scope,
)
from grassflow.report.figures import COLORS, save
from grassflow.report.stats import gap_ci, mean_std, verdict
from grassflow.report.tables import MODELS, fmt, latex, record_links, write_tables


def cell(sub: pd.DataFrame) -> dict:
    """One model at one value: its runs, those that completed with a validation figure, their
    figures."""
    good = sub[sub.status == "completed"].dropna(subset=["val_ppl"])
    return {
        "n": len(sub),
        "n_ok": len(good),
        "diverged": int((sub.status == "diverged").sum()),
        "not_learned": sorted(good[~good.learned].run_id),
        "val": list(good.val_ppl),
        "test": list(good.test_ppl),
        "records": list(sub.sort_values("seed").record),
    }


def choose(cells: list[dict]) -> dict:
    """A model's chosen value (an index into the values): the lowest mean validation perplexity
    among the values where every run completed with one; bracketed when it is neither the first nor
    the last value; {"index": None} where no value qualifies."""
    scores = [_mean(c["val"]) if c["n"] and c["n_ok"] == c["n"] else math.inf for c in cells]
    if all(math.isinf(s) for s in scores):
        return {"index": None, "bracketed": False, "edge": None}
    i = min(range(len(scores)), key=lambda k: scores[k])
    edge = "first" if i == 0 else "last" if i == len(cells) - 1 else None
    return {"index": i, "bracketed": edge is None, "edge": edge}


def _mean(xs: list[float]) -> float:
    """The mean of a cell's figures; inf for none (a value that cannot be chosen)."""
    return mean_std(xs)[0] if xs else math.inf


def summarise(df: pd.DataFrame, grid: dict) -> dict:
    """{"cells": [{model: cell} per value], "chosen": {model: choose(...)}, "shared_gaps": [gap on
    test per value, or None], "tuned": the tuned gap on test and on validation, or None, "why_not":
    why none}."""
    cells = [{m: cell(df[df.run_id.isin(ids)]) for m, ids in runs.items()} for runs in grid["runs"]]
    models = [m for m in MODELS if all(m in c for c in cells)]
    chosen = {m: choose([c[m] for c in cells]) for m in models}

    def gap(g: dict, t: dict, key: str):
        complete = g["n"] and t["n"] and g["n_ok"] == g["n"] and t["n_ok"] == t["n"]
        return gap_ci(g[key], t[key]) if complete else None

    shared = [
        gap(c["grassmann"], c["transformer"], "test") if len(models) == 2 else None for c in cells
    ]
    out = {"cells": cells, "models": models, "chosen": chosen, "shared_gaps": shared, "tuned": None}
    if len(models) < 2:
        out["why_not"] = (
            f"the sweep has no {' or '.join(m for m in MODELS if m not in models)} runs"
        )
        return out
    unbracketed = [m for m in models if not chosen[m]["bracketed"]]
    if unbracketed:
        out["why_not"] = "; ".join(not_bracketed(m, chosen[m], grid) for m in unbracketed)
        return out
    g, t = (
        cells[chosen["grassmann"]["index"]]["grassmann"],
        cells[chosen["transformer"]["index"]]["transformer"],
    )
    out["tuned"] = {"test": gap_ci(g["test"], t["test"]), "validation": gap_ci(g["val"], t["val"])}
    return out


def not_bracketed(model: str, choice: dict, grid: dict) -> str:
    """Why a model's choice is no best: at which end of the values, and which way to extend them."""
    if choice["index"] is None:
        return f"the {model} has no value at which every run completed"
    labels = grid["labels"]
    if choice["edge"] == "first":
        return (
            f"the {model}'s best is at the first value tried ({labels[0]}): not bracketed, extend "
            f"the sweep below {labels[0]}"
        )
    return (
        f"the {model}'s best is at the last value tried ({labels[-1]}): not bracketed, extend the "
        f"sweep above {labels[-1]}"
    )


def _gap(g: dict | None) -> str:
    if not g:
        return "—"
    ci = "" if math.isnan(g["ci_low"]) else f" ({g['ci_low']:+.1f} … {g['ci_high']:+.1f})"
    return f"{g['gap_pct']:+.1f} %{ci}"


def _runs(c: dict) -> str:
    said = f"{c['n_ok']}/{c['n']}"
    if c["diverged"]:
        said += f", {c['diverged']} diverged"
    if c["not_learned"]:
        said += f", {len(c['not_learned'])} did not learn"
    return said


def _chosen_at(s: dict, i: int) -> str:
    return ", ".join(m for m in s["models"] if s["chosen"][m]["index"] == i) or ""


def markdown_table(
    s: dict,
    grid: dict,
    e: dict,
    seeds: list,
    why: list[str],
    scope: str | None,
    limit: float,
    out: Path,
) -> str:
    key, labels = grid["key"], grid["labels"]
    rows = []
    for i, c in enumerate(s["cells"]):
        t, g = c.get("transformer"), c.get("grassmann")
        rows.append(
            [
                labels[i],
                _chosen_at(s, i) or "—",
                *(fmt(*mean_std(m[k])) if m else "—" for m in (t, g) for k in ("val", "test")),
                _gap(s["shared_gaps"][i]),
                _runs(t) if t else "—",
                _runs(g) if g else "—",
                record_links((t["records"] if t else []) + (g["records"] if g else []), out),
            ]
        )
    lines = [
        f"### Sweep of {key} on {grid['base']}: N={e['n_layers']}, L={e['context_len']}, "
        f"B={e['batch_size']}, {e['epochs']} epochs, seeds {seeds}",
        "",
        "Each model's value is chosen on validation (the lowest mean best validation PPL over its "
        "seeds, a value where a run diverged excluded) and reported on test.",
        "",
        *markdown.table(
            [
                key,
                "chosen by",
                "Transformer val PPL",
                "Transformer test PPL",
                "Grassmann val PPL",
                "Grassmann test PPL",
                "gap G−T, test PPL (95 % CI)",
                "runs T (ok/all)",
                "runs G (ok/all)",
                "provenance",
            ],
            rows,
        ),
        "",
        "#### Each model at its own best",
        "",
    ]
    best = []
    for m in s["models"]:
        ch = s["chosen"][m]
        c = s["cells"][ch["index"]][m] if ch["index"] is not None else None
        best.append(
            [
                m,
                labels[ch["index"]] if c else "—",
                "yes"
                if ch["bracketed"]
                else f"no (the {ch['edge']} value)"
                if ch["edge"]
                else "no value qualifies",
                fmt(*mean_std(c["val"])) if c else "—",
                fmt(*mean_std(c["test"])) if c else "—",
            ]
        )
    lines += markdown.table(["model", f"chosen {key}", "bracketed", "val PPL", "test PPL"], best)
    lines.append("")
    if s["tuned"]:
        t = s["tuned"]["test"]
        at = ", ".join(
            f"the {m} at {labels[s['chosen'][m]['index']]}" for m in ("grassmann", "transformer")
        )
        ci = (
            ""
            if math.isnan(t["ci_low"])
            else f" (95 % CI {t['ci_low']:+.1f} … {t['ci_high']:+.1f} %)"
        )
        lines.append(
            f"**Tuned gap G−T on test PPL: {t['gap_pct']:+.1f} %**{ci}: {at}; on validation PPL "
            f"{_gap(s['tuned']['validation'])}. The interval is at the chosen values: the "
            "uncertainty of the choice itself is not in it."
        )
        if why:
            lines += ["", cannot_compare(why)]
        else:
            said = verdict(t["ci_low"], t["ci_high"], t["gap_pct"], limit) + (
                f" — {scope}" if scope else ""
            )
            lines += [
                "",
                f'Paper\'s claim "within 10–15 %", each model at its own best: **{said}**.',
            ]
    else:
        lines.append(f"**No tuned gap:** {s['why_not']}.")
        if why:
            lines += ["", cannot_compare(why)]
    return "\n".join(lines) + "\n"


def tex(s: dict, grid: dict) -> str:
    labels = grid["labels"]
    body = [
        [
            labels[i],
            *(fmt(*mean_std(c[m]["val"])) if m in c else "--" for m in MODELS),
            _gap(s["shared_gaps"][i]),
            _chosen_at(s, i) or "--",
        ]
        for i, c in enumerate(s["cells"])
    ]
    cap = (
        f"Sweep of {grid['key']} on {grid['base']}: best validation perplexity, mean ± std over "
        "seeds; the gap on test."
    )
    if s["tuned"]:
        cap += (
            " Each model at its own best (chosen on validation): tuned gap on test "
            f"{_gap(s['tuned']['test'])}."
        )
    else:
        cap += f" No tuned gap: {s['why_not']}."
    return latex(
        [
            grid["key"],
            "Transformer val PPL",
            "Grassmann val PPL",
            "Gap on test (95 % CI)",
            "Chosen by",
        ],
        body,
        cap,
    )


def figure(s: dict, grid: dict, preset_name: str, path: Path) -> dict:
    """Validation PPL against the value (a log axis where every value is positive), each seed a dot,
    each model's mean a line, its chosen value ringed; returns what it plots."""
    values = grid["values"]
    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = {}
    for m in s["models"]:
        means = [_mean(c[m]["val"]) if c[m]["val"] else math.nan for c in s["cells"]]
        for v, c in zip(values, s["cells"]):
            ax.plot([v] * len(c[m]["val"]), c[m]["val"], "o", ms=3, alpha=0.5, color=COLORS[m])
        ch = s["chosen"][m]
        label = m + ("" if ch["bracketed"] else " (not bracketed)")
        ax.plot(values, means, "-", lw=1.8, color=COLORS[m], label=label)
        if ch["index"] is not None:
            ax.plot(
                [values[ch["index"]]],
                [means[ch["index"]]],
                "o",
                ms=12,
                mfc="none",
                mew=2,
                color=COLORS[m],
            )
        plotted[m] = {"means": means, "chosen": ch["index"]}
    ax.set(
        xlabel=grid["key"],
        ylabel="best validation perplexity",
        xscale="log" if min(values) > 0 else "linear",
        yscale="log",
        title=f"sweep of {grid['key']} on {grid['base']} — preset {preset_name}\n"
        "(dots: seeds; line: mean; ring: chosen)",
    )
    # the values as the table names them, and no other x tick; the y axis keeps its minor ticks:
    # within one decade of PPL they are the only labelled ones (plain numbers: report.figures)
    ax.set_xticks(values, grid["labels"])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=7)
    save(fig, path)
    return plotted


def aggregate_sweep(
    preset: dict, preset_name: str, grid: dict, runs_dir, unigram, checksums, published, out_dir
) -> None:
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    unigram = json.loads(Path(unigram).read_text())
    checksums, pub = load_checksums(checksums), load_published(published)
    ids = sorted({r for runs in grid["runs"] for rs in runs.values() for r in rs})
    df = load_runs([Path(runs_dir) / r for r in ids], unigram)
    s = summarise(df, grid)
    exp = run_settings(df)  # N, L, B, epochs and `<unk>`'s reading: as the runs ran them
    unk = exp.pop("unk_mapped")
    setup = pub["paper_setup"]
    # the swept key: the table's subject
    ran = ran_settings(run_specs(df), varied=[grid["key"].split(".", 1)[1]])
    # what the tuned gap rests on: each model's runs at its chosen value (a run elsewhere that did
    # not learn or diverged is the sweep's finding, in its row)
    at = {
        m: s["cells"][ch["index"]][m] if ch["index"] is not None else None
        for m, ch in s["chosen"].items()
    }
    learned = {
        m: {
            "n_learned": c["n_ok"] - len(c["not_learned"]) if c else 0,
            "not_learned": c["not_learned"] if c else [],
        }
        for m, c in at.items()
    }
    why = not_comparable(preset, grid["base"], ran, checksums, setup, learned, unk)
    head = provenance_line(preset_name, preset, checksums, setup, unk)
    md = (
        markdown_table(
            s,
            grid,
            exp,
            preset["sweep"]["seeds"],
            why,
            verdict_scope(checksums, setup),
            setup["claim_limit_pct"],
            out,
        )
        + "\n"
        + made_line(df.sort_values("run_id"))
        + "\n\n"
        + baseline_line(unigram)
        + "\n"
    )
    per_run = pd.concat(
        [
            df[df.run_id.isin([r for rs in runs.values() for r in rs])].assign(
                value=grid["values"][i], chosen_by=_chosen_at(s, i)
            )
            for i, runs in enumerate(grid["runs"])
        ],
        ignore_index=True,
    )
    write_tables(
        out,
        "sweep",
        head,
        md,
        per_run.assign(preset=preset_name, data_source=preset["data"]["source"]),
        tex(s, grid),
    )
    figure(s, grid, preset_name, out / "sweep.png")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    for name in ("preset", "grid"):
        p.add_argument(f"--{name}", required=True, type=job.json_arg, help=job.JSON)
    for name in ("preset-name", "runs-dir", "unigram", "checksums", "published", "out-dir"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args(argv)
    return job.run(
        aggregate_sweep,
        a.preset,
        a.preset_name,
        a.grid,
        a.runs_dir,
        a.unigram,
        a.checksums,
        a.published,
        a.out_dir,
    )


if __name__ == "__main__":
    sys.exit(main())
