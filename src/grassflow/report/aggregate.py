"""Tables (Markdown, CSV, LaTeX), figures and a summary for one preset.

Per experiment: `<exp>.csv` holds one row per run with its provenance (record path, commit,
data and weights hashes); `<exp>.md`/`.tex` hold ours (mean ± std over seeds) beside the
paper, the unigram baseline of the same tokens, the Grassmann-vs-Transformer gap with a 95 % CI,
and the verdict on the paper's claim, given only where the table can carry one (report.setup).
Diverged runs are listed as such and left out of the means; a run whose validation perplexity
is not below the unigram baseline is marked "did not learn".
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from grassflow import job, markdown
from grassflow.errors import DataError
from grassflow.io import atomic_path, write_text
from grassflow.report import figures
from grassflow.report.records import fields, read_metrics, read_record
from grassflow.report.setup import (
    data_label,
    load_checksums,
    load_published,
    not_comparable,
    paper_ppl,
    verdict_scope,
)
from grassflow.report.stats import gap_ci, mean_std, verdict

MODELS = ("transformer", "grassmann")


def read_runs(run_dirs, columns) -> pd.DataFrame:
    """One row per run directory: its task's `columns(run.json, eval.json, completed and evaluated,
    validation results, test results)`, then the provenance columns."""
    rows = []
    for d in map(Path, run_dirs):
        rec, ev = (read_record(d / f) for f in ("run.json", "eval.json"))
        read_metrics(d / "metrics.jsonl")  # checked before any table is written (the curves read it later)

        def row(rec=rec, ev=ev, d=d):
            ok = rec["status"]["state"] == "completed" and bool(ev.get("validation"))
            return {**columns(rec, ev, ok, ev.get("validation") or {}, ev.get("test") or {}),
                    **provenance_columns(d, rec, ev)}

        rows.append(fields(d, row))
    return pd.DataFrame(rows)


def provenance_columns(d: Path, rec: dict, ev: dict) -> dict:
    """The columns that trace a table row to its run: code, data, weights, record."""
    return {"epochs": rec["epochs_completed"], "wall_s": rec["wall_seconds"],
            # wall_s: the sum of the run's parts (each start or resume to its stop; 0 parts: a record
            # from before they were kept, whose wall_s is its last part's alone)
            "parts": len(rec.get("parts") or []), "device": rec["device"],
            "device_type": rec.get("device_type"), "op_backend": rec.get("plucker_backend"),
            "commit": rec["git"]["commit"], "dirty": rec["git"]["dirty"],
            "train_tokens_sha256": rec["data"]["train"]["file_sha256"],
            "weights_sha256": ev["weights_sha256"], "record": str(d / "run.json"),
            "metrics": str(d / "metrics.jsonl"), "adopted_from": adopted_from(d)}


def adopted_from(d: Path) -> str:
    """Where a run adopted from records made elsewhere came from (grassflow.lm.adopt); "" for a
    run made in this tree."""
    f = d / "adopted.json"
    return str(read_record(f)["source"]) if f.is_file() else ""


def made_line(df: pd.DataFrame) -> str:
    """What a table's runs were made at: each commit (a dirty tree said) with its number of runs,
    and the runs adopted from records made elsewhere, with where from."""
    made = df.assign(code=[f"{str(c)[:7] if isinstance(c, str) else 'no commit'}{' (dirty tree)' if d else ''}"
                           for c, d in zip(df.commit, df.dirty)]).groupby("code", sort=True).run_id.count()
    line = "Runs made at " + ", ".join(f"{markdown.text(code)}: {n} run{'s' * (n != 1)}" for code, n in made.items()) + "."
    adopted = df[df.adopted_from != ""].sort_values("run_id")
    if not adopted.empty:
        where = sorted({str(Path(a).parent) for a in adopted.adopted_from})
        line += (f" From records made elsewhere (finished_runs: {', '.join(map(markdown.text, where))}): "
                 f"{', '.join(map(markdown.text, adopted.run_id))}; the others trained in this tree.")
    return line


def load_runs(run_dirs, unigram: dict | None = None) -> pd.DataFrame:
    """One row per run; `learned`: completed with validation PPL below the unigram baseline."""
    baseline = (unigram or {}).get("validation", {}).get("unigram_ppl", math.inf)
    return read_runs(run_dirs, lambda rec, ev, ok, val, test: {
        "run_id": rec["run_id"], "experiment": rec["spec"]["experiment"], "model": rec["spec"]["model_kind"],
        "seed": rec["spec"]["seed"], "status": rec["status"]["state"],
        "diverged_epoch": rec["status"].get("epoch"), "best_epoch": rec["best_epoch"],
        "val_ppl": val.get("chunked_ppl", math.nan) if ok else math.nan,
        "test_ppl": test.get("chunked_ppl", math.nan) if ok else math.nan,
        "test_strided_ppl": test.get("strided_ppl", math.nan) if ok else math.nan,
        "test_word_ppl": test.get("harness", {}).get("word_ppl", math.nan) if ok else math.nan,  # lm-eval's
        "test_tokens": test.get("chunked_tokens"), "n_params": rec["n_params"],
        "learned": bool(ok and val.get("chunked_ppl", math.inf) < baseline),
        # the settings the table prints, as the run ran them
        **{k: rec["spec"][section][key] for k, (section, key) in RUN_SETTINGS.items()},
        "unk_mapped": rec["data"]["train"].get("unk_mapped") is not None})


# an experiment's settings a table prints: {its name: (the spec's section, key)}; the records hold them
RUN_SETTINGS = {"n_layers": ("model", "n_layers"), "context_len": ("model", "context_len"),
                "batch_size": ("train", "batch_size"), "epochs_asked": ("train", "epochs")}


def run_settings(df: pd.DataFrame) -> dict:
    """An experiment's settings (N, L, B, epochs) and whether its token files map `<unk>`, from its
    runs' records (load_runs): one value each, or a DataError naming the setting."""
    out = {}
    for col in (*RUN_SETTINGS, "unk_mapped"):
        values = sorted(set(df[col].tolist()))
        if len(values) != 1:
            raise DataError(f"the runs' records disagree on {col}: {values} ({', '.join(sorted(df.run_id))})")
        out["epochs" if col == "epochs_asked" else col] = values[0]
    return out


def _fmt(mean, std, digits=1):
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def by_model(df: pd.DataFrame, key: str) -> dict:
    """{model: (its runs, those completed with a `key` value)}, in MODELS' order, for the models with runs."""
    return {m: (sub, sub[sub.status == "completed"].dropna(subset=[key])) for m in MODELS
            if not (sub := df[df.model == m]).empty}


def no_gap_reason(models: dict, unit: str = "model") -> str:
    """Why a table of `models` ({model: ...}) has no gap: the models its preset did not ask for
    (a preset may ask one), or one that completed no run."""
    absent = [m for m in MODELS if m not in models]
    return f"no {' or '.join(absent)} runs in this table" if absent else f"a {unit} has no completed run"


def cannot_compare(why: list[str]) -> str:
    """The line under a table whose numbers the paper's cannot be compared with (report.setup.not_comparable)."""
    return "**These numbers cannot be compared with the paper's:** " + "; ".join(why) + "."


def left_out(sub: pd.DataFrame, good: pd.DataFrame) -> list[str]:
    """The runs a model's statistics leave out, each with why (diverged, or how else it ended)."""
    kept = set(good.run_id)
    return [markdown.text(f"{r.run_id} ({r.status if r.status != 'completed' else 'no validation PPL'})")
            for r in sub.sort_values("run_id").itertuples() if r.run_id not in kept]


def seed_basis(models: dict, asked: int) -> str:
    """What a gap rests on: each model's runs of the seeds the preset asked for, and the runs left out."""
    dropped = [r for m in models.values() for r in m["left_out"]]
    return (", ".join(f"{m['n_ok']} of {asked} {model} seeds" for model, m in models.items())
            + (f"; left out: {', '.join(dropped)}" if dropped else ""))


def summarise(df: pd.DataFrame, paper: dict, asked: int) -> dict:
    """Per-model statistics and the gap for one experiment; `paper`: the paper's PPL per model;
    `asked`: the seeds per model the preset asked for."""
    out = {"models": {}, "asked": asked}
    for model, (sub, good) in by_model(df, "val_ppl").items():
        stats = {k: mean_std(good[k]) for k in ("val_ppl", "test_ppl", "test_strided_ppl", "test_word_ppl")}
        out["models"][model] = {"n": len(sub), "n_ok": len(good), "stats": stats,
                                "n_learned": int(good.learned.sum()),
                                "not_learned": sorted(good[~good.learned].run_id),
                                "diverged": sorted(sub[sub.status == "diverged"].run_id),
                                "left_out": left_out(sub, good),
                                "paper": paper.get(model), "n_params": int(sub.n_params.iloc[0]),
                                "records": list(sub.record), "val_values": list(good.val_ppl)}
    m = out["models"]
    if all(k in m and m[k]["n_ok"] for k in MODELS):
        out["gap"] = gap_ci(m["grassmann"]["val_values"], m["transformer"]["val_values"])
    if all(paper.get(k) for k in MODELS):
        out["paper_gap_pct"] = 100 * (paper["grassmann"] - paper["transformer"]) / paper["transformer"]
    return out


def provenance_line(name: str, preset: dict, checksums: dict, setup: dict, unk: bool | None = None) -> str:
    return (f"Preset **{name}**: data {data_label(preset, checksums, setup, unk)}; "
            f"tokenizer {preset['tokenizer']['name']}.")


def judge(s: dict, why: list[str], limit: float, scope: str | None = None) -> None:
    """The verdict on the paper's claim (a gap within `limit` %: published.yaml's
    claim_limit_pct), or why the table cannot give one; `scope`: what a verdict must say it was
    measured on (verdict_scope)."""
    s["not_comparable"] = why
    if "gap" in s:
        g = s["gap"]
        g["verdict"] = verdict(g["ci_low"], g["ci_high"], g["gap_pct"], limit)
        if why:
            s["gap"]["verdict"] = "not comparable: " + "; ".join(why)
        elif scope:
            s["gap"]["verdict"] += f" — {scope}"
        if any(m["n_ok"] < s["asked"] for m in s["models"].values()):  # never a silently dropped seed
            g["verdict"] += f" — on fewer seeds than asked ({seed_basis(s['models'], s['asked'])})"


def baseline_line(unigram: dict) -> str:
    return (f"Unigram baseline (training-split token frequencies, add-one): validation PPL "
            f"**{unigram['validation']['unigram_ppl']:.1f}**, test {unigram['test']['unigram_ppl']:.1f}. "
            "A run not below it did not learn.")


def markdown_table(exp_name, exp, s, out_dir) -> str:
    rows = []
    for model, m in s["models"].items():
        st = m["stats"]
        div = f" ({len(m['diverged'])} diverged)" if m["diverged"] else ""
        div += f" (did not learn: {', '.join(map(markdown.text, m['not_learned']))})" if m["not_learned"] else ""
        rows.append([model, f"{m['n_params']:,}", f"{m['n_learned']} / {m['n_ok']} / {m['n']}{div}", _fmt(*st["val_ppl"]),
                     m["paper"] or "—", _fmt(*st["test_ppl"]), _fmt(*st["test_strided_ppl"]), _fmt(*st["test_word_ppl"]),
                     record_links(m["records"], out_dir)])
    lines = [f"### {exp_name}: N={exp['n_layers']}, L={exp['context_len']}, B={exp['batch_size']}, "
             f"{exp['epochs']} epochs", "", *markdown.table(
                 ["model", "params", "runs learned / ok / all", "best val PPL (ours)", "paper", "test PPL", "test strided",
                  "test word-level (lm-eval)", "provenance"], rows), ""]
    if "gap" in s:
        g = s["gap"]
        ci = "" if math.isnan(g["ci_low"]) else f" (95 % CI {g['ci_low']:+.1f} … {g['ci_high']:+.1f} %)"
        paper_gap = f"; paper: {s['paper_gap_pct']:+.1f} %" if "paper_gap_pct" in s else ""
        lines.append(f"Grassmann vs Transformer, best validation PPL: **{g['gap_pct']:+.1f} %**{ci}{paper_gap}, "
                     f"over {seed_basis(s['models'], s['asked'])}. Paper's claim \"within 10–15 %\": **{g['verdict']}**.")
    else:
        # and the reasons a verdict would give: the paper's numbers stand in the table all the same
        said = s.get("not_comparable")
        lines.append(f"Gap not computed: {no_gap_reason(s['models'])}." + (f" {cannot_compare(said)}" if said else ""))
    return "\n".join(lines) + "\n"


# Plain text to LaTeX: its special characters, and the non-ASCII ones our tables use (pdflatex)
TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
       "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "<": r"\textless{}",
       ">": r"\textgreater{}", "`": r"\textasciigrave{}", "±": r"$\pm$", "—": "---", "–": "--", "…": r"\ldots{}",
       "→": r"$\rightarrow$", "×": r"$\times$", "−": "$-$", "≥": r"$\geq$", "≤": r"$\leq$", "≈": r"$\approx$",
       "Δ": r"$\Delta$", "α": r"$\alpha$", "·": r"$\cdot$", "⊙": r"$\odot$", "\u2009": r"\,", "\u00a0": "~"}


