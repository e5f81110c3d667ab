"""Multi-query associative recall: the generator's contract (zoology's MQAR), the windowed attention
and FFN switches, the reach of each model, the config checks, and the distance effect itself: a
Transformer recalls keys far back that a Grassmann model with short offsets cannot reach."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grassflow.data import DataError
from grassflow.models import ModelConfig, build_model
from grassflow.pipeline.presets import ConfigError, check_preset
from grassflow.recall.data import IGNORE, check_params, generate, make_splits, read_split
from grassflow.recall.evaluate import evaluate_recall_run, reach
from grassflow.recall.grid import geometric_lags, recall_runs
from grassflow.recall.train import train_recall


def test_generator_holds_zoologys_mqar_contract():
    V, L, kv, n = 64, 32, 4, 300
    a = generate(V, L, kv, n, seed=7)
    assert all(np.array_equal(a[k], generate(V, L, kv, n, seed=7)[k]) for k in a)  # deterministic
    assert not np.array_equal(a["inputs"], generate(V, L, kv, n, seed=8)["inputs"])
    x, y, dist = a["inputs"], a["labels"], a["distance"]
    keys, values = x[:, 0 : 2 * kv : 2], x[:, 1 : 2 * kv : 2]
    assert ((keys >= 1) & (keys < V // 2)).all() and ((values >= V // 2) & (values < V)).all()
    assert all(len(set(r)) == kv for r in keys) and all(len(set(r)) == kv for r in values)
    for i in range(n):
        q = np.flatnonzero(y[i] != IGNORE)
        # even slots after the pairs
        assert len(q) == kv and (q >= 2 * kv).all() and ((q - 2 * kv) % 2 == 0).all()
        for pos in q:  # the query is a key; its label the key's value; its distance back to the key
            j = int(np.flatnonzero(keys[i] == x[i, pos])[0])
            assert y[i, pos] == values[i, j] and dist[i, pos] == pos - 2 * j
    assert (dist[y == IGNORE] == 0).all() and x.min() >= 0 and x.max() < V
    # power law a = 0.01: short gaps most likely (uniform slots would put the mean near the middle)
    gaps = (np.flatnonzero(y.reshape(-1) != IGNORE) % L - 2 * kv) // 2
    assert gaps.mean() < 0.4 * ((L - 2 * kv) // 2)


def test_generator_refuses_what_zoology_refuses():
    with pytest.raises(DataError, match="4·kv ≤ seq_len"):
        check_params(64, 32, 9)
    with pytest.raises(DataError, match="vocab > seq_len"):
        check_params(32, 32, 4)
    with pytest.raises(DataError, match="even"):
        check_params(64, 31, 4)


def _preset(**recall):
    r = {
        "data": {"vocab": 64, "examples": {"train": 10, "validation": 10, "test": 10}, "seed": 0},
        "cells": [{"seq_len": 32, "kv": 4}],
        "d_models": [16],
        "n_layers": 2,
        "ffn_mult": 4,
        "model": {},
        "models": {
            "transformer": {"kind": "transformer"},
            "window4": {"kind": "transformer", "switches": {"attention_window": 4}},
            "grassmann_geo": {"kind": "grassmann", "geometric_lags": True},
        },
        "lrs": [1e-3, 3e-3],
        "seeds": [0],
        "epochs": 1,
        "batch_size": 8,
        "train": {"device": "cpu"},
    }
    return {"recall": {**r, **recall}}


def test_recall_config_errors_name_the_cell():
    with pytest.raises(ConfigError, match=r"presets.x.recall.cells\[1\]: needs 4·kv ≤ seq_len"):
        check_preset("x", _preset(cells=[{"seq_len": 32, "kv": 4}, {"seq_len": 32, "kv": 16}]))
    with pytest.raises(ConfigError, match=r"presets.x.recall.cells\[0\]: needs vocab > seq_len"):
        check_preset("x", _preset(cells=[{"seq_len": 64, "kv": 4}]))
    check_preset("x", _preset())  # a recall-only preset is a preset


def test_recall_grid_and_model_specs():
    specs = recall_runs("x", _preset())
    assert len(specs) == 3 * 2  # models × learning rates × one cell, one width, one seed
    s = specs["L32-kv4-d16-grassmann_geo-lr0.001-s0"]
    assert (
        s["model"]["lags"] == geometric_lags(32) == [1, 2, 4, 8, 16]
        and "attention_window" not in s["model"]
    )
    assert s["model"]["d_ff"] == 64 and s["train"]["lr"] == 1e-3 and s["model"]["context_len"] == 32
    w = specs["L32-kv4-d16-window4-lr0.003-s0"]
    assert w["model"]["attention_window"] == 4 and "lags" not in w["model"]


def _grad_reach(model, T):
    """For each output position t, the earliest input position its output depends on."""
    x = torch.randint(0, 50, (1, T))
    emb = model.tok_emb(x).detach().requires_grad_(True)
    model.tok_emb = torch.nn.Identity()
    earliest = []
    for t in range(T):
        (g,) = torch.autograd.grad(model(emb)[0, t].sum(), emb, retain_graph=True)
        dep = torch.nonzero(g[0].abs().sum(-1) > 0).flatten()
        assert dep.max() <= t  # causal
        earliest.append(int(dep.min()))
    return earliest


@pytest.mark.parametrize("n_layers, window", [(1, 3), (2, 3), (3, 1)])
def test_windowed_attention_is_causal_and_reaches_layers_times_window(n_layers, window):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=50,
        context_len=20,
        n_layers=n_layers,
        d_model=16,
        d_ff=32,
        n_heads=2,
        dropout=0.0,
        attention_window=window,
    )
    model = build_model("transformer", cfg).eval()
    earliest = _grad_reach(model, 20)
    assert earliest == [max(0, t - n_layers * window) for t in range(20)]
    assert reach("transformer", cfg) == n_layers * window
    full = ModelConfig(
        vocab_size=50, context_len=20, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0
    )
    assert (
        _grad_reach(build_model("transformer", full).eval(), 20) == [0] * 20
        and reach("transformer", full) == 19
    )


def test_grassmann_reach_and_the_ffn_switch():
    cfg = ModelConfig(
        vocab_size=50,
        context_len=32,
        n_layers=2,
        d_model=16,
        d_ff=32,
        r=4,
        lags=(1, 2),
        dropout=0.0,
    )
    assert reach("grassmann", cfg) == 4
    torch.manual_seed(0)
    assert _grad_reach(build_model("grassmann", cfg).eval(), 12) == [
        max(0, t - 4) for t in range(12)
    ]
    per_layer = ModelConfig(
        **{**cfg.to_dict(), "lags": (1, 2, 4, 8, 12, 16), "lag_schedule": "per_layer"}
    )
    assert reach("grassmann", per_layer) == 1 + 8  # layer i: lags[i·6/2]
    for kind in ("transformer", "grassmann"):
        with_ffn = build_model(kind, cfg)
        without = build_model(kind, ModelConfig(**{**cfg.to_dict(), "ffn": False}))
        # 2 layers: FFN + its LN
        assert with_ffn.num_params() - without.num_params() == 2 * (
            16 * 32 + 32 + 32 * 16 + 16 + 2 * 16
        )
        assert without(torch.randint(0, 50, (2, 12))).shape == (2, 12, 50)


RECALL_SPEC = {
    "preset": "test",
    "task": "recall",
    "cell": {"seq_len": 32, "kv": 4},
    "seed": 0,
    "train": {
        "epochs": 20,
        "batch_size": 32,
        "lr": 1e-3,
        "betas": [0.9, 0.95],
        "weight_decay": 0.1,
        "warmup_frac": 0.05,
        "min_lr_frac": 0.1,
        "grad_clip": 1.0,
        "eval_batch_size": 256,
        "checkpoint_every": 0,
        "device": "cpu",
    },
}


def _run(tmp_path, data, name, kind, **model):
    spec = {
        **RECALL_SPEC,
        "run_id": name,
        "model_name": name,
        "model_kind": kind,
        "model": {
            "d_model": 64,
            "d_ff": 128,
            "n_heads": 1,
            "n_layers": 2,
            "dropout": 0.0,
            "init": "small",
            "norm": "pre",
            "context_len": 32,
            **model,
        },
    }
    out = tmp_path / name
    rec = train_recall(spec, data / "train.parquet", data / "validation.parquet", out)
    ev = evaluate_recall_run(
        out / "model.safetensors",
        out / "run.json",
        data / "validation.parquet",
        data / "test.parquet",
        out / "eval.json",
    )
    return rec, ev


def test_the_learning_rate_is_chosen_by_mean_validation_accuracy():
    """Per cell × width × model, the learning rate with the best mean validation accuracy over its
    seeds; a diverged run counts as 0 %, so the lr with the single best run (3e-3: 95 % and a
    divergence, mean 47.5) loses to a steady one (1e-3: 60 and 70, mean 65); ties go to the smaller
    lr. Only the chosen lr's runs are kept, every seed of them."""
    import pandas as pd

    from grassflow.recall.aggregate import best_lr

    nan = float("nan")
    rows = [
        ("grassmann", 1e-3, 0, 60.0),
        ("grassmann", 1e-3, 1, 70.0),
        ("grassmann", 3e-3, 0, 95.0),
        ("grassmann", 3e-3, 1, nan),  # diverged
        ("transformer", 1e-3, 0, 80.0),
        ("transformer", 1e-3, 1, 80.0),
        ("transformer", 3e-3, 0, 90.0),
        ("transformer", 3e-3, 1, 70.0),  # a tie at 80: the smaller lr
        ("transformer", 1e-2, 0, 10.0),
        ("transformer", 1e-2, 1, 20.0),
    ]
    df = pd.DataFrame(
        [
            {
                "cell": "L32-kv4",
                "d_model": 32,
                "model": m,
                "lr": lr,
                "seed": s,
                "val_acc": v,
                "run_id": f"{m}-{lr}-{s}",
            }
            for m, lr, s, v in rows
        ]
    )
    chosen = best_lr(df)
    assert sorted(chosen.run_id) == [
        "grassmann-0.001-0",
        "grassmann-0.001-1",
        "transformer-0.001-0",
        "transformer-0.001-1",
    ]
    # per width its own pick
    other_width = df.assign(d_model=64, val_acc=df.val_acc.where(df.lr != 1e-2, 99.0))
    both = best_lr(pd.concat([df, other_width]))
    assert set(both[both.d_model == 64].lr) == {1e-2, 1e-3}  # transformer 1e-2, grassmann 1e-3


