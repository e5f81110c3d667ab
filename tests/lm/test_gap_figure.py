"""The gap figure (grassflow.lm.figures.gap), the first of each LM table's: what it plots is the
table's gap after each epoch, each run's best validation perplexity so far against the other
model's, with the table's 95 % interval, recomputed here independently from the runs' records
(metrics.jsonl): the H200's Table 1, three seeds a model, whose last epoch is the table's +20.4
%."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest
from scipy import stats

from grassflow.lm import figures
from helpers.dag import ROOT

GPU = ROOT / "reports/wikitext2-v1-gpu"


def _runs():
    df = pd.read_csv(GPU / "report/table1.csv")
    df["metrics"] = [str(GPU / "runs" / r / "metrics.jsonl") for r in df.run_id]
    return df


def _by_hand(epoch):
    """(gap %, low, high) after `epoch`: the means of each model's best-so-far validation PPL, the
    ratio's variance by the delta method, Welch–Satterthwaite's degrees of freedom, Student's t."""
    best = {}
    for path in sorted((GPU / "runs").glob("table1-*/metrics.jsonl")):
        ppl = [json.loads(line)["val_ppl"] for line in path.read_text().splitlines()]
        best.setdefault(path.parent.name.split("-")[1], []).append(min(ppl[:epoch]))
    g, t = best["grassmann"], best["transformer"]
    mg, mt = sum(g) / len(g), sum(t) / len(t)
    vg = sum((x - mg) ** 2 for x in g) / (len(g) - 1) / len(g)
    vt = (mg / mt) ** 2 * sum((x - mt) ** 2 for x in t) / (len(t) - 1) / len(t)
    df = (vg + vt) ** 2 / (vg**2 / (len(g) - 1) + vt**2 / (len(t) - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(vg + vt) / mt * 100
    gap = 100 * (mg - mt) / mt
    return gap, gap - half, gap + half


def test_the_gap_figure_plots_the_tables_gap_after_every_epoch(tmp_path):
    data = figures.gap(_runs(), 11.0, "table1", "paper_v1", tmp_path / "gap_table1.png")
    assert (tmp_path / "gap_table1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert data["epochs"] == list(range(1, 31))
    for e, got in zip(data["epochs"], data["gap"]):
        want = _by_hand(e)
        assert (got["gap_pct"], got["ci_low"], got["ci_high"]) == pytest.approx(
            want, rel=1e-9, abs=1e-9
        ), e
    # its last epoch is the table's gap and interval (best against best)
    md = (GPU / "report/table1.md").read_text()
    gap, low, high = map(
        float,
        re.search(r"\*\*([+-][\d.]+) %\*\* \(95 % CI ([+-][\d.]+) … ([+-][\d.]+) %\)", md).groups(),
    )
    last = data["gap"][-1]
    assert (round(last["gap_pct"], 1), round(last["ci_low"], 1), round(last["ci_high"], 1)) == (
        gap,
        low,
        high,
    )
    # the second panel: each run's validation perplexity per epoch, as its records hold it
    for model, seeds in data["runs"].items():
        for seed, curve in seeds.items():
            rows = (GPU / f"runs/table1-{model}-s{seed}/metrics.jsonl").read_text().splitlines()
            assert curve == [json.loads(r)["val_ppl"] for r in rows]


def test_the_reports_readme_says_the_tables_gap_per_epoch_and_per_seed():
    """reports/wikitext2-v1-gpu/README.md's figures, with one definition: its epoch table's rows are
    the figure's (each run's best so far; the gap of the means, its interval), its per-seed gaps
    best against best."""
    text = (GPU / "README.md").read_text().replace("−", "-")
    data = figures.gap_by_epoch(_runs())
    rows = re.findall(
        r"^  \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+) % \(([+-][\d.]+) … ([+-][\d.]+)\) "
        r"\|$",
        text,
        re.M,
    )
    assert len(rows) == 6
    for e, t, g, gap, low, high in rows:
        e = int(e)
        means = {
            m: sum(min(c[:e]) for c in runs.values()) / len(runs)
            for m, runs in data["runs"].items()
        }
        got = data["gap"][e - 1]
        assert (float(t), float(g)) == (
            round(means["transformer"], 1),
            round(means["grassmann"], 1),
        ), e
        assert (float(gap), float(low), float(high)) == tuple(
            round(got[k], 1) for k in ("gap_pct", "ci_low", "ci_high")
        ), e
    per_seed = re.search(
        r"best against best, the gaps are ([+-][\d.]+), ([+-][\d.]+) and ([+-][\d.]+) %", text
    ).groups()
    want = [
        100
        * (min(data["runs"]["grassmann"][s]) - min(data["runs"]["transformer"][s]))
        / min(data["runs"]["transformer"][s])
        for s in (0, 1, 2)
    ]
    assert [float(x) for x in per_seed] == [round(w, 1) for w in want]


def test_the_ablation_tables_gap_over_training_ends_at_each_variants_gap(tmp_path):
    """The ablation table's figure over training (figures.ablation_gaps_over_training): each
    variant's gap after its last epoch is the table's (the laptop grid: one epoch, three seeds
    each)."""
    laptop = ROOT / "reports/wikitext2-v1-laptop-ablations/laptop_v1_ablations"
    df = pd.read_csv(laptop / "report/ablations.csv")
    df["metrics"] = [str(laptop / "runs" / r / "metrics.jsonl") for r in df.run_id]
    data = figures.ablation_gaps_over_training(
        df, 11.0, "laptop_v1_ablations", tmp_path / "ablations_gap.png"
    )
    md = (laptop / "report/ablations.md").read_text().replace("−", "-")
    table = {
        v: tuple(map(float, g))
        for v, *g in re.findall(
            r"^\| ([\w-]+) \|.*?\| ([+-][\d.]+) % \(([+-][\d.]+) … ([+-][\d.]+)\)", md, re.M
        )
    }
    assert set(data) == set(table) == {"laptop", "lags_124", "r64", "lags_124_r64", "lr_1e-2"}
    for variant, d in data.items():
        last = d["gap"][-1]
        assert (
            tuple(round(last[k], 1) for k in ("gap_pct", "ci_low", "ci_high")) == table[variant]
        ), variant
