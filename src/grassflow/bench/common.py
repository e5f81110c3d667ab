"""What every benchmark shares: timing, the training step as the loop takes it, the backends worth
timing on a device."""

from __future__ import annotations

import os
import shutil
import statistics
import time

import torch

from grassflow.compiled import Compiled
from grassflow.loop import make_optimizer
from grassflow.models import ModelConfig, build_model
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.ops.linear_ce import resolve as resolve_head_loss
from grassflow.ops.plucker import cupy_backend
from grassflow.runtime import autocast
from grassflow.train_config import TrainConfig

LAGS = (1, 2, 4, 8, 12, 16)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn, device, repeat=3, warmup=1, best=False) -> float:
    """Median (or, with best=True, minimum) wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times) if best else statistics.median(times)


class SavedBytes:
    """Bytes of the distinct storages saved for backward, parameters excluded: the CPU activation
    memory, all of which is alive at the end of the forward pass."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.saved, self.peak = {}, 0

    def end_step(self):
        self.peak = max(self.peak, sum(self.saved.values()))
        self.saved.clear()

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key not in self.params:
            self.saved[key] = t.untyped_storage().nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def grassmann_backends(device) -> list[str]:
    """The op backends worth timing here: `fast` everywhere, plus the device's fused path."""
    if device.type == "cuda":
        return ["fast"] + (["cupy"] if cupy_backend.usable(device) else [])
    return ["fast"] + (["fused-cpu"] if shutil.which(os.environ.get("CXX", "g++")) else [])


def training_step(
    device,
    kind,
    L,
    tokens,
    n_layers,
    vocab,
    with_head,
    backend="auto",
    *,
    compile=False,
    optimizer="train",
    head_loss="auto",
    dropout=0.0,
):
    """One training step as the training loop takes it, as a function: make_optimizer's AdamW
    (`train`: fused where the loop uses it; `default`: PyTorch's default form), the LM loss of the
    LM task (its head and loss as one op, ops.linear_ce, `head_loss` backend) or, without the head,
    a loss on the final-LN states; eager or compiled (grassflow.compiled). Returns (step, facts
    about it, the saved-bytes meter)."""
    torch.manual_seed(0)
    B = max(1, tokens // L)
    model = build_model(
        kind,
        ModelConfig(
            vocab_size=vocab,
            context_len=L,
            n_layers=n_layers,
            dropout=dropout,
            plucker_backend=backend,
        ),
    ).to(device)
    tcfg = TrainConfig(epochs=1, batch_size=1, lr=1e-4)
    if optimizer == "train":
        opt, opt_impl = make_optimizer(model, tcfg, device)
    else:
        opt, opt_impl = torch.optim.AdamW(model.parameters(), lr=1e-4), "default"
    x = torch.randint(0, vocab, (B, L + 1), device=device)
    meter = SavedBytes(model.parameters())

    class StepObjective:
        def loss(self, model, x):
            h = model.hidden(x[:, :-1])
            if not with_head:
                return h.float().square().mean()
            return linear_cross_entropy(
                h.reshape(B * L, -1), model.head.weight, x[:, 1:].reshape(-1), backend=head_loss
            )

    compiled = Compiled(model, StepObjective(), compile, "default", device)

    def step():
        with autocast(device), meter.hooks():
            loss = compiled.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        meter.end_step()

    facts = {
        "model": kind,
        "backend": backend if kind == "grassmann" else None,
        "L": L,
        "B": B,
        "head": with_head,
        "compile": compiled.enabled,
        "optimizer": opt_impl,
        "head_loss": resolve_head_loss(head_loss, device) if with_head else None,
    }
    return step, facts, meter


def bench_step(device, kind, L, tokens, n_layers, vocab, with_head, backend="auto", **kw) -> dict:
    """The time, tokens/s and peak memory of training_step (same arguments)."""
    step, facts, meter = training_step(
        device, kind, L, tokens, n_layers, vocab, with_head, backend, **kw
    )
    step()  # the first step compiles (if it does) and allocates AdamW's state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # best of 5: the 30,522-way head's ~0.5 GB of logits and gradients makes single steps on a
    # shared 2-core machine vary by ±20 %; the minimum is the stable estimate.
    t = timeit(step, device, repeat=5, best=True, warmup=0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else meter.peak
    return {
        **facts,
        "seconds": t,
        "tokens_per_s": facts["B"] * L / t,
        "peak_mem_mb": peak / 2**20,
        "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "saved_activations",
    }
