"""Small helpers shared by every backend of the Plücker op."""

from __future__ import annotations

import torch


def pair_indices(r: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(I, J) with I < J, row-major upper triangle: the order of the r(r−1)/2 coordinates."""
    ij = torch.triu_indices(r, r, offset=1, device=device)
    return ij[0], ij[1]


def valid_counts(lags, T: int, device) -> torch.Tensor:
    """n_t: how many offsets are valid at each position t (duplicates count)."""
    t = torch.arange(T, device=device)
    return sum((t >= d).long() for d in lags) if lags else torch.zeros_like(t)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic dtype of the elementwise stages: float64 stays, the rest compute in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
