"""What every task's tables share: the run rows with their provenance columns, the Markdown cells
and lines (a mean ± std, the runs left out, what a gap rests on, where the runs were made), LaTeX
(booktabs, every cell escaped) and the atomic writing of a table's .md/.csv/.tex; a table job's
command line. Each task's table job is its own (grassflow.lm.aggregate, snli.aggregate,
recall.aggregate)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from grassflow import job, markdown
from grassflow.io import atomic_path, write_text
from grassflow.report.records import fields, read_metrics, read_record

MODELS = ("transformer", "grassmann")


def read_runs(run_dirs, columns) -> pd.DataFrame:
    """One row per run directory: its task's
    `columns(run.json, eval.json, completed and evaluated, validation results, test results)`, then
    the provenance columns; in the order of the directories' paths, whatever order they were handed
    in (a table's rows never depend on how it was run)."""
    rows = []
    for d in sorted(map(Path, run_dirs)):
        rec, ev = (read_record(d / f) for f in ("run.json", "eval.json"))
        # checked before any table is written (the curves read it later)
        read_metrics(d / "metrics.jsonl")

        def row(rec=rec, ev=ev, d=d):
            ok = rec["status"]["state"] == "completed" and bool(ev.get("validation"))
            return {
                **columns(rec, ev, ok, ev.get("validation") or {}, ev.get("test") or {}),
                **provenance_columns(d, rec, ev),
            }

        rows.append(fields(d, row))
    return pd.DataFrame(rows)


def provenance_columns(d: Path, rec: dict, ev: dict) -> dict:
    """The columns that trace a table row to its run: code, data, weights, record."""
    return {
        "epochs": rec["epochs_completed"],
        "wall_s": rec["wall_seconds"],
        # wall_s: the sum of the run's parts (each start or resume to its stop; 0 parts: a record
        # from before they were kept, whose wall_s is its last part's alone)
        "parts": len(rec.get("parts") or []),
        "device": rec["device"],
        "device_type": rec.get("device_type"),
        "op_backend": rec.get("plucker_backend"),
        "commit": rec["git"]["commit"],
        "dirty": rec["git"]["dirty"],
        "train_tokens_sha256": rec["data"]["train"]["file_sha256"],
        "stop_reason": rec["status"].get("reason")
        or "",  # a completed run short of its epochs says why
        "weights_sha256": ev["weights_sha256"],
        "record": str(d / "run.json"),
        "metrics": str(d / "metrics.jsonl"),
        "adopted_from": adopted_from(d),
    }


def adopted_from(d: Path) -> str:
    """Where a run adopted from records made elsewhere came from (grassflow.lm.adopt); "" for a run
    made in this tree."""
    f = d / "adopted.json"
    return str(read_record(f)["source"]) if f.is_file() else ""


def fmt(mean, std, digits=1):
    if math.isnan(mean):
        return "—"
    return f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def by_model(df: pd.DataFrame, key: str) -> dict:
    """{model: (its runs, those completed with a `key` value)}, in MODELS' order, for the models
    with runs."""
    return {
        m: (sub, sub[sub.status == "completed"].dropna(subset=[key]))
        for m in MODELS
        if not (sub := df[df.model == m]).empty
    }


def no_gap_reason(models: dict, unit: str = "model") -> str:
    """Why a table of `models` ({model: ...}) has no gap: the models its preset did not ask for (a
    preset may ask one), or one that completed no run."""
    absent = [m for m in MODELS if m not in models]
    return (
        f"no {' or '.join(absent)} runs in this table"
        if absent
        else f"a {unit} has no completed run"
    )


# Plain text to LaTeX: its special characters, and the non-ASCII ones our tables use (pdflatex)
TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "`": r"\textasciigrave{}",
    "±": r"$\pm$",
    "—": "---",
    "–": "--",
    "…": r"\ldots{}",
    "→": r"$\rightarrow$",
    "×": r"$\times$",
    "−": "$-$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "≈": r"$\approx$",
    "Δ": r"$\Delta$",
    "α": r"$\alpha$",
    "·": r"$\cdot$",
    "⊙": r"$\odot$",
    "\u2009": r"\,",
    "\u00a0": "~",
}


def tex_escape(text) -> str:
    """A table cell or caption (plain text) as LaTeX: every character pdflatex would misread
    escaped; any other non-ASCII character is refused, naming it, before a table that cannot compile
    is written."""
    out = "".join(TEX.get(c, c) for c in str(text))
    bad = sorted({c for c in out if ord(c) > 126})
    if bad:
        raise ValueError(
            f"no LaTeX for {bad} in {str(text)!r}: add it to grassflow.report.tables.TEX"
        )
    return out


def latex(header: list[str], rows: list[list[str]], caption: str) -> str:
    """A booktabs table of plain-text cells and caption (tex_escape): first column left-aligned, the
    rest right."""

    def cells(row):
        return " & ".join(tex_escape(c) for c in row) + r" \\"

    body = "\n".join(cells(r) for r in rows)
    return (
        "\\begin{table}[t]\n\\centering\n\\begin{tabular}{l"
        + "r" * (len(header) - 1)
        + "}\n\\toprule\n"
        f"{cells(header)}\n\\midrule\n{body}\n\\bottomrule\n\\end{{tabular}}\n"
        f"\\caption{{{tex_escape(caption)}}}\n\\end{{table}}\n"
    )


def record_links(records, out_dir) -> str:
    """Markdown links from a table row to the provenance records of its runs."""
    return " ".join(
        f"[{markdown.text(Path(r).parent.name)}]({quote(os.path.relpath(r, out_dir))})"
        for r in records
    )


def write_tables(out: Path, stem: str, head: str, md: str, rows: pd.DataFrame, tex: str) -> None:
    """<stem>.md, .csv (one row per run, with provenance) and .tex, each written atomically; the
    Markdown and LaTeX open with the provenance line `head`."""
    write_text(out / f"{stem}.md", f"{head}\n\n{md}")
    with atomic_path(out / f"{stem}.csv") as tmp:
        rows.to_csv(tmp, index=False)
    # a comment, line by line
    write_text(out / f"{stem}.tex", "".join(f"% {line}\n" for line in head.splitlines()) + tex)


def aggregate_args(p) -> None:
    """A task's table job: the preset (its params' JSON), its name, the runs it reads, where it
    writes."""
    p.add_argument("--preset", required=True, type=job.json_arg, help="the preset: " + job.JSON)
    p.add_argument("--preset-name", required=True)
    p.add_argument("--runs", required=True, nargs="+", help="run directories")
    p.add_argument("--out-dir", required=True)
