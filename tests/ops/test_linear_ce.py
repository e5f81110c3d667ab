"""The LM head's `fused` backend: kernels/cross_entropy.cu through the CPU shim (its arithmetic and
calling convention, as a GPU runs them) and through the CuPy stand-in (the CUDA path: the driver
launch on torch's stream, inside a graph capture), against the exact cross-entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grassflow.kernel_sources import kernels_dir
from grassflow.ops.linear_ce import fused, linear_cross_entropy, resolve
from grassflow.ops.plucker import kernel_abi
from helpers import fake_cupy
from helpers.margins import close, rel_err
from helpers.steps import bf16_head_case, with_grads

# V < LANES, ragged, > 2·LANES, bert's
SHAPES = [
    (1, 1),
    (3, 7),
    (37, 53),
    (5, 300),
    (4, 777),
    (2, 30522),
]


def exact(x, y, scale):
    """Each row's loss and scale · (softmax − onehot), in float64."""
    x = x.double()
    return F.cross_entropy(x, y, reduction="none"), (
        x.softmax(1) - F.one_hot(y, x.shape[1])
    ) * scale


def test_params_are_the_sources():
    """The GPU launch packs by fused.PARAMS (no C++ compiler is assumed on a GPU node): they must be
    what cross_entropy.cu declares, for every instantiation."""
    sigs = kernel_abi.signatures(kernels_dir() / fused.KERNEL_SOURCES[0])
    want = {
        f"{k}_{suffix}": tuple(p.replace("T", t) for p in params)
        for k, params in fused.PARAMS.items()
        for t, suffix in fused.TYPES.values()
    }
    assert sigs == want


@pytest.mark.parametrize("N, V", SHAPES)
def test_kernels_fp32_equal_the_exact_loss_and_gradient(N, V, gen):
    # logits units apart: exp underflows, the loss must not
    x = torch.randn(N, V, generator=gen) * 4
    y = torch.randint(0, V, (N,), generator=gen)
    g = x.clone()
    loss = fused.softmax_cross_entropy_(g, y, 0.25)
    want_loss, want_g = exact(x, y, 0.25)
    assert loss.dtype == torch.float32 and loss.shape == (N,)
    close(loss, want_loss, 4e-6, "loss")  # a few fp32 ulps at the logits' scale
    close(g, want_g, 4e-6, "gradient")


@pytest.mark.parametrize("N, V", SHAPES)
def test_kernels_bf16_read_bf16_and_write_the_rounded_gradient(N, V, gen):
    """bf16 logits (their raw bits): the loss of exactly those logits in fp32 arithmetic, the
    gradient rounded to bf16 once."""
    x = (torch.randn(N, V, generator=gen) * 4).bfloat16()
    y = torch.randint(0, V, (N,), generator=gen)
    g = x.clone()
    loss = fused.softmax_cross_entropy_(g, y, 1.0)
    want_loss, want_g = exact(x, y, 1.0)
    close(loss, want_loss, 1e-6, "loss")
    assert g.dtype == torch.bfloat16
    assert (
        g.double() - want_g
    ).abs().max() <= 2**-8 * want_g.abs().max() + 1e-12  # one bf16 rounding


@pytest.mark.parametrize("margin", [4.0, 12.0, 30.0])
def test_a_confident_row_keeps_its_digits(margin, gen):
    """The target's logit `margin` above the rest: the loss and the target's 1 − p are
    t/(1+t)-sized, t = Σ_{j≠y} exp(x_j − x_y) ~ V·e^−margin, which 1 + t and m + log(1 + t) round
    away in fp32 (and fp64's log-softmax at margin 30): the kernels sum t, take log1p and expm1, and
    match log1p(t) and −t/(1 + t) in fp64 within 1e-5."""
    V = 50
    x = torch.randn(3, V, generator=gen) * 0.1
    y = torch.tensor([0, 17, V - 1])
    rows = torch.arange(3)
    x[rows, y] += margin
    g = x.clone()
    loss = fused.softmax_cross_entropy_(g, y, 1.0)
    xd = x.double()
    t = (xd - xd[rows, y][:, None]).exp().scatter(1, y[:, None], 0.0).sum(1)
    close(loss, torch.log1p(t), 1e-5, "loss")
    close(g[rows, y], -t / (1 + t), 1e-5, "the target's gradient")


