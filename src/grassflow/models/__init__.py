"""The two language models of the paper, one file each. Their classes load on first use (their
modules import torch, 1.5 s): the Snakefile reads ModelConfig and KIND_CODE on every start, and
never builds a model."""

from grassflow.models.config import ModelConfig


def _classes() -> dict:
    from grassflow.models.grassmann import GrassmannLM
    from grassflow.models.transformer import TransformerLM

    return {"grassmann": GrassmannLM, "transformer": TransformerLM}


def __getattr__(name: str):
    """MODELS ({kind: class}), GrassmannLM, TransformerLM, as attributes of the package."""
    if name == "MODELS":
        return _classes()
    if name in ("GrassmannLM", "TransformerLM"):
        return next(c for c in _classes().values() if c.__name__ == name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# The code each kind owns (modules and packages): a job runs its own kind's, never another's,
# although building a model loads both. grassflow.staleness reads this literal without
# importing it, so that editing one model's code reruns only that model's jobs.
KIND_CODE = {"transformer": ("grassflow.models.transformer",),
             "grassmann": ("grassflow.models.grassmann", "grassflow.ops.plucker")}


# config.json of a model directory (a run's, an export's): the Hugging Face layout (grassflow.pretrained)
FORMAT = "grassflow-lm/1"


def config_json(kind: str, cfg: ModelConfig) -> dict:
    """What config.json says of a model: its format, kind, class and every ModelConfig field."""
    return {"format": FORMAT, "model_kind": kind, "architectures": [_classes()[kind].__name__], **cfg.to_dict()}


def config_from_json(config: dict) -> ModelConfig:
    """The ModelConfig of a config.json (its other keys: the kind, the spec, provenance)."""
    return ModelConfig.from_dict({k: v for k, v in config.items() if k in ModelConfig.__dataclass_fields__})


def build_model(kind: str, cfg: ModelConfig):
    models = _classes()
    if kind not in models:
        raise ValueError(f"unknown model {kind!r}; choose one of {sorted(models)}")
    return models[kind](cfg)


__all__ = ["FORMAT", "KIND_CODE", "MODELS", "GrassmannLM", "ModelConfig", "TransformerLM", "build_model",
           "config_from_json", "config_json"]