def tex_escape(text) -> str:
    """A table cell or caption (plain text) as LaTeX: every character pdflatex would misread
    escaped; any other non-ASCII character is refused, naming it, before a table that cannot
    compile is written."""
    out = "".join(TEX.get(c, c) for c in str(text))
    bad = sorted({c for c in out if ord(c) > 126})
    if bad:
        raise ValueError(f"no LaTeX for {bad} in {str(text)!r}: add it to grassflow.report.aggregate.TEX")
    return out


def latex(header: list[str], rows: list[list[str]], caption: str) -> str:
    """A booktabs table of plain-text cells and caption (tex_escape): first column left-aligned,
    the rest right."""
    def cells(row):
        return " & ".join(tex_escape(c) for c in row) + r" \\"
    body = "\n".join(cells(r) for r in rows)
    return ("\\begin{table}[t]\n\\centering\n\\begin{tabular}{l" + "r" * (len(header) - 1) + "}\n\\toprule\n"
            f"{cells(header)}\n\\midrule\n{body}\n\\bottomrule\n\\end{{tabular}}\n"
            f"\\caption{{{tex_escape(caption)}}}\n\\end{{table}}\n")


def record_links(records, out_dir) -> str:
    """Markdown links from a table row to the provenance records of its runs."""
    return " ".join(f"[{markdown.text(Path(r).parent.name)}]({quote(os.path.relpath(r, out_dir))})" for r in records)


