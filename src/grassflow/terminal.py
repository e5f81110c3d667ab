"""`grassflow runs` and `grassflow diff` on a terminal: tables that fit its width (rich), plain text
(no Markdown escapes, no HTML entities), figures rounded as the tables round them. The run and its
figures always; its other key columns (status, epochs, seed, model, table), the settings that
differ, then wall time and commit, each while the table still fits, the rest named under it (`--md`,
`--csv` and `--json` show them all)."""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

KEY_COLUMNS = ("run", "table", "model", "seed", "status", "epochs", "best_val", "test")
TAIL_COLUMNS = ("wall_s", "commit")


def figure(v, task: str | None) -> str:
    """A perplexity as the tables print it (1 decimal), an accuracy % (2 decimals)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.2f}" if task in ("snli", "recall") else f"{v:.1f}"


def value(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        return f"{v:g}"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def varying(rows: list[dict], keys: list[str]) -> list[str]:
    """The settings among `keys` that take two values among the rows that have them (a key of
    another task's runs, absent from these, is not one)."""
    return [
        k
        for k in keys
        if len({json.dumps(r.get(k), sort_keys=True) for r in rows if r.get(k) is not None}) > 1
    ]


def _fits(console: Console, table: Table) -> bool:
    """The table at its columns' natural widths (none folded) fits the terminal."""
    # unbounded: a measure within the terminal is clamped to it
    wide = console.options.update_width(10**6)
    return Measurement.get(console, wide, table).maximum <= console.width


def _table(**kw) -> Table:
    return Table(show_edge=False, pad_edge=False, box=None, header_style="bold", **kw)


def _print(console: Console, table: Table, note: str | None) -> None:
    console.print(table)
    if note:
        console.print(note, highlight=False, markup=False)


RIGHT = ("seed", "epochs", "best_val", "test", "wall_s", "n", "ok")


def _fitted(
    console: Console,
    rows: list[dict],
    key: list[str],
    extra: list[str],
    cell,
    label=lambda c: c,
    order: list[str] | None = None,
) -> tuple[Table, list[str]]:
    """A table of `rows` with the `key` columns and as many of the `extra` ones, taken in turn, as
    fit the terminal at their natural widths, laid out in `order` (default: key, then extra); (the
    table, the extra columns left out)."""
    order = order or [*key, *extra]

    def build(columns: list[str]) -> Table:
        t = _table()
        for c in sorted(columns, key=order.index):
            t.add_column(
                label(c),
                no_wrap=True,
                overflow="ellipsis",
                justify="right" if c in RIGHT else "left",
            )
        for r in rows:
            t.add_row(*(cell(r, c) for c in sorted(columns, key=order.index)))
        return t

    columns, left = list(key), []
    for c in extra:
        if _fits(console, build([*columns, c])):
            columns.append(c)
        else:
            left.append(c)
    return build(columns), left


def _left(left: list[str]) -> str:
    return (
        f" Not shown (too wide for this terminal): {', '.join(left)}; --md, --csv or --json show "
        "every column."
        if left
        else ""
    )


def runs_table(
    rows: list[dict], settings: list[str], tasks: dict[str, str], console: Console | None = None
) -> None:
    """The rows of `grassflow runs` (compare.list_runs) as a terminal table: the key columns, then
    the settings that vary among the rows, then wall time and commit, each while the table still
    fits the terminal at its natural widths; those left out are named under it."""
    console = console or Console(highlight=False)
    if not rows:
        console.print("No runs found.")
        return

    def cell(r, c) -> str:
        task = tasks.get(r["run"])
        if c == "run":
            return r["run"].rsplit("/", 1)[-1]
        if c in ("best_val", "test"):
            return figure(r[c], task)
        if c == "wall_s":
            return f"{r[c]:.0f} s" if isinstance(r.get(c), (int, float)) else "—"
        return value(r.get(c))

    shown = varying(rows, settings)
    # the run and its figures always; the other key columns while they fit (the run's id holds its
    # table, model and seed), then the settings, then wall time and commit
    table, left = _fitted(
        console,
        rows,
        ["run", "best_val", "test"],
        ["status", "epochs", "seed", "model", "table", *shown, *TAIL_COLUMNS],
        cell,
        lambda c: c.replace("_", " ") if c in (*KEY_COLUMNS, *TAIL_COLUMNS) else c,
        order=[*KEY_COLUMNS, *shown, *TAIL_COLUMNS],
    )
    _print(console, table, f"{len(rows)} run(s)." + _left(left))


def _mean_std(g: dict, key: str, task: str | None) -> str:
    m, s = g[f"{key}_mean"], g[f"{key}_std"]
    return "—" if m is None else figure(m, task) + ("" if s is None else f" ± {figure(s, task)}")


def group_table(groups: list[dict], tasks: dict[str, str], console: Console | None = None) -> None:
    """`grassflow runs --group` (compare.group_rows): a group's runs and figures first, then its
    table, seeds and preset while they fit."""
    console = console or Console(highlight=False)

    def cell(g, c) -> str:
        if c in ("best_val", "test"):
            return _mean_std(g, c, tasks.get(g["group"]))
        return value(g[c]) if c != "seeds" else ",".join(map(str, g[c]))

    table, left = _fitted(
        console,
        groups,
        ["group", "model", "n", "ok", "best_val", "test"],
        ["table", "seeds", "preset"],
        cell,
        lambda c: c.replace("_", " "),
    )
    _print(
        console,
        table,
        f"{len(groups)} group(s): runs that differ only in their seed, pooled (mean ± std over "
        "those ok)." + _left(left),
    )


def _short(v) -> str:
    return f"{v[:16]}…" if isinstance(v, str) and len(v) > 16 else value(v)


def diff_table(data: dict, console: Console | None = None) -> None:
    """compare.diff_data as terminal tables: spec, figures with their differences, records,
    environment, curves."""
    console = console or Console(highlight=False)
    names = data["runs"]

    def table(title: str, head: str, rows) -> None:
        t = _table(title=title, title_justify="left")
        t.add_column(head, overflow="fold")
        for n in names:
            t.add_column(n, overflow="fold")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        console.print()

    table(
        "Spec",
        "key",
        [[k, *map(value, vs)] for k, vs in data["spec"]]
        or [["(the same spec)", *[""] * len(names)]],
    )
    fig = []
    for name, values, deltas, pcts in data["figures"]:
        fig.append([name, *(value(v) if v is None else f"{v:.4g}" for v in values)])
        fig.append([f"Δ {name}", *("—" if d is None else f"{d:+.4g}" for d in deltas)])
        fig.append([f"Δ {name} %", *("—" if p is None else f"{p:+.2f} %" for p in pcts)])
    table("Figures (Δ: from the first run)", "", fig)
    table(
        "Records (hashes: their first 16 hex digits)",
        "",
        [[n, *(_short(v) if "sha256" in n else value(v) for v in vs)] for n, vs in data["records"]],
    )
    table("Environment", "", [[n, *map(value, vs)] for n, vs in data["environment"]])
    n = max((len(c) for c in data["curves"]), default=0)
    table(
        f"Validation curves ({data['curve_key']})",
        "epoch",
        [
            [
                str(e + 1),
                *(
                    f"{c[e]:.4g}" if e < len(c) and c[e] is not None else "—"
                    for c in data["curves"]
                ),
            ]
            for e in range(n)
        ],
    )
