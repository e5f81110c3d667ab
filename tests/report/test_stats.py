"""The verdict's statistics against independent truth: Student t quantiles at fractional df
(a pure-Python integration of the density, not scipy), Welch intervals (scipy's own Welch
test for a difference; the delta method written out for the gap), and every branch of the
verdict reached through the real aggregate on crafted run records."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from scipy import stats as scipy_stats

from grassflow.lm.aggregate import aggregate
from grassflow.lm.comparable import load_published
from grassflow.report.stats import diff_ci, gap_ci, t95
from helpers.specs import PUBLISHED

SETUP = load_published(PUBLISHED)["paper_setup"]


# --- an oracle for Student's t that shares no code with scipy ------------------------------------
def _t_pdf(x: float, df: float) -> float:
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return c * (1 + x * x / df) ** (-(df + 1) / 2)


def _t_cdf(x: float, df: float, n: int = 4000) -> float:
    """0.5 + ∫_0^x pdf by composite Simpson (the density is smooth: error ≪ 1e-9 here)."""
    h = x / n
    s = (
        _t_pdf(0, df)
        + _t_pdf(x, df)
        + sum((4 if i % 2 else 2) * _t_pdf(i * h, df) for i in range(1, n))
    )
    return 0.5 + s * h / 3


def oracle_t975(df: float) -> float:
    lo, hi = 0.0, 20.0  # the 97.5 % quantile is below 12.71 for df ≥ 1
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize(
    "df, want", [(2.2, 3.949), (2.5, 3.575), (3.5, 2.940), (11, 2.201), (1, 12.706), (30, 2.042)]
)
def test_t95_between_table_rows(df, want):
    """The old table lookup gave the next larger row's quantile: 3.182 for df 2.2 and 2.5."""
    assert t95(df) == pytest.approx(want, abs=6e-4)


def test_t95_matches_the_oracle_on_random_fractional_df(gen):
    import torch

    dfs = (1 + 39 * torch.rand(8, generator=gen, dtype=torch.float64)).tolist()
    for df in dfs:
        assert t95(df) == pytest.approx(oracle_t975(df), rel=1e-6), df
    assert t95(0) == math.inf and t95(math.nan) == math.inf


def test_diff_ci_is_welchs_interval(gen):
    """scipy's Welch t-test reports its own interval: ours must be the same numbers."""
    import torch

    for n_a, n_b in [(3, 3), (2, 5), (4, 3)]:
        a = (50 + 3 * torch.randn(n_a, generator=gen, dtype=torch.float64)).tolist()
        b = (48 + 1 * torch.randn(n_b, generator=gen, dtype=torch.float64)).tolist()
        ci = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
        got = diff_ci(a, b)
        assert (got["ci_low"], got["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)


def test_gap_ci_is_the_delta_method_with_satterthwaite_df():
    """The issue's example (3 seeds each): the table lookup said 'supported' (CI high 14.81);
    the exact quantile at the ratio's own df says 'inconclusive'."""
    g, t = [275.0, 281.0, 270.0], [249.0, 247.5, 251.0]
    mg, mt = statistics.fmean(g), statistics.fmean(t)
    r = mg / mt
    vg, vt = statistics.variance(g) / 3, r * r * statistics.variance(t) / 3
    df = (vg + vt) ** 2 / (vg**2 / 2 + vt**2 / 2)
    half = oracle_t975(df) * math.sqrt(vg + vt) / mt * 100
    got = gap_ci(g, t)
    assert got["df"] == pytest.approx(df, rel=1e-12) and 2 < df < 3
    assert got["gap_pct"] == pytest.approx(100 * (mg - mt) / mt, rel=1e-12)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx(
        (got["gap_pct"] - half, got["gap_pct"] + half), rel=1e-6
    )
    assert got["ci_high"] > 15 > got["ci_low"]


def test_identical_seeds_give_a_point_interval_not_nan():
    got = gap_ci([260.0, 260.0], [250.0, 250.0])
    assert got["ci_low"] == got["ci_high"] == pytest.approx(4.0)
    assert math.isnan(gap_ci([260.0], [250.0, 251.0])["ci_low"])


# --- every verdict through the real aggregate -----------------------------------------------------
PRESET = {
    "data": {
        "source": "hub",
        "dataset": "Salesforce/wikitext",
        "name": "wikitext-2-raw-v1",
        "revision": "b08601e",
    },
    "tokenizer": {"name": "bert-base-uncased"},
    "models": ["transformer", "grassmann"],
    "model": {"d_model": 256, "d_ff": 1024, "n_heads": 4, "r": 32, "lags": [1, 2, 4, 8, 12, 16]},
    "train": {"lr": 3.0e-4, "max_steps_per_epoch": None},
    "experiments": {"table1": {"n_layers": 6, "context_len": 128, "batch_size": 32, "epochs": 30}},
    "seeds": [0, 1, 2],
}
UNIGRAM = {"validation": {"unigram_ppl": 800.0}, "test": {"unigram_ppl": 820.0}}


def _run(root, model: str, seed: int, val_ppl: float):
    d = root / "runs" / f"table1-{model}-s{seed}"
    d.mkdir(parents=True)
    rec = {
        "run_id": d.name,
        "spec": {
            "experiment": "table1",
            "model_kind": model,
            "seed": seed,
            "model": {"n_layers": 6, "context_len": 128},
            "train": {"batch_size": 32, "epochs": 30},
        },
        "status": {"state": "completed"},
        "best_epoch": 30,
        "n_params": 1000,
        "epochs_completed": 30,
        "wall_seconds": 1.0,
        "device": "crafted",
        "device_type": "cpu",
        "plucker_backend": None,
        "git": {"commit": "0" * 40, "dirty": False},
        "data": {"train": {"file_sha256": "a" * 64}},
    }
    ppl = {
        "chunked_ppl": val_ppl,
        "strided_ppl": val_ppl,
        "strided_word_ppl": 2 * val_ppl,
        "chunked_tokens": 10,
    }
    (d / "run.json").write_text(json.dumps(rec))
    (d / "eval.json").write_text(
        json.dumps({"validation": ppl, "test": ppl, "weights_sha256": "b" * 64})
    )
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "val_ppl": val_ppl}) + "\n")
    return d


