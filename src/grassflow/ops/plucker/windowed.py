"""Windowed, non-causal Plücker mixing for encoders (the SNLI head): a generalisation of
`plucker_mix` to windows, masks and both directions.

Windows of `window` tokens start every `stride` tokens (stride = window: a partition of the
sequence; the tail is padded). Within a window, each real token t (mask true) pairs with the other
real tokens s of that window:
    pairs="bidirectional"  every other token, as the oriented pair (earlier ∧ later): the sign
                           of p carries the order, so the features are not a bag of the window
    pairs="causal"         the earlier tokens only, as z_t ∧ z_s: the language model's rule
and, with p̂ = p / max(‖p‖, eps) and one W shared by all pairs,
    g_t = mean over all pairs of t, over every window holding t, of (W p̂ + b).
Tokens with no pair get 0 (empty="zero") or b (empty="bias"). Padding never pairs.

Fast path: `plucker_mix` with offsets 1..window−1 on each window (and on the reversed window for the
later partners), bias-free: padding rows are zeroed, and a zero partner adds exactly 0 to the sum,
so sum = n_window · mean, divided afterwards by the count of real partners.
`windowed_plucker_mix_reference` is the literal loop over tokens and partners, the test oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grassflow.ops.plucker import plucker_mix
from grassflow.ops.plucker.common import acc_dtype, pair_indices, valid_counts

PAIRS = ("bidirectional", "causal")


def window_starts(T: int, window: int, stride: int) -> list[int]:
    """Start of every window; the last one reaches (or passes) the end of the sequence."""
    n = max(1, -(-max(T - window, 0) // stride) + 1)
    return [i * stride for i in range(n)]


def _check(z, mask, window, stride, pairs, empty):
    if z.dim() != 3 or mask.shape != z.shape[:2]:
        raise ValueError(
            f"z must be (B, T, r) and mask (B, T); got {tuple(z.shape)} and {tuple(mask.shape)}"
        )
    if window < 2 or not 1 <= stride <= window:
        raise ValueError(
            f"need window ≥ 2 and 1 ≤ stride ≤ window, got window={window}, stride={stride}"
        )
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    if empty not in ("zero", "bias"):
        raise ValueError(f"empty must be 'zero' or 'bias', got {empty!r}")


def _finish(sums, counts, bias, empty):
    g = sums / counts.clamp_min(1).to(sums.dtype)[..., None]
    if bias is not None:
        on = torch.ones_like(counts) if empty == "bias" else (counts > 0)
        g = g + on.to(g.dtype)[..., None] * bias.to(g.dtype)
    return g


def windowed_plucker_mix(
    z,
    mask,
    weight,
    bias=None,
    *,
    window=8,
    stride=8,
    pairs="bidirectional",
    eps=1e-6,
    empty="zero",
    backend="auto",
):
    """z (B, T, r), mask (B, T) bool, weight (d, r(r−1)/2) → g (B, T, d), in fp32 for bf16/fp16
    inputs (the sums over pairs and windows are accumulated there)."""
    _check(z, mask, window, stride, pairs, empty)
    B, T, r = z.shape
    starts = window_starts(T, window, stride)
    Tp = starts[-1] + window
    # Sums over pairs and windows, and the counts, in fp32 (fp64 for fp64 z), never in z's bf16:
    # also because CUDA autocast turns cumsum/sum of bf16 into fp32 while index_add_ wants one
    # dtype, and the counts are exact integers in the accumulation dtype.
    acc = acc_dtype(z.dtype)
    m = F.pad(mask, (0, Tp - T))
    zp = F.pad(z, (0, 0, 0, Tp - T)) * m.to(z.dtype)[..., None]
    zw = zp.unfold(1, window, stride).permute(0, 1, 3, 2).reshape(-1, window, r)  # (B·nW, w, r)
    mw = m.to(acc).unfold(1, window, stride).reshape(-1, window)
    lags = tuple(range(1, window))
    n = valid_counts(lags, window, z.device).to(acc)[:, None]  # slots per window position

    def mix(x):
        return plucker_mix(x, lags, weight, None, eps=eps, empty="zero", backend=backend)

    earlier = mix(zw).to(acc) * n  # Σ over earlier partners s of W p̂(z_t ∧ z_s)
    before = torch.cumsum(mw, 1) - mw  # real tokens earlier in the window
    if pairs == "causal":
        sums, counts = earlier, before * mw
    else:
        # Σ over later partners of W p̂(z_t ∧ z_s)
        later = mix(zw.flip(1)).flip(1).to(acc) * n.flip(0)
        sums, counts = later - earlier, (mw.sum(1, keepdim=True) - 1) * mw
    pos = (
        torch.tensor(starts, device=z.device)[:, None] + torch.arange(window, device=z.device)
    ).reshape(-1)
    d = weight.shape[0]
    total = torch.zeros(B, Tp, d, dtype=acc, device=z.device).index_add_(
        1, pos, sums.reshape(B, -1, d)
    )
    count = torch.zeros(B, Tp, dtype=acc, device=z.device).index_add_(1, pos, counts.reshape(B, -1))
    return _finish(total, count, bias, empty)[:, :T]


def windowed_plucker_mix_reference(
    z, mask, weight, bias=None, *, window=8, stride=8, pairs="bidirectional", eps=1e-6, empty="zero"
):
    """The definition, literally: a loop over windows, tokens and partners."""
    _check(z, mask, window, stride, pairs, empty)
    B, T, r = z.shape
    I, J = pair_indices(r, z.device)
    sums = z.new_zeros(B, T, weight.shape[0])
    counts = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for start in window_starts(T, window, stride):
            for t in range(start, min(start + window, T)):
                for s in range(start, min(start + window, T)):
                    if s == t or not (mask[b, t] and mask[b, s]) or (pairs == "causal" and s > t):
                        continue
                    x, y = (
                        (z[b, t], z[b, s])
                        if pairs == "causal"
                        else (z[b, min(s, t)], z[b, max(s, t)])
                    )
                    p = x[I] * y[J] - x[J] * y[I]
                    sums[b, t] = sums[b, t] + weight @ (p / p.norm().clamp_min(eps))
                    counts[b, t] += 1
    return _finish(sums, counts.to(z.device), bias, empty)
