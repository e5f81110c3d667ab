"""Which run was what, and why two differ: `grassflow runs` and `grassflow diff`, from the records.

`grassflow runs [DIR]` (default `results/`): every run with a record under a results tree (any
preset, any task: each `run.json` under it; a run still training has none yet), a row each: preset, table, model, seed, the spec's settings that differ
across the runs listed (dotted keys), status, epochs, parts, wall time, the best validation and the
test figure (perplexity for language modelling, accuracy % for SNLI and recall), commit and where it
was adopted from. `--preset` and `--where key=value` (a column or a dotted spec key) filter; `--csv`
writes CSV. It reads records only (run.json, eval.json, adopted.json), never weights.

`grassflow diff RUN RUN` (two run directories): the spec keys that differ (dotted, both values), the
data and weights hashes, the commits, the parts, and the two validation curves side by side with
their best epochs.

A missing or damaged record is one line naming it (grassflow.report.records).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from grassflow import markdown
from grassflow.errors import CommandError
from grassflow.report.records import read_metrics, read_record

NAMED = ("run_id", "preset", "task", "experiment", "model_kind", "model_name", "seed")  # columns of their own


def flat(d, at="") -> dict:
    """A nested dict as {dotted key: value} (lists are values)."""
    out = {}
    for k, v in d.items():
        key = f"{at}.{k}" if at else str(k)
        out.update(flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def _figures(task: str, ev: dict) -> tuple[float | None, float | None]:
    """(best validation, test) as the run's table reads them: perplexity for the LM, accuracy % else."""
    key = "chunked_ppl" if task == "lm" else "accuracy"
    return (ev.get("validation") or {}).get(key), (ev.get("test") or {}).get(key)


def record_row(run_json: Path) -> tuple[dict, dict]:
    """(the row of the run whose run.json is `run_json`, its spec flattened)."""
    rec = read_record(run_json)
    d = run_json.parent
    ev = read_record(d / "eval.json") if (d / "eval.json").is_file() else {}
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else None
    if spec is None:
        raise CommandError(f"{run_json}: no spec: not a run's record")
    adopted = d / "adopted.json"
    val, test = _figures(spec.get("task", "lm"), ev)
    if val is None and rec.get("best_val_ppl") is not None:
        val = rec["best_val_ppl"]
    commit = (rec.get("git") or {}).get("commit")
    row = {"run": str(d), "preset": spec.get("preset"), "table": spec.get("experiment") or spec.get("data_cell"),
           "model": spec.get("model_name") or spec.get("model_kind"), "seed": spec.get("seed"),
           "status": (rec.get("status") or {}).get("state"), "epochs": rec.get("epochs_completed"),
           "parts": len(rec.get("parts") or []), "wall_s": rec.get("wall_seconds"),
           "best_val": val, "test": test, "commit": (commit or "")[:7] + (" dirty" if (rec.get("git") or {}).get("dirty") else ""),
           "adopted_from": read_record(adopted).get("source", "") if adopted.is_file() else ""}
    return row, {k: v for k, v in flat(spec).items() if k not in NAMED}


def list_runs(root: Path, preset: str | None = None, where=()) -> tuple[list[dict], list[str]]:
    """(the rows of every run under `root` that `preset` and `where` (key=value) keep, sorted;
    the settings that differ across them, dotted)."""
    root = Path(root)
    if not root.is_dir():
        raise CommandError(f"{root}: no such directory (a results tree: results/)")
    found = []
    for run_json in sorted(root.rglob("run.json")):
        row, spec = record_row(run_json)
        if preset is not None and row["preset"] != preset:
            continue
        found.append((row, spec))
    for cond in where:
        key, _, want = cond.partition("=")
        if not _:
            raise CommandError(f"--where {cond}: give key=value (a column or a dotted spec key)")
        found = [(r, s) for r, s in found if str(r.get(key, s.get(key))) == want]
    keys = sorted({k for _, s in found for k in s})
    differ = [k for k in keys if len({json.dumps(s.get(k), sort_keys=True) for _, s in found}) > 1]
    rows = [{**{k: v for k, v in r.items() if k != "run"}, **{k: s.get(k) for k in differ}, "run": r["run"]}
            for r, s in found]
    return sorted(rows, key=lambda r: (str(r["preset"]), str(r["table"]), str(r["model"]), r["seed"] or 0)), differ


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        return f"{v:.6g}"
    return markdown.text(json.dumps(v) if isinstance(v, (list, dict)) else v)


def runs_markdown(rows: list[dict], differ: list[str]) -> str:
    if not rows:
        return "No runs found.\n"
    head = list(rows[0])
    lines = markdown.table([markdown.text(k) for k in head], [[_cell(r[k]) for k in head] for r in rows])
    said = f"Settings that differ across these runs: {', '.join(differ)}." if differ else "No setting differs across these runs."
    return "\n".join([f"{len(rows)} run(s). {markdown.text(said)}", "", *lines, ""])


def runs_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    if rows:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()} for r in rows)
    return out.getvalue()


def _differences(a, b, at=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in _differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{at}.{k}" if at else k)]
    return [] if a == b else [(at, a, b)]


def diff(a_dir: Path, b_dir: Path) -> str:
    """What differs between two runs, as Markdown."""
    recs = []
    for d in (Path(a_dir), Path(b_dir)):
        if not (d / "run.json").is_file():
            raise CommandError(f"{d}: no run.json (a run's directory: results/<preset>/runs/<run>)")
        rec = read_record(d / "run.json")
        recs.append((d, rec, read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []))
    (da, ra, ma), (db, rb, mb) = recs
    lines = [f"# {markdown.text(da.name)} vs {markdown.text(db.name)}", ""]
    spec = _differences(ra.get("spec") or {}, rb.get("spec") or {})
    lines += ["## Spec", ""]
    lines += (markdown.table(["key", markdown.text(da.name), markdown.text(db.name)],
                             [[markdown.text(k), _cell(x), _cell(y)] for k, x, y in spec])
              if spec else ["The same spec."])
    facts = [("commit", lambda r: (r.get("git") or {}).get("commit")), ("dirty", lambda r: (r.get("git") or {}).get("dirty")),
             ("weights_sha256", lambda r: r.get("weights_sha256")), ("status", lambda r: (r.get("status") or {}).get("state")),
             ("epochs", lambda r: r.get("epochs_completed")), ("best epoch", lambda r: r.get("best_epoch")),
             ("parts", lambda r: [p.get("ended") for p in r.get("parts") or []]), ("device", lambda r: r.get("device"))]
    facts += [(f"data.{s}.file_sha256", lambda r, s=s: ((r.get("data") or {}).get(s) or {}).get("file_sha256"))
              for s in sorted(set(ra.get("data") or {}) | set(rb.get("data") or {}))]
    lines += ["", "## Records", "", *markdown.table(
        ["", markdown.text(da.name), markdown.text(db.name), "same"],
        [[markdown.text(name), _cell(get(ra)), _cell(get(rb)), "yes" if get(ra) == get(rb) else "**no**"]
         for name, get in facts])]
    key = "val_ppl" if any("val_ppl" in m for m in ma + mb) else "val_acc"
    n = max(len(ma), len(mb))
    lines += ["", f"## Validation curves ({key})", "", *markdown.table(
        ["epoch", markdown.text(da.name), markdown.text(db.name)],
        [[e + 1, _cell(ma[e].get(key)) if e < len(ma) else "—", _cell(mb[e].get(key)) if e < len(mb) else "—"]
         for e in range(n)]), "",
        f"Best epochs: {ra.get('best_epoch')} and {rb.get('best_epoch')}.", ""]
    return "\n".join(lines)