def _table(root, grassmann: list[float], transformer: list[float], test_hash=None) -> str:
    runs = [_run(root, "grassmann", i, v) for i, v in enumerate(grassmann)]
    runs += [_run(root, "transformer", i, v) for i, v in enumerate(transformer)]
    files = {
        "unigram": UNIGRAM,
        "bench": {"step_rows": [], "tokens": 0, "device": "crafted"},
        "checksums": {
            "test": {"content_sha256": test_hash or SETUP["data"]["content_sha256"]["test"]}
        },
    }
    for name, obj in files.items():
        (root / f"{name}.json").write_text(json.dumps(obj))
    aggregate(
        PRESET,
        "paper",
        "table1",
        runs,
        root / "report",
        root / "unigram.json",
        root / "checksums.json",
        PUBLISHED,
    )
    csv = (root / "report" / "table1.csv").read_text()
    assert all(str(d / "run.json") in csv for d in runs)  # every number traces to its record
    return (root / "report" / "table1.md").read_text()


@pytest.mark.parametrize(
    "grassmann, transformer, verdict",
    [
        (
            [275.0, 281.0, 270.0],
            [249.0, 247.5, 251.0],
            "inconclusive (CI straddles 15 %)",
        ),  # the example
        ([260.0, 261.0, 259.0], [250.0, 250.5, 249.5], "supported (gap ≤ 15 % at 95 %)"),
        ([330.0, 331.0, 329.0], [250.0, 250.5, 249.5], "refuted (gap > 15 % at 95 %)"),
        ([230.0, 231.0, 229.0], [250.0, 250.5, 249.5], "exceeded (Grassmann better at 95 %)"),
        (
            [260.0],
            [250.0],
            "not comparable: fewer than 2 seeds per model that learned — on fewer seeds than asked "
            "(1 of 3 transformer seeds, 1 of 3 grassmann seeds)",
        ),
    ],
    ids=["inconclusive", "supported", "refuted", "exceeded", "one-seed"],
)
def test_every_verdict_through_the_aggregate(grassmann, transformer, verdict, tmp_path):
    md = _table(tmp_path, grassmann, transformer)
    assert f'Paper\'s claim "within 10–15 %": **{verdict}**.' in md
    if len(grassmann) > 1:
        g = gap_ci(grassmann, transformer)
        assert f"(95 % CI {g['ci_low']:+.1f} … {g['ci_high']:+.1f} %)" in md


def test_the_verdict_limit_is_the_papers_claim_from_published_yaml():
    assert SETUP["claim_limit_pct"] == 15


def test_no_verdict_on_data_that_is_not_the_papers(tmp_path):
    md = _table(tmp_path, [260.0, 261.0, 259.0], [250.0, 250.5, 249.5], test_hash="f" * 64)
    assert "**not comparable: not the paper's data (Wikitext-2 content hashes differ)**" in md


def test_a_preset_that_leaves_model_keys_unset_is_read_at_the_models_defaults():
    # what the model runs with where a preset is silent (ModelConfig's defaults, their one source),
    # not "None": the paper's own sizes and switches are no difference
    from grassflow.lm.comparable import setup_differences
    from helpers.specs import ran

    exp = {"n_layers": 6, "context_len": 128, "epochs": 30, "batch_size": 32}
    train = {"lr": 3e-4, "max_steps_per_epoch": None}
    assert setup_differences(ran({}, train, exp), "table1", SETUP) == []
    assert setup_differences(ran({"norm": "pre", "lags": [1, 2]}, train, exp), "table1", SETUP) == [
        "not the paper's setup: lags [1, 2] (paper [1, 2, 4, 8, 12, 16]), norm pre (paper post)"
    ]
