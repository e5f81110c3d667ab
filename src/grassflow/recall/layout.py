"""What recall.smk's rules read, planned from the preset's `recall` part: its data cells, the cell
each run reads, its outputs. Planning: no job imports it."""

from __future__ import annotations

from types import SimpleNamespace

from grassflow.recall.grid import recall_cells


def recall_layout(p: dict, runs: dict, results: str) -> SimpleNamespace:
    """The names of recall.smk (`runs`: its task's specs; `results`: results/<preset>)."""
    r = p.get("recall") or {}
    res, report = f"{results}/recall", f"{results}/report"
    return SimpleNamespace(
        part=r or None,
        runs=runs,
        res=res,
        cells=recall_cells(r) if r else {},  # {cell: its data section}
        data={run: f"{res}/data/{spec['data_cell']}" for run, spec in runs.items()},  # token files
        outputs=[f"{report}/recall.{x}" for x in ("md", "csv", "tex")]
        + [f"{report}/recall_vs_dmodel.png", f"{report}/recall_by_distance.png"]
        if r
        else [],
    )
