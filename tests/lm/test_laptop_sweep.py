"""The committed laptop sweep (reports/wikitext2-v1-laptop-sweep/): its table and README recomputed
from the committed records alone — the sweep's new runs beside the ablations' (3e-3: the base, 1e-2:
the lr_1e-2 variant) — through the table job's own code: every value and model holds 3 seeds, each
model's choice and bracketing, every figure of each value's row and the tuned gap are the committed
table's, and the README quotes them."""

from __future__ import annotations

import re

from grassflow.lm.grid import sweep_grid
from grassflow.lm.sweep import aggregate_sweep
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.preview import load_config
from helpers import ROOT
from helpers.specs import PUBLISHED

SWEEP = ROOT / "reports/wikitext2-v1-laptop-sweep"
RECORDS = [
    SWEEP / "laptop_v1_ablations/runs",
    ROOT / "reports/wikitext2-v1-laptop-ablations/laptop_v1_ablations/runs",
]


def _figures(md: str) -> list[str]:
    """A sweep table's rows without their provenance column, and its tuned-gap line."""
    rows = [
        line.rsplit(" | ", 1)[0]
        for line in md.splitlines()
        if re.match(r"\| \d", line) or re.match(r"\| (transformer|grassmann) \|", line)
    ]
    return rows + [
        line for line in md.splitlines() if line.startswith(("**Tuned gap", "**No tuned gap"))
    ]


def test_the_laptop_sweep_is_its_records(tmp_path):
    name, p = select_preset(
        load_config(ROOT, ["workflow/overlays/wikitext2-v1-local.yaml"], "laptop_v1_ablations")
    )
    grid = sweep_grid(name, p)
    runs = tmp_path / "runs"
    runs.mkdir()
    for cell in grid["runs"]:
        for model, ids in cell.items():
            assert len(ids) == 3, (model, ids)
            for run in ids:
                (src,) = [d / run for d in RECORDS if (d / run / "run.json").is_file()]
                (runs / run).symlink_to(src)
    data = SWEEP / "laptop_v1_ablations/data"
    out = tmp_path / "report"
    slice_ = {k: p[k] for k in ("data", "tokenizer", "models", "seeds", "sweep")}
    aggregate_sweep(
        slice_, name, grid, runs, data / "unigram.json", data / "checksums.json", PUBLISHED, out
    )
    mine, committed = (
        _figures(f.read_text())
        for f in (out / "sweep.md", SWEEP / "laptop_v1_ablations/report/sweep.md")
    )
    assert mine == committed and len(mine) == len(grid["values"]) + 2 + 1, mine
    readme = (SWEEP / "README.md").read_text()
    tuned = re.search(
        r"\*\*Tuned gap G−T on test PPL: ([+−-][\d.]+ %)\*\* "
        r"\(95 % CI ([+−-][\d.]+) … ([+−-][\d.]+) %\)",
        committed[-1],
    )
    if tuned:
        # the table's own line, as the README gives it
        assert tuned.group(0) in readme, tuned.groups()
    # each model's chosen value, as the README gives it
    for row in committed[len(grid["values"]) : -1]:
        model, value = row.split(" | ")[0].lstrip("| "), row.split(" | ")[1]
        assert re.search(rf"{model}\b.*\b{re.escape(value)}\b", readme, re.I | re.S), (model, value)
