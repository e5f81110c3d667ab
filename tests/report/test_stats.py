"""The verdict's statistics against independent truth: Student t quantiles at fractional df (a
pure-Python integration of the density, not scipy), Welch intervals (scipy's own Welch test for a
difference; the delta method written out for the gap). The LM verdict that reads them:
tests/lm/test_verdict.py."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as scipy_stats

from grassflow.report.stats import diff_ci, gap_ci, t95


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
    """The issue's example (3 seeds each): the table lookup said 'supported' (CI high 14.81); the
    exact quantile at the ratio's own df says 'inconclusive'."""
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
