"""The Plücker mixing op of GrassmannLM, with interchangeable backends.

`plucker_mix(z, lags, weight, bias=None, *, eps=1e-6, empty="zero", backend="auto")` takes z (B, T,
r) and weight (d, r(r−1)/2) and returns g (B, T, d) (an ensemble of E models, models/layers.py:
weight (E, d, ·), bias (E, d), member e's rows of z at [e·B/E, (e+1)·B/E)):

    g_t = mean_{Δ ∈ lags, t−Δ ≥ 0} ( W p̂(z_t ∧ z_{t−Δ}) + b ),   p̂ = p / max(‖p‖, eps)

backends: "reference" (paper-literal loop), "fast" (algebraic form in PyTorch), "cupy" (CUDA
RawKernels), "kernel-cpu" (the CUDA kernels compiled for the CPU, for tests), "fused-cpu" (fused
per-token C++ loops with OpenMP, for CPU training), "auto" (cupy on CUDA tensors when CuPy is
installed and compiles the kernels there, else fast; `resolve_backend` says which one a device
gets). Under torch.compile every backend but the reference is one custom op,
`grassflow::plucker_mix` (function.py).
"""

from __future__ import annotations

import torch

from grassflow.ops.plucker.backends import BACKENDS, check_backend, resolve_backend, stages_for
from grassflow.ops.plucker.function import PluckerMixFunction, plucker_mix_op
from grassflow.ops.plucker.reference import plucker_mix_reference

EMPTY_POLICIES = ("zero", "bias")


def plucker_mix(z, lags, weight, bias=None, *, eps=1e-6, empty="zero", backend="auto"):
    if z.dim() != 3:
        raise ValueError(f"z must be (B, T, r), got shape {tuple(z.shape)}")
    r = z.shape[-1]
    if r < 2:
        raise ValueError(f"r must be ≥ 2, got {r}")
    if weight.dim() not in (2, 3) or weight.shape[-1] != r * (r - 1) // 2:
        raise ValueError(
            f"weight must be (d, {r * (r - 1) // 2}) for r={r} (or (E, d, ...) for an ensemble of "
            f"E), got {tuple(weight.shape)}"
        )
    if weight.dim() == 3 and z.shape[0] % weight.shape[0]:
        raise ValueError(
            f"an ensemble of {weight.shape[0]} needs z's batch in as many blocks, got "
            f"{z.shape[0]} rows"
        )
    if bias is not None and bias.shape != weight.shape[:-1]:
        raise ValueError(f"bias must be {tuple(weight.shape[:-1])}, got {tuple(bias.shape)}")
    lags = tuple(int(d) for d in lags)
    if any(d <= 0 for d in lags):
        raise ValueError(f"lags must be positive integers, got {lags}")
    if empty not in EMPTY_POLICIES:
        raise ValueError(f"empty must be one of {EMPTY_POLICIES}, got {empty!r}")
    check_backend(backend)
    if backend == "reference":  # plain PyTorch: eager and compiled alike
        return plucker_mix_reference(z, lags, weight, bias, eps=eps, empty=empty)
    if torch.compiler.is_compiling():  # one opaque op for Dynamo; the backend resolves inside
        return plucker_mix_op(z, weight, bias, list(lags), float(eps), empty, backend)[0]
    backend = resolve_backend(backend, z)
    return PluckerMixFunction.apply(z, weight, bias, lags, eps, empty, stages_for(backend))


__all__ = ["BACKENDS", "plucker_mix", "plucker_mix_reference", "resolve_backend"]
