"""Language models as files others can load: the Hugging Face layout, without the pipeline.

    model.safetensors  the weights, tensors only (a tied LM head is stored once, as the token
                       embedding, and tied again on load: grassflow.checkpoint.save_weights)
    config.json        every ModelConfig field, the model kind, the vocabulary size, the tokenizer's
                       name and sha256, the weights' sha256 (grassflow.checkpoint.state_sha256)

    from grassflow.pretrained import load_model
    model = load_model("exports/table1-grassmann-s0")          # a GrassmannLM or a TransformerLM

Why not huggingface_hub's PyTorchModelHubMixin on the model classes: it would put the hub's code
into every training job's code fingerprint (grassflow.planning.staleness), so adding it would rerun
every trained model, and it rebuilds a model from its __init__ keyword arguments while ours take one
ModelConfig. The files it writes are these; pushing a directory is
`huggingface_hub.upload_folder(repo_id=..., folder_path=...)` (docs/use/using-models.md).

A training run writes the same two files into its directory (grassflow.loop), so a run directory
loads as well. This module is read by `grassflow export` and `grassflow generate`, never by a
training or evaluation job: editing it reruns nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from grassflow.checkpoint import CONFIG, WEIGHTS, load_weights, save_weights, state_sha256
from grassflow.errors import ModelFileError
from grassflow.io import write_json
from grassflow.models import FORMAT, KIND_CODE, build_model, config_from_json, config_json

MODEL_KINDS = tuple(KIND_CODE)


def save_pretrained(model, kind: str, out_dir, **extra) -> dict:
    """model.safetensors and config.json into `out_dir`, as a training run writes them in its
    directory (grassflow.loop); `extra` (tokenizer, ...) joins the config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        **config_json(kind, model.cfg),
        "weights_sha256": state_sha256(model.state_dict()),
        **extra,
    }
    save_weights(out / WEIGHTS, model.state_dict())
    write_json(out / CONFIG, config)
    return config


def read_config(path) -> dict:
    """config.json of a model directory, checked to be ours: JSON, of our format, of a kind we
    have."""
    f = Path(path) / CONFIG
    if not f.is_file():
        raise FileNotFoundError(
            f"{path}: no {CONFIG}: not a model directory (make one with `grassflow export`)"
        )
    try:
        config = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{f}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelFileError(f"{f}: not a JSON object")
    if config.get("format") != FORMAT:
        raise ModelFileError(
            f"{f}: format {config.get('format')!r}; this grassflow reads {FORMAT!r}"
        )
    if config.get("model_kind") not in MODEL_KINDS:
        raise ModelFileError(
            f"{f}: model_kind {config.get('model_kind')!r} is not one of {list(MODEL_KINDS)}"
        )
    return config


def _fields_sizing(cfg, size: int) -> list[str]:
    """The config fields that make a tensor dimension `size` (for an error that names them)."""
    out = [
        k for k, v in cfg.to_dict().items() if type(v) is int and size in (v, 2 * v, 3 * v, 4 * v)
    ]
    return out + ["r"] * (size == cfg.r * (cfg.r - 1) // 2)


def load_model(path, device="cpu"):
    """The model of a model directory (an export, or a language-model run's directory), in eval mode
    on `device`. config.json must describe the model whole (config_from_json: every field, no
    unknown key); the weights are read by safetensors (no pickle), must fit that model tensor for
    tensor, and their sha256 must be the one config.json records. Every refusal is a ModelFileError
    (a ValueError) naming the file and the key or tensor, before any weight is loaded."""
    import torch

    from grassflow.ops.plucker import cupy_backend

    config = read_config(path)
    source = Path(path) / CONFIG
    cfg = config_from_json(config, source)
    if not config.get("weights_sha256"):
        raise ModelFileError(
            f"{source}: no weights_sha256: no weights (a run that diverged before its first "
            "validation has none)"
        )
    if config["model_kind"] == "grassmann" and cfg.plucker_backend in (
        "cupy",
        "kernel-cpu",
        "fused-cpu",
    ):
        need = "cuda" if cfg.plucker_backend == "cupy" else "cpu"
        if torch.device(device).type != need or (
            need == "cuda" and not cupy_backend.usable(torch.device(device))
        ):
            raise ModelFileError(
                f"{source}: plucker_backend {cfg.plucker_backend!r} does not run on {device}: "
                f'load it on {need}, or set plucker_backend to "auto" in {source}'
            )
    model = build_model(config["model_kind"], cfg)
    state = load_weights(Path(path) / WEIGHTS)
    want = model.state_dict()
    missing = [k for k in want if k not in state and not (k == "head.weight" and cfg.tie_weights)]
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise ModelFileError(
            f"{Path(path) / WEIGHTS} does not fit the {config['model_kind']} of {source}: "
            f"missing tensors {missing[:5]}, unexpected {unexpected[:5]}"
        )
    for k, t in state.items():
        if tuple(t.shape) != tuple(want[k].shape):
            sizes = {
                f
                for got, need in zip(t.shape, want[k].shape)
                if got != need
                for f in _fields_sizing(cfg, need)
            }
            raise ModelFileError(
                f"{Path(path) / WEIGHTS}: tensor {k} is {tuple(t.shape)}, but {source} makes it "
                f"{tuple(want[k].shape)} (its {', '.join(sorted(sizes)) or 'sizes'})"
            )
    model.load_state_dict(state, strict=False)
    if state_sha256(model.state_dict()) != config["weights_sha256"]:
        raise ModelFileError(
            f"{Path(path) / WEIGHTS}: its weights' sha256 is not {source}'s weights_sha256"
        )
    return model.to(device).eval()