def latex_table(exp_name, exp, s) -> str:
    rows = [[model, f"{m['n_params']:,}", _fmt(*m["stats"]["val_ppl"]), m["paper"] or "--", _fmt(*m["stats"]["test_ppl"])]
            for model, m in s["models"].items()]
    cap = f"{exp_name}: N={exp['n_layers']}, L={exp['context_len']}. Best validation perplexity, mean ± std over seeds."
    if "gap" in s:
        cap += f" Gap {s['gap']['gap_pct']:+.1f}\u2009%: {s['gap']['verdict']}."
    elif s.get("not_comparable"):
        cap += f" Not comparable with the paper's numbers: {'; '.join(s['not_comparable'])}."
    return latex(["Model", "Params", "Val PPL (ours)", "Paper", "Test PPL"], rows, cap)


def write_tables(out: Path, stem: str, head: str, md: str, rows: pd.DataFrame, tex: str) -> None:
    """<stem>.md, .csv (one row per run, with provenance) and .tex, each written atomically;
    the Markdown and LaTeX open with the provenance line `head`."""
    write_text(out / f"{stem}.md", f"{head}\n\n{md}")
    with atomic_path(out / f"{stem}.csv") as tmp:
        rows.to_csv(tmp, index=False)
    write_text(out / f"{stem}.tex", "".join(f"% {line}\n" for line in head.splitlines()) + tex)  # a comment, line by line


