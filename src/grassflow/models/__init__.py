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


def build_model(kind: str, cfg: ModelConfig):
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; choose one of {sorted(MODELS)}")
    return MODELS[kind](cfg)


__all__ = ["KIND_CODE", "MODELS", "GrassmannLM", "ModelConfig", "TransformerLM", "build_model"]
