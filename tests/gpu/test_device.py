"""On a GPU (pytest -m gpu; `make gpu-check` runs these first): the models and heads under the real
bf16 autocast, and the CUDA kernels against `fast` inside a model. The CPU rehearsal of the same
code is tests/gpu/test_cuda_rules.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grassflow.models import ModelConfig, build_model
from grassflow.ops.plucker import cupy_backend
from grassflow.preflight import preflight
from grassflow.runtime import autocast
from grassflow.snli.config import HeadConfig
from grassflow.snli.model import ScratchEmbedding, SNLIClassifier

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = torch.device("cuda")
BACKENDS = ["fast"] + (["cupy"] if cupy_backend.cupy_available() else [])


def _lm(kind, backend, norm="post"):
    torch.manual_seed(0)
    return build_model(
        kind,
        ModelConfig(
            vocab_size=200,
            context_len=32,
            n_layers=2,
            d_model=64,
            d_ff=128,
            n_heads=4,
            r=8,
            norm=norm,
            init="small",
            dropout=0.0,
            plucker_backend=backend,
        ),
    ).to(CUDA)


def _losses(model, loss_fn, steps=25):
    """AdamW on one fixed batch under the jobs' autocast: the loss of every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = []
    for _ in range(steps):
        with autocast(CUDA):
            loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _lm_loss(model, x):
    return lambda: F.cross_entropy(model(x[:, :-1]).float().reshape(-1, 200), x[:, 1:].reshape(-1))


@pytest.mark.parametrize(
    "kind, backend", [("transformer", "auto")] + [("grassmann", b) for b in BACKENDS]
)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_lm_learns_a_batch_under_bf16_autocast(kind, backend, norm):
    model = _lm(kind, backend, norm)
    x = torch.randint(0, 200, (8, 33), device=CUDA, generator=torch.Generator(CUDA).manual_seed(0))
    losses = _losses(model, _lm_loss(model, x))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize(
    "kind, backend", [("transformer", "auto")] + [("grassmann", b) for b in BACKENDS]
)
def test_snli_head_learns_a_batch_under_bf16_autocast(kind, backend):
    torch.manual_seed(0)
    cfg = HeadConfig(
        d_model=32, d_ff=64, n_heads=2, d_proj=16, mix_heads=2, dropout=0.0, plucker_backend=backend
    )
    model = SNLIClassifier(kind, cfg, embedding=ScratchEmbedding(100, 32, 40, 0.0), feat_dim=32).to(
        CUDA
    )
    gen = torch.Generator(CUDA).manual_seed(0)
    ids = torch.randint(0, 100, (16, 23), device=CUDA, generator=gen)
    mask = torch.arange(23, device=CUDA)[None] < torch.randint(
        3, 24, (16, 1), device=CUDA, generator=gen
    )
    label = torch.randint(0, 3, (16,), device=CUDA, generator=gen)
    losses = _losses(
        model, lambda: F.cross_entropy(model({"ids": ids, "mask": mask}).float(), label)
    )
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.7 * losses[0], losses


@pytest.mark.skipif("cupy" not in BACKENDS, reason="needs CuPy compiling on this device")
def test_cupy_and_fast_agree_on_the_same_weights():
    x = torch.randint(0, 200, (8, 33), device=CUDA, generator=torch.Generator(CUDA).manual_seed(0))
    fast, cupy = _lm("grassmann", "fast"), _lm("grassmann", "cupy")
    cupy.load_state_dict(fast.state_dict())
    grads = {}
    for name, model in (("fast", fast), ("cupy", cupy)):
        with autocast(CUDA):
            loss = _lm_loss(model, x)()
        loss.backward()
        grads[name] = (loss.item(), model.blocks[0].mix.reduce.weight.grad.float())
    assert abs(grads["cupy"][0] - grads["fast"][0]) < 1e-2 * abs(grads["fast"][0])
    err = (grads["cupy"][1] - grads["fast"][1]).abs().max() / grads["fast"][1].abs().max()
    assert err < 5e-2, err.item()


def test_preflight_passes_on_this_gpu():
    rec = preflight(["cuda", "auto"], ["auto", *BACKENDS], snli=True)
    assert rec["ok"] and {d["type"] for d in rec["devices"]} == {"cuda"}
    assert rec["versions"]["torch_cuda"]


