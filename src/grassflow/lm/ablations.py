"""The ablation table: which of the paper's ambiguities makes the Grassmann − Transformer gap.

`ablations.md/.csv/.tex` and `ablations.png`: per variant (model switches on the base experiment),
both models' best validation and test perplexity (mean ± std over seeds), the gap with its 95 % CI,
diverged and did-not-learn runs counted, the Grassmann variant's parameter count (and its change
from the unswitched variant's: r changes it), and its receptive field in tokens (Σ over layers of
the layer's largest offset: N·max Δ when every layer has all offsets). N, L, B and epochs, and the
model a receptive field is of, are the runs' records'. The CSV has one row per variant × run with
the run's provenance (a run shared by two variants appears under each). Under the table: the
published numbers (published.yaml), so ours are read beside everyone's, and what the table can carry
(lm.comparable).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from grassflow import job
from grassflow.lm import figures
from grassflow.lm.aggregate import (
    baseline_line,
    cannot_compare,
    load_runs,
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
from grassflow.markdown import table as md_table
from grassflow.models.config import ModelConfig
from grassflow.report.records import read_record
from grassflow.report.stats import gap_ci, mean_std
from grassflow.report.tables import MODELS, fmt, latex, record_links, write_tables


def receptive_field(model: dict) -> int:
    """Tokens a Grassmann model's last position can reach back: Σ_layers max offset (`model`: a
    run's spec's, as its record holds it)."""
    cfg = ModelConfig.from_dict({**model, "vocab_size": 2})
    return sum(max(cfg.layer_lags(i)) for i in range(cfg.n_layers))


def _model_stats(sub: pd.DataFrame) -> dict:
    good = sub[sub.status == "completed"].dropna(subset=["val_ppl"])
    return {
        "n": len(sub),
        "n_ok": len(good),
        "n_learned": int(good.learned.sum()),
        "params": int(sub.n_params.iloc[0]) if len(sub) else None,
        "not_learned": sorted(good[~good.learned].run_id),
        "diverged": int((sub.status == "diverged").sum()),
        "val": mean_std(good.val_ppl),
        "test": mean_std(good.test_ppl),
        "val_values": list(good.val_ppl),
        "records": list(sub.record),
    }


def summarise(df: pd.DataFrame, preset: dict, grid: dict) -> list[dict]:
    rows = []
    for variant, models in grid.items():
        m = {k: _model_stats(df[df.run_id.isin(ids)]) for k, ids in models.items()}
        # its Grassmann model, as its runs ran it
        g = df[df.run_id.isin(models.get("grassmann", []))]
        row = {
            "variant": variant,
            "switches": preset["ablations"]["variants"][variant] or {},
            "models": m,
            "receptive_field": receptive_field(read_record(g.record.iloc[0])["spec"]["model"])
            if len(g)
            else "—",
        }
        if all(k in m and m[k]["n_ok"] for k in MODELS):
            row["gap"] = gap_ci(m["grassmann"]["val_values"], m["transformer"]["val_values"])
        rows.append(row)
    return rows


def _switches(sw: dict) -> str:
    """A variant's switches as the table says them: model keys, and training keys as train.<key>."""
    said = {
        **{k: v for k, v in sw.items() if k != "train"},
        **{f"train.{k}": v for k, v in (sw.get("train") or {}).items()},
    }
    return ", ".join(f"{k}: {v}" for k, v in said.items()) or "(the base)"


def _gap(row) -> str:
    g = row.get("gap")
    if not g:
        return "—"
    ci = "" if math.isnan(g["ci_low"]) else f" ({g['ci_low']:+.1f} … {g['ci_high']:+.1f})"
    return f"{g['gap_pct']:+.1f} %{ci}"


def _params_cell(m: dict | None, base: dict | None) -> str:
    """A model's parameter count, and its change from the base variant's where it differs (r)."""
    if not m or m["params"] is None:
        return "—"
    cell = f"{m['params']:,}"
    if base and base["params"] and m["params"] != base["params"]:
        cell += f" ({100 * (m['params'] - base['params']) / base['params']:+.1f} %)"
    return cell


def _runs_cell(m: dict) -> str:
    cell = f"{m['n_learned']}/{m['n_ok']}/{m['n']}"
    if m["diverged"]:
        cell += f", {m['diverged']} diverged"
    if m["not_learned"]:
        cell += f", {len(m['not_learned'])} did not learn"
    return cell