@pytest.mark.slow
def test_the_distance_effect(tmp_path):
    """On tiny MQAR (L=32, 4 pairs): a 2-layer Transformer recalls keys at every distance; a 2-layer
    Grassmann model with offsets 1 and 2 (reach 4) is at chance (1 in 31 values) beyond its reach.
    At this budget it is at chance within it too (1 of 29 queries at distances 2-3): the test bounds
    Grassmann from above only (docs/understand/recall.md). Deterministic: fixed seeds, CPU. (One
    head: with 4 heads of 16 dimensions the same budget reached 89 %, at lr 3e-3 29 %: measured.)"""
    data = tmp_path / "data"
    make_splits(64, 32, 4, {"train": 3000, "validation": 300, "test": 300}, seed=0, out_dir=data)
    _, t = _run(tmp_path, data, "transformer", "transformer")
    _, g = _run(tmp_path, data, "grassmann", "grassmann", r=8, lags=[1, 2])
    far = lambda ev: [b for b in ev["test"]["by_distance"] if b["lo"] >= 8 and b["n"]]  # noqa: E731
    print(json.dumps({"transformer": t["test"], "grassmann": g["test"]}))
    assert g["reach"] == 4 and t["reach"] == 31
    assert all(b["accuracy"] >= 80 for b in far(t)), far(t)
    assert all(b["accuracy"] <= 15 for b in far(g)), far(g)


def test_recall_split_files_carry_their_hash(tmp_path):
    meta = make_splits(
        64, 32, 4, {"train": 50, "validation": 20, "test": 20}, seed=3, out_dir=tmp_path
    )
    arrays, m = read_split(tmp_path / "train.parquet")
    assert m == meta["train"] and arrays["inputs"].shape == (50, 32)
    other, _ = read_split(tmp_path / "test.parquet")
    assert not np.array_equal(arrays["inputs"][:20], other["inputs"])  # each split its own seed
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "test.parquet")
    bad = t.replace_schema_metadata(
        {b"grassflow": json.dumps({**meta["test"], "content_sha256": "0" * 64})}
    )
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="bad.parquet: content does not match"):
        read_split(tmp_path / "bad.parquet")
