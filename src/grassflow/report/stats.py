"""Seed statistics and the verdict on the paper's "within 10–15 %" claim.

Intervals are Welch's: the variance of a difference (or, by the delta method, of a ratio) of two
seed means, its degrees of freedom by Welch–Satterthwaite over the very terms that variance is made
of, and the exact two-sided 95 % Student t quantile at that (fractional) df from scipy. With 3 seeds
per model df is typically 2–4, where rounding df to a table row moves the interval's edge by several
percent of the gap."""

from __future__ import annotations

import math
import statistics

from scipy import stats as _scipy_stats


def t95(df: float) -> float:
    """The two-sided 95 % quantile of Student's t with `df` (> 0, fractional allowed) degrees of
    freedom; inf for df ≤ 0 or NaN (no interval)."""
    if not df > 0:
        return math.inf
    return float(_scipy_stats.t.ppf(0.975, df))


def mean_std(xs: list[float]) -> tuple[float, float]:
    """(mean, sample std) of the values; NaN where there are too few (none: both), and both where a
    value is missing (NaN: a run without that number is not averaged away)."""
    xs = list(xs)
    if any(math.isnan(x) for x in xs):
        return math.nan, math.nan
    return (statistics.fmean(xs) if xs else math.nan), (
        statistics.stdev(xs) if len(xs) > 1 else math.nan
    )


def satterthwaite(terms: list[tuple[float, int]]) -> float:
    """Degrees of freedom of a sum of independent variance terms, [(term, n − 1)]: (Σ v)² / Σ v²/df.
    A term of zero variance adds nothing; all zero: inf (the sum is exact)."""
    num = sum(v for v, _ in terms) ** 2
    den = sum(v * v / df for v, df in terms if v)
    return num / den if den else math.inf


def _half_width(terms: list[tuple[float, int]], scale: float = 1.0) -> float:
    """95 % half-width of scale·sqrt(Σ terms): 0 when every term is 0 (identical seeds)."""
    var = sum(v for v, _ in terms)
    return 0.0 if var == 0 else t95(satterthwaite(terms)) * math.sqrt(var) * scale


def gap_ci(grassmann: list[float], transformer: list[float]) -> dict:
    """Gap (G − T)/T in %, with a 95 % CI: the ratio r = mean(G)/mean(T) has, by the delta method,
    var(r) ≈ (s_G²/n_G + r² s_T²/n_T) / mean(T)²; Welch–Satterthwaite gives its df. With one seed
    per model the CI is undefined (NaN)."""
    mg, sg = mean_std(grassmann)
    mt, st = mean_std(transformer)
    gap = 100 * (mg - mt) / mt
    ng, nt = len(grassmann), len(transformer)
    if ng < 2 or nt < 2:
        return {"gap_pct": gap, "ci_low": math.nan, "ci_high": math.nan, "df": math.nan}
    r = mg / mt
    terms = [(sg**2 / ng, ng - 1), (r * r * st**2 / nt, nt - 1)]
    h = _half_width(terms, 100 / mt)
    return {"gap_pct": gap, "ci_low": gap - h, "ci_high": gap + h, "df": satterthwaite(terms)}


def diff_ci(a: list[float], b: list[float]) -> dict:
    """mean(a) − mean(b) with a 95 % Welch CI (NaN with fewer than two values per side)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if len(a) < 2 or len(b) < 2:
        return {"diff": ma - mb, "ci_low": math.nan, "ci_high": math.nan, "df": math.nan}
    terms = [(sa**2 / len(a), len(a) - 1), (sb**2 / len(b), len(b) - 1)]
    h = _half_width(terms)
    return {
        "diff": ma - mb,
        "ci_low": ma - mb - h,
        "ci_high": ma - mb + h,
        "df": satterthwaite(terms),
    }


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
    return f"inconclusive (CI straddles {limit:g} %)"
