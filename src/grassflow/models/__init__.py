"""The two language models of the paper, one file each."""

from grassflow.models.config import ModelConfig
from grassflow.models.grassmann import GrassmannLM
from grassflow.models.transformer import TransformerLM

MODELS = {"grassmann": GrassmannLM, "transformer": TransformerLM}
# The code each kind owns (modules and packages): a job runs its own kind's, never another's,
# although importing this package loads both. grassflow.staleness reads this literal without
# importing it, so that editing one model's code reruns only that model's jobs.
KIND_CODE = {"transformer": ("grassflow.models.transformer",),
             "grassmann": ("grassflow.models.grassmann", "grassflow.ops.plucker")}


# config.json of a model directory (a run's, an export's): the Hugging Face layout (grassflow.pretrained)
FORMAT = "grassflow-lm/1"


def config_json(kind: str, cfg: ModelConfig) -> dict:
    """What config.json says of a model: its format, kind, class and every ModelConfig field."""
    return {"format": FORMAT, "model_kind": kind, "architectures": [MODELS[kind].__name__], **cfg.to_dict()}


def config_from_json(config: dict) -> ModelConfig:
    """The ModelConfig of a config.json (its other keys: the kind, the spec, provenance)."""
    return ModelConfig.from_dict({k: v for k, v in config.items() if k in ModelConfig.__dataclass_fields__})


def build_model(kind: str, cfg: ModelConfig):
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {sorted(MODELS)}")
    return MODELS[kind](cfg)


__all__ = ["FORMAT", "KIND_CODE", "MODELS", "GrassmannLM", "ModelConfig", "TransformerLM", "build_model",
           "config_from_json", "config_json"]
