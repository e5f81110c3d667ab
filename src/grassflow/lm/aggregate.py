"""Tables (Markdown, CSV, LaTeX), figures and a summary for one preset.

Per experiment: `<exp>.csv` holds one row per run with its provenance (record path, commit, data and
weights hashes); `<exp>.md`/`.tex` hold ours (mean ± std over seeds) beside the paper, the unigram
baseline of the same tokens, the Grassmann-vs-Transformer gap with a 95 % CI, and the verdict on the
paper's claim, given only where the table can carry one (lm.comparable). Diverged runs are listed as
such and left out of the means; a run whose validation perplexity is not below the unigram baseline
is marked "did not learn".
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from grassflow import job, markdown
from grassflow.errors import DataError
from grassflow.lm import figures
from grassflow.lm.comparable import (
    data_label,
    load_checksums,
    load_published,
    not_comparable,
    paper_ppl,
    ran_settings,
    verdict_scope,
)
from grassflow.report.figures import curves
from grassflow.report.records import read_record
from grassflow.report.stats import gap_ci, mean_std, verdict
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


# --- what the LM's tables (Tables 1-2, the ablations, the sweep) say under their numbers ---
def made_line(df: pd.DataFrame) -> str:
    """What a table's runs were made at: each commit (a dirty tree said) with its number of runs,
    and the runs adopted from records made elsewhere, with where from."""
    made = (
        df.assign(
            code=[
                f"{str(c)[:7] if isinstance(c, str) else 'no commit'}{' (dirty tree)' if d else ''}"
                for c, d in zip(df.commit, df.dirty)
            ]
        )
        .groupby("code", sort=True)
        .run_id.count()
    )
    line = (
        "Runs made at "
        + ", ".join(f"{markdown.text(code)}: {n} run{'s' * (n != 1)}" for code, n in made.items())
        + "."
    )
    short = df[df.stop_reason != ""].sort_values("run_id")
    if not short.empty:
        line += (
            " Stopped before their spec's epochs, as their records say: "
            + ", ".join(
                f"{markdown.text(r.run_id)} after {r.epochs} ({markdown.text(r.stop_reason)})"
                for r in short.itertuples()
            )
            + "."
        )
    adopted = df[df.adopted_from != ""].sort_values("run_id")
    if not adopted.empty:
        where = sorted({str(Path(a).parent) for a in adopted.adopted_from})
        line += (
            " From records made elsewhere (finished_runs: "
            f"{', '.join(map(markdown.text, where))}): "
            f"{', '.join(map(markdown.text, adopted.run_id))}; the others trained in this tree."
        )
    return line


def cannot_compare(why: list[str]) -> str:
    """The line under a table whose numbers the paper's cannot be compared with
    (lm.comparable.not_comparable)."""
    return "**These numbers cannot be compared with the paper's:** " + "; ".join(why) + "."


def left_out(sub: pd.DataFrame, good: pd.DataFrame) -> list[str]:
    """The runs a model's statistics leave out, each with why (diverged, or how else it ended)."""
    kept = set(good.run_id)
    return [
        markdown.text(
            f"{r.run_id} ({r.status if r.status != 'completed' else 'no validation PPL'})"
        )
        for r in sub.sort_values("run_id").itertuples()
        if r.run_id not in kept
    ]


def seed_basis(models: dict, asked: int) -> str:
    """What a gap rests on: each model's runs of the seeds the preset asked for, and the runs left
    out."""
    dropped = [r for m in models.values() for r in m["left_out"]]
    return ", ".join(f"{m['n_ok']} of {asked} {model} seeds" for model, m in models.items()) + (
        f"; left out: {', '.join(dropped)}" if dropped else ""
    )


def load_runs(run_dirs, unigram: dict | None = None) -> pd.DataFrame:
    """One row per run; `learned`: completed with validation PPL below the unigram baseline."""
    baseline = (unigram or {}).get("validation", {}).get("unigram_ppl", math.inf)
    return read_runs(
        run_dirs,
        lambda rec, ev, ok, val, test: {
            "run_id": rec["run_id"],
            "experiment": rec["spec"]["experiment"],
            "model": rec["spec"]["model_kind"],
            "seed": rec["spec"]["seed"],
            "status": rec["status"]["state"],
            "diverged_epoch": rec["status"].get("epoch"),
            "best_epoch": rec["best_epoch"],
            "val_ppl": val.get("chunked_ppl", math.nan) if ok else math.nan,
            "test_ppl": test.get("chunked_ppl", math.nan) if ok else math.nan,
            "test_strided_ppl": test.get("strided_ppl", math.nan) if ok else math.nan,
            "test_word_ppl": test.get("harness", {}).get("word_ppl", math.nan)
            if ok
            else math.nan,  # lm-eval's
            "test_tokens": test.get("chunked_tokens"),
            "n_params": rec["n_params"],
            "learned": bool(ok and val.get("chunked_ppl", math.inf) < baseline),
            # the settings the table prints, as the run ran them
            **{k: rec["spec"][section][key] for k, (section, key) in RUN_SETTINGS.items()},
            "unk_mapped": rec["data"]["train"].get("unk_mapped") is not None,
        },
    )


