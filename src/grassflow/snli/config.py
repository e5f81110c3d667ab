"""HeadConfig: the SNLI heads' settings; defaults are the paper's Grassmann–Plücker head (d_proj 64,
window 8, stride 8, d_model 256, 2 mixing layers, 4 mixing heads, d_ff 512, dropout 0.1). Each
ambiguity of the paper is a switch; the default comes first."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from grassflow.models.config import PLUCKER_BACKENDS, check_fields, from_known_keys

CHOICES = {
    "norm": ("post", "pre"),
    "pairs": ("bidirectional", "causal"),
    "empty_offsets": ("zero", "bias"),
    "pool": ("mean", "cls"),
    "pair_input": ("joint", "separate"),
    "plucker_backend": PLUCKER_BACKENDS,
}


@dataclass(frozen=True)
class HeadConfig:
    d_model: int = 256
    d_ff: int = 512  # GELU FFN
    ffn: bool = True  # the FFN sublayer of each block (the blocks are the LM's)
    n_layers: int = 2  # encoder layers (Transformer) / mixing layers (Grassmann)
    dropout: float = 0.1
    norm: str = "post"  # post (as the LM) | pre
    n_heads: int = 4  # Transformer head: attention heads
    # --- Grassmann–Plücker head ---
    d_proj: int = 64  # reduced dimension, split over the mixing heads: r = d_proj / mix_heads
    mix_heads: int = 4  # each head: its own r-slice of z and its own W_plü (d_model/mix_heads rows)
    window: int = 8  # tokens per window; a token pairs with the other tokens of its windows
    stride: int = 8  # windows start every `stride` tokens (= window: non-overlapping)
    pairs: str = "bidirectional"  # bidirectional: all others, oriented (earlier ∧ later) | causal
    empty_offsets: str = "zero"  # g of a token with no partner: zero | bias
    eps: float = 1e-6
    plucker_backend: str = "auto"
    # --- both heads ---
    pool: str = "mean"  # sentence vector: mean over real tokens | the [CLS] position
    pair_input: str = "joint"  # joint: one sequence [CLS] p [SEP] h [SEP], classifier on its
    #                            pooled vector | separate: each sentence alone, classifier on
    #                            [u, v, |u−v|, u⊙v]

    # the enums and ranges of the fields: checked here, and the JSON schema's `snli_head` section is
    # generated from them (grassflow.planning.schema)
    CHOICES = CHOICES
    BOUNDS = {
        **{
            k: {"minimum": 1}
            for k in ("d_model", "d_ff", "n_layers", "n_heads", "mix_heads", "stride")
        },
        "d_proj": {"minimum": 2},
        "window": {"minimum": 2},
        "dropout": {"minimum": 0, "exclusiveMaximum": 1},
        "eps": {"exclusiveMinimum": 0},
    }

    def __post_init__(self):
        check_fields(self, "head")
        for key in ("n_heads", "mix_heads"):
            if self.d_model % getattr(self, key):
                raise ValueError(
                    f"head.{key} ({getattr(self, key)}) must divide head.d_model ({self.d_model})"
                )
        if self.d_proj % self.mix_heads or self.d_proj // self.mix_heads < 2:
            raise ValueError(
                f"head.d_proj ({self.d_proj}) must be a multiple of head.mix_heads "
                f"({self.mix_heads}) with at least 2 dimensions per head"
            )
        if self.stride > self.window:
            raise ValueError(
                f"head.stride must be ≤ head.window; got window {self.window}, stride {self.stride}"
            )

    @property
    def r(self) -> int:
        return self.d_proj // self.mix_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HeadConfig:
        return from_known_keys(cls, d, "head")
