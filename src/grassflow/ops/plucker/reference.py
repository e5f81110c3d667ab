"""The paper-literal Plücker mixing: a loop over offsets. Readable, slow; the test oracle.

For each offset Δ and each position t with t − Δ ≥ 0 (causal: z_t is paired with the
*earlier* z_{t−Δ}; the paper's text writes t+Δ, which would read the future):
    p_ij = z_t,i z_{t−Δ},j − z_t,j z_{t−Δ},i            (i < j, r(r−1)/2 coordinates)
    p̂   = p / max(‖p‖, eps)
    g_t  = mean over valid Δ of (W p̂ + b)                (one W shared by all offsets)
Positions with no valid offset (t < min Δ) get g_t = 0 (empty="zero") or b (empty="bias").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grassflow.ops.plucker.common import pair_indices, valid_counts


def plucker_mix_reference(z, lags, weight, bias=None, *, eps=1e-6, empty="zero"):
    if weight.dim() == 3:  # an ensemble: each member on its rows, one after another
        biases = [None] * len(weight) if bias is None else list(bias)
        return torch.cat(
            [
                plucker_mix_reference(zm, lags, w, b, eps=eps, empty=empty)
                for zm, w, b in zip(z.chunk(len(weight)), weight, biases)
            ]
        )
    B, T, r = z.shape
    I, J = pair_indices(r, z.device)
    g = z.new_zeros(B, T, weight.shape[0])
    for d in lags:
        if d >= T:
            continue
        a, b = z[:, d:], z[:, :-d]
        p = a[..., I] * b[..., J] - a[..., J] * b[..., I]
        p_hat = p / p.norm(dim=-1, keepdim=True).clamp_min(eps)
        g = g + F.pad(F.linear(p_hat, weight, bias), (0, 0, d, 0))
    n = valid_counts(lags, T, z.device)
    g = g / n.clamp_min(1).to(g.dtype)[:, None]
    if empty == "bias" and bias is not None:
        g = torch.where((n == 0)[:, None], bias.to(g.dtype), g)
    return g