def aggregate(preset: dict, preset_name: str, experiment: str, runs, out_dir, unigram, checksums,
              published) -> None:
    """One experiment's table (<exp>.md/.csv/.tex) and figures (gap_, curves_, best_ppl_<exp>.png)
    from its runs: one job per table, so that a table's target plans only its own runs."""
    out = Path(out_dir)  # made by its first write (io.atomic_path)
    unigram = json.loads(Path(unigram).read_text())
    checksums, published = load_checksums(checksums), load_published(published)
    setup = published["paper_setup"]
    df = load_runs(runs, unigram)
    if set(df.experiment) != {experiment}:
        raise ValueError(f"aggregate --experiment {experiment}: runs of {sorted(set(df.experiment) - {experiment})} given")
    exp = run_settings(df)  # N, L, B, epochs: as the runs ran them
    unk = exp.pop("unk_mapped")
    head = provenance_line(preset_name, preset, checksums, setup, unk)
    sub = df.sort_values(["model", "seed"])
    paper = paper_ppl(published, experiment)
    s = summarise(sub, paper, len(preset["seeds"]))
    judge(s, not_comparable(preset, experiment, exp, checksums, setup, s["models"], unk), setup["claim_limit_pct"],
          verdict_scope(checksums, setup))
    md = markdown_table(experiment, exp, s, out) + "\n" + made_line(sub) + "\n\n" + baseline_line(unigram) + "\n"
    write_tables(out, experiment, head, md, sub.assign(preset=preset_name, data_source=preset["data"]["source"]),
                 latex_table(experiment, exp, s))
    figures.gap(sub, s.get("paper_gap_pct"), experiment, preset_name, out / f"gap_{experiment}.png")
    figures.curves(sub, experiment, preset_name, out / f"curves_{experiment}.png")
    figures.best_bars(sub, paper, experiment, preset_name, out / f"best_ppl_{experiment}.png")


