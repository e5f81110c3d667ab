"""`fast` backend: the algebraic form of the Plücker mix, in plain PyTorch (CPU or GPU).

Because W_plü is shared by all offsets and the mean is linear, and the wedge is bilinear,

    mean_Δ W p̂_Δ = W (z_t ∧ c_t),   c_t = (1/n_t) Σ_Δ z_{t−Δ} / N_Δ,   N_Δ = max(‖z_t ∧ z_{t−Δ}‖,
    eps)

and ‖a ∧ b‖² = ‖a‖²‖b‖² − (a·b)² (Lagrange), so each offset costs O(r) instead of O(r²) + a
projection: one wedge and one projection per token, ~6× fewer FLOPs for 6 offsets. We evaluate the
Lagrange form as ‖a‖²‖b − μa‖² (μ = a·b/‖a‖²): the same number, without the cancellation that makes
(‖a‖²‖b‖² − (a·b)²) useless in fp32 for near-parallel vectors.

Backward (the kernels in kernels/plucker.cu implement exactly these formulas):
  wedge:  with D the antisymmetric r×r matrix D_ij = dq_ij (i<j),  da = D c,  dc = −D a.
  lags:   with w = 1/(n_t N), u = dc_t·b, κ = −u w / N² (0 where N is clamped to eps),
          b⊥ = b − μa, s⊥ = ‖b⊥‖²:
            da += κ (s⊥ a − (a·b) b⊥)        db += w dc_t + κ ‖a‖² b⊥
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from grassflow.ops.plucker.common import acc_dtype, pair_indices, valid_counts


class PairTerms(NamedTuple):
    sa: torch.Tensor  # ‖a‖²           (..., 1)
    ab: torch.Tensor  # a·b            (..., 1)
    b_perp: torch.Tensor  # b − μa     (..., r)
    sp: torch.Tensor  # ‖b − μa‖²      (..., 1)
    norm: torch.Tensor  # max(‖a∧b‖, eps)
    active: torch.Tensor  # ‖a∧b‖ > eps


def pair_terms(a, b, sa, eps) -> PairTerms:
    ab = (a * b).sum(-1, keepdim=True)
    mu = torch.where(sa > 0, ab / sa.clamp_min(torch.finfo(sa.dtype).tiny), 0)
    b_perp = b - mu * a
    sp = (b_perp * b_perp).sum(-1, keepdim=True)
    s = sa * sp
    active = s > eps * eps
    return PairTerms(sa, ab, b_perp, sp, torch.where(active, s, eps * eps).sqrt(), active)


def _inv_counts(lags, T, device, dtype):
    n = valid_counts(lags, T, device)
    return torch.where(n > 0, 1.0 / n.clamp_min(1).to(dtype), 0)[:, None]


class TorchStages:
    name = "fast"

    def coeff(self, z, lags, eps):
        zf = z.to(acc_dtype(z.dtype))
        T = z.shape[1]
        sq = (zf * zf).sum(-1, keepdim=True)
        c = torch.zeros_like(zf)
        for d in lags:
            if d >= T:
                continue
            p = pair_terms(zf[:, d:], zf[:, :-d], sq[:, d:], eps)
            c[:, d:] += zf[:, :-d] / p.norm
        return c * _inv_counts(lags, T, z.device, zf.dtype)

    def wedge(self, z, c):
        # Row blocks of the upper triangle, (a_i c_j − c_i a_j)_{j>i} for each i: the same row-major
        # order as pair_indices, ~4× faster on CPU than gathering with index lists.
        a, r = z.to(c.dtype), z.shape[-1]
        rows = [
            a[..., i : i + 1] * c[..., i + 1 :] - c[..., i : i + 1] * a[..., i + 1 :]
            for i in range(r - 1)
        ]
        return torch.cat(rows, -1).to(z.dtype)

    def wedge_bwd(self, dq, z, c):
        # U = strict upper triangle holding dq, D = U − Uᵀ; [da, −dc] = D [c, a] as two bmms.
        r = z.shape[-1]
        I, J = pair_indices(r, z.device)
        n = dq.numel() // dq.shape[-1]
        U = dq.new_zeros(n, r * r, dtype=c.dtype)
        U = U.index_copy_(1, I * r + J, dq.reshape(n, -1).to(c.dtype)).view(n, r, r)
        S = torch.stack((c, z.to(c.dtype)), -1).reshape(n, r, 2)
        out = (torch.bmm(U, S) - torch.bmm(U.mT, S)).reshape(*c.shape, 2)
        return out[..., 0], -out[..., 1]

    def lag_bwd(self, z, dc, da, lags, eps):
        zf = z.to(dc.dtype)
        T = z.shape[1]
        sq = (zf * zf).sum(-1, keepdim=True)
        inv_n = _inv_counts(lags, T, z.device, zf.dtype)
        dz = da.clone()
        for d in lags:
            if d >= T:
                continue
            a, b, dct = zf[:, d:], zf[:, :-d], dc[:, d:]
            p = pair_terms(a, b, sq[:, d:], eps)
            w = inv_n[d:] / p.norm
            u = (dct * b).sum(-1, keepdim=True)
            kappa = torch.where(p.active, -u * w / (p.norm * p.norm), 0)
            dz[:, d:] += kappa * (p.sp * a - p.ab * p.b_perp)
            dz[:, :-d] += w * dct + kappa * p.sa * p.b_perp
        return dz