# an experiment's settings a table prints: {its name: (the spec's section, key)}; the records hold
# them
RUN_SETTINGS = {
    "n_layers": ("model", "n_layers"),
    "context_len": ("model", "context_len"),
    "batch_size": ("train", "batch_size"),
    "epochs_asked": ("train", "epochs"),
}


def run_settings(df: pd.DataFrame) -> dict:
    """An experiment's settings (N, L, B, epochs) and whether its token files map `<unk>`, from its
    runs' records (load_runs): one value each, or a DataError naming the setting."""
    out = {}
    for col in (*RUN_SETTINGS, "unk_mapped"):
        values = sorted(set(df[col].tolist()))
        if len(values) != 1:
            raise DataError(
                f"the runs' records disagree on {col}: {values} ({', '.join(sorted(df.run_id))})"
            )
        out["epochs" if col == "epochs_asked" else col] = values[0]
    return out


def run_specs(df: pd.DataFrame) -> list[dict]:
    """The specs the runs' records hold (what each ran: lm.comparable.ran_settings reads them)."""
    return [read_record(r)["spec"] for r in df.record]


def summarise(df: pd.DataFrame, paper: dict, asked: int) -> dict:
    """Per-model statistics and the gap for one experiment; `paper`: the paper's PPL per model;
    `asked`: the seeds per model the preset asked for."""
    out = {"models": {}, "asked": asked}
    for model, (sub, good) in by_model(df, "val_ppl").items():
        stats = {
            k: mean_std(good[k])
            for k in ("val_ppl", "test_ppl", "test_strided_ppl", "test_word_ppl")
        }
        out["models"][model] = {
            "n": len(sub),
            "n_ok": len(good),
            "stats": stats,
            "n_learned": int(good.learned.sum()),
            "not_learned": sorted(good[~good.learned].run_id),
            "diverged": sorted(sub[sub.status == "diverged"].run_id),
            "left_out": left_out(sub, good),
            "paper": paper.get(model),
            "n_params": int(sub.n_params.iloc[0]),
            "records": list(sub.record),
            "val_values": list(good.val_ppl),
        }
    m = out["models"]
    if all(k in m and m[k]["n_ok"] for k in MODELS):
        out["gap"] = gap_ci(m["grassmann"]["val_values"], m["transformer"]["val_values"])
    if all(paper.get(k) for k in MODELS):
        out["paper_gap_pct"] = (
            100 * (paper["grassmann"] - paper["transformer"]) / paper["transformer"]
        )
    return out


def provenance_line(
    name: str, preset: dict, checksums: dict, setup: dict, unk: bool | None = None
) -> str:
    return (
        f"Preset **{name}**: data {data_label(preset, checksums, setup, unk)}; "
        f"tokenizer {preset['tokenizer']['name']}."
    )


def judge(s: dict, why: list[str], limit: float, scope: str | None = None) -> None:
    """The verdict on the paper's claim (a gap within `limit` %: published.yaml's claim_limit_pct),
    or why the table cannot give one; `scope`: what a verdict must say it was measured on
    (verdict_scope)."""
    s["not_comparable"] = why
    if "gap" in s:
        g = s["gap"]
        g["verdict"] = verdict(g["ci_low"], g["ci_high"], g["gap_pct"], limit)
        if why:
            s["gap"]["verdict"] = "not comparable: " + "; ".join(why)
        elif scope:
            s["gap"]["verdict"] += f" — {scope}"
        # never a silently dropped seed
        if any(m["n_ok"] < s["asked"] for m in s["models"].values()):
            g["verdict"] += f" — on fewer seeds than asked ({seed_basis(s['models'], s['asked'])})"


def baseline_line(unigram: dict) -> str:
    return (
        "Unigram baseline (training-split token frequencies, add-one): validation PPL "
        f"**{unigram['validation']['unigram_ppl']:.1f}**, test "
        f"{unigram['test']['unigram_ppl']:.1f}. A run not below it did not learn."
    )


