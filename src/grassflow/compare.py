"""Which run was what, and why runs differ: `grassflow runs` and `grassflow diff`, from the records.

`grassflow runs [DIR]` (default `results/`): every run with a record under a results tree (any
preset, any task: each `run.json` under it; a run still training has none yet), a row each: preset,
table, model, seed, the spec's settings that differ across the runs listed (dotted keys), status,
epochs, parts, wall time, the best validation and the test figure (perplexity for language
modelling, accuracy % for SNLI and recall), commit and where it was adopted from. `--preset` and
`--where key=value` (a column or a dotted spec key) filter, `--sort KEY` orders; `--group` pools the
runs that differ only in their seed (n, mean ± std). On a terminal a table that fits it
(grassflow.terminal); `--md` Markdown (the default where the output is piped), `--csv` CSV, `--json`
every field of every record at full precision. It reads records only (run.json, eval.json,
adopted.json), never weights.

`grassflow diff RUN RUN [RUN ...]`: the runs side by side: the spec keys that differ (dotted), the
best validation and test figures with their differences from the first run (absolute and %), the
records (status, epochs, hashes, parts), the environment each ran in (Python, torch, CUDA, CuPy,
device, commit, dirty) and the validation curves; the same modes.

A missing or damaged record is one line naming it (grassflow.report.records).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
from pathlib import Path

from grassflow import markdown
from grassflow.errors import CommandError
from grassflow.report.records import read_metrics, read_record

# columns of their own
NAMED = (
    "run_id",
    "preset",
    "task",
    "experiment",
    "model_kind",
    "model_name",
    "seed",
)


def flat(d, at="") -> dict:
    """A nested dict as {dotted key: value} (lists are values)."""
    out = {}
    for k, v in d.items():
        key = f"{at}.{k}" if at else str(k)
        out.update(flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def _figures(task: str, ev: dict) -> tuple[float | None, float | None]:
    """(best validation, test) as the run's table reads them: perplexity for the LM, accuracy %
    else."""
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
    row = {
        "run": str(d),
        "preset": spec.get("preset"),
        "table": spec.get("experiment") or spec.get("data_cell"),
        "model": spec.get("model_name") or spec.get("model_kind"),
        "seed": spec.get("seed"),
        "status": (rec.get("status") or {}).get("state"),
        "epochs": rec.get("epochs_completed"),
        "parts": len(rec.get("parts") or []),
        "wall_s": rec.get("wall_seconds"),
        "best_val": val,
        "test": test,
        "commit": (commit or "")[:7] + (" dirty" if (rec.get("git") or {}).get("dirty") else ""),
        "adopted_from": read_record(adopted).get("source", "") if adopted.is_file() else "",
    }
    return row, {k: v for k, v in flat(spec).items() if k not in NAMED}


def list_runs(root: Path, preset: str | None = None, where=()) -> tuple[list[dict], list[str]]:
    """(the rows of every run under `root` that `preset` and `where` (key=value) keep, sorted; the
    settings that differ across them, dotted)."""
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
    rows = [
        {
            **{k: v for k, v in r.items() if k != "run"},
            **{k: s.get(k) for k in differ},
            "run": r["run"],
        }
        for r, s in found
    ]
    return sorted(
        rows, key=lambda r: (str(r["preset"]), str(r["table"]), str(r["model"]), r["seed"] or 0)
    ), differ


def run_tasks(rows: list[dict]) -> dict[str, str]:
    """{run directory: its task} (lm, snli, recall), from its record."""
    return {
        r["run"]: (read_record(Path(r["run"]) / "run.json").get("spec") or {}).get("task", "lm")
        for r in rows
    }


def sort_rows(rows: list[dict], key: str) -> list[dict]:
    """`rows` ordered by `key` (a column or a dotted spec key of theirs), numbers as numbers, rows
    without it last."""
    if rows and not any(key in r for r in rows):
        raise CommandError(
            f"--sort {key}: no such column or differing spec key (have: {', '.join(rows[0])})"
        )

    def k(r):
        v = r.get(key)
        missing = v is None or (isinstance(v, float) and math.isnan(v))
        return (
            missing,
            0 if isinstance(v, (int, float)) and not isinstance(v, bool) else 1,
            v if isinstance(v, (int, float)) and not missing else str(v),
        )

    return sorted(rows, key=k)


def group_rows(rows: list[dict]) -> list[dict]:
    """The runs that differ only in their seed pooled (their preset and run group: the run's id less
    its seed, grassflow.planning.sections.run_id): n, runs ok (completed with a figure), and the
    best validation and test figures' mean and sample std over them."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        name = Path(r["run"]).name
        group = name.rsplit("-s", 1)[0] if re.fullmatch(r".+-s\d+", name) else name
        groups.setdefault((str(r["preset"]), group), []).append(r)
    out = []
    for (preset, group), rs in groups.items():
        ok = [r for r in rs if r["status"] == "completed" and r["best_val"] is not None]
        row = {
            "preset": preset,
            "group": group,
            "table": rs[0]["table"],
            "model": rs[0]["model"],
            "seeds": sorted(r["seed"] for r in rs if r["seed"] is not None),
            "n": len(rs),
            "ok": len(ok),
        }
        for key in ("best_val", "test"):
            xs = [float(r[key]) for r in ok if r[key] is not None]
            row[f"{key}_mean"] = statistics.fmean(xs) if xs else None
            row[f"{key}_std"] = statistics.stdev(xs) if len(xs) > 1 else None
        out.append(row)
    return out


