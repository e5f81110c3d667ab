"""Language models as files others can load: the Hugging Face layout, without the pipeline.

    model.safetensors  the weights, tensors only (a tied LM head is stored once, as the token
                       embedding, and tied again on load)
    config.json        every ModelConfig field, the model kind, the vocabulary size, the tokenizer's
                       name and sha256, the weights' sha256 (grassflow.checkpoint.state_sha256)

    from grassflow.pretrained import load_model
    model = load_model("exports/table1-grassmann-s0")          # a GrassmannLM or a TransformerLM

Why not huggingface_hub's PyTorchModelHubMixin on the model classes: it would put the hub's code
into every training job's code fingerprint (grassflow.staleness), so adding it would rerun every
trained model, and it rebuilds a model from its __init__ keyword arguments while ours take one
ModelConfig. The files it writes are these; pushing a directory is
`huggingface_hub.upload_folder(repo_id=..., folder_path=...)` (docs/using-models.md).

This module is read by `grassflow export` and `grassflow generate`, never by a training or
evaluation job: editing it reruns nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grassflow.checkpoint import state_sha256
from grassflow.io import atomic_path, write_json
from grassflow.models import MODELS, ModelConfig, build_model

WEIGHTS, CONFIG = "model.safetensors", "config.json"
FORMAT = "grassflow-lm/1"


def weights_to_save(model) -> dict[str, torch.Tensor]:
    """The state dict with a tied head left out (safetensors stores no tensor twice)."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_weights:
        state.pop("head.weight")
    return state


def save_pretrained(model, kind: str, out_dir, **extra) -> dict:
    """model.safetensors and config.json into `out_dir`; `extra` (tokenizer, ...) joins the config."""
    from safetensors.torch import save_file

    if kind not in MODELS:
        raise ValueError(f"unknown model kind {kind!r}; one of {sorted(MODELS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "model_kind": kind, "architectures": [MODELS[kind].__name__],
              **model.cfg.to_dict(), "weights_sha256": state_sha256(model.state_dict()), **extra}
    with atomic_path(out / WEIGHTS) as tmp:
        save_file(weights_to_save(model), str(tmp), metadata={"format": "pt", "grassflow": FORMAT})
    write_json(out / CONFIG, config)
    return config


def read_config(path) -> dict:
    """config.json of a model directory, checked to be ours."""
    f = Path(path) / CONFIG
    if not f.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG}: not a model directory (make one with `grassflow export`)")
    config = json.loads(f.read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{f}: format {config.get('format')!r}, expected {FORMAT!r}")
    return config


def load_model(path, device="cpu"):
    """The model of a directory written by save_pretrained (an export), in eval mode on `device`.
    The weights are read by safetensors (no pickle) and must fit the model exactly; their
    sha256 must be the one config.json records."""
    from safetensors.torch import load_file

    config = read_config(path)
    cfg = ModelConfig.from_dict({k: v for k, v in config.items() if k in ModelConfig.__dataclass_fields__})
    model = build_model(config["model_kind"], cfg)
    state = load_file(str(Path(path) / WEIGHTS))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "head.weight" and cfg.tie_weights)]  # tied: the embedding
    if missing or unexpected:
        raise ValueError(f"{path}/{WEIGHTS} does not fit a {config['model_kind']} of its config.json: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if state_sha256(model.state_dict()) != config["weights_sha256"]:
        raise ValueError(f"{path}/{WEIGHTS}: its weights' sha256 is not config.json's weights_sha256")
    return model.to(device).eval()