def markdown_table(exp_name, exp, s, out_dir) -> str:
    rows = []
    for model, m in s["models"].items():
        st = m["stats"]
        div = f" ({len(m['diverged'])} diverged)" if m["diverged"] else ""
        div += (
            f" (did not learn: {', '.join(map(markdown.text, m['not_learned']))})"
            if m["not_learned"]
            else ""
        )
        rows.append(
            [
                model,
                f"{m['n_params']:,}",
                f"{m['n_learned']} / {m['n_ok']} / {m['n']}{div}",
                fmt(*st["val_ppl"]),
                m["paper"] or "—",
                fmt(*st["test_ppl"]),
                fmt(*st["test_strided_ppl"]),
                fmt(*st["test_word_ppl"]),
                record_links(m["records"], out_dir),
            ]
        )
    lines = [
        f"### {exp_name}: N={exp['n_layers']}, L={exp['context_len']}, B={exp['batch_size']}, "
        f"{exp['epochs']} epochs",
        "",
        *markdown.table(
            [
                "model",
                "params",
                "runs learned / ok / all",
                "best val PPL (ours)",
                "paper",
                "test PPL",
                "test strided",
                "test word-level (lm-eval)",
                "provenance",
            ],
            rows,
        ),
        "",
    ]
    if "gap" in s:
        g = s["gap"]
        ci = (
            ""
            if math.isnan(g["ci_low"])
            else f" (95 % CI {g['ci_low']:+.1f} … {g['ci_high']:+.1f} %)"
        )
        paper_gap = f"; paper: {s['paper_gap_pct']:+.1f} %" if "paper_gap_pct" in s else ""
        lines.append(
            f"Grassmann vs Transformer, best validation PPL: **{g['gap_pct']:+.1f} "
            f"%**{ci}{paper_gap}, "
            f'over {seed_basis(s["models"], s["asked"])}. Paper\'s claim "within 10–15 %": '
            f"**{g['verdict']}**."
        )
    else:
        # and the reasons a verdict would give: the paper's numbers stand in the table all the same
        said = s.get("not_comparable")
        lines.append(
            f"Gap not computed: {no_gap_reason(s['models'])}."
            + (f" {cannot_compare(said)}" if said else "")
        )
    return "\n".join(lines) + "\n"


def latex_table(exp_name, exp, s) -> str:
    rows = [
        [
            model,
            f"{m['n_params']:,}",
            fmt(*m["stats"]["val_ppl"]),
            m["paper"] or "--",
            fmt(*m["stats"]["test_ppl"]),
        ]
        for model, m in s["models"].items()
    ]
    cap = (
        f"{exp_name}: N={exp['n_layers']}, L={exp['context_len']}. Best validation perplexity, "
        "mean ± std over seeds."
    )
    if "gap" in s:
        cap += f" Gap {s['gap']['gap_pct']:+.1f}\u2009%: {s['gap']['verdict']}."
    elif s.get("not_comparable"):
        cap += f" Not comparable with the paper's numbers: {'; '.join(s['not_comparable'])}."
    return latex(["Model", "Params", "Val PPL (ours)", "Paper", "Test PPL"], rows, cap)


def aggregate(
    preset: dict, preset_name: str, experiment: str, runs, out_dir, unigram, checksums, published
) -> None:
    """One experiment's table (<exp>.md/.csv/.tex) and figures (gap_, curves_, best_ppl_<exp>.png)
    from its runs: one job per table, so that a table's target plans only its own runs."""
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    unigram = json.loads(Path(unigram).read_text())
    checksums, published = load_checksums(checksums), load_published(published)
    setup = published["paper_setup"]
    df = load_runs(runs, unigram)
    if set(df.experiment) != {experiment}:
        raise ValueError(
            f"aggregate --experiment {experiment}: runs of "
            f"{sorted(set(df.experiment) - {experiment})} given"
        )
    exp = run_settings(df)  # N, L, B, epochs: as the runs ran them
    unk = exp.pop("unk_mapped")
    head = provenance_line(preset_name, preset, checksums, setup, unk)
    sub = df.sort_values(["model", "seed"])
    paper = paper_ppl(published, experiment)
    s = summarise(sub, paper, len(preset["seeds"]))
    why = not_comparable(
        preset, experiment, ran_settings(run_specs(sub)), checksums, setup, s["models"], unk
    )
    judge(s, why, setup["claim_limit_pct"], verdict_scope(checksums, setup))
    md = (
        markdown_table(experiment, exp, s, out)
        + "\n"
        + made_line(sub)
        + "\n\n"
        + baseline_line(unigram)
        + "\n"
    )
    write_tables(
        out,
        experiment,
        head,
        md,
        sub.assign(preset=preset_name, data_source=preset["data"]["source"]),
        latex_table(experiment, exp, s),
    )
    figures.gap(sub, s.get("paper_gap_pct"), experiment, preset_name, out / f"gap_{experiment}.png")
    curves(sub, experiment, preset_name, out / f"curves_{experiment}.png")
    figures.best_bars(sub, paper, experiment, preset_name, out / f"best_ppl_{experiment}.png")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    aggregate_args(p)
    for name in ("experiment", "unigram", "checksums", "published"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args(argv)
    return job.run(
        aggregate,
        a.preset,
        a.preset_name,
        a.experiment,
        a.runs,
        a.out_dir,
        a.unigram,
        a.checksums,
        a.published,
    )


if __name__ == "__main__":
    sys.exit(main())
