"""Small tasks and models the training-step tests drive (the loop, its trackers, the CUDA rules)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from grassflow.lm.train import LanguageModelObjective
from grassflow.models import ModelConfig, build_model
from helpers.specs import LM_SPEC

CPU = torch.device("cpu")


class Toy:
    """A task of fixed batches whose loss can be made non-finite at one (epoch, step)."""

    steps_per_epoch, items_per_step, rate_key = 10, 4, "items_per_s"

    def __init__(self, nan_at=None):
        self.nan_at, self.losses = nan_at, {}

    def batch(self, epoch, step):
        x = torch.linspace(-1, 1, 12).reshape(4, 3) * (1 + step)
        return x, (math.nan if (epoch, step) == self.nan_at else 1.0)

    def loss(self, model, batch):
        x, scale = batch
        return model(x).square().mean() * scale

    def validate(self, model):
        with torch.no_grad():
            return {"val_loss": float(model(torch.ones(2, 3)).square().mean())}

    def score(self, row):
        return row["val_loss"]


def toy_spec(**train):
    return {
        **LM_SPEC,
        "run_id": "toy",
        "train": {
            **LM_SPEC["train"],
            "epochs": 3,
            "checkpoint_every": 0,
            "log_every": 100,
            "max_steps_per_epoch": None,
            **train,
        },
    }


def tiny_lm(kind, **kw):
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=40,
        context_len=12,
        n_layers=2,
        d_model=16,
        d_ff=32,
        n_heads=2,
        r=4,
        lags=(1, 2, 4),
        dropout=0.0,
    )
    return build_model(kind, ModelConfig(**{**cfg, **kw}))


def lm_task(model, device=CPU):
    ids = np.arange(600) % 37
    return LanguageModelObjective(ids, ids[:100], model.cfg.context_len, 4, 0, 8, device, "t")


def with_grads(loss, params):
    """(loss, d(1.7 loss)/d each param): the scaled gradients a head's tests compare."""
    return (loss.detach(), *torch.autograd.grad(loss * 1.7, params))


def bf16_head_case(gen, N, V, scale):
    """An LM head's problem (N rows of width 16, V classes, hidden states `scale` wide): the fp32
    (h, W, y) the op under test takes, the exact (fp64) loss and gradients, and CUDA's autocast
    reference (bf16 GEMM, fp32 loss) with its gradients."""
    h = (torch.randn(N, 16, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    W = torch.randn(V, 16, generator=gen, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, V, (N,), generator=gen)
    exact = with_grads(F.cross_entropy(h @ W.t(), y), (h, W))
    hf, Wf = h.detach().float().requires_grad_(), W.detach().float().requires_grad_()
    autocast_ref = with_grads(
        F.cross_entropy((hf.bfloat16() @ Wf.bfloat16().t()).float(), y), (hf, Wf)
    )
    return hf, Wf, y, exact, autocast_ref
