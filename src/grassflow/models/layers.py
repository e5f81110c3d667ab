"""Linear, LayerNorm and Embedding that also run an ensemble: E models of one shape trained as one
(a config's seeds side by side, grassflow.models.ensemble). A member's parameters are the slices [e]
of stacked [E, ...] parameters, and activations keep the members in the batch dimension: member e's
rows are [e·B, (e+1)·B). So everything between these layers (attention, the Plücker op's per-token
stages, activations, dropout) runs on the ensemble unchanged, the members folded into its batch, and
these layers run each member's weights on its own rows as one batched GEMM. With plain (unstacked)
parameters they are exactly nn.Linear, nn.LayerNorm and nn.Embedding: a single run computes what it
always did.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# Device types on which an ensemble's linear layers run a GEMM per member: the CPU, where bmm
# measured slower than as many GEMMs (reports/bench/bench-cpu.md, fused rows). Elsewhere one batched
# GEMM (one launch for all members). The tests count a GPU step's ops on the CPU with it empty.
GEMM_PER_MEMBER = {"cpu"}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b; with weight (E, out, in) and bias (E, out), member e's on its rows of x (one
    batched GEMM, or a GEMM per member: GEMM_PER_MEMBER)."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    E, out = weight.shape[:2]
    # unbind, not [e]: its backward stacks the members' gradients once
    if x.device.type in GEMM_PER_MEMBER:
        biases = [None] * E if bias is None else bias.unbind(0)
        return torch.cat(
            [
                F.linear(r, w, b)
                for r, w, b in zip(
                    x.reshape(E, -1, x.shape[-1]).unbind(0), weight.unbind(0), biases
                )
            ]
        ).reshape(*x.shape[:-1], out)
    xs = x.reshape(E, -1, x.shape[-1])
    w = weight.transpose(1, 2)
    y = torch.bmm(xs, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), xs, w)
    return y.reshape(*x.shape[:-1], out)


def add_per_member(x: torch.Tensor, y: torch.Tensor, members: int) -> torch.Tensor:
    """x + y where y holds a value per member (E, *x.shape[2:]) and x the members' rows (E·B, ...);
    for a plain model (members 0) y broadcasts as usual."""
    if not members:
        return x + y
    return (x.reshape(members, -1, *x.shape[1:]) + y.unsqueeze(1)).reshape(x.shape)


class Linear(nn.Linear):
    def forward(self, x):
        return linear(x, self.weight, self.bias)


class LayerNorm(nn.LayerNorm):
    def forward(self, x):
        if self.weight.dim() == 1:
            return super().forward(x)
        E = self.weight.shape[0]
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps).reshape(E, -1, x.shape[-1])
        return torch.addcmul(self.bias.unsqueeze(1), y, self.weight.unsqueeze(1)).reshape(x.shape)


class Embedding(nn.Embedding):
    def forward(self, idx):
        if self.weight.dim() == 2:
            return super().forward(idx)
        E, V = self.weight.shape[:2]
        # member e's rows
        first = torch.arange(E, device=idx.device).repeat_interleave(idx.shape[0] // E) * V
        return F.embedding(
            idx + first.view(-1, *[1] * (idx.dim() - 1)), self.weight.reshape(E * V, -1)
        )


def members(module: nn.Module) -> int:
    """E for an ensemble (grassflow.models.ensemble.stack), 0 for a plain model."""
    return getattr(module, "ensemble_size", 0)