@pytest.mark.parametrize(
    "kind, backend", [("transformer", "auto")] + [("grassmann", b) for b in BACKENDS]
)
def test_a_captured_step_replays_bitwise_as_the_eager_one(kind, backend):
    """train.compile graph: the whole step (bf16 autocast, backward, clipping, fused AdamW, the loss
    bookkeeping) captured once and replayed gives, at dropout 0, bitwise the parameters and the loss
    sum of the same steps run eagerly (grassflow.train_step; CPU rehearsal:
    tests/gpu/test_capture.py)."""
    import numpy as np

    from grassflow.lm.train import LanguageModelObjective
    from grassflow.loop import lr_at, make_optimizer, set_lr
    from grassflow.train_config import TrainConfig
    from grassflow.train_step import WARMUP, EpochLoss, TrainStep

    tcfg = TrainConfig(
        epochs=1, batch_size=8, lr=3e-3, warmup_frac=0.3, min_lr_frac=0.1, weight_decay=0.01
    )
    ids = np.arange(20_000) % 197
    runs = {}
    for capture in (False, True):
        model = _lm(kind, backend)
        task = LanguageModelObjective(ids, ids[:2000], 32, 8, 0, 8, CUDA, "t")
        opt, _ = make_optimizer(model, tcfg, CUDA, capture=capture)
        losses = EpochLoss(CUDA)
        losses.reset([0.0], 0)
        step = TrainStep(
            model, lambda b, m=model, t=task: t.loss(m, b), opt, 0.5, CUDA, losses, capture=capture
        )
        for i in range(WARMUP + 5):
            set_lr(opt, lr_at(i, 20, tcfg))
            step(task.batch(0, i))
        torch.cuda.synchronize()
        assert (step.graph is not None) == capture
        runs[capture] = ([p.detach().clone() for p in model.parameters()], losses.read())
    for p, q in zip(*(runs[c][0] for c in (False, True))):
        assert torch.equal(p, q)
    assert runs[False][1] == runs[True][1]


def test_a_captured_validation_forward_gives_the_eager_perplexity():
    """train.compile graph's validation: the forward captured per input shape (the last, partial
    batch too) gives bitwise the eager chunked NLL."""
    import numpy as np

    from grassflow.lm.perplexity import chunked_nll
    from grassflow.train_step import GraphedForward

    model = _lm("grassmann", BACKENDS[-1])
    ids = np.arange(3_001) % 197
    eager = chunked_nll(model, ids, 32, 7, CUDA)
    graphed = GraphedForward(model, CUDA)
    assert chunked_nll(graphed, ids, 32, 7, CUDA) == eager
    assert len(graphed.graphs) == 2  # 7 blocks a batch, and the last 93 % 7 = 2
    assert chunked_nll(graphed, ids, 32, 7, CUDA) == eager  # replayed


@pytest.mark.skipif(not cupy_backend.cupy_available(), reason="needs CuPy")
@pytest.mark.parametrize("N, V", [(4096, 30522), (37, 53), (5, 1111)])
def test_fused_head_equals_the_autocast_reference_on_this_gpu(N, V):
    """kernels/cross_entropy.cu compiled by NVRTC and launched on this GPU: the loss of the same
    bf16 logits, the gradients within bf16's rounding of the reference under CUDA's autocast."""
    from grassflow.ops.linear_ce import linear_cross_entropy

    gen = torch.Generator(device=CUDA).manual_seed(0)
    h = torch.randn(N, 256, device=CUDA, generator=gen).requires_grad_()
    W = (torch.randn(V, 256, device=CUDA, generator=gen) * 0.05).requires_grad_()
    y = torch.randint(0, V, (N,), device=CUDA, generator=gen)
    out = {}
    for backend in ("reference", "fused"):
        with autocast(CUDA):
            loss = linear_cross_entropy(h, W, y, backend=backend)
        out[backend] = (loss.detach(), *torch.autograd.grad(loss, (h, W)))
    same_logits = F.cross_entropy((h.detach().bfloat16() @ W.detach().bfloat16().t()).double(), y)
    assert abs(out["fused"][0].item() - same_logits.item()) <= 1e-5 * same_logits.item()
    for a, b in zip(out["fused"][1:], out["reference"][1:]):
        assert ((a - b).abs().max() / b.abs().max()).item() <= 3e-2
