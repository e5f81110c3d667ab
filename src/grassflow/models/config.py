"""ModelConfig: one dataclass for both models; defaults are the paper's Table 1 setting."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields

NORMS = ("post", "pre")
INITS = ("default", "small")
LAG_SCHEDULES = ("all", "per_layer")
EMPTY_OFFSETS = ("zero", "bias")
# The Plücker op's backends (grassflow.ops.plucker): the one list, which the op (its BACKENDS),
# every config check, the JSON schema's enums and the preflight rule's wildcard read.
PLUCKER_BACKENDS = ("auto", "reference", "fast", "cupy", "kernel-cpu", "fused-cpu")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 30522  # bert-base-uncased
    context_len: int = 128  # L: rows of the learned position table, max sequence length
    n_layers: int = 6  # N
    d_model: int = 256
    d_ff: int = 1024  # 4·d_model, GELU
    n_heads: int = 4  # Transformer only
    r: int = 32  # Grassmann: reduced dimension, r(r−1)/2 = 496 Plücker coordinates
    lags: tuple[int, ...] = (1, 2, 4, 8, 12, 16)  # Grassmann: offsets Δ (pairs z_t, z_{t−Δ})
    dropout: float = 0.1
    tie_weights: bool = True  # LM head shares the token embedding
    ffn: bool = True  # the GELU FFN sublayer of every block (off: zoology's mixer-only blocks)
    attention_window: int | None = None  # Transformer: attend to offsets 0..window only (a
    #                                      sliding window; reach N·window) | None: all of t's past
    # --- switches; the paper-literal choice is the first of each ---
    norm: str = "post"  # post: LN after each residual (paper) | pre: pre-LN with residuals
    init: str = "default"  # default: PyTorch's init | small: N(0, 0.02), zero biases
    lag_schedule: str = "all"  # all: every layer uses all lags | per_layer: layer i uses
    #                             lags[i·len(lags)//n_layers] (N=12: 1,1,2,2,4,4,…,16,16)
    empty_offsets: str = "zero"  # g_t where no offset is valid (t < min Δ): zero | bias
    eps: float = 1e-6  # floor of ‖p‖ in p / max(‖p‖, eps)
    plucker_backend: str = "auto"  # reference | fast | cupy | kernel-cpu | fused-cpu | auto

    # the enums and ranges of the fields: checked here, and the JSON schema's `model` section is
    # generated from them (grassflow.planning.schema)
    CHOICES = {
        "norm": NORMS,
        "init": INITS,
        "lag_schedule": LAG_SCHEDULES,
        "empty_offsets": EMPTY_OFFSETS,
        "plucker_backend": PLUCKER_BACKENDS,
    }
    BOUNDS = {
        **{
            k: {"minimum": 1}
            for k in (
                "vocab_size",
                "context_len",
                "n_layers",
                "d_model",
                "d_ff",
                "n_heads",
                "lags",
                "attention_window",
            )
        },
        "r": {"minimum": 2},
        "dropout": {"minimum": 0, "exclusiveMaximum": 1},
        "eps": {"exclusiveMinimum": 0},
    }

    def __post_init__(self):
        object.__setattr__(self, "lags", tuple(int(d) for d in self.lags))
        if not self.lags:
            raise ValueError("model.lags must not be empty")
        check_fields(self, "model")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must divide model.d_model ({self.d_model})"
            )
        for d in self.lags:
            if not 0 < d < self.context_len:
                raise ValueError(
                    f"model.lags: offset {d} must be in 1..context_len-1 ({self.context_len - 1})"
                )

    def layer_lags(self, i: int) -> tuple[int, ...]:
        if self.lag_schedule == "all":
            return self.lags
        return (self.lags[i * len(self.lags) // self.n_layers],)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lags"] = list(self.lags)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        return from_known_keys(cls, d, "model")


def from_known_keys(cls, d: dict, key: str, **given):
    """cls(**d, **given) for a dataclass, with an error naming any key of `d` it does not have, or
    any it needs that `d` lacks; `given`: the fields the caller fills, not `d`."""
    known = {f.name for f in fields(cls)} - set(given)
    if unknown := sorted(set(d) - known):
        raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    required = (
        f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
    )
    if missing := sorted(k for k in required if k in known and k not in d):
        raise ValueError(f"{key}: missing key(s) {missing}")
    return cls(**d, **given)


def check_fields(obj, prefix: str) -> None:
    """ValueError naming `<prefix>.<field>` for a value outside the class's CHOICES or BOUNDS."""
    for key, allowed in obj.CHOICES.items():
        if getattr(obj, key) not in allowed:
            raise ValueError(
                f"{prefix}.{key}: {getattr(obj, key)!r} is not one of {tuple(allowed)}"
            )
    for key, b in obj.BOUNDS.items():
        value = getattr(obj, key)
        for v in value if isinstance(value, (tuple, list)) else [value]:
            if v is None:
                continue
            if (
                ("minimum" in b and v < b["minimum"])
                or ("exclusiveMinimum" in b and v <= b["exclusiveMinimum"])
                or ("exclusiveMaximum" in b and v >= b["exclusiveMaximum"])
            ):
                raise ValueError(f"{prefix}.{key} must be {_bounds_text(b)}, got {value}")


def _bounds_text(b: dict) -> str:
    if "minimum" in b and "exclusiveMaximum" in b:
        return f"in [{b['minimum']}, {b['exclusiveMaximum']})"
    return "≥ {}".format(b["minimum"]) if "minimum" in b else "> {}".format(b["exclusiveMinimum"])
