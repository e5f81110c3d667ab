"""The frozen feature extractor of the SNLI experiment.

  pretrained  AutoModel.from_pretrained(path or name, revision) — DistilBERT-base-uncased
              from the hub, or a local copy of its files
  random      a randomly initialised DistilBERT of the given size (DistilBertConfig; seeded),
              the offline stand-in used by the tests and the demo preset

Frozen: no gradients, always in eval mode (dropout off), run under no_grad on the fly. The token
features are not cached: see README "SNLI" for the measurement behind that choice. A sha256 of the
weights goes into each run's provenance record.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from grassflow.checkpoint import state_sha256
from grassflow.data import DataError


def fetch_backbone(backbone: dict, out_dir) -> None:
    """Save the pretrained backbone's files into out_dir, so training jobs need no internet: the
    pipeline runs this where Snakemake runs (a cluster's login node). Written beside out_dir and
    renamed into place: a killed fetch never leaves a partial directory."""
    import shutil
    import tempfile
    from pathlib import Path

    model = _pretrained(backbone.get("path") or backbone["name"], backbone.get("revision"))
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        (tmp / "weights.sha256").write_text(weights_sha256(model) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pretrained(src: str, revision=None) -> nn.Module:
    try:
        from transformers import AutoModel

        # safetensors only: a pytorch_model.bin is a pickle, and the backbone directory sits in a
        # shared results tree (see checkpoint.load_data)
        return AutoModel.from_pretrained(
            os.path.expanduser(src), revision=revision, use_safetensors=True
        )
    except Exception as e:
        raise DataError(
            f"snli.backbone: could not load {src!r} ({type(e).__name__}: {e})\nFix: set "
            "snli.backbone.path to a local copy of its files, or run where the hub is "
            "reachable; offline, snli.backbone.random builds a random stand-in."
        ) from None


def load_backbone(cfg: dict, vocab_size: int, pad_id: int, fetched=None) -> nn.Module:
    """The frozen backbone of a spec; `fetched`: the directory fetch_backbone wrote for it."""
    rand = cfg.get("random")
    if rand:
        from transformers import DistilBertConfig, DistilBertModel

        conf = DistilBertConfig(
            vocab_size=vocab_size,
            n_layers=rand["n_layers"],
            dim=rand["dim"],
            n_heads=rand["n_heads"],
            hidden_dim=rand["hidden_dim"],
            pad_token_id=pad_id,
        )
        with torch.random.fork_rng():
            torch.manual_seed(rand["seed"])
            model = DistilBertModel(conf)
    else:
        src = str(fetched) if fetched else (cfg.get("path") or cfg["name"])
        model = _pretrained(src, None if fetched else cfg.get("revision"))
        if model.config.vocab_size != vocab_size:
            raise DataError(
                f"snli.backbone: {src!r} has a vocabulary of {model.config.vocab_size} tokens, "
                f"but the token files were made by a tokenizer of {vocab_size}; use the "
                "backbone's own tokenizer (snli.tokenizer)"
            )
    model.requires_grad_(False)
    return model.eval()


def weights_sha256(model: nn.Module) -> str:
    return state_sha256(model.state_dict())


def hidden_size(model: nn.Module) -> int:
    return model.config.hidden_size
