"""TransformerLM: the size-matched causal Transformer baseline (4 heads).

Block (post-norm):  h ← LN(h + Dropout(Attn(h)));  h ← LN(h + FFN(h))
Pre-norm:           h ← h + Dropout(Attn(LN(h)));  h ← h + FFN(LN(h))
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from grassflow.models.common import FeedForward, LanguageModel
from grassflow.models.config import ModelConfig


class SelfAttention(nn.Module):
    """Causal (the LM) or bidirectional over the real tokens of `mask` (the SNLI head)."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.n_heads, self.p, self.causal = cfg.n_heads, cfg.dropout, causal
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        keys = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T): True = attend
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, is_causal=self.causal,
                                           dropout_p=self.p if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.attn = SelfAttention(cfg, causal)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h, mask=None):
        if self.pre:
            h = h + self.drop(self.attn(self.ln1(h), mask))
            return h + self.ffn(self.ln2(h))
        h = self.ln1(h + self.drop(self.attn(h, mask)))
        return self.ln2(h + self.ffn(h))


class TransformerLM(LanguageModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, [TransformerBlock(cfg) for _ in range(cfg.n_layers)])
