"""Stage 3, train: one language-model run (model × experiment × seed) from its spec.

The loop, checkpoints and resume live in grassflow.loop; this module supplies the language
modelling task (random blocks of L+1 tokens, chunked validation perplexity) and the run's
provenance record. Outputs in the run directory: model.safetensors and config.json (the best
weights, a model directory grassflow.pretrained.load_model reads), metrics.jsonl, run.json, all
written when the run ends; working files: last.pt (resume state), best_state.pt (best so far).
"""

from __future__ import annotations

import math

import torch

from grassflow.checkpoint import seed_everything
from grassflow.lm.data import read_tokens
from grassflow.lm.perplexity import chunked_nll
from grassflow.loop import ShuffledBatches, fit
from grassflow.models import ModelConfig, build_model, config_json
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.ops.linear_ce import resolve as resolve_head_loss
from grassflow.runs import read_train_val, run_record, start_run


class LanguageModelTask:
    """Next-token prediction on random non-overlapping blocks of L+1 tokens."""

    rate_key = "tokens_per_s"

    def __init__(self, train_ids, val_ids, L, B, seed, eval_batch_size, device, path):
        n_blocks = (len(train_ids) - 1) // L
        if n_blocks < B:
            raise RuntimeError(f"{path}: {len(train_ids)} tokens make {n_blocks} blocks of {L}, "
                               f"fewer than one batch of {B}")
        self.L, self.device = L, device
        self.head_loss = resolve_head_loss("auto", device)
        self.val_ids, self.eval_batch_size = val_ids, eval_batch_size
        self.order = ShuffledBatches(n_blocks, B, seed, device)
        self.steps_per_epoch, self.items_per_step = self.order.steps_per_epoch, B * L
        self.data = torch.as_tensor(train_ids[: n_blocks * L + 1], dtype=torch.long).to(device)
        self.offsets = torch.arange(L + 1, device=device)

    def batch(self, epoch, step):
        rows = self.order(epoch, step)[:, None] * self.L + self.offsets[None, :]
        return self.data[rows[:, :-1]], self.data[rows[:, 1:]]

    def loss(self, model, batch):
        """Mean next-token cross-entropy; the head and its loss as one op (ops.linear_ce)."""
        x, y = batch
        h = model.hidden(x)
        return linear_cross_entropy(h.reshape(-1, h.shape[-1]), model.head.weight, y.reshape(-1),
                                    backend=self.head_loss)

    def validate(self, model):
        nll, n = chunked_nll(model, self.val_ids, self.L, self.eval_batch_size, self.device)
        return {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}

    def score(self, row):
        return row["val_loss"]


def train(spec: dict, train_tokens, val_tokens, out_dir, preflight=None, execution=None) -> dict:
    t_start, out, device = start_run(spec, out_dir)
    tcfg = spec["train"]
    train_ids, train_meta, val_ids, val_meta = read_train_val(read_tokens, train_tokens, val_tokens)
    mcfg = ModelConfig.from_dict({**spec["model"], "vocab_size": train_meta["vocab_size"]})
    task = LanguageModelTask(train_ids, val_ids, mcfg.context_len, tcfg["batch_size"], spec["seed"],
                             tcfg["eval_batch_size"], device, train_tokens)
    seed_everything(spec["seed"])
    model = build_model(spec["model_kind"], mcfg).to(device)
    tokenizer = {"name": train_meta["tokenizer"], "sha256": train_meta["tokenizer_sha256"]}
    status, metrics, ran = fit(model, task, spec, out, device, execution=execution,
                               header={**config_json(spec["model_kind"], mcfg), "spec": spec, "tokenizer": tokenizer})
    best = min(metrics, key=lambda m: m["val_loss"]) if metrics else None
    files = {"train": (train_tokens, train_meta), "validation": (val_tokens, val_meta)}
    return run_record(spec, out, model, status, metrics, best, device, files, t_start, preflight=preflight,
                      model_config=mcfg.to_dict(), **ran, head_loss=task.head_loss,
                      best_val_ppl=best["val_ppl"] if best else None)
