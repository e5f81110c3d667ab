"""The Plücker op: every backend against the paper-literal reference, outputs and gradients."""

import re
import shutil
import subprocess

import pytest
import torch

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.plucker import kernel_abi, plucker_mix, plucker_mix_reference
from grassflow.ops.plucker.cupy_backend import cupy_available
from grassflow.ops.plucker.kernel_stages import (
    KERNEL_TYPES,
    KERNELS,
    kernel_name,
    kernel_names,
    signature,
)
from helpers.margins import close

PAPER_LAGS = (1, 2, 4, 8, 12, 16)
# (B, T, r, d, lags): odd shapes, T=1, T < max Δ, duplicates, offsets ≥ T
CASES = [
    (2, 37, 8, 5, PAPER_LAGS),
    (1, 1, 6, 3, PAPER_LAGS),
    (3, 5, 4, 7, PAPER_LAGS),
    (1, 63, 32, 16, PAPER_LAGS),
    (2, 21, 16, 9, PAPER_LAGS),
    (2, 20, 3, 4, (1, 1, 2, 3, 3)),
    (2, 9, 5, 2, (4,)),
    (1, 6, 4, 3, (2, 9, 40)),
]


def rand(gen, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype)


def run(backend, z, lags, W, b, dg, empty, eps=1e-6):
    z, W = z.detach().requires_grad_(), W.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    g = plucker_mix(z, lags, W, b, eps=eps, empty=empty, backend=backend)
    leaves = [x for x in (z, W, b) if x is not None]
    if not g.requires_grad:  # the reference at T=1 with no bias: a constant output
        return [g.detach(), *(torch.zeros_like(x) for x in leaves)]
    grads = torch.autograd.grad((g * dg).sum(), leaves, allow_unused=True, materialize_grads=True)
    return [g.detach(), *grads]


