"""Seed statistics and the verdict on the paper's "within 10–15 %" claim."""

from __future__ import annotations

import math
import statistics

# two-sided 95 % Student t quantiles by degrees of freedom
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df: float) -> float:
    if df < 1:
        return math.inf
    keys = sorted(_T95)
    for k in keys:
        if df <= k:
            return _T95[k]
    return 1.96


def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else math.nan)


def gap_ci(grassmann: list[float], transformer: list[float]) -> dict:
    """Gap (G − T)/T in %, with a 95 % CI from Welch's t on the difference of seed means
    (delta method for the ratio). With one seed per model the CI is undefined (NaN)."""
    mg, sg = mean_std(grassmann)
    mt, st = mean_std(transformer)
    gap = 100 * (mg - mt) / mt
    ng, nt = len(grassmann), len(transformer)
    if ng < 2 or nt < 2:
        return {"gap_pct": gap, "ci_low": math.nan, "ci_high": math.nan}
    vg, vt = sg**2 / ng, st**2 / nt
    se_diff = math.sqrt(vg + vt)
    df = (vg + vt) ** 2 / ((vg**2 / (ng - 1) if vg else 0) + (vt**2 / (nt - 1) if vt else 0) or 1e-300)
    # ratio r = mg/mt: var(r) ≈ (vg + r² vt) / mt²
    r = mg / mt
    se = math.sqrt(vg + r * r * vt) / mt * 100 if se_diff else 0.0
    h = t95(df) * se
    return {"gap_pct": gap, "ci_low": gap - h, "ci_high": gap + h}


def diff_ci(a: list[float], b: list[float]) -> dict:
    """mean(a) − mean(b) with a 95 % Welch CI (NaN with fewer than two values per side)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if len(a) < 2 or len(b) < 2:
        return {"diff": ma - mb, "ci_low": math.nan, "ci_high": math.nan}
    va, vb = sa**2 / len(a), sb**2 / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1) if va else 0) + (vb**2 / (len(b) - 1) if vb else 0) or 1e-300)
    h = t95(df) * se
    return {"diff": ma - mb, "ci_low": ma - mb - h, "ci_high": ma - mb + h}


def verdict(ci_low: float, ci_high: float, gap: float, limit: float = 15.0) -> str:
    """The paper claims Grassmann is within 10–15 % of the Transformer's perplexity."""
    if math.isnan(ci_low):
        return "consistent (no CI: one seed)" if gap <= limit else "not supported (no CI: one seed)"
    if ci_high < 0:
        return "exceeded (Grassmann better at 95 %)"
    if ci_high <= limit:
        return f"supported (gap ≤ {limit:g} % at 95 %)"
    if ci_low > limit:
        return f"refuted (gap > {limit:g} % at 95 %)"
    return "inconclusive (CI straddles 15 %)"
