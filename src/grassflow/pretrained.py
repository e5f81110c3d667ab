"""Language models as files others can load: the Hugging Face layout, without the pipeline.

    model.safetensors  the weights, tensors only (a tied LM head is stored once, as the token
                       embedding, and tied again on load: grassflow.checkpoint.save_weights)
    config.json        every ModelConfig field, the model kind, the vocabulary size, the tokenizer's
                       name and sha256, the weights' sha256 (grassflow.checkpoint.state_sha256)

    from grassflow.pretrained import load_model
    model = load_model("exports/table1-grassmann-s0")          # a GrassmannLM or a TransformerLM

Why not huggingface_hub's PyTorchModelHubMixin on the model classes: it would put the hub's code
into every training job's code fingerprint (grassflow.staleness), so adding it would rerun every
trained model, and it rebuilds a model from its __init__ keyword arguments while ours take one
ModelConfig. The files it writes are these; pushing a directory is
`huggingface_hub.upload_folder(repo_id=..., folder_path=...)` (docs/using-models.md).

A training run writes the same two files into its directory (grassflow.loop), so a run directory
loads as well. This module is read by `grassflow export` and `grassflow generate`, never by a
training or evaluation job: editing it reruns nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from grassflow.checkpoint import CONFIG, WEIGHTS, load_weights, save_weights, state_sha256
from grassflow.io import write_json
from grassflow.models import FORMAT, build_model, config_from_json, config_json


def save_pretrained(model, kind: str, out_dir, **extra) -> dict:
    """model.safetensors and config.json into `out_dir`, as a training run writes them in its
    directory (grassflow.loop); `extra` (tokenizer, ...) joins the config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {**config_json(kind, model.cfg), "weights_sha256": state_sha256(model.state_dict()), **extra}
    save_weights(out / WEIGHTS, model.state_dict())
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
    """The model of a model directory (an export, or a language-model run's directory), in eval
    mode on `device`. The weights are read by safetensors (no pickle) and must fit the model
    exactly; their sha256 must be the one config.json records."""
    config = read_config(path)
    if not config.get("weights_sha256"):
        raise ValueError(f"{path}: no weights (the run diverged before its first validation)")
    model = build_model(config["model_kind"], config_from_json(config))
    state = load_weights(Path(path) / WEIGHTS)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "head.weight" and model.cfg.tie_weights)]  # an export without `tied`
    if missing or unexpected:
        raise ValueError(f"{path}/{WEIGHTS} does not fit a {config['model_kind']} of its config.json: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    if state_sha256(model.state_dict()) != config["weights_sha256"]:
        raise ValueError(f"{path}/{WEIGHTS}: its weights' sha256 is not config.json's weights_sha256")
    return model.to(device).eval()
