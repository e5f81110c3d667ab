"""The autograd.Function shared by the `fast`, `cupy` and `kernel-cpu` backends.

They differ only in who runs the four elementwise stages (a "stages" object: PyTorch ops,
CuPy RawKernels on the current CUDA stream, or the same kernels compiled for the CPU);
the two projections by W are plain matmuls (cuBLAS/MKL) here:

    forward   c = coeff(z);  q = wedge(z, c);  g = q Wᵀ + b·[n_t > 0 or empty="bias"]
    backward  q = wedge(z, c)  (recomputed: nothing of size r(r−1)/2 per token is saved)
              dW = dgᵀ q;  db = Σ dg;  dq = dg W
              da, dc = wedge_bwd(dq, z, c);  dz = lag_bwd(z, dc, da)

Saved for backward: z, c (2·r values per token) and W.

Under autocast z arrives in bf16 (it is a Linear's output) and the forward computes in z's
dtype. There is deliberately no custom_fwd/custom_bwd: they would re-enter autocast in the
backward, where the fast stages' fp32 bmm would drop to bf16. Without them the backward runs
with autocast off (autograd's engine does not carry it), every dtype is chosen here, and it
behaves the same on CUDA, on the CPU and under the CPU rehearsal of CUDA's autocast.
"""

from __future__ import annotations

import torch

from grassflow.ops.plucker.common import valid_counts


def _bias_mask(lags, T, empty, device, dtype):
    if empty == "bias":
        return None
    return (valid_counts(lags, T, device) > 0).to(dtype)[:, None]


class PluckerMixFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, weight, bias, lags, eps, empty, stages):
        z = z.contiguous()
        B, T, r = z.shape
        c = stages.coeff(z, lags, eps)
        q = stages.wedge(z, c)
        w = weight.to(z.dtype)
        g = torch.matmul(q, w.t())
        if bias is not None:
            mask = _bias_mask(lags, T, empty, z.device, g.dtype)
            g = g + (bias.to(g.dtype) if mask is None else bias.to(g.dtype) * mask)
        ctx.save_for_backward(z, c, weight)
        ctx.lags, ctx.eps, ctx.empty, ctx.stages = lags, eps, empty, stages
        ctx.has_bias = bias is not None
        return g

    @staticmethod
    def backward(ctx, dg):
        z, c, weight = ctx.saved_tensors
        stages, lags, eps = ctx.stages, ctx.lags, ctx.eps
        B, T, r = z.shape
        d = weight.shape[0]
        dg = dg.contiguous().to(z.dtype)
        dz = dweight = dbias = None
        if ctx.needs_input_grad[1]:
            q = stages.wedge(z, c)
            dweight = (dg.reshape(-1, d).t() @ q.reshape(B * T, -1)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            mask = _bias_mask(lags, T, ctx.empty, z.device, dg.dtype)
            dbias = (dg if mask is None else dg * mask).sum((0, 1)).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            dq = torch.matmul(dg, weight.to(z.dtype)).contiguous()
            da, dc = stages.wedge_bwd(dq, z, c)
            dz = stages.lag_bwd(z, dc, da, lags, eps).to(z.dtype)
        return dz, dweight, dbias, None, None, None, None
