"""SNLI evaluation of a run's best checkpoint: accuracy, per-class accuracy and the confusion matrix
on validation and test."""

from __future__ import annotations

import sys

import torch

from grassflow import job, runs
from grassflow.data import DataError
from grassflow.io import sha256_file, write_json
from grassflow.loop import load_trained
from grassflow.run_spec import RunSpec
from grassflow.runs import open_for_evaluation
from grassflow.snli.data import read_token_pairs
from grassflow.snli.synthetic import LABELS
from grassflow.snli.train import build_classifier, predict


def accuracy_report(pred: torch.Tensor, gold: torch.Tensor) -> dict:
    confusion = torch.zeros(3, 3, dtype=torch.long)  # rows: gold, columns: predicted
    confusion.index_put_((gold, pred), torch.ones_like(gold), accumulate=True)
    per_class = {
        name: (100.0 * confusion[i, i].item() / confusion[i].sum().item())
        if confusion[i].sum()
        else None
        for i, name in enumerate(LABELS)
    }
    return {
        "accuracy": 100.0 * (pred == gold).double().mean().item(),
        "n": len(gold),
        "per_class_accuracy": per_class,
        "confusion": confusion.tolist(),
        "labels": list(LABELS),
    }


def evaluate_snli_run(
    weights, run_json, val_tokens, test_tokens, out, batch_size=None, backbone_dir=None
) -> dict:
    ckpt, result, evaluable, device = open_for_evaluation(weights, run_json, out)
    if not evaluable:
        return result
    spec = RunSpec.from_dict(ckpt["spec"])
    splits = {}
    for split, path in (("validation", val_tokens), ("test", test_tokens)):
        splits[split] = (path, *read_token_pairs(path))
    meta = splits["validation"][2]
    if splits["test"][2]["tokenizer_sha256"] != meta["tokenizer_sha256"]:
        raise DataError(f"{val_tokens} and {test_tokens} were made by different tokenizers")
    model, features = build_classifier(spec, meta, backbone_dir)
    if features.get("weights_sha256") != ckpt["features"].get("weights_sha256"):
        raise RuntimeError(
            f"{weights}: trained on backbone weights {ckpt['features'].get('weights_sha256')}, "
            f"but {features.get('backbone')} now loads {features.get('weights_sha256')}"
        )
    load_trained(model, ckpt["model"])
    model = model.to(device)
    bs = batch_size or spec.train.eval_batch_size
    for split, (path, data, meta) in splits.items():
        pred, nll = predict(model, data, meta, model.cfg.pair_input, bs, device)
        result[split] = {
            **accuracy_report(pred, torch.as_tensor(data["label"])),
            "nll": nll,
            "tokens_file": str(path),
            "tokens_sha256": sha256_file(path),
        }
    write_json(out, result)
    return result


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.evaluate_args(p)
    p.add_argument(
        "--backbone-dir", help="the pretrained backbone the pipeline fetched (snli_fetch_backbone)"
    )
    a = p.parse_args(argv)
    return job.run(
        evaluate_snli_run,
        a.weights,
        a.run_json,
        a.val_tokens,
        a.test_tokens,
        a.out,
        backbone_dir=a.backbone_dir,
    )


if __name__ == "__main__":
    sys.exit(main())
