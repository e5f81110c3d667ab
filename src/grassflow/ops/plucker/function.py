"""Autograd for the `fast`, `cupy`, `kernel-cpu` and `fused-cpu` backends: one forward and one
backward, run eagerly by an autograd.Function and, under torch.compile, by two `torch.library`
custom ops (fake + autograd registered), so Dynamo sees the op whole.

The backends differ only in who runs the four elementwise stages (a "stages" object: PyTorch ops,
CuPy RawKernels on the current CUDA stream, the same kernels compiled for the CPU, or fused C++
loops); the two projections by W are plain matmuls (cuBLAS/MKL) here:

    forward   c = coeff(z);  q = wedge(z, c);  g = q Wᵀ + b·[n_t > 0 or empty="bias"]
    backward  q = wedge(z, c)  (recomputed: nothing of size r(r−1)/2 per token is saved)
              dW = dgᵀ q;  db = Σ dg;  dq = dg W
              da, dc = wedge_bwd(dq, z, c);  dz = lag_bwd(z, dc, da)

Saved for backward: z, c (2·r values per token) and W.

Under autocast z arrives in bf16 (it is a Linear's output) and the forward computes in z's dtype.
There is deliberately no custom_fwd/custom_bwd: they would re-enter autocast in the backward, where
the fast stages' fp32 bmm would drop to bf16. Without them the backward runs with autocast off
(autograd's engine does not carry it), every dtype is chosen here, and it behaves the same on CUDA,
on the CPU and under the CPU rehearsal of CUDA's autocast. The custom ops have no autocast kernel
either: autocast passes their inputs through unchanged.

Why two paths: a custom op costs more per call in eager mode than an autograd.Function (its Python
dispatch; timed by hand: ~0.17 ms more per forward + backward of a trivial op), while Dynamo cannot
trace the stages' ctypes or CuPy launches (a graph break, and with `fused-cpu` a crash). So eager
runs the Function and `torch.compile` the ops; both call forward() and backward() below (tested
equal).
"""

from __future__ import annotations

import functools

import torch

from grassflow.ops.plucker.backends import resolve_backend, stages_for
from grassflow.ops.plucker.common import acc_dtype, valid_counts


def _bias_mask(lags, T, empty, device, dtype):
    """(T, 1): 1 where some offset is valid (the bias applies), else 0; None for empty="bias"."""
    return None if empty == "bias" else _has_offsets(tuple(lags), T, str(device), dtype)


@functools.lru_cache(maxsize=64)
def _has_offsets(lags, T, device, dtype):
    # one tensor per shape and device, made once: ~20 small ops per layer and step fewer
    return (valid_counts(lags, T, device) > 0).to(dtype)[:, None]


# An ensemble (models/layers.py): weight (E, d, P) and bias (E, d), z (E·B, T, r) with member e's
# rows at [e·B, (e+1)·B). The stages are per token and run on all rows at once; the projections by W
# are one batched GEMM over the members (`_members` gives E, 0 for a plain weight).
def _members(weight) -> int:
    return weight.shape[0] if weight.dim() == 3 else 0


def _bias_term(bias, lags, T, empty, device, dtype):
    """What the bias adds: (T, d) or (d,) for a plain bias, (E, T, d) or (E, 1, d) for an
    ensemble's."""
    b = bias.to(dtype) if bias.dim() == 1 else bias.to(dtype).unsqueeze(1)
    mask = _bias_mask(lags, T, empty, device, dtype)
    return b if mask is None else b * mask


def forward(z, weight, bias, lags, eps, empty, stages) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, c): the op's output and the per-token coefficient c that backward needs."""
    z = z.contiguous()
    T, E = z.shape[1], _members(weight)
    c = stages.coeff(z, lags, eps)
    q = stages.wedge(z, c)
    if E:
        g = torch.bmm(q.reshape(E, -1, q.shape[-1]), weight.to(z.dtype).transpose(1, 2)).reshape(
            *z.shape[:2], -1
        )
    else:
        g = torch.matmul(q, weight.to(z.dtype).t())
    if bias is not None:
        term = _bias_term(bias, lags, T, empty, z.device, g.dtype)
        g = (
            g + term
            if not E
            else (g.reshape(E, -1, T, g.shape[-1]) + term.unsqueeze(1)).reshape(g.shape)
        )
    return g, c