def test_a_target_out_of_range_makes_its_row_nan_and_only_it(gen):
    x = torch.randn(3, 40, generator=gen)
    y = torch.tensor([5, 40, -1])
    loss = fused.softmax_cross_entropy_(x.clone(), y, 1.0)
    assert torch.isnan(loss[1:]).all()
    close(loss[:1], F.cross_entropy(x[:1].double(), y[:1], reduction="none"), 1e-6, "valid row")


def test_kernels_refuse_what_they_cannot_read(gen):
    x = torch.randn(4, 6, generator=gen)
    for bad in (x.t(), x.double(), x[0]):
        with pytest.raises(ValueError, match="contiguous \\(N, V\\) float32 or bfloat16"):
            fused.softmax_cross_entropy_(bad, torch.zeros(4, dtype=torch.long), 1.0)


@pytest.mark.parametrize("N, V", [(37, 53), (64, 300), (5, 1111), (3, 2)])
def test_fused_head_equals_the_reference_within_bf16(N, V, gen):
    """The op as training calls it: the loss of the same bf16 logits CUDA's autocast reference
    computes, its gradients up to bf16's rounding, and within bf16's rounding of the exact (fp64)
    loss and gradients. fp32 outputs for fp32 inputs."""
    # logits of a few units (confident rows, where fp32's reference loses digits: the test above)
    hf, Wf, y, want, ref = bf16_head_case(gen, N, V, 0.5)
    got = with_grads(linear_cross_entropy(hf, Wf, y, backend="fused"), (hf, Wf))
    logits = hf.detach().bfloat16() @ Wf.detach().bfloat16().t()
    # the loss of those bf16 logits (fp32's loses digits on a confident row)
    same_logits = F.cross_entropy(logits.double(), y)
    close(got[0], same_logits, 1e-5, "loss of the same bf16 logits")
    for what, a, r, b in zip(("loss", "dh", "dW"), got, ref, want):
        assert a.dtype == torch.float32
        if what != "loss":  # bf16 G, rounded after or before the 1.7
            close(a, r, 3e-2, f"{what} against the autocast reference")
        # no further from the exact one than bf16's rounding, or twice the reference's error
        close(a.double(), b, max(3e-2, 2 * rel_err(r, b)), f"{what} against the exact one")


def test_fused_is_chosen_by_name_only():
    """No GPU has measured it: `auto` stays the reference on CUDA and the chunked op on the CPU."""
    assert resolve("auto", "cuda") == "reference" and resolve("auto", "cpu") == "chunked"
    assert resolve("fused", "cpu") == "fused"


def test_cuda_path_launches_on_torchs_stream_and_captures(monkeypatch, gen):
    """The CUDA path through the CuPy stand-in: compiled once from cross_entropy.cu, every launch on
    torch's current stream (a capture's while capturing) with nothing compiled or allocated by CuPy
    there, and the same numbers as the shim's direct path."""
    N, V = 6, 300
    h = torch.randn(N, 16, generator=gen, requires_grad=True)
    W = torch.randn(V, 16, generator=gen, requires_grad=True)
    y = torch.randint(0, V, (N,), generator=gen)
    direct = linear_cross_entropy(h, W, y, backend="fused")
    direct_grads = torch.autograd.grad(direct, (h, W))
    with fake_cupy.installed(monkeypatch) as state:
        assert fused.why_not(h.device) is None
        eager = linear_cross_entropy(h, W, y, backend="fused")  # warm-up: the compile happens here
        with fake_cupy.capturing():
            captured = linear_cross_entropy(h, W, y, backend="fused")
            grads = torch.autograd.grad(captured, (h, W))
    # why_not compiles plucker.cu (the backend's check), then this source
    assert state.compiles == 1 + 1
    names = [name for name, *_ in state.launches]
    # the gradient is made in the forward
    assert names == ["ce_partial_bf16", "ce_finish_bf16", "ce_grad_bf16"] * 2
    assert {s for *_, s in state.launches[-3:]} == {fake_cupy.CAPTURE}
    assert state.launches[-1][1] == -(-N * V // 256)  # one thread per logit
    assert torch.equal(eager, direct) and torch.equal(captured, direct)
    assert all(torch.equal(a, b) for a, b in zip(grads, direct_grads))


def test_cuda_path_without_nvrtc_says_why(monkeypatch):
    with fake_cupy.installed(monkeypatch, nvrtc_missing=True):
        assert "libnvrtc" in fused.why_not(torch.device("cpu"))
