"""GrassmannLM: causal Grassmann (Plücker) mixing in place of self-attention.

Block (post-norm, the paper's):
    z  = W_red h + b                                  (r = 32)
    g  = plucker_mix(z, lags, W_plü, b_plü)           (grassflow.ops.plucker; one shared W_plü)
    α  = σ(W_gate [h; g] + b_gate)
    ĥ  = Dropout(LN(α h + (1−α) g))
    h' = LN(ĥ + FFN(ĥ))
Pre-norm (norm="pre"), the stabilisation 12-layer reproductions needed:
    u = LN(h);  h ← h + Dropout(α u + (1−α) g(u));  h ← h + FFN(LN(h))

Offsets pair z_t with the *earlier* z_{t−Δ}. The paper's text writes z_{t+Δ}, which would let
position t read the future; a causal language model cannot do that.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from grassflow.models import layers
from grassflow.models.common import FeedForward, LanguageModel
from grassflow.models.config import ModelConfig
from grassflow.ops.plucker import plucker_mix


class GrassmannMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, lags: tuple[int, ...]):
        super().__init__()
        self.cfg, self.lags = cfg, lags
        self.reduce = layers.Linear(cfg.d_model, cfg.r)
        self.plucker = layers.Linear(cfg.r * (cfg.r - 1) // 2, cfg.d_model)
        self.gate = layers.Linear(2 * cfg.d_model, cfg.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        g = plucker_mix(
            self.reduce(h),
            self.lags,
            self.plucker.weight,
            self.plucker.bias,
            eps=cfg.eps,
            empty=cfg.empty_offsets,
            backend=cfg.plucker_backend,
        )
        return gated_mix(self.gate, h, g)


def gated_mix(gate: layers.Linear, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """α = σ(W_gate [h; g] + b); α h + (1−α) g. Without materialising [h; g], and as a lerp:
    backward then keeps only α beyond tensors it already holds (h, g). lerp has no autocast rule and
    wants one dtype, while under autocast the gate's linear gives bf16 beside an fp32 h (a
    LayerNorm's output): the mix is taken in h's dtype."""
    d, w = h.shape[-1], gate.weight
    g = g.to(h.dtype)
    alpha = torch.sigmoid(layers.linear(h, w[..., :d], gate.bias) + layers.linear(g, w[..., d:]))
    return torch.lerp(g, h, alpha.to(h.dtype))


class GrassmannBlock(nn.Module):
    """The post-norm (or pre-norm) block around a mixer: GrassmannMixer here, the windowed mixer in
    the SNLI head. Extra forward arguments (a padding mask) go to the mixer."""

    def __init__(self, cfg: ModelConfig, mixer: nn.Module):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.mix = mixer
        self.ln1 = layers.LayerNorm(cfg.d_model)
        self.ln2 = layers.LayerNorm(cfg.d_model) if cfg.ffn else None
        self.ffn = FeedForward(cfg) if cfg.ffn else None
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h, *mix_args):
        if self.pre:
            h = h + self.drop(self.mix(self.ln1(h), *mix_args))
            return h if self.ffn is None else h + self.ffn(self.ln2(h))
        h = self.drop(self.ln1(self.mix(h, *mix_args)))
        return h if self.ffn is None else self.ln2(h + self.ffn(h))


class GrassmannLM(LanguageModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(
            cfg,
            [
                GrassmannBlock(cfg, GrassmannMixer(cfg, cfg.layer_lags(i)))
                for i in range(cfg.n_layers)
            ],
        )
