"""SNLI training: one run (experiment × head × seed) from its spec, through grassflow.loop.

Batches: the pairs in a (seed, epoch)-shuffled order, padded to the longest in the batch; the last
partial batch is dropped so every step is full. After each epoch: validation loss and accuracy;
model.safetensors keeps the best-validation-accuracy weights (the frozen backbone is rebuilt from
the spec, never saved). Outputs: model.safetensors, config.json, metrics.jsonl, run.json.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from grassflow import job, runs
from grassflow.checkpoint import seed_everything
from grassflow.compiled import static_shapes
from grassflow.data import DataError
from grassflow.loop import ShuffledBatches, fit
from grassflow.run_spec import RunSpec
from grassflow.runs import read_train_val, run_record, start_run
from grassflow.runtime import autocast
from grassflow.snli.backbone import hidden_size, load_backbone, weights_sha256
from grassflow.snli.config import HeadConfig
from grassflow.snli.data import read_token_pairs
from grassflow.snli.model import ScratchEmbedding, SNLIClassifier, make_batch


def build_classifier(spec: RunSpec, meta: dict, backbone_dir=None) -> tuple[SNLIClassifier, dict]:
    """The model of a spec, and what provenance needs to know of its features; backbone_dir: where
    the pipeline fetched a pretrained backbone (else its name or path)."""
    hcfg = HeadConfig.from_dict(spec.head)
    feats = spec.features
    if feats["kind"] == "backbone":
        backbone = load_backbone(spec.backbone, meta["vocab_size"], meta["pad_id"], backbone_dir)
        model = SNLIClassifier(
            spec.model_kind, hcfg, backbone=backbone, feat_dim=hidden_size(backbone)
        )
        return model, {
            "kind": "backbone",
            "backbone": spec.backbone,
            "weights_sha256": weights_sha256(backbone),
        }
    emb = ScratchEmbedding(
        meta["vocab_size"], feats["embed_dim"], 2 * meta["max_tokens"], hcfg.dropout
    )
    return SNLIClassifier(spec.model_kind, hcfg, embedding=emb, feat_dim=feats["embed_dim"]), {
        "kind": "scratch"
    }


@torch.no_grad()
def predict(
    model, data, meta, pair_input, batch_size, device, static=False
) -> tuple[torch.Tensor, float]:
    """(predicted labels, mean NLL) over a whole split, in file order."""
    model.eval()
    preds, nll, n = [], 0.0, len(data["label"])
    for i in range(0, n, batch_size):
        batch = make_batch(data, range(i, min(i + batch_size, n)), meta, pair_input, device, static)
        with autocast(device):
            logits = model(batch).float()
        nll += F.cross_entropy(logits, batch["label"], reduction="sum").item()
        preds.append(logits.argmax(-1).cpu())
    return torch.cat(preds), nll / n


class SNLIObjective:
    rate_key = "examples_per_s"

    def __init__(
        self, train, val, meta, pair_input, B, seed, eval_batch_size, device, path, static=False
    ):
        n = len(train["label"])
        if n < B:
            raise DataError(f"{path}: {n} pairs, fewer than one batch of {B}")
        self.train, self.val, self.meta, self.pair_input = train, val, meta, pair_input
        self.device, self.eval_batch_size, self.static = device, eval_batch_size, static
        self.order = ShuffledBatches(n, B, seed)
        self.steps_per_epoch, self.items_per_step = self.order.steps_per_epoch, B

    def batch(self, epoch, step):
        return make_batch(
            self.train,
            self.order(epoch, step),
            self.meta,
            self.pair_input,
            self.device,
            self.static,
        )

    def loss(self, model, batch):
        return F.cross_entropy(model(batch).float(), batch["label"])

    def validate(self, model):
        pred, nll = predict(
            model,
            self.val,
            self.meta,
            self.pair_input,
            self.eval_batch_size,
            self.device,
            self.static,
        )
        return {
            "val_loss": nll,
            "val_acc": 100.0 * (pred == torch.as_tensor(self.val["label"])).double().mean().item(),
        }

    def score(self, row):
        return -row["val_acc"]


def train_snli(
    spec: RunSpec | dict,
    train_tokens,
    val_tokens,
    out_dir,
    backbone_dir=None,
    preflight=None,
    execution=None,
) -> dict:
    spec = RunSpec.of(spec)
    t_start, out, device = start_run(spec, out_dir)
    tcfg = spec.train
    train, train_meta, val, val_meta = read_train_val(read_token_pairs, train_tokens, val_tokens)
    seed_everything(spec.seed)
    model, features = build_classifier(spec, train_meta, backbone_dir)
    model = model.to(device)
    objective = SNLIObjective(
        train,
        val,
        train_meta,
        model.cfg.pair_input,
        tcfg.batch_size,
        spec.seed,
        tcfg.eval_batch_size,
        device,
        train_tokens,
        static=static_shapes((execution or {}).get("compile", "auto"), device),
    )
    status, metrics, ran = fit(
        model,
        objective,
        spec,
        out,
        device,
        header={"spec": spec.source, "features": features},
        execution=execution,
    )
    best = min(metrics, key=objective.score) if metrics else None
    files = {"train": (train_tokens, train_meta), "validation": (val_tokens, val_meta)}
    return run_record(
        spec,
        out,
        model,
        status,
        metrics,
        best,
        device,
        files,
        t_start,
        features=features,
        preflight=preflight,
        **ran,
        head_config=model.cfg.to_dict(),
        best_val_acc=best["val_acc"] if best else None,
    )


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.train_args(p)
    p.add_argument(
        "--backbone-dir", help="the pretrained backbone the pipeline fetched (snli_fetch_backbone)"
    )
    a = p.parse_args(argv)
    return job.run(
        train_snli,
        a.spec,
        a.train_tokens,
        a.val_tokens,
        a.out_dir,
        a.backbone_dir,
        a.preflight,
        runs.execution(a),
    )


if __name__ == "__main__":
    sys.exit(main())
