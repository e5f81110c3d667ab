"""Small tasks and models the training-step tests drive (the loop, its trackers, the CUDA rules)."""

from __future__ import annotations

import math

import numpy as np
import torch

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
    return {**LM_SPEC, "run_id": "toy", "train": {**LM_SPEC["train"], "epochs": 3, "checkpoint_every": 0, "log_every": 100,
                                       "max_steps_per_epoch": None, **train}}


def tiny_lm(kind, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, context_len=12, n_layers=2, d_model=16, d_ff=32, n_heads=2, r=4, lags=(1, 2, 4),
               dropout=0.0)
    return build_model(kind, ModelConfig(**{**cfg, **kw}))


def lm_task(model, device=CPU):
    ids = np.arange(600) % 37
    return LanguageModelObjective(ids, ids[:100], model.cfg.context_len, 4, 0, 8, device, "t")
