"""TransformerLM: the size-matched causal Transformer baseline (4 heads).

Block (post-norm):  h ← LN(h + Dropout(Attn(h)));  h ← LN(h + FFN(h))
Pre-norm:           h ← h + Dropout(Attn(LN(h)));  h ← h + FFN(LN(h))
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from grassflow.models.common import FeedForward, LanguageModel
from grassflow.models.config import ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.p = cfg.n_heads, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.attn = CausalSelfAttention(cfg)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h):
        if self.pre:
            h = h + self.drop(self.attn(self.ln1(h)))
            return h + self.ffn(self.ln2(h))
        h = self.ln1(h + self.drop(self.attn(h)))
        return self.ln2(h + self.ffn(h))


class TransformerLM(LanguageModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, [TransformerBlock(cfg) for _ in range(cfg.n_layers)])
