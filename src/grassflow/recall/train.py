"""MQAR training: one run (model × (L, kv) × d_model × learning rate × seed) through grassflow.loop,
on the task's parquet files.

Batches: examples in a (seed, epoch)-shuffled order; the loss is the cross-entropy at the answer
positions only (every other target is IGNORE), as in zoology. After each epoch: the validation loss
and accuracy at the answer positions; model.safetensors keeps the best-accuracy weights. Optimiser
as zoology: AdamW (weight decay from the spec, 0.1 in the presets), cosine schedule.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from grassflow import job, runs
from grassflow.checkpoint import seed_everything
from grassflow.data import DataError
from grassflow.loop import ShuffledBatches, fit
from grassflow.models import ModelConfig, build_model, config_json
from grassflow.recall.data import IGNORE, read_split
from grassflow.run_spec import RunSpec
from grassflow.runs import run_record, start_run
from grassflow.runtime import autocast


def model_config(spec: RunSpec, meta: dict) -> ModelConfig:
    return ModelConfig.from_dict(
        {**spec.model, "vocab_size": meta["vocab"], "context_len": meta["seq_len"]}
    )


@torch.no_grad()
def predict(model, data: dict, batch_size: int, device) -> tuple[torch.Tensor, float]:
    """(whether each answer was predicted exactly, in file order; mean NLL over answers)."""
    model.eval()
    hits, nll, n = [], 0.0, 0
    for i in range(0, len(data["inputs"]), batch_size):
        x = torch.as_tensor(data["inputs"][i : i + batch_size]).to(device)
        y = torch.as_tensor(data["labels"][i : i + batch_size]).to(device)
        with autocast(device):
            logits = model(x).float()
        at = y != IGNORE
        nll += F.cross_entropy(logits[at], y[at], reduction="sum").item()
        n += int(at.sum())
        hits.append((logits[at].argmax(-1) == y[at]).cpu())
    return torch.cat(hits), nll / max(1, n)


class RecallObjective:
    rate_key = "examples_per_s"

    def __init__(self, train, val, B, seed, eval_batch_size, device, path):
        n = len(train["inputs"])
        if n < B:
            raise DataError(f"{path}: {n} examples, fewer than one batch of {B}")
        self.inputs = torch.as_tensor(train["inputs"]).to(device)
        self.labels = torch.as_tensor(train["labels"]).to(device)
        self.val, self.device, self.eval_batch_size = val, device, eval_batch_size
        self.order = ShuffledBatches(n, B, seed, device)
        self.steps_per_epoch, self.items_per_step = self.order.steps_per_epoch, B

    def batch(self, epoch, step):
        idx = self.order(epoch, step)
        return self.inputs[idx], self.labels[idx]

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE
        )

    def validate(self, model):
        hits, nll = predict(model, self.val, self.eval_batch_size, self.device)
        return {"val_loss": nll, "val_acc": 100.0 * hits.double().mean().item()}

    def score(self, row):
        return -row["val_acc"]


def train_recall(
    spec: RunSpec | dict, train_tokens, val_tokens, out_dir, preflight=None, execution=None
) -> dict:
    spec = RunSpec.of(spec)
    t_start, out, device = start_run(spec, out_dir)
    tcfg = spec.train
    train, train_meta = read_split(train_tokens)
    val, val_meta = read_split(val_tokens)
    if (val_meta["vocab"], val_meta["seq_len"], val_meta["kv"]) != (
        train_meta["vocab"],
        train_meta["seq_len"],
        train_meta["kv"],
    ):
        raise DataError(f"{train_tokens} and {val_tokens} are different MQAR settings")
    mcfg = model_config(spec, train_meta)
    objective = RecallObjective(
        train, val, tcfg.batch_size, spec.seed, tcfg.eval_batch_size, device, train_tokens
    )
    seed_everything(spec.seed)
    model = build_model(spec.model_kind, mcfg).to(device)
    status, metrics, ran = fit(
        model,
        objective,
        spec,
        out,
        device,
        execution=execution,
        header={**config_json(spec.model_kind, mcfg), "spec": spec.source},
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
        preflight=preflight,
        model_config=mcfg.to_dict(),
        **ran,
        best_val_acc=best["val_acc"] if best else None,
    )


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.train_args(p)
    a = p.parse_args(argv)
    return job.run(
        train_recall,
        a.spec,
        a.train_tokens,
        a.val_tokens,
        a.out_dir,
        a.preflight,
        runs.execution(a),
    )


if __name__ == "__main__":
    sys.exit(main())
