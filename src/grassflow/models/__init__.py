"""The two language models of the paper, one file each."""

from grassflow.models.config import ModelConfig
from grassflow.models.grassmann import GrassmannLM
from grassflow.models.transformer import TransformerLM

MODELS = {"grassmann": GrassmannLM, "transformer": TransformerLM}


def build_model(kind: str, cfg: ModelConfig):
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {sorted(MODELS)}")
    return MODELS[kind](cfg)


__all__ = ["MODELS", "GrassmannLM", "ModelConfig", "TransformerLM", "build_model"]
