"""Run specs and token files shared by the tests (tiny, CPU-sized)."""

from __future__ import annotations

from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[2] / "workflow" / "resources" / "published.yaml"

LM_SPEC = {
    "run_id": "t-grassmann-s0",
    "preset": "test",
    "task": "lm",
    "experiment": "t",
    "model_kind": "grassmann",
    "seed": 0,
    "tokenizer": "trained",
    "model": {
        "d_model": 32,
        "d_ff": 64,
        "n_heads": 4,
        "r": 4,
        "lags": [1, 2, 4],
        "dropout": 0.1,
        "n_layers": 1,
        "context_len": 16,
    },
    "train": {
        "epochs": 3,
        "batch_size": 8,
        "lr": 3e-3,
        "betas": [0.9, 0.95],
        "weight_decay": 0.01,
        "warmup_frac": 0.05,
        "min_lr_frac": 0.1,
        "grad_clip": 1.0,
        "eval_batch_size": 32,
        "checkpoint_every": 3,
        "device": "cpu",
    },
}

SNLI_TINY_HEAD = {
    "d_model": 16,
    "d_ff": 32,
    "n_heads": 2,
    "d_proj": 8,
    "mix_heads": 2,
    "dropout": 0.0,
}
RANDOM_BACKBONE = {
    "name": "random-distilbert",
    "random": {"n_layers": 2, "dim": 32, "n_heads": 2, "hidden_dim": 64, "seed": 0},
}


def snli_spec(features, kind="grassmann", head=None, **train):
    spec = {
        "run_id": f"t-{kind}-s0",
        "preset": "test",
        "task": "snli",
        "experiment": "t",
        "model_kind": kind,
        "seed": 0,
        "head": {**SNLI_TINY_HEAD, "dropout": 0.1, **(head or {})},
        "features": features,
        "tokenizer": "trained",
        "max_tokens": 12,
        "train": {
            "epochs": 3,
            "batch_size": 16,
            "lr": 3e-3,
            "betas": [0.9, 0.95],
            "weight_decay": 0.01,
            "warmup_frac": 0.05,
            "min_lr_frac": 0.1,
            "grad_clip": 1.0,
            "eval_batch_size": 64,
            "checkpoint_every": 4,
            "device": "cpu",
            **train,
        },
    }
    if features["kind"] == "backbone":
        spec["backbone"] = RANDOM_BACKBONE
    return spec


def _make_tokens(d, download, train_tokenizer, tokenize_split, cfg, vocab_size, **cut):
    """raw parquet splits → a trained tokenizer → token files, through the stages' own functions."""
    for split in ("train", "validation", "test"):
        download(cfg, split, d / f"raw_{split}.parquet")
    train_tokenizer(d / "raw_train.parquet", vocab_size, d / "tok.json")
    for split in ("train", "validation", "test"):
        tokenize_split(
            {"name": "trained", **cut},
            d / f"raw_{split}.parquet",
            d / f"{split}.parquet",
            d / "tok.json",
        )
    return d


def make_lm_tokens(d):
    from grassflow.lm.data import download
    from grassflow.lm.tokenize import tokenize_split
    from grassflow.lm.train_tokenizer import train_tokenizer

    cfg = {
        "source": "synthetic",
        "synthetic": {"seed": 1, "articles": {"train": 150, "validation": 10, "test": 10}},
    }
    return _make_tokens(d, download, train_tokenizer, tokenize_split, cfg, 300)


def make_snli_tokens(d):
    from grassflow.snli.data import download, tokenize_split, train_tokenizer

    cfg = {
        "source": "synthetic",
        "synthetic": {"seed": 3, "pairs": {"train": 320, "validation": 64, "test": 64}},
    }
    # 12 per sentence
    return _make_tokens(d, download, train_tokenizer, tokenize_split, cfg, 120, max_tokens=12)


def ran(model: dict, train: dict, exp: dict, kinds=("transformer", "grassmann")) -> dict:
    """What runs of a preset-like `model`, `train` and experiment `exp` (N, L, B, epochs) ran, as
    lm.comparable.ran_settings reads it from their records: each kind's own model keys."""
    from grassflow.lm.comparable import ran_settings
    from grassflow.planning.sections import own_keys

    return ran_settings(
        [
            {
                "run_id": f"t-{k}-s0",
                "model_kind": k,
                "model": own_keys(
                    k, {**model, "n_layers": exp["n_layers"], "context_len": exp["context_len"]}
                ),
                "train": {**train, "batch_size": exp["batch_size"], "epochs": exp["epochs"]},
            }
            for k in kinds
        ]
    )
