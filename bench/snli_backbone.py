"""On the fly or cached? The frozen-backbone cost of one SNLI training step, measured side by side
with the heads: `python bench/snli_backbone.py [--device cpu|cuda]`. Writes
reports/bench/snli_backbone.md.

A DistilBERT-base-sized model (DistilBertConfig() defaults, random weights: the cost does not depend
on the values) runs the joint pairs of one batch under no_grad; each head (paper size) runs forward
+ backward + AdamW on its features. A feature cache would instead read tokens × 768 values per pair
from disk each epoch; its size is computed for SNLI's train split.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from grassflow.runtime import configure_torch, device_name
from grassflow.snli.config import HeadConfig
from grassflow.snli.model import SNLIClassifier

SNLI_TRAIN_PAIRS = 549_367  # stanfordnlp/snli train, gold labels only
MEAN_JOINT_TOKENS = 27  # [CLS] premise [SEP] hypothesis [SEP] with BERT word pieces (~14 + ~8 + 3)


def timed(fn, device, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    from transformers import DistilBertConfig, DistilBertModel

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=40, help="padded joint length of a batch")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="reports/bench/snli_backbone.md")
    a = ap.parse_args()
    configure_torch()
    device = torch.device(a.device)
    backbone = DistilBertModel(DistilBertConfig()).to(device).eval().requires_grad_(False)
    ids = torch.randint(1000, 30000, (a.batch, a.tokens), device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        feats = backbone(input_ids=ids, attention_mask=mask).last_hidden_state

    def run_backbone():
        with torch.no_grad():
            backbone(input_ids=ids, attention_mask=mask)

    t_backbone = timed(run_backbone, device, a.reps)
    rows = []
    for kind in ("transformer", "grassmann"):
        head = (
            SNLIClassifier(kind, HeadConfig(), backbone=torch.nn.Identity(), feat_dim=768)
            .to(device)
            .train()
        )
        head.token_features = lambda i, m: feats
        opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
        batch = {"ids": ids, "mask": mask.bool()}
        labels = torch.randint(0, 3, (a.batch,), device=device)

        def step(head=head, opt=opt, batch=batch, labels=labels):
            loss = torch.nn.functional.cross_entropy(head(batch), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()

        rows.append((kind, timed(step, device, a.reps)))
    body = sum(p.numel() for n, p in backbone.named_parameters() if "embeddings" not in n)
    pflop = 2 * body * SNLI_TRAIN_PAIRS * MEAN_JOINT_TOKENS / 1e15
    gb_fp16 = SNLI_TRAIN_PAIRS * MEAN_JOINT_TOKENS * 768 * 2 / 1e9
    gb_padded = SNLI_TRAIN_PAIRS * 2 * 48 * 768 * 2 / 1e9
    lines = [
        f"# SNLI: frozen backbone on the fly vs a feature cache — {device_name(device)}",
        "",
        f"Batch {a.batch} joint pairs of {a.tokens} tokens; median of {a.reps}; DistilBERT-base "
        f"size ({sum(p.numel() for p in backbone.parameters()) / 1e6:.1f}M parameters).",
        "",
        "| step part | ms | backbone share of the step |",
        "|---|---|---|",
        f"| backbone forward (no_grad) | {1000 * t_backbone:.1f} | |",
    ]
    for kind, t in rows:
        lines.append(
            f"| {kind} head forward + backward + AdamW | {1000 * t:.1f} | "
            f"{100 * t_backbone / (t_backbone + t):.0f} % |"
        )
    lines += [
        "",
        f"A cache of the train split's token features would hold {gb_fp16:.0f} GB in fp16 "
        f"(unpadded joint pairs, ~{MEAN_JOINT_TOKENS} tokens each) or {gb_padded:.0f} GB "
        "(premise and hypothesis padded to 48 each), read once per epoch.",
        "",
        f"Estimate for a GPU (arithmetic, not measured): one epoch of backbone forwards is "
        f"2 × {body / 1e6:.1f}M non-embedding parameters × "
        f"{SNLI_TRAIN_PAIRS * MEAN_JOINT_TOKENS / 1e6:.1f}M "
        f"tokens = {pflop:.2f} PFLOP, {pflop * 1e3 / 200:.0f} s at 200 TFLOP/s (bf16); reading the "
        f"fp16 cache once is {gb_fp16 / 2:.0f} s at 2 GB/s.",
    ]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
