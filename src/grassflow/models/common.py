"""Pieces both language models share: the FFN and the embedding/LM-head shell. Their layers
(models/layers.py) also run a config's seeds as one ensemble (models/ensemble.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

from grassflow.models import layers
from grassflow.models.config import ModelConfig


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = layers.Linear(cfg.d_model, cfg.d_ff)
        self.down = layers.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.down(nn.functional.gelu(self.up(x))))


class LanguageModel(nn.Module):
    """Token + learned position embeddings → blocks → final LayerNorm → (tied) LM head."""

    def __init__(self, cfg: ModelConfig, blocks: list[nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = layers.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = layers.Embedding(cfg.context_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = layers.LayerNorm(cfg.d_model)
        self.head = layers.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.init == "small":
            self.apply(_init_small)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(idx))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm states (B, T, d): everything but the LM head."""
        T = idx.shape[1]
        if T > self.cfg.context_len:
            raise ValueError(f"sequence length {T} exceeds context_len {self.cfg.context_len}")
        x, E = self.tok_emb(idx), layers.members(self)
        if E:  # an ensemble: member e's positions on its rows
            x = layers.add_per_member(x, self.pos_emb.weight[:, :T], E)
        else:
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights count once


def _init_small(m: nn.Module):
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
