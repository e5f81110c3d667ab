"""SNLIClassifier: token features → head (Transformer or Grassmann–Plücker) → pooling → 3-way
classifier.

Token features come from the frozen backbone (experiment features: backbone) or from trainable token
+ position embeddings (features: scratch, the from-scratch variant). Both are position-aware, so
neither head adds positions of its own. pair_input "joint" runs the head once over "[CLS] premise
[SEP] hypothesis [SEP]" and classifies its pooled vector; "separate" runs it on each sentence and
classifies [u, v, |u−v|, u⊙v].
"""

from __future__ import annotations

import torch
import torch.nn as nn

from grassflow.snli.config import HeadConfig
from grassflow.snli.heads import HEADS

N_CLASSES = 3


class ScratchEmbedding(nn.Module):
    """Token + learned position embeddings, LayerNorm, dropout (as DistilBERT's embeddings)."""

    def __init__(self, vocab_size: int, dim: int, max_len: int, dropout: float):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.ln = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids, mask):
        return self.drop(
            self.ln(self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device)))
        )


class SNLIClassifier(nn.Module):
    not_checkpointed = ("backbone.",)  # frozen; rebuilt from the spec (its weights hash is checked)

    def __init__(
        self,
        kind: str,
        cfg: HeadConfig,
        *,
        backbone: nn.Module | None = None,
        embedding: ScratchEmbedding | None = None,
        feat_dim: int,
    ):
        super().__init__()
        if (backbone is None) == (embedding is None):
            raise ValueError(
                "give exactly one of backbone (frozen features) and embedding (scratch)"
            )
        if kind not in HEADS:
            raise ValueError(f"unknown head {kind!r}; choose one of {sorted(HEADS)}")
        self.kind, self.cfg = kind, cfg
        self.backbone, self.embedding = backbone, embedding
        self.in_proj = nn.Linear(feat_dim, cfg.d_model)
        self.blocks = nn.ModuleList(HEADS[kind](cfg))
        k = 1 if cfg.pair_input == "joint" else 4
        self.classifier = nn.Sequential(
            nn.Linear(k * cfg.d_model, cfg.d_model),
            nn.GELU(),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.d_model, N_CLASSES),
        )

    def train(self, mode: bool = True):
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()  # frozen: dropout stays off
        return self

    def token_features(self, ids, mask):
        if self.backbone is None:
            return self.embedding(ids, mask)
        with torch.no_grad():
            return self.backbone(input_ids=ids, attention_mask=mask.long()).last_hidden_state

    def encode(self, ids, mask):
        """Pooled vector (B, d_model) of padded sequences ids (B, T), mask (B, T)."""
        h = self.in_proj(self.token_features(ids, mask))
        for block in self.blocks:
            h = block(h, mask)
        if self.cfg.pool == "cls":
            return h[:, 0]
        m = mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1).clamp_min(1)

    def forward(self, batch: dict) -> torch.Tensor:
        if self.cfg.pair_input == "joint":
            return self.classifier(self.encode(batch["ids"], batch["mask"]))
        u = self.encode(batch["premise_ids"], batch["premise_mask"])
        v = self.encode(batch["hypothesis_ids"], batch["hypothesis_mask"])
        return self.classifier(torch.cat([u, v, (u - v).abs(), u * v], -1))

    def num_params(self) -> int:
        """Trainable parameters (the frozen backbone excluded)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def padded_len(meta: dict, pair_input: str) -> int:
    """The longest sequence a batch can hold: the fixed length of static-shape batches."""
    return 2 * meta["max_tokens"] - 1 if pair_input == "joint" else meta["max_tokens"]


def _to(x: torch.Tensor, device) -> torch.Tensor:
    # from pinned memory without blocking: a plain copy to a GPU waits for it, every step
    return (
        x.pin_memory().to(device, non_blocking=True)
        if torch.device(device).type == "cuda"
        else x.to(device)
    )


def make_batch(data: dict, idx, meta: dict, pair_input: str, device, static: bool = False) -> dict:
    """Padded tensors for the pairs `idx` of a token file (see grassflow.snli.data): padded to the
    longest pair of the batch, or with static=True to padded_len (for torch.compile, which would
    otherwise compile once per length)."""
    cls, sep, pad = meta["cls_id"], meta["sep_id"], meta["pad_id"]

    def padded(seqs):
        T = padded_len(meta, pair_input) if static else max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), pad, dtype=torch.long)
        mask = torch.zeros(len(seqs), T, dtype=torch.bool)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, : len(s)] = True
        return _to(ids, device), _to(mask, device)

    idx = [int(i) for i in idx]
    p = [[cls, *data["premise"][i], sep] for i in idx]
    h = [[cls, *data["hypothesis"][i], sep] for i in idx]
    out = {"label": _to(torch.as_tensor(data["label"][idx], dtype=torch.long), device)}
    if pair_input == "joint":
        out["ids"], out["mask"] = padded([a + b[1:] for a, b in zip(p, h)])
    else:
        (
            (out["premise_ids"], out["premise_mask"]),
            (out["hypothesis_ids"], out["hypothesis_mask"]),
        ) = padded(p), padded(h)
    return out
