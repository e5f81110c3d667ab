"""The two SNLI heads: stacks of encoder layers over token features (never a pooled vector).

Transformer head: bidirectional self-attention blocks (grassflow.models.transformer) with a padding
mask. Grassmann–Plücker head: the LM's gated block (grassflow.models.grassmann) around a windowed
mixer; per mixing head k, with z = W_red h split into mix_heads slices of r dims,
    g = concat_k windowed_plucker_mix(z_k, mask, W_plü,k, b_plü,k)     (d_model/mix_heads each)
    α = σ(W_gate [h; g] + b),  h_mix = α h + (1−α) g
Padding never pairs and never attends, so extra padding changes no real token's output.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from grassflow.models.grassmann import GrassmannBlock, gated_mix
from grassflow.models.transformer import TransformerBlock
from grassflow.ops.plucker.windowed import windowed_plucker_mix
from grassflow.snli.config import HeadConfig


class WindowedGrassmannMixer(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.reduce = nn.Linear(cfg.d_model, cfg.d_proj)
        self.plucker = nn.ModuleList(
            nn.Linear(cfg.r * (cfg.r - 1) // 2, cfg.d_model // cfg.mix_heads)
            for _ in range(cfg.mix_heads)
        )
        self.gate = nn.Linear(2 * cfg.d_model, cfg.d_model)

    def features(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """g (B, T, d_model): the Plücker mixing features, before the gate."""
        cfg = self.cfg
        z = self.reduce(h).view(*h.shape[:2], cfg.mix_heads, cfg.r)
        return torch.cat(
            [
                windowed_plucker_mix(
                    z[:, :, k],
                    mask,
                    p.weight,
                    p.bias,
                    window=cfg.window,
                    stride=cfg.stride,
                    pairs=cfg.pairs,
                    eps=cfg.eps,
                    empty=cfg.empty_offsets,
                    backend=cfg.plucker_backend,
                )
                for k, p in enumerate(self.plucker)
            ],
            -1,
        )

    def forward(self, h, mask):
        return gated_mix(self.gate, h, self.features(h, mask))


def grassmann_blocks(cfg: HeadConfig) -> list[nn.Module]:
    return [GrassmannBlock(cfg, WindowedGrassmannMixer(cfg)) for _ in range(cfg.n_layers)]


def transformer_blocks(cfg: HeadConfig) -> list[nn.Module]:
    return [TransformerBlock(cfg, causal=False) for _ in range(cfg.n_layers)]


HEADS = {"transformer": transformer_blocks, "grassmann": grassmann_blocks}
