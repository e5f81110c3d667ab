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
- `auto` — `chunked` on the CPU; `reference` on CUDA until a GPU measurement says otherwise.

It is a torch.library custom op (fake + autograd registered), so torch.compile sees it whole.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "reference", "chunked")
BUFFER_FLOATS = 2**23  # a chunk's logits: 32 MB of fp32 (and as much for its log-softmax)


def resolve(backend: str, device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"linear_cross_entropy backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "chunked" if torch.device(device).type == "cpu" else "reference"
    return backend


def linear_cross_entropy_reference(h, weight, target):
    return F.cross_entropy((h @ weight.t()).float(), target)


@torch.library.custom_op("grassflow::linear_cross_entropy", mutates_args=())
def _chunked(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
             chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, d loss/dh, d loss/dW)."""
    hf, wf = h.float(), weight.float()
    N, V = h.shape[0], weight.shape[0]
    dh = torch.empty_like(hf)
    dw = torch.zeros_like(wf)
    logits = torch.empty(min(chunk, N), V, dtype=torch.float32, device=h.device)
    logp = torch.empty_like(logits)
    total = torch.zeros((), dtype=torch.float64, device=h.device)
    # ATen's (log_)softmax kernels, not exp_: the elementwise exp takes a slow path for every
    # argument whose result is subnormal (measured 10× slower on logits of an untrained model)
    for i in range(0, N, chunk):
        hc, yc = hf[i : i + chunk], target[i : i + chunk, None]
        g, lp = logits[: hc.shape[0]], logp[: hc.shape[0]]
        torch.mm(hc, wf.t(), out=g)
        torch.ops.aten._log_softmax.out(g, 1, False, out=lp)
        total -= lp.gather(1, yc).sum(dtype=torch.float64)
        torch.ops.aten._softmax.out(g, 1, False, out=g)  # in place
        g.scatter_add_(1, yc, torch.full(yc.shape, -1.0, device=g.device))  # softmax − onehot
        g.div_(N)
        torch.mm(g, wf, out=dh[i : i + chunk])
        dw.addmm_(g.t(), hc)
    return (total / N).float(), dh.to(h.dtype), dw.to(weight.dtype)


@_chunked.register_fake
def _(h, weight, target, chunk):
    return h.new_empty((), dtype=torch.float32), torch.empty_like(h), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx, g, _dh, _dw):
    dh, dw = ctx.saved_tensors
    return dh * g.to(dh.dtype), dw * g.to(dw.dtype), None, None


_chunked.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(h, weight, target, backend="auto"):
    """Mean cross-entropy of h Wᵀ (fp32 logits) against target; h (N, d), weight (V, d)."""
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1] or target.shape != h.shape[:1]:
        raise ValueError(f"need h (N, d), weight (V, d), target (N,); got {tuple(h.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(target.shape)}")
    if resolve(backend, h.device) == "reference":
        return linear_cross_entropy_reference(h, weight, target)
    return _chunked(h, weight, target, max(1, BUFFER_FLOATS // weight.shape[0]))[0]