def summary(preset_name: str, tables, bench, out_dir) -> None:
    """summary.md (every table of the preset, under their one provenance line, and their figures:
    those `aggregate` wrote for them, not whatever else the directory holds when this runs) and
    the scaling figure from the benchmark."""
    out = Path(out_dir)
    figures.scaling(json.loads(Path(bench).read_text()), preset_name, out / "scaling.png")
    texts = [Path(t).read_text().split("\n\n", 1) for t in tables]  # (provenance line, table)
    lines = [f"# grassflow results — preset `{preset_name}`", "", texts[0][0], ""]
    for _, md in texts:
        lines += [md.rstrip("\n") + "\n", ""]
    pngs = [f"{kind}_{Path(t).stem}.png" for t in tables for kind in ("gap", "curves", "best_ppl")] + ["scaling.png"]
    lines += ["Figures: " + ", ".join(f"`{p}`" for p in sorted(pngs))]
    write_text(out / "summary.md", "\n".join(lines) + "\n")



def aggregate_args(p) -> None:
    """A task's table job: the preset (its params' JSON), its name, the runs it reads, where it writes."""
    p.add_argument("--preset", required=True, type=job.json_arg, help="the preset: " + job.JSON)
    p.add_argument("--preset-name", required=True)
    p.add_argument("--runs", required=True, nargs="+", help="run directories")
    p.add_argument("--out-dir", required=True)


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    aggregate_args(p)
    for name in ("experiment", "unigram", "checksums", "published"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args(argv)
    return job.run(aggregate, a.preset, a.preset_name, a.experiment, a.runs, a.out_dir, a.unigram, a.checksums,
                   a.published)


if __name__ == "__main__":
    sys.exit(main())