def markdown(
    rows: list[dict],
    preset: dict,
    e: dict,
    published: list[dict],
    why: list[str],
    unigram: dict,
    out: Path,
    scope: str | None = None,
) -> str:
    """The table; `e`: the base experiment's settings as the runs' records hold them
    (run_settings)."""
    a = preset["ablations"]
    table = []
    # the unswitched variant
    base = next((r["models"].get("grassmann") for r in rows if not r["switches"]), None)
    for r in rows:
        t, g = r["models"].get("transformer"), r["models"].get("grassmann")
        table.append(
            [
                r["variant"],
                _switches(r["switches"]),
                *(fmt(*m[k]) if m else "—" for m in (t, g) for k in ("val", "test")),
                _gap(r),
                _runs_cell(t) if t else "—",
                _runs_cell(g) if g else "—",
                _params_cell(g, base),
                r["receptive_field"],
                record_links((t["records"] if t else []) + (g["records"] if g else []), out),
            ]
        )
    lines = [
        f"### Ablations of {a['base']}: N={e['n_layers']}, L={e['context_len']}, "
        f"B={e['batch_size']}, {e['epochs']} epochs, seeds {a['seeds']}",
        "",
        *md_table(
            [
                "variant",
                "switches",
                "Transformer val PPL",
                "Transformer test PPL",
                "Grassmann val PPL",
                "Grassmann test PPL",
                "gap G−T (95 % CI)",
                "runs T (learned/ok/all)",
                "runs G",
                "Grassmann params",
                "Grassmann receptive field (tokens)",
                "provenance",
            ],
            table,
        ),
        "",
        baseline_line(unigram),
        "",
        cannot_compare(why)
        if why
        else (
            f"The paper's tokenizer and scale, {scope}; every run learned: the gaps compare with "
            "the paper's, the perplexities do not."
            if scope
            else "Same data, tokenizer and scale as the paper's Table; every run learned."
        ),
        "",
        "#### Published results (Grassmann − Transformer, best validation PPL unless noted)",
        "",
        *md_table(
            ["source", "setup", "Transformer", "Grassmann", "gap"],
            [
                [
                    p["source"],
                    p["setup"],
                    p.get("transformer") or "—",
                    p.get("grassmann") or "—",
                    f"{100 * (p['grassmann'] - p['transformer']) / p['transformer']:+.1f} %"
                    if p.get("transformer") and p.get("grassmann")
                    else f"{p['gap_pct']:+.1f} %"
                    if p.get("gap_pct") is not None
                    else "—",
                ]
                for p in published
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def tex(rows: list[dict], preset: dict) -> str:
    body = [
        [
            r["variant"],
            fmt(*r["models"]["transformer"]["val"]) if "transformer" in r["models"] else "--",
            fmt(*r["models"]["grassmann"]["val"]) if "grassmann" in r["models"] else "--",
            _gap(r),
            str(r["receptive_field"]),
        ]
        for r in rows
    ]
    a = preset["ablations"]
    return latex(
        ["Variant", "Transformer val PPL", "Grassmann val PPL", "Gap (95 % CI)", "Receptive field"],
        body,
        f"Ablations of {a['base']}: best validation perplexity, mean ± std over seeds "
        f"{a['seeds']}.",
    )


def aggregate_ablations(
    preset: dict, preset_name: str, grid: dict, runs_dir, unigram, checksums, published, out_dir
) -> None:
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    unigram = json.loads(Path(unigram).read_text())
    checksums, pub = load_checksums(checksums), load_published(published)
    ids = sorted({r for models in grid.values() for rs in models.values() for r in rs})
    df = load_runs([Path(runs_dir) / r for r in ids], unigram)
    rows = summarise(df, preset, grid)
    base = preset["ablations"]["base"]
    worst = {
        k: {
            "n_learned": min(r["models"][k]["n_learned"] for r in rows if k in r["models"]),
            "not_learned": sorted(
                {x for r in rows if k in r["models"] for x in r["models"][k]["not_learned"]}
            ),
        }
        for k in preset["models"]
    }
    exp = run_settings(df)  # N, L, B, epochs and `<unk>`'s reading: as the runs ran them
    unk = exp.pop("unk_mapped")
    # what the runs ran, less what the variants switch (the table's subject, in its switches column)
    switched = {
        k
        for sw in preset["ablations"]["variants"].values()
        for k in (*(sw or {}), *((sw or {}).get("train") or {}))
    }
    ran = ran_settings(run_specs(df), varied=switched - {"train"})
    why = not_comparable(preset, base, ran, checksums, pub["paper_setup"], worst, unk)
    head = provenance_line(preset_name, preset, checksums, pub["paper_setup"], unk)
    per_run = pd.concat(
        [
            df[df.run_id.isin([x for rs in models.values() for x in rs])].assign(variant=v)
            for v, models in grid.items()
        ],
        ignore_index=True,
    )
    scope = verdict_scope(checksums, pub["paper_setup"])
    write_tables(
        out,
        "ablations",
        head,
        markdown(rows, preset, exp, pub["published"], why, unigram, out, scope),
        per_run.assign(preset=preset_name, data_source=preset["data"]["source"]),
        tex(rows, preset),
    )
    paper = next((p for p in pub["published"] if p.get("experiment") == base), None)
    paper_gap = (
        100 * (paper["grassmann"] - paper["transformer"]) / paper["transformer"] if paper else None
    )
    figures.ablation_gaps_over_training(per_run, paper_gap, preset_name, out / "ablations_gap.png")
    figures.ablation_gaps(rows, paper_gap, preset_name, out / "ablations.png")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    for name in ("preset", "grid"):
        p.add_argument(f"--{name}", required=True, type=job.json_arg, help=job.JSON)
    for name in ("preset-name", "runs-dir", "unigram", "checksums", "published", "out-dir"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args(argv)
    return job.run(
        aggregate_ablations,
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