def backward(dg, z, c, weight, has_bias, lags, eps, empty, stages, needs):
    """(dz, dW, db) for needs = (dz?, dW?, db?); None where not needed."""
    z = z.contiguous()
    B, T, r = z.shape
    E, d = _members(weight), weight.shape[-2]
    dg = dg.contiguous().to(z.dtype)
    dz = dweight = dbias = None
    if needs[1]:
        q = stages.wedge(z, c)
        if E:
            dweight = torch.bmm(
                dg.reshape(E, -1, d).transpose(1, 2), q.reshape(E, -1, q.shape[-1])
            ).to(weight.dtype)
        else:
            dweight = (dg.reshape(-1, d).t() @ q.reshape(B * T, -1)).to(weight.dtype)
    if has_bias and needs[2]:
        mask = _bias_mask(lags, T, empty, z.device, dg.dtype)
        masked = dg if mask is None else dg * mask
        dbias = (masked.reshape(E, -1, d).sum(1) if E else masked.sum((0, 1))).to(weight.dtype)
    if needs[0]:
        if E:
            dq = torch.bmm(dg.reshape(E, -1, d), weight.to(z.dtype)).reshape(B, T, -1)
        else:
            dq = torch.matmul(dg, weight.to(z.dtype)).contiguous()
        da, dc = stages.wedge_bwd(dq, z, c)
        dz = stages.lag_bwd(z, dc, da, lags, eps).to(z.dtype)
    return dz, dweight, dbias


class PluckerMixFunction(torch.autograd.Function):
    """The eager path."""

    @staticmethod
    def forward(ctx, z, weight, bias, lags, eps, empty, stages):
        g, c = forward(z, weight, bias, lags, eps, empty, stages)
        ctx.save_for_backward(z.contiguous(), c, weight)
        ctx.lags, ctx.eps, ctx.empty, ctx.stages = lags, eps, empty, stages
        ctx.has_bias = bias is not None
        return g

    @staticmethod
    def backward(ctx, dg):
        z, c, weight = ctx.saved_tensors
        dz, dweight, dbias = backward(
            dg,
            z,
            c,
            weight,
            ctx.has_bias,
            ctx.lags,
            ctx.eps,
            ctx.empty,
            ctx.stages,
            ctx.needs_input_grad[:3],
        )
        return dz, dweight, dbias, None, None, None, None


# --- the compiled path: custom ops ------------------------------------------------------------
# `backend` is resolved inside the ops (auto -> cupy | fast by the tensors' device), so that nothing
# Dynamo would have to trace (an import of CuPy, a compile probe) runs in the graph.


@torch.library.custom_op("grassflow::plucker_mix", mutates_args=())
def plucker_mix_op(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lags: list[int],
    eps: float,
    empty: str,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(
        z, weight, bias, tuple(lags), eps, empty, stages_for(resolve_backend(backend, z))
    )


@plucker_mix_op.register_fake
def _(z, weight, bias, lags, eps, empty, backend):
    B, T, r = z.shape
    return z.new_empty(B, T, weight.shape[-2]), z.new_empty(B, T, r, dtype=acc_dtype(z.dtype))


@torch.library.custom_op("grassflow::plucker_mix_backward", mutates_args=())
def plucker_mix_backward_op(
    dg: torch.Tensor,
    z: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor,
    has_bias: bool,
    lags: list[int],
    eps: float,
    empty: str,
    backend: str,
    needs: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    stages = stages_for(resolve_backend(backend, z))
    dz, dweight, dbias = backward(
        dg, z, c, weight, has_bias, tuple(lags), eps, empty, stages, needs
    )
    # a custom op returns tensors, never None (nor its inputs): empty stand-ins for "not needed"
    return (
        z.new_empty(0) if dz is None else dz,
        weight.new_empty(0) if dweight is None else dweight,
        weight.new_empty(0) if dbias is None else dbias,
    )


@plucker_mix_backward_op.register_fake
def _(dg, z, c, weight, has_bias, lags, eps, empty, backend, needs):
    return (
        z.new_empty(z.shape if needs[0] else (0,)),
        weight.new_empty(weight.shape if needs[1] else (0,)),
        weight.new_empty(weight.shape[:-1] if has_bias and needs[2] else (0,)),
    )


def _setup_context(ctx, inputs, output):
    z, weight, bias, lags, eps, empty, backend = inputs
    ctx.save_for_backward(z, output[1], weight)
    ctx.args = (bias is not None, lags, eps, empty, backend)
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, dg, _dc):
    z, c, weight = ctx.saved_tensors
    has_bias = ctx.args[0]
    needs = [bool(n) for n in ctx.needs_input_grad[:3]]
    needs[2] = needs[2] and has_bias
    dz, dweight, dbias = plucker_mix_backward_op(dg, z, c, weight, *ctx.args, needs)
    return (
        dz if needs[0] else None,
        dweight if needs[1] else None,
        dbias if needs[2] else None,
        None,
        None,
        None,
        None,
    )


plucker_mix_op.register_autograd(_backward, setup_context=_setup_context)
