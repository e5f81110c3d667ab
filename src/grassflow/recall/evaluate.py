"""MQAR evaluation of a run's best checkpoint: exact-match accuracy at the answer positions of
validation and test, overall and by key–query distance (buckets [1, 2), [2, 4), [4, 8), …), and the
model's reach: how many tokens back its last layer can see (lm.ablations' receptive field for
Grassmann, N·window for a windowed Transformer, the context otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from grassflow import job, runs
from grassflow.io import sha256_file, write_json
from grassflow.loop import load_trained
from grassflow.models import ModelConfig, build_model, config_from_json
from grassflow.recall.data import IGNORE, read_split
from grassflow.recall.train import predict
from grassflow.run_spec import RunSpec
from grassflow.runs import open_for_evaluation


def reach(kind: str, cfg: ModelConfig) -> int:
    """Tokens back the last layer's output can depend on (at most the context)."""
    if kind == "grassmann":
        r = sum(max(cfg.layer_lags(i)) for i in range(cfg.n_layers))
    elif cfg.attention_window is not None:
        r = cfg.n_layers * cfg.attention_window
    else:
        r = cfg.context_len - 1
    return min(r, cfg.context_len - 1)


def distance_buckets(L: int) -> list[tuple[int, int]]:
    edges = [1]
    while edges[-1] < L:
        edges.append(edges[-1] * 2)
    return list(zip(edges[:-1], edges[1:]))


def accuracy_report(hits: torch.Tensor, distance: np.ndarray, L: int) -> dict:
    hits = hits.numpy().astype(bool)
    by = []
    for lo, hi in distance_buckets(L):
        sel = (distance >= lo) & (distance < hi)
        by.append(
            {
                "lo": lo,
                "hi": hi,
                "n": int(sel.sum()),
                "accuracy": 100.0 * hits[sel].mean() if sel.any() else None,
            }
        )
    return {"accuracy": 100.0 * hits.mean(), "n": int(hits.size), "by_distance": by}


def evaluate_recall_run(weights, run_json, val_tokens, test_tokens, out, batch_size=None) -> dict:
    ckpt, result, evaluable, device = open_for_evaluation(weights, run_json, out)
    cfg = config_from_json(
        {k: v for k, v in ckpt.items() if k != "model"}, Path(weights).parent / "config.json"
    )
    spec = RunSpec.from_dict(ckpt["spec"])
    result["reach"] = reach(spec.model_kind, cfg)
    if not evaluable:
        write_json(out, result)
        return result
    model = build_model(spec.model_kind, cfg)
    load_trained(model, ckpt["model"])
    model = model.to(device)
    bs = batch_size or spec.train.eval_batch_size
    for split, path in (("validation", val_tokens), ("test", test_tokens)):
        data, meta = read_split(path)
        hits, nll = predict(model, data, bs, device)
        answers = data["distance"][data["labels"] != IGNORE]  # row-major, as predict's mask
        result[split] = {
            **accuracy_report(hits, answers, meta["seq_len"]),
            "nll": nll,
            "tokens_file": str(path),
            "tokens_sha256": sha256_file(path),
            "content_sha256": meta["content_sha256"],
        }
    write_json(out, result)
    return result


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.evaluate_args(p)
    a = p.parse_args(argv)
    return job.run(evaluate_recall_run, a.weights, a.run_json, a.val_tokens, a.test_tokens, a.out)


if __name__ == "__main__":
    sys.exit(main())
