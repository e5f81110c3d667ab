"""The LM head and its loss in one op: mean cross-entropy of logits = h Wᵀ against targets.

`linear_cross_entropy(h, weight, target, backend="auto")`, h (N, d), weight (V, d), target (N,):

- `reference` — F.cross_entropy(h @ Wᵀ, target): the (N, V) logits, their log-softmax and its
  gradient are three tensors of N·V floats (4,096 × 30,522: 500 MB each), freshly allocated
  and page-faulted in every step, and read and written by separate passes;
- `chunked` — the gradient is taken in the forward, chunk by chunk of tokens in one reused
  buffer: logits, log-softmax (the loss), softmax − onehot in place, then dh = G W and
  dW += Gᵀ h; the
  backward only scales (dh, dW) by the incoming gradient. Three GEMMs as before and a few
  passes over a buffer that stays in cache, nothing of size N·V allocated (Liger's fused
  linear cross-entropy, without its kernels). Measured faster on the CPU
  (`python -m grassflow.bench`, head rows); computes in fp32;
- `chunked-bf16` — the same with its three GEMMs in bf16 (tensor cores; fp32 accumulation
  inside each GEMM) and each chunk's (log-)softmax in fp32: the head under CUDA's autocast,
  whose reference materialises bf16 logits and then fp32 ones (~5 GB of traffic per step at
  4,096 × 30,522); dW summed over the chunks in fp32;
- `fused` — CUDA's autocast head in one pass over its logits: the bf16 logits of one GEMM,
  then kernels/cross_entropy.cu (ops/linear_ce/fused.py) reads them twice and writes the
  gradient over them (fp32 arithmetic), then dh = G W and dW = Gᵀ h: the loss and gradient
  move 6 bytes per logit where the reference moves 44 (by arithmetic: reports/bench/head-bytes.md).
  On the CPU the same kernels run through the shim, for the tests;
- `auto` — `chunked` on the CPU; `reference` on CUDA until a GPU measurement says otherwise.

It is a torch.library custom op (fake + autograd registered), so torch.compile sees it whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grassflow.errors import ConfigError
from grassflow.ops.linear_ce import fused
from grassflow.ops.linear_ce.fused import softmax_cross_entropy_

BACKENDS = ("auto", "reference", "chunked", "chunked-bf16", "fused")
BUFFER_FLOATS = 2**23  # a chunk's logits: 32 MB of fp32 (and as much for its log-softmax)


# Device type -> what `auto` runs there, from `python -m grassflow.bench` (head rows). CUDA: the
# reference until a GPU measurement says otherwise (a GPU default is only what ran on one).
AUTO = {"cpu": "chunked", "cuda": "reference"}


def resolve(backend: str, device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"linear_cross_entropy backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return AUTO.get(torch.device(device).type, "reference")
    return backend


def require(backend: str, device) -> str:
    """resolve(), and for `fused` raise naming the cause unless its kernels run on `device`: a CUDA
    device with CuPy (on the CPU they run only through the tests' shim, far too slowly to train)."""
    backend = resolve(backend, device)
    device = torch.device(device)
    if backend == "fused":
        if not fused.cupy_backend.CUDA.is_cuda(device):
            raise ConfigError(
                f"train.head_loss 'fused' runs CUDA kernels, and this job trains on {device}: "
                "set train.head_loss to auto or chunked"
            )
        why = fused.why_not(device)
        if why is not None:
            raise ConfigError(f"train.head_loss 'fused': {why}")
    return backend


@torch.library.custom_op("grassflow::linear_cross_entropy", mutates_args=())
def _chunked(
    h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, chunk: int, bf16: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, d loss/dh, d loss/dW); the GEMMs in bf16 where `bf16`, else in fp32."""
    gemm = torch.bfloat16 if bf16 else torch.float32
    hg, wg = h.to(gemm), weight.to(gemm)
    N, V = h.shape[0], weight.shape[0]
    dh = torch.empty(h.shape, dtype=gemm, device=h.device)
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=h.device)
    logits = torch.empty(min(chunk, N), V, dtype=torch.float32, device=h.device)
    logp = torch.empty_like(logits)
    # a chunk's bf16 GEMM in/output
    low = torch.empty(logits.shape, dtype=gemm, device=h.device) if bf16 else None
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    # ATen's (log_)softmax kernels, not exp_: the elementwise exp takes a slow path for every
    # argument whose result is subnormal (measured 10× slower on logits of an untrained model)
    for i in range(0, N, chunk):
        hc, yc = hg[i : i + chunk], target[i : i + chunk, None]
        g, lp = logits[: hc.shape[0]], logp[: hc.shape[0]]
        if bf16:
            torch.mm(hc, wg.t(), out=low[: hc.shape[0]])
            g.copy_(low[: hc.shape[0]])
        else:
            torch.mm(hc, wg.t(), out=g)
        torch.ops.aten._log_softmax.out(g, 1, False, out=lp)
        total -= lp.gather(1, yc).sum(dtype=torch.float64)
        torch.ops.aten._softmax.out(g, 1, False, out=g)  # in place
        g.scatter_add_(1, yc, torch.full(yc.shape, -1.0, device=g.device))  # softmax − onehot
        g.div_(N)
        if bf16:
            gl = low[: hc.shape[0]].copy_(g)
            torch.mm(gl, wg, out=dh[i : i + chunk])
            dw.add_(gl.t() @ hc)
        else:
            torch.mm(g, wg, out=dh[i : i + chunk])
            dw.addmm_(g.t(), hc)
    return (total / N).float(), dh.to(h.dtype), dw.to(weight.dtype)


@_chunked.register_fake
def _(h, weight, target, chunk, bf16):
    return h.new_empty((), dtype=torch.float32), torch.empty_like(h), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx, g, _dh, _dw):
    dh, dw = ctx.saved_tensors
    return dh * g.to(dh.dtype), dw * g.to(dw.dtype), None, None, None


_chunked.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("grassflow::linear_cross_entropy_fused", mutates_args=())
def _fused(
    h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, d loss/dh, d loss/dW): bf16 GEMMs, the loss and gradient by the fused kernels."""
    hg, wg = h.to(torch.bfloat16), weight.to(torch.bfloat16)
    g = torch.mm(hg, wg.t())  # (N, V) bf16: the only logits tensor, overwritten by the gradient
    loss = softmax_cross_entropy_(g, target, 1.0 / h.shape[0])
    return loss.mean(), torch.mm(g, wg).to(h.dtype), torch.mm(g.t(), hg).to(weight.dtype)


@_fused.register_fake
def _(h, weight, target):
    return h.new_empty((), dtype=torch.float32), torch.empty_like(h), torch.empty_like(weight)


_fused.register_autograd(
    lambda ctx, g, dh, dw: _backward(ctx, g, dh, dw)[:3], setup_context=_setup_context
)


def linear_cross_entropy(h, weight, target, backend="auto"):
    """Mean cross-entropy of h Wᵀ against target; h (N, d), weight (V, d). The logits are fp32, but
    for chunked-bf16's (and the reference's under autocast: bf16, then fp32)."""
    if (
        h.dim() != 2
        or weight.dim() != 2
        or h.shape[1] != weight.shape[1]
        or target.shape != h.shape[:1]
    ):
        raise ValueError(
            f"need h (N, d), weight (V, d), target (N,); got {tuple(h.shape)}, "
            f"{tuple(weight.shape)}, {tuple(target.shape)}"
        )
    backend = resolve(backend, h.device)
    if backend == "reference":
        return F.cross_entropy((h @ weight.t()).float(), target)
    if backend == "fused":
        return _fused(h, weight, target)[0]
    return _chunked(
        h, weight, target, max(1, BUFFER_FLOATS // weight.shape[0]), backend == "chunked-bf16"
    )[0]