def runs_json(rows: list[dict]) -> str:
    """Each row with its run's records whole (run.json, eval.json, adopted.json: every field, at
    full precision)."""
    out = []
    for r in rows:
        d = Path(r["run"])
        out.append(
            {
                **r,
                "records": {
                    name: read_record(d / name) if (d / name).is_file() else None
                    for name in ("run.json", "eval.json", "adopted.json")
                },
            }
        )
    return json.dumps(out, indent=1) + "\n"


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
    lines = markdown.table(
        [markdown.text(k) for k in head], [[_cell(r[k]) for k in head] for r in rows]
    )
    said = (
        f"Settings that differ across these runs: {', '.join(differ)}."
        if differ
        else "No setting differs across these runs."
    )
    return "\n".join([f"{len(rows)} run(s). {markdown.text(said)}", "", *lines, ""])


def runs_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    if rows:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(
            {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()}
            for r in rows
        )
    return out.getvalue()


def _differences(a, b, at=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b))
            for d in _differences(
                a.get(k, "<absent>"), b.get(k, "<absent>"), f"{at}.{k}" if at else k
            )
        ]
    return [] if a == b else [(at, a, b)]


def _cuda(rec: dict):
    versions = (rec.get("preflight") or {}).get("versions") or {}
    return versions.get("torch_cuda") or versions.get("cuda_runtime")


def _cupy(rec: dict):
    packages = rec.get("packages") or {}
    found = [f"{k} {v}" for k, v in sorted(packages.items()) if k.startswith("cupy")]
    return ", ".join(found) or ((rec.get("preflight") or {}).get("versions") or {}).get("cupy")


# what diff says of each run's records and of the environment it ran in: (row name, reader)
RECORD_FACTS = [
    ("status", lambda r: (r.get("status") or {}).get("state")),
    ("epochs", lambda r: r.get("epochs_completed")),
    ("best epoch", lambda r: r.get("best_epoch")),
    ("parts", lambda r: [p.get("ended") for p in r.get("parts") or []]),
    ("weights_sha256", lambda r: r.get("weights_sha256")),
]
ENVIRONMENT = [
    ("python", lambda r: (r.get("packages") or {}).get("python")),
    ("torch", lambda r: (r.get("packages") or {}).get("torch")),
    ("CUDA", _cuda),
    ("CuPy", _cupy),
    ("device", lambda r: r.get("device")),
    ("commit", lambda r: (r.get("git") or {}).get("commit")),
    ("dirty", lambda r: (r.get("git") or {}).get("dirty")),
]


