"""TransformerLM: the size-matched causal Transformer baseline (4 heads).

Block (post-norm): h ← LN(h + Dropout(Attn(h))); h ← LN(h + FFN(h)) Pre-norm: h ← h +
Dropout(Attn(LN(h))); h ← h + FFN(LN(h)) `attention_window` w makes the attention a causal sliding
window: position t attends to t−w … t only, so N layers reach N·w tokens back, as GrassmannLM with
offsets ≤ w does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from grassflow.models import layers
from grassflow.models.common import FeedForward, LanguageModel
from grassflow.models.config import ModelConfig


def window_mask(T: int, window: int, device) -> torch.Tensor:
    """(T, T), True where query t may attend to key s: 0 ≤ t − s ≤ window."""
    t = torch.arange(T, device=device)
    back = t[:, None] - t[None, :]
    return (back >= 0) & (back <= window)


class SelfAttention(nn.Module):
    """Causal (the LM; optionally a sliding window) or bidirectional over the real tokens of `mask`
    (the SNLI head)."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.n_heads, self.p, self.causal = cfg.n_heads, cfg.dropout, causal
        self.window = cfg.attention_window if causal else None
        self.qkv = layers.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = layers.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        allowed = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T): True = attend
        causal = self.causal
        if self.window is not None and self.window < T - 1:  # else the window is the causal mask
            win = window_mask(T, self.window, x.device)
            allowed, causal = win if allowed is None else allowed & win, False
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=causal, dropout_p=self.p if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.attn = SelfAttention(cfg, causal)
        self.ln1 = layers.LayerNorm(cfg.d_model)
        self.ln2 = layers.LayerNorm(cfg.d_model) if cfg.ffn else None
        self.ffn = FeedForward(cfg) if cfg.ffn else None
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h, mask=None):
        if self.pre:
            h = h + self.drop(self.attn(self.ln1(h), mask))
            return h if self.ffn is None else h + self.ffn(self.ln2(h))
        h = self.ln1(h + self.drop(self.attn(h, mask)))
        return h if self.ffn is None else self.ln2(h + self.ffn(h))


class TransformerLM(LanguageModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, [TransformerBlock(cfg) for _ in range(cfg.n_layers)])
