"""Stages run by the kernels in kernels/plucker.cu: on a GPU through CuPy (`cupy`), or on the CPU
through a small CUDA-on-CPU shim (`kernel-cpu`, used to test the very same source without a GPU).
Subclasses only say how one kernel is launched."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import torch

from grassflow.ops.plucker.common import acc_dtype, pair_indices

# dtype -> (C++ type in plucker.cu, suffix of its extern "C" kernels: plucker_<stage>_<suffix>)
KERNEL_TYPES = {
    torch.float32: ("float", "f32"),
    torch.float64: ("double", "f64"),
    torch.bfloat16: ("bf16_t", "bf16"),
}
KERNELS = ("plucker_coeff", "plucker_wedge", "plucker_wedge_bwd", "plucker_lag_bwd")
# The stages instantiated per r (plucker.cu): r exact for these, else the next bound, up to R_MAX.
EXACT_R = (4, 8, 16, 32)
R_BOUNDS = (8, 16, 32, 64)
R_MAX = R_BOUNDS[-1]
PER_R = ("plucker_coeff", "plucker_wedge_bwd", "plucker_lag_bwd")

BLOCK = 256  # threads per block of every launch

# Each stage's kernel parameters as plucker.cu declares them (T: the kernel's type, ACC: its
# arithmetic type), for the GPU launch, which cannot preprocess the source to read them (no C++
# compiler is assumed there); tests/ops/test_plucker.py holds them to the source.
PARAMS = {
    "plucker_coeff": ("T*", "int*", "int", "long", "int", "int", "ACC", "ACC*"),
    "plucker_wedge": ("T*", "ACC*", "int*", "int*", "long", "int", "T*"),
    "plucker_wedge_bwd": ("T*", "T*", "ACC*", "long", "int", "ACC*", "ACC*"),
    "plucker_lag_bwd": ("T*", "ACC*", "ACC*", "int*", "int", "long", "int", "int", "ACC", "ACC*"),
}


def signature(kernel: str, dtype: torch.dtype) -> tuple[str, ...]:
    """The parameter types of `kernel`'s instantiations for `dtype`, as kernel_abi spells them."""
    t, acc = KERNEL_TYPES[dtype][0], "double" if dtype == torch.float64 else "float"
    return tuple(p.replace("ACC", acc).replace("T", t) for p in PARAMS[kernel])


def r_variant(r: int) -> str:
    """The instantiation of the per-r kernels that serves r: `r32` (exact) or `upto64` (a bound)."""
    if r in EXACT_R:
        return f"r{r}"
    return f"upto{next(b for b in R_BOUNDS if r <= b)}"


def kernel_name(kernel: str, dtype: torch.dtype, r: int) -> str:
    variant = f"{r_variant(r)}_" if kernel in PER_R else ""
    return f"{kernel}_{variant}{KERNEL_TYPES[dtype][1]}"


def kernel_names() -> set[str]:
    """Every extern "C" kernel plucker.cu defines."""
    variants = [f"r{r}_" for r in EXACT_R] + [f"upto{b}_" for b in R_BOUNDS]
    return {
        f"{k}_{v if k in PER_R else ''}{suffix}"
        for k in KERNELS
        for v in variants
        for _, suffix in KERNEL_TYPES.values()
    }


def grid_for(n_threads: int) -> int:
    return (n_threads + BLOCK - 1) // BLOCK


class KernelStages:
    name = "kernel"
    # kernel launches so far, by kernel: read by the benchmark (launches per layer and step)
    launches: Counter = Counter()

    def _launch(self, kernel: str, dtype: torch.dtype, r: int, n_threads: int, *args) -> None:
        """Run kernel_name(kernel, dtype, r) on grid_for(n_threads) blocks of BLOCK threads."""
        if n_threads == 0:
            return
        KernelStages.launches[kernel] += 1
        self._run(kernel_name(kernel, dtype, r), signature(kernel, dtype), n_threads, *args)

    def _run(self, name: str, params: tuple[str, ...], n_threads: int, *args) -> None:
        raise NotImplementedError

    @staticmethod
    def _check(z, *others):
        """z sets the kernel's type and r; every other input must match it and all be contiguous."""
        if z.dtype not in KERNEL_TYPES:
            raise TypeError(f"plucker kernels take float32, float64 or bfloat16, got {z.dtype}")
        if z.shape[-1] > R_MAX:
            raise ValueError(
                f"plucker kernels take r ≤ {R_MAX}, got r={z.shape[-1]}: "
                "set model.plucker_backend to fast for a larger r"
            )
        for t in (z, *others):
            if t.dtype != z.dtype:
                raise TypeError(
                    f"plucker kernels: input of dtype {t.dtype} beside z of dtype {z.dtype}"
                )
            if not t.is_contiguous():
                raise ValueError("plucker kernels need contiguous inputs")

    @staticmethod
    @cache
    def _int_tensor(values: tuple, device: str) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    @staticmethod
    @cache
    def _pairs(r: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        I, J = pair_indices(r, "cpu")
        return I.to(device, torch.int32), J.to(device, torch.int32)

    def _lags(self, lags, device):
        return self._int_tensor(tuple(int(d) for d in lags) or (0,), str(device))

    def _eps(self, dtype, eps):
        return (np.float64 if acc_dtype(dtype) == torch.float64 else np.float32)(eps)

    def coeff(self, z, lags, eps):
        self._check(z)
        B, T, r = z.shape
        c = torch.empty(z.shape, dtype=acc_dtype(z.dtype), device=z.device)
        n = B * T
        self._launch(
            "plucker_coeff",
            z.dtype,
            r,
            n * r,
            z,
            self._lags(lags, z.device),
            np.int32(len(lags)),
            np.int64(n),
            np.int32(T),
            np.int32(r),
            self._eps(z.dtype, eps),
            c,
        )
        return c

    def wedge(self, z, c):
        B, T, r = z.shape
        n_pairs = r * (r - 1) // 2
        pi, pj = self._pairs(r, str(z.device))
        q = torch.empty(B, T, n_pairs, dtype=z.dtype, device=z.device)
        self._launch(
            "plucker_wedge",
            z.dtype,
            r,
            B * T * n_pairs,
            z,
            c,
            pi,
            pj,
            np.int64(B * T),
            np.int32(r),
            q,
        )
        return q

    def wedge_bwd(self, dq, z, c):
        self._check(z, dq)
        B, T, r = z.shape
        da, dc = torch.empty_like(c), torch.empty_like(c)
        self._launch(
            "plucker_wedge_bwd",
            z.dtype,
            r,
            B * T * r,
            dq,
            z,
            c,
            np.int64(B * T),
            np.int32(r),
            da,
            dc,
        )
        return da, dc

    def lag_bwd(self, z, dc, da, lags, eps):
        B, T, r = z.shape
        dz = torch.empty_like(dc)
        self._launch(
            "plucker_lag_bwd",
            z.dtype,
            r,
            B * T * r,
            z,
            dc,
            da,
            self._lags(lags, z.device),
            np.int32(len(lags)),
            np.int64(B * T),
            np.int32(T),
            np.int32(r),
            self._eps(z.dtype, eps),
            dz,
        )
        return dz