@pytest.mark.parametrize("backend", ["fast", "kernel-cpu", "fused-cpu"])
@pytest.mark.parametrize("empty", ["zero", "bias"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}T{c[1]}r{c[2]}lags{len(c[4])}")
def test_backend_matches_reference_float64(backend, empty, with_bias, case, gen):
    B, T, r, d, lags = case
    z, W = rand(gen, B, T, r), rand(gen, d, r * (r - 1) // 2)
    b = rand(gen, d) if with_bias else None
    dg = rand(gen, B, T, d)
    ref = run("reference", z, lags, W, b, dg, empty)
    got = run(backend, z, lags, W, b, dg, empty)
    for name, x, y in zip(["g", "dz", "dW", "db"], got, ref):
        assert x.shape == y.shape
        close(x, y, 1e-10, f"{backend} {name}")


def test_empty_policy_sets_first_positions(gen):
    z, W, b = rand(gen, 2, 6, 4), rand(gen, 3, 6), rand(gen, 3)
    for backend in ("reference", "fast", "kernel-cpu", "fused-cpu"):
        g0 = plucker_mix(z, (2, 4), W, b, empty="zero", backend=backend)
        g1 = plucker_mix(z, (2, 4), W, b, empty="bias", backend=backend)
        assert torch.all(g0[:, :2] == 0)
        assert torch.allclose(g1[:, :2], b.expand(2, 2, 3))
        assert torch.allclose(g0[:, 2:], g1[:, 2:])


@pytest.mark.parametrize("backend", ["reference", "fast", "kernel-cpu", "fused-cpu"])
def test_gradcheck(backend, gen):
    z = rand(gen, 2, 7, 4).requires_grad_()
    W = rand(gen, 3, 6).requires_grad_()
    b = rand(gen, 3).requires_grad_()
    for empty in ("zero", "bias"):

        def f(z, W, b, empty=empty):
            return plucker_mix(z, (1, 2, 2, 5), W, b, empty=empty, backend=backend)

        assert torch.autograd.gradcheck(f, (z, W, b), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", ["fast", "kernel-cpu", "fused-cpu"])
def test_parallel_inputs_are_finite_and_bounded(backend, gen):
    """z_t all parallel: ‖p‖ is roundoff, below eps. Every formulation then amplifies that roundoff
    by 1/eps; the fast path combines offsets before the wedge, so it amplifies it differently. The
    documented bound: each normalised coordinate p̂ may differ by δ = 64·u·max‖z‖²/eps (u = 2⁻⁵³),
    so |Δg| ≤ δ·Σ|W_row| and |ΔdW| ≤ δ·Σ_t|dg_t|. dz and db carry no cancellation (dz = D c with c ~
    z/eps) and must match closely."""
    B, T, r, d, eps = 2, 30, 8, 5, 1e-6
    v = rand(gen, r)
    z = rand(gen, B, T, 1) * v  # every z_t ∥ v
    W, b, dg = rand(gen, d, r * (r - 1) // 2), rand(gen, d), rand(gen, B, T, d)
    ref = run("reference", z, PAPER_LAGS, W, b, dg, "zero", eps)
    got = run(backend, z, PAPER_LAGS, W, b, dg, "zero", eps)
    for x in got:
        assert torch.isfinite(x).all()
    delta = 64 * 2.0**-53 * z.pow(2).sum(-1).max().item() / eps
    assert (got[0] - ref[0]).abs().max().item() <= delta * W.abs().sum(1).max().item()
    assert (got[2] - ref[2]).abs().max().item() <= delta * dg.abs().sum((0, 1)).max().item()
    for name, x, y in (("dz", got[1], ref[1]), ("db", got[3], ref[3])):
        close(x, y, 1e-8, name)


def test_kernel_cpu_float32_and_bf16(gen):
    B, T, r, d = 2, 40, 32, 24
    z, W, b = rand(gen, B, T, r), rand(gen, d, 496) / 20, rand(gen, d)
    dg = rand(gen, B, T, d)
    ref = run("reference", z, PAPER_LAGS, W, b, dg, "zero")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        got = run(
            "kernel-cpu", z.to(dtype), PAPER_LAGS, W.to(dtype), b.to(dtype), dg.to(dtype), "zero"
        )
        fast = run("fast", z.to(dtype), PAPER_LAGS, W.to(dtype), b.to(dtype), dg.to(dtype), "zero")
        for name, x, y, f in zip(["g", "dz", "dW", "db"], got, ref, fast):
            assert x.dtype == dtype
            close(x, y, tol, f"{dtype} {name}")
            close(f, y, tol, f"fast {dtype} {name}")


def test_fused_cpu_float32_uses_every_thread_and_refuses_bf16(gen):
    """The fused C++ loops split tokens over torch's threads: each stage's result is the same, bit
    for bit, at 1 to 4 threads (a machine's cores, or a test worker's share of them). The op around
    them projects by W with torch's matmul, whose sums round differently at 3 threads and more (the
    reference's too): the op is held to the reference within float32's tolerance."""
    from grassflow.ops.plucker.backends import stages_for

    B, T, r, d = 3, 70, 32, 24
    z, W, b = rand(gen, B, T, r), rand(gen, d, 496) / 20, rand(gen, d)
    dg = rand(gen, B, T, d)
    ref = run("reference", z, PAPER_LAGS, W, b, dg, "zero")
    f32 = [x.to(torch.float32) for x in (z, W, b, dg)]
    zf, dq = f32[0].contiguous(), rand(gen, B, T, 496).to(torch.float32)
    stages, threads, by_threads = stages_for("fused-cpu"), torch.get_num_threads(), {}
    try:
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            c = stages.coeff(zf, PAPER_LAGS, 1e-6)
            da, dc = stages.wedge_bwd(dq, zf, c)
            by_threads[n] = {
                "coeff": c,
                "wedge": stages.wedge(zf, c),
                "wedge_bwd": torch.cat([da.flatten(), dc.flatten()]),
                "lag_bwd": stages.lag_bwd(zf, dc, da, PAPER_LAGS, 1e-6),
            }
            for name, x, y in zip(
                ["g", "dz", "dW", "db"],
                run("fused-cpu", *f32[:1], PAPER_LAGS, *f32[1:], "zero"),
                ref,
            ):
                assert x.dtype == torch.float32
                close(x, y, 1e-5, f"{n} threads: {name}")
    finally:
        torch.set_num_threads(threads)
    for n in (2, 3, 4):
        for stage, x in by_threads[n].items():
            assert torch.equal(x, by_threads[1][stage]), f"{stage} differs at {n} threads from 1"
    with pytest.raises(TypeError, match="fused-cpu backend takes float32 or float64"):
        plucker_mix(z.to(torch.bfloat16), PAPER_LAGS, W.to(torch.bfloat16), backend="fused-cpu")


def test_backward_saves_no_per_pair_tensor(gen):
    """fast/cupy save z and c (2r per token), not an r(r−1)/2 tensor per token or per offset."""
    B, T, r, d = 2, 64, 32, 16
    z = rand(gen, B, T, r, dtype=torch.float32).requires_grad_()
    W = rand(gen, d, 496, dtype=torch.float32).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel()) or t, lambda t: t
    ):
        plucker_mix(z, PAPER_LAGS, W, backend="fast")
    assert sum(saved) <= 2 * B * T * r + W.numel()


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(lags=(0, 1)), "lags must be positive"),
        (dict(lags=(-2,)), "lags must be positive"),
        (dict(empty="nan"), "empty must be one of"),
        (dict(backend="triton"), "backend must be one of"),
        (dict(W=torch.zeros(3, 5)), r"weight must be \(d, 6\)"),
    ],
)
def test_bad_arguments_are_named(bad, match, gen):
    args = dict(lags=(1, 2), W=rand(gen, 3, 6), empty="zero", backend="fast")
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        plucker_mix(
            rand(gen, 1, 4, 4),
            args["lags"],
            args["W"],
            empty=args["empty"],
            backend=args["backend"],
        )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_to_ptx(arch, tmp_path):
    src = kernels_dir() / "plucker.cu"
    out = tmp_path / f"plucker_{arch}.ptx"
    res = subprocess.run(
        [
            "nvcc",
            "-std=c++17",
            "-ptx",
            f"-arch={arch}",
            "-Werror",
            "all-warnings",
            "-o",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    entries = set(re.findall(r"\.entry\s+(\w+)", out.read_text()))
    # the extern "C" names CuPy launches: unmangled, so no name_expressions are needed
    assert entries == kernel_names()
    assert entries == set(kernel_abi.signatures(src))


def test_the_gpu_launchs_parameter_table_is_the_sources():
    """The cupy backend packs arguments by kernel_stages.PARAMS (a GPU node may have no C++
    preprocessor to read them off the source): every kernel's, as the source declares them."""
    sigs = kernel_abi.signatures(kernels_dir() / "plucker.cu")
    for dtype in KERNEL_TYPES:
        for kernel in KERNELS:
            for r in (2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64):
                assert signature(kernel, dtype) == sigs[kernel_name(kernel, dtype, r)], (
                    kernel,
                    dtype,
                    r,
                )
    assert set(sigs) == kernel_names()


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="needs CUDA and CuPy")
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}T{c[1]}r{c[2]}")
def test_cupy_matches_reference(dtype, tol, case, gen):
    B, T, r, d, lags = case
    z, W, b, dg = (
        rand(gen, B, T, r),
        rand(gen, d, r * (r - 1) // 2),
        rand(gen, d),
        rand(gen, B, T, d),
    )
    # the reference sees the rounded inputs
    z, W, b, dg = (x.to(dtype).double() for x in (z, W, b, dg))
    ref = run("reference", z, lags, W, b, dg, "zero")
    dev = [x.to("cuda", dtype) for x in (z, W, b, dg)]
    got = run("cupy", dev[0], lags, dev[1], dev[2], dev[3], "zero")
    for name, x, y in zip(["g", "dz", "dW", "db"], got, ref):
        assert x.dtype == dtype and x.is_cuda
        close(x.cpu(), y, tol, f"cupy {dtype} {name}")


def test_reference_is_the_paper_formula(gen):
    """Spot-check the oracle itself against a scalar loop at one position."""
    z, W, b = rand(gen, 1, 10, 4), rand(gen, 2, 6), rand(gen, 2)
    g = plucker_mix_reference(z, (1, 3), W, b)
    t, acc = 7, 0
    for d in (1, 3):
        a, c = z[0, t], z[0, t - d]
        p = torch.stack([a[i] * c[j] - a[j] * c[i] for i in range(4) for j in range(i + 1, 4)])
        acc = acc + W @ (p / p.norm()) + b
    assert torch.allclose(g[0, t], acc / 2)