def diff_data(dirs) -> dict:
    """What differs between runs (the first the reference): their names, the spec keys that differ
    ([key, values]), the best validation and test figures with each run's difference from the first
    (absolute, %), the records' facts and the environment ([name, values]), and the validation
    curves."""
    runs = []
    for d in map(Path, dirs):
        if not (d / "run.json").is_file():
            raise CommandError(f"{d}: no run.json (a run's directory: results/<preset>/runs/<run>)")
        rec = read_record(d / "run.json")
        ev = read_record(d / "eval.json") if (d / "eval.json").is_file() else {}
        runs.append(
            (
                d,
                rec,
                ev,
                read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else [],
            )
        )
    specs = [flat(rec.get("spec") or {}) for _, rec, _, _ in runs]
    keys = sorted(set().union(*specs))
    spec = [
        [k, [s.get(k, "<absent>") for s in specs]]
        for k in keys
        if len({json.dumps(s.get(k, "<absent>"), sort_keys=True) for s in specs}) > 1
    ]
    figures = []
    for name, split in (("best val", 0), ("test", 1)):
        values = [
            _figures(((rec.get("spec") or {}).get("task")) or "lm", ev)[split]
            for _, rec, ev, _ in runs
        ]
        first = values[0]
        figures.append(
            [
                name,
                values,
                [v - first if None not in (v, first) else None for v in values],
                [
                    100 * (v - first) / first if None not in (v, first) and first else None
                    for v in values
                ],
            ]
        )
    key = "val_ppl" if any("val_ppl" in m for _, _, _, ms in runs for m in ms) else "val_acc"
    return {
        "runs": [d.name for d, *_ in runs],
        "dirs": [str(d) for d, *_ in runs],
        "spec": spec,
        "figures": figures,
        "records": [[n, [get(rec) for _, rec, _, _ in runs]] for n, get in RECORD_FACTS]
        + [
            [
                f"data.{s}.file_sha256",
                [
                    ((rec.get("data") or {}).get(s) or {}).get("file_sha256")
                    for _, rec, _, _ in runs
                ],
            ]
            for s in sorted(set().union(*((rec.get("data") or {}) for _, rec, _, _ in runs)))
        ],
        "environment": [[n, [get(rec) for _, rec, _, _ in runs]] for n, get in ENVIRONMENT],
        "curve_key": key,
        "curves": [[m.get(key) for m in ms] for *_, ms in runs],
        "best_epochs": [rec.get("best_epoch") for _, rec, _, _ in runs],
    }


def _delta(x, pct=False) -> str:
    if x is None:
        return "—"
    return f"{x:+.2f} %" if pct else f"{x:+.6g}"


def diff_markdown(data: dict) -> str:
    names = [markdown.text(n) for n in data["runs"]]
    lines = [f"# {' vs '.join(names)}", ""]
    lines += ["## Spec", ""]
    lines += (
        markdown.table(
            ["key", *names], [[markdown.text(k), *map(_cell, vs)] for k, vs in data["spec"]]
        )
        if data["spec"]
        else ["The same spec."]
    )
    rows = []
    for name, values, deltas, pcts in data["figures"]:
        rows.append([markdown.text(name), *map(_cell, values)])
        rows.append([markdown.text(f"{name}: Δ from the first"), *(_delta(d) for d in deltas)])
        rows.append([markdown.text(f"{name}: Δ %"), *(_delta(p, pct=True) for p in pcts)])
    lines += ["", "## Figures", "", *markdown.table(["", *names], rows)]
    for title, section in (("Records", "records"), ("Environment", "environment")):
        lines += [
            "",
            f"## {title}",
            "",
            *markdown.table(
                ["", *names, "same"],
                [
                    [
                        markdown.text(n),
                        *map(_cell, vs),
                        "yes" if len({json.dumps(v) for v in vs}) == 1 else "**no**",
                    ]
                    for n, vs in data[section]
                ],
            ),
        ]
    n = max((len(c) for c in data["curves"]), default=0)
    lines += [
        "",
        f"## Validation curves ({data['curve_key']})",
        "",
        *markdown.table(
            ["epoch", *names],
            [
                [e + 1, *(_cell(c[e]) if e < len(c) else "—" for c in data["curves"])]
                for e in range(n)
            ],
        ),
        "",
        f"Best epochs: {', '.join(map(str, data['best_epochs']))}.",
        "",
    ]
    return "\n".join(lines)


def diff(*dirs) -> str:
    """What differs between runs, as Markdown."""
    return diff_markdown(diff_data(dirs))
