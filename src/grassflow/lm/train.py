"""Stage 3, train: one language-model run (model × experiment × seed) from its spec.

The loop, checkpoints and resume live in grassflow.loop; this module supplies the language modelling
objective (random blocks of L+1 tokens, chunked validation perplexity) and the run's provenance
record. Outputs in the run directory: model.safetensors and config.json (the best weights, a model
directory grassflow.pretrained.load_model reads), metrics.jsonl, run.json, all written when the run
ends; working files: last.pt (resume state), best_state.pt (best so far).
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from grassflow import job, runs
from grassflow.checkpoint import seed_everything
from grassflow.lm.data import read_tokens
from grassflow.lm.perplexity import chunked_nll
from grassflow.loop import Run, ShuffledBatches, fit_runs
from grassflow.models import ModelConfig, build_model, config_json
from grassflow.models.ensemble import stack
from grassflow.ops.linear_ce import BACKENDS as HEAD_LOSSES
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.ops.linear_ce import require as require_head_loss
from grassflow.run_spec import RunSpec
from grassflow.runs import read_train_val, run_record, start_run


class LanguageModelObjective:
    """Next-token prediction on random non-overlapping blocks of L+1 tokens. `seed` may be a list:
    the objective of an ensemble of that many runs (models/ensemble.py), each member's batch the one
    its own run draws, side by side."""

    rate_key = "tokens_per_s"

    def __init__(
        self, train_ids, val_ids, L, B, seed, eval_batch_size, device, path, head_loss="auto"
    ):
        n_blocks = (len(train_ids) - 1) // L
        if n_blocks < B:
            raise RuntimeError(
                f"{path}: {len(train_ids)} tokens make {n_blocks} blocks of {L}, "
                f"fewer than one batch of {B}"
            )
        self.L, self.device = L, device
        self.head_loss = require_head_loss(head_loss, device)
        self.val_ids, self.eval_batch_size = val_ids, eval_batch_size
        self.members = len(seed) if isinstance(seed, (list, tuple)) else 0
        self.orders = [
            ShuffledBatches(n_blocks, B, s, device) for s in (seed if self.members else [seed])
        ]
        self.steps_per_epoch, self.items_per_step = self.orders[0].steps_per_epoch, B * L
        self.data = torch.as_tensor(train_ids[: n_blocks * L + 1], dtype=torch.long).to(device)
        self.offsets = torch.arange(L + 1, device=device)

    def batch(self, epoch, step):
        blocks = (
            self.orders[0](epoch, step)
            if not self.members
            else torch.cat([o(epoch, step) for o in self.orders])
        )
        rows = blocks[:, None] * self.L + self.offsets[None, :]
        return self.data[rows[:, :-1]], self.data[rows[:, 1:]]

    def loss(self, model, batch):
        """Mean next-token cross-entropy (one per member of an ensemble); the head and its loss as
        one op (ops.linear_ce)."""
        x, y = batch
        h = model.hidden(x)
        if not self.members:
            return linear_cross_entropy(
                h.reshape(-1, h.shape[-1]), model.head.weight, y.reshape(-1), backend=self.head_loss
            )
        # unbind, not [e]: its backward stacks the members' gradients once, where [e] would fill a
        # zero tensor of the whole ensemble's head per member
        return torch.stack(
            [
                linear_cross_entropy(h_e, w_e, y_e, backend=self.head_loss)
                for h_e, w_e, y_e in zip(
                    h.reshape(self.members, -1, h.shape[-1]).unbind(0),
                    model.head.weight.unbind(0),
                    y.reshape(self.members, -1).unbind(0),
                )
            ]
        )

    def validate(self, model):
        nll, n = chunked_nll(model, self.val_ids, self.L, self.eval_batch_size, self.device)
        return {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}

    def score(self, row):
        return row["val_loss"]


def build_group(kind: str, mcfg: ModelConfig, seeds, device):
    """(the model a fit trains, the members): each seed's model built as its own run builds it,
    then, for more than one, stacked into an ensemble (models/ensemble.py)."""
    members = []
    for seed in seeds:
        seed_everything(seed)
        members.append(build_model(kind, mcfg).to(device))
    return (members[0] if len(members) == 1 else stack(members)), members


def train(
    spec: RunSpec | dict, train_tokens, val_tokens, out_dir, preflight=None, execution=None
) -> dict:
    """One run; its record (run.json)."""
    return train_fused([spec], train_tokens, val_tokens, [out_dir], out_dir, preflight, execution)[
        0
    ]


def train_fused(
    specs: list[RunSpec | dict],
    train_tokens,
    val_tokens,
    out_dirs,
    work_dir,
    preflight=None,
    execution=None,
) -> list[dict]:
    """Runs that differ only in their seeds (a config's seeds, train.fuse_seeds) trained as one
    ensemble (models/ensemble.py), each member built with its own seed as its own run builds it,
    each run's outputs in its own directory; one run alone is trained as itself. The resume state is
    in `work_dir`. Returns each run's record (run.json, which names its fused group)."""
    specs = [RunSpec.of(s) for s in specs]
    for spec in specs[1:]:
        if replace(spec, seed=specs[0].seed, run_id=specs[0].run_id) != specs[0]:
            raise ValueError(
                f"fused runs differ in more than their seeds: {specs[0].run_id}, {spec.run_id}"
            )
    spec = specs[0]
    t_start, _, device = start_run(spec, work_dir)
    for d in out_dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
    tcfg = spec.train
    train_ids, train_meta, val_ids, val_meta = read_train_val(read_tokens, train_tokens, val_tokens)
    mcfg = ModelConfig.from_dict({**spec.model, "vocab_size": train_meta["vocab_size"]})
    seeds = [s.seed for s in specs]
    objective = LanguageModelObjective(
        train_ids,
        val_ids,
        mcfg.context_len,
        tcfg.batch_size,
        seeds if len(specs) > 1 else seeds[0],
        tcfg.eval_batch_size,
        device,
        train_tokens,
        (execution or {}).get("head_loss", "auto"),
    )
    model, members = build_group(spec.model_kind, mcfg, seeds, device)
    tokenizer = {"name": train_meta["tokenizer"], "sha256": train_meta["tokenizer_sha256"]}
    runs = [
        Run(
            s,
            Path(d),
            {**config_json(s.model_kind, mcfg), "spec": s.source, "tokenizer": tokenizer},
        )
        for s, d in zip(specs, out_dirs)
    ]
    statuses, metrics, ran = fit_runs(
        model, objective, runs, work_dir, device, viewer=members[0], execution=execution
    )
    files = {"train": (train_tokens, train_meta), "validation": (val_tokens, val_meta)}
    group = (
        {"fused": {"runs": [s.run_id for s in specs], "work_dir": str(work_dir)}}
        if len(specs) > 1
        else {}
    )
    records = []
    for e, (run, status, m) in enumerate(zip(runs, statuses, metrics)):
        best = min(m, key=lambda r: r["val_loss"]) if m else None
        extra = {"fused": {**group["fused"], "index": e}} if group else {}
        records.append(
            run_record(
                run.spec,
                run.out_dir,
                members[0],
                status,
                m,
                best,
                device,
                files,
                t_start,
                preflight=preflight,
                model_config=mcfg.to_dict(),
                **ran,
                **extra,
                head_loss=objective.head_loss,
                best_val_ppl=best["val_ppl"] if best else None,
            )
        )
    return records


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    runs.train_args(p, fused=True)
    p.add_argument(
        "--head-loss", choices=HEAD_LOSSES, default="auto", help="train.head_loss (ops.linear_ce)"
    )
    a = p.parse_args(argv)
    if len(a.spec) != len(a.out_dir):
        p.error(f"{len(a.spec)} specs but {len(a.out_dir)} output directories")
    return job.run(
        train_fused,
        a.spec,
        a.train_tokens,
        a.val_tokens,
        a.out_dir,
        a.work_dir or a.out_dir[0],
        a.preflight,
        {**runs.execution(a), "head_loss": a.head_loss},
    )


if __name__ == "__main__":
    sys.exit(main())
