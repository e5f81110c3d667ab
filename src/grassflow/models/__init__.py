"""The two language models of the paper, one file each. Their classes load on first use (their
modules import torch, 1.5 s): the Snakefile reads ModelConfig and KIND_CODE on every start, and
never builds a model."""

import types
import typing

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
# although building a model loads both. grassflow.planning.staleness reads this literal without
# importing it, so that editing one model's code reruns only that model's jobs.
KIND_CODE = {
    "transformer": ("grassflow.models.transformer",),
    "grassmann": ("grassflow.models.grassmann", "grassflow.ops.plucker"),
}


# config.json of a model directory (a run's, an export's): the Hugging Face layout
# (grassflow.pretrained)
FORMAT = "grassflow-lm/1"


def config_json(kind: str, cfg: ModelConfig) -> dict:
    """What config.json says of a model: its format, kind, class and every ModelConfig field."""
    return {
        "format": FORMAT,
        "model_kind": kind,
        "architectures": [_classes()[kind].__name__],
        **cfg.to_dict(),
    }


# config.json's keys beside the model's fields: what it is, what the weights are, where they came
# from
CONFIG_KEYS = {
    "format",
    "model_kind",
    "architectures",
    "weights_sha256",
    "tokenizer",
    "spec",
    "epoch",
    "val_loss",
    "val_metrics",
    "run",
    "model_type",
}


def config_from_json(config: dict, source="config.json") -> ModelConfig:
    """The ModelConfig of a config.json, strictly: every ModelConfig field present (a default in a
    missing one's place would silently be another model), no key it does not know, each value of its
    field's type and range. A ModelFileError names `source` and the key."""
    from grassflow.errors import ModelFileError

    fields = ModelConfig.__dataclass_fields__
    missing = sorted(set(fields) - set(config))
    if missing:
        raise ModelFileError(
            f"{source}: missing model field(s) {missing}: it does not say which model its "
            "weights are"
        )
    unknown = sorted(set(config) - set(fields) - CONFIG_KEYS)
    if unknown:
        raise ModelFileError(
            f"{source}: unknown key(s) {unknown}; a model's config.json has {sorted(fields)} "
            f"and {sorted(CONFIG_KEYS)}"
        )
    hints = typing.get_type_hints(ModelConfig)
    for name in fields:
        if not _of_type(config[name], hints[name]):
            raise ModelFileError(
                f"{source}: {name}: {config[name]!r} is not {_type_name(hints[name])}"
            )
    try:
        return ModelConfig(**{k: config[k] for k in fields})
    except ValueError as e:  # a range or a choice: ModelConfig's message names model.<field>
        raise ModelFileError(f"{source}: {str(e).removeprefix('model.')}") from None


def _of_type(value, hint) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_of_type(value, h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return isinstance(value, (list, tuple)) and all(_of_type(v, int) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))


def _type_name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return "a list of integers"
    return {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        type(None): "null",
    }[hint]


def build_model(kind: str, cfg: ModelConfig):
    models = _classes()
    if kind not in models:
        raise ValueError(f"unknown model {kind!r}; choose one of {sorted(models)}")
    return models[kind](cfg)


__all__ = [
    "FORMAT",
    "KIND_CODE",
    "MODELS",
    "GrassmannLM",
    "ModelConfig",
    "TransformerLM",
    "build_model",
    "config_from_json",
    "config_json",
]
