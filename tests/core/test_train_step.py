"""The training step's speed work, held on the CPU: no host sync per step, divergence still found at
its exact step, fused AdamW's tensor LR, the LM head op, torch.compile without graph breaks or
recompiles (the Plücker op as custom ops, every backend, the CuPy stand-in's included), checkpoints
across compile settings, and what a CUDA graph capture demands of the cupy backend (rehearsed by the
stand-in). Compiled tests are few and tiny: compiling costs."""

from __future__ import annotations

import json
import math
import os
import re
import signal

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from grassflow.bench import count_launches
from grassflow.checkpoint import load_weights
from grassflow.lm.train import LanguageModelObjective, train
from grassflow.loop import fit, make_optimizer, set_lr, tensor_lr
from grassflow.ops.linear_ce import linear_cross_entropy
from grassflow.ops.plucker import plucker_mix
from grassflow.ops.plucker.function import _has_offsets
from grassflow.ops.plucker.kernel_stages import KernelStages
from grassflow.train_config import TrainConfig
from helpers import fake_cupy
from helpers.host_syncs import HostSyncs
from helpers.margins import close, rel_err, within
from helpers.procs import import_or_skip
from helpers.specs import LM_SPEC
from helpers.steps import CPU, Toy, bf16_head_case, lm_task, tiny_lm, toy_spec, with_grads


# --- the loop -------------------------------------------------------------------------------------
def _syncs_of_lm_runs(tokens, tmp_path, steps=(3, 9), log_every=100, trackers=()) -> list[int]:
    counts = []
    for n in steps:
        spec = {
            **LM_SPEC,
            "train": {
                **LM_SPEC["train"],
                "epochs": 1,
                "max_steps_per_epoch": n,
                "checkpoint_every": 0,
                "log_every": log_every,
            },
        }
        out = tmp_path / f"{n}-{'-'.join(trackers)}"
        with HostSyncs() as syncs:
            train(
                spec,
                tokens / "train.parquet",
                tokens / "validation.parquet",
                out,
                execution={"trackers": list(trackers)},
            )
        counts.append(syncs.n)
    return counts


def test_training_steps_take_no_host_sync(tokens, tmp_path):
    """The syncs of a run do not grow with its steps: none per step, only the periodic read."""
    counts = _syncs_of_lm_runs(tokens, tmp_path)
    assert counts[0] == counts[1] > 0  # > 0: the epoch-end read is seen


def test_trackers_add_no_host_sync(tokens, tmp_path, monkeypatch):
    """train.trackers log what the periodic read has already read: with TensorBoard and W&B on, a
    run logging every 2 steps takes exactly the syncs it takes without them."""
    import_or_skip("tensorboard")
    import_or_skip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline: the default
    plain = _syncs_of_lm_runs(tokens, tmp_path, log_every=2)
    assert (
        _syncs_of_lm_runs(tokens, tmp_path, log_every=2, trackers=("tensorboard", "wandb")) == plain
    )
    assert plain[1] - plain[0] == 3  # the premise: the reads at steps 4, 6, 8 were seen


def test_a_per_step_read_would_be_caught(tokens, tmp_path, monkeypatch):
    """The premise of the test above: a `.tolist()` per step (what the periodic read uses, and
    invisible to ATen's sync ops on the CPU) makes the count grow with the steps."""
    loss = LanguageModelObjective.loss

    def reading(self, model, batch):
        out = loss(self, model, batch)
        out.detach().tolist()
        return out

    monkeypatch.setattr(LanguageModelObjective, "loss", reading)
    counts = _syncs_of_lm_runs(tokens, tmp_path)
    assert counts[1] - counts[0] == 6


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.item(),
        lambda t: t.tolist(),
        lambda t: t.numpy(),
        lambda t: t.cpu(),
        lambda t: bool(t),
        lambda t: 1 if t else 0,
        lambda t: float(t),
        lambda t: int(t),
        lambda t: [0, 1, 2][t.long()],
        lambda t: np.asarray(t),
        lambda t: f"{t:.3f}",
        lambda t: torch.ones(1)[0].item() + t.sum().item(),
    ],
    ids=[
        "item",
        "tolist",
        "numpy",
        "cpu",
        "bool",
        "if",
        "float",
        "int",
        "index",
        "asarray",
        "format",
        "aten-item",
    ],
)
def test_the_detector_catches_every_host_read(read):
    t = torch.tensor(1.0)
    with HostSyncs() as syncs:
        read(t)
    assert syncs.n >= 1, syncs.seen
    with HostSyncs() as syncs:  # and device-side work alone is not a read
        (t * 2 + 1).sum().sqrt()
    assert syncs.n == 0, syncs.seen


def test_divergence_is_found_at_its_exact_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    status, metrics, _ = fit(
        model, Toy(nan_at=(1, 5)), toy_spec(log_every=4), tmp_path, CPU, header={}
    )
    assert status["state"] == "diverged"
    # epoch 2, its 6th step (index 5), seen by the check after step 8
    assert (status["epoch"], status["step"], status["detected_at_step"]) == (2, 5, 8)
    assert len(metrics) == 1 and math.isfinite(status["last_finite_loss"])
    best = json.loads((tmp_path / "config.json").read_text())
    assert best["epoch"] == 1 and all(
        torch.isfinite(v).all() for v in load_weights(tmp_path / "model.safetensors").values()
    )


def test_last_finite_loss_is_the_mean_before_the_bad_step(tmp_path):
    seen = []

    class Recording(Toy):
        def loss(self, model, batch):
            loss = super().loss(model, batch)
            seen.append(loss.item())
            return loss

    torch.manual_seed(0)
    status, _, _ = fit(
        torch.nn.Linear(3, 1),
        Recording(nan_at=(0, 3)),
        toy_spec(log_every=5),
        tmp_path,
        CPU,
        header={},
    )
    assert (status["epoch"], status["step"], status["detected_at_step"]) == (1, 3, 5)
    assert status["last_finite_loss"] == sum(seen[:3]) / 3


def test_fused_adamw_lr_is_a_tensor_set_in_place_and_survives_a_checkpoint():
    model = torch.nn.Linear(3, 2)
    opt, impl = make_optimizer(
        model, TrainConfig(epochs=1, batch_size=1, lr=1e-3, weight_decay=0.1), CPU
    )
    assert impl == "fused" and opt.defaults["fused"]
    lr = opt.param_groups[0]["lr"]
    set_lr(opt, 5e-4)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(5e-4)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    again, _ = make_optimizer(
        model, TrainConfig(epochs=1, batch_size=1, lr=1.0, weight_decay=0.1), CPU
    )
    again.load_state_dict(saved)
    tensor_lr(again, CPU)
    assert all(
        isinstance(g["lr"], torch.Tensor) and g["lr"].item() == pytest.approx(5e-4)
        for g in again.param_groups
    )


# --- the LM head op -------------------------------------------------------------------------------
@pytest.mark.parametrize("N, V, chunk_floats", [(37, 53, 200), (5, 11, 10**6), (64, 30, 30)])
def test_linear_cross_entropy_chunked_matches_reference(N, V, chunk_floats, gen, monkeypatch):
    import grassflow.ops.linear_ce as lce

    monkeypatch.setattr(lce, "BUFFER_FLOATS", chunk_floats)  # several chunks, a ragged last one
    h = (torch.randn(N, 8, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    W = torch.randn(V, 8, generator=gen, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, V, (N,), generator=gen)
    out = {}
    for backend in ("reference", "chunked"):
        loss = linear_cross_entropy(h.float(), W.float(), y, backend=backend)
        out[backend] = (loss, *torch.autograd.grad(loss * 1.7, (h, W)))
    for what, a, b in zip(("loss", "dh", "dW"), out["chunked"], out["reference"]):
        close(a, b, 1e-5, what)  # fp32 on both sides, summed in another order


@pytest.mark.parametrize("N, V, chunk_floats", [(37, 53, 200), (64, 300, 2000), (5, 11, 10**6)])
def test_linear_cross_entropy_bf16_chunks_equal_the_reference_within_bf16(
    N, V, chunk_floats, gen, monkeypatch
):
    """The head on CUDA: GEMMs in bf16, softmax per chunk in fp32. Loss and both gradients within
    bf16's rounding of the exact (fp64) ones, as CUDA's autocast reference is; fp32 outputs."""
    import grassflow.ops.linear_ce as lce

    monkeypatch.setattr(lce, "BUFFER_FLOATS", chunk_floats)
    hf, Wf, y, want, ref = bf16_head_case(gen, N, V, 2)
    got = with_grads(linear_cross_entropy(hf, Wf, y, backend="chunked-bf16"), (hf, Wf))
    for what, a, b, r in zip(("loss", "dh", "dW"), got, want, ref):
        assert a.dtype == torch.float32
        # bf16's rounding, or twice the autocast reference's own error where a draw makes that
        # larger
        close(a.double(), b, max(3e-2, 2 * rel_err(r, b)), what)


def test_linear_cross_entropy_is_finite_on_untrained_logits(gen):
    """Logits tens of units apart (an untrained model with N(0, 1) embeddings): softmax terms
    underflow, the loss must not (the chunked op takes ATen's (log_)softmax, never -log p)."""
    h, W = torch.randn(16, 64, generator=gen) * 4, torch.randn(100, 64, generator=gen) * 4
    y = torch.randint(0, 100, (16,), generator=gen)
    got = linear_cross_entropy(h, W, y, backend="chunked")
    assert torch.isfinite(got) and torch.allclose(got, F.cross_entropy(h @ W.t(), y), rtol=1e-5)


# --- torch.compile --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, switches",
    [
        ("transformer", {"norm": "post"}),
        ("transformer", {"norm": "pre"}),
        ("grassmann", {"norm": "post"}),
        ("grassmann", {"norm": "pre", "plucker_backend": "fused-cpu"}),
        ("grassmann", {"plucker_backend": "kernel-cpu", "lag_schedule": "per_layer"}),
        ("transformer", {"attention_window": 3, "ffn": False}),
        ("grassmann", {"ffn": False, "lags": (1, 2)}),
    ],
    ids=[
        "T-post",
        "T-pre",
        "G-post",
        "G-pre-fused",
        "G-kernel-per-layer",
        "recall-window",
        "recall-G-noffn",
    ],
)
def test_lm_and_recall_losses_trace_without_graph_breaks(kind, switches):
    model = tiny_lm(kind, **switches)
    task = lm_task(model)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda b: task.loss(model, b))(task.batch(0, 0))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.mark.parametrize(
    "features",
    [{"kind": "scratch", "embed_dim": 16}, {"kind": "backbone"}],
    ids=["scratch", "backbone"],
)
@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
def test_snli_heads_trace_without_graph_breaks(kind, features, snli_tokens):
    from grassflow.run_spec import RunSpec
    from grassflow.snli.data import read_token_pairs
    from grassflow.snli.train import SNLIObjective, build_classifier
    from helpers.specs import snli_spec

    spec = snli_spec(features, kind=kind, head={"dropout": 0.0})  # backbone: a random DistilBERT
    train, meta = read_token_pairs(snli_tokens / "train.parquet")
    torch.manual_seed(0)
    model, _ = build_classifier(RunSpec.from_dict(spec), meta)
    task = SNLIObjective(train, train, meta, model.cfg.pair_input, 8, 0, 8, CPU, "t", static=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda b: task.loss(model, b))(task.batch(0, 0))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    # static: one shape, one graph
    assert task.batch(0, 0)["ids"].shape == task.batch(0, 1)["ids"].shape


def _loss_and_grads(model, loss_fn, batch):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind, backend", [("grassmann", "fused-cpu"), ("transformer", "auto")])
def test_compiled_loss_and_every_gradient_equal_eager(kind, backend):
    """Inductor on the CPU: the loss (forward, the Plücker custom op, the LM head op) and the
    gradient of every parameter, against eager, within fp32 tolerance."""
    model = tiny_lm(kind, plucker_backend=backend, norm="pre")
    task = lm_task(model)
    batch = task.batch(0, 0)
    eager = _loss_and_grads(model, lambda b: task.loss(model, b), batch)
    torch._dynamo.reset()
    compiled = _loss_and_grads(
        model, torch.compile(lambda b: task.loss(model, b), fullgraph=True, dynamic=False), batch
    )
    close(compiled[0], eager[0], 1e-5, "loss")
    for name, g in eager[
        1
    ].items():  # relative to each gradient's largest element, not 1e-6 absolute
        close(compiled[1][name], g, 1e-4, name)


def test_cupy_backend_runs_as_the_custom_op_under_compile(monkeypatch, gen):
    """The custom op resolves `cupy` inside (the stand-in: CPU tensors as CUDA ones) and its
    launches run under torch.compile; the result equals the eager fast path."""
    z = torch.randn(2, 11, 4, generator=gen, requires_grad=True)
    W = torch.randn(3, 6, generator=gen, requires_grad=True)
    want = torch.autograd.grad(plucker_mix(z, (1, 2, 4), W, backend="fast").square().sum(), (z, W))
    with fake_cupy.installed(monkeypatch) as state:
        torch._dynamo.reset()
        f = torch.compile(
            lambda z, W: plucker_mix(z, (1, 2, 4), W, backend="cupy").square().sum(), fullgraph=True
        )
        got = torch.autograd.grad(f(z, W), (z, W))
        assert state.launches and {s for *_, s in state.launches} == {fake_cupy.STREAM}
    for what, a, b in zip(("dz", "dW"), got, want):
        close(a, b, 1e-5, what)


def _compiled_frames() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compiled_training_never_recompiles_and_resumes_across_compile_settings(
    tokens, tmp_path, monkeypatch
):
    """A compiled run compiles once (training loss, validation forward), never again across steps
    and epochs; a run stopped under compile resumes eagerly, and the other way round, to the metrics
    of an uninterrupted run (fp32 tolerance: compiled kernels sum in another order)."""
    # no dropout: compiled code draws its dropout masks from another random stream than eager
    spec = {
        **LM_SPEC,
        "model": {**LM_SPEC["model"], "dropout": 0.0},
        "train": {**LM_SPEC["train"], "epochs": 3, "checkpoint_every": 0},
    }
    paths = (tokens / "train.parquet", tokens / "validation.parquet")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    full = train(spec, *paths, tmp_path / "full", execution={"compile": True})
    graphs = _compiled_frames()
    # the scale of a legitimate difference: the same run eager, uninterrupted; a resumed run may
    # differ from the compiled one by no more than (twice) that
    train(spec, *paths, tmp_path / "eager", execution={"compile": False})
    assert full["compile"] == {
        "setting": True,
        "enabled": True,
        "mode": "default",
        "cuda_graph": False,
    }
    uninterrupted = [
        json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(uninterrupted) == 3
    eager = [json.loads(x) for x in (tmp_path / "eager" / "metrics.jsonl").read_text().splitlines()]
    drift = max(abs(e["val_loss"] / u["val_loss"] - 1) for e, u in zip(eager, uninterrupted))
    assert 2 <= graphs <= 3  # the loss; the validation forward (and its last, smaller batch)

    import grassflow.loop as loop

    for first, then in ((True, False), (False, True)):
        out = tmp_path / f"{first}-{then}"
        # a step into epoch 2
        stop_in_epoch_two = _stop_at_call(_steps_per_epoch(tokens, spec) + 2, loop.lr_at)
        real = loop.lr_at
        monkeypatch.setattr(loop, "lr_at", stop_in_epoch_two)
        with pytest.raises(SystemExit) as stopped:
            train(spec, *paths, out, execution={"compile": first})
        assert stopped.value.code == 75
        monkeypatch.setattr(loop, "lr_at", real)
        rec = train(spec, *paths, out, execution={"compile": then})
        assert rec["compile"]["enabled"] is then and rec["status"] == {"state": "completed"}
        got = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert [m["epoch"] for m in got] == [1, 2, 3]
        for a, b in zip(got, uninterrupted):
            within(
                abs(a["val_loss"] / b["val_loss"] - 1),
                max(2 * drift, 1e-5),
                f"epoch {a['epoch']} val_loss",
            )
    torch._dynamo.reset()


def _stop_at_call(n: int, real):
    """lr_at that sends this process SIGTERM at its n-th call (one call per step, one per epoch's
    row)."""
    calls = [0]

    def lr_at(step, total, cfg):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(step, total, cfg)

    return lr_at


def _steps_per_epoch(tokens, spec) -> int:
    from grassflow.lm.data import read_tokens

    ids, _ = read_tokens(tokens / "train.parquet")
    return ((len(ids) - 1) // spec["model"]["context_len"]) // spec["train"]["batch_size"]


# --- CUDA graphs and kernel launches, through the CuPy stand-in -----------------------------------
def test_a_captured_step_launches_only_on_the_capture_stream_and_compiles_nothing(monkeypatch, gen):
    """torch.cuda.graph captures on a side stream: every launch must be on it (one on another stream
    would be missing from the graph), and nothing may be compiled or allocated by CuPy, nor any of
    the op's cached device tensors be made (a host-to-device copy) during capture."""
    model = tiny_lm("grassmann", plucker_backend="cupy")
    x = torch.randint(0, 40, (2, 12), generator=gen)
    caches = (KernelStages._int_tensor, KernelStages._pairs, _has_offsets)
    with fake_cupy.installed(monkeypatch) as state:
        model(x).square().mean().backward()  # warm-up, as before torch.cuda.graph
        misses = [c.cache_info().misses for c in caches]
        state.launches.clear()
        with fake_cupy.capturing():
            model(x).square().mean().backward()
        assert state.launches and {s for *_, s in state.launches} == {fake_cupy.CAPTURE}
        assert state.compiles == 1 and state.allocations == 0
        assert [c.cache_info().misses for c in caches] == misses
        with fake_cupy.capturing(), pytest.raises(RuntimeError, match="CaptureUnsupported"):
            __import__("cupy").empty((4,))


def test_kernel_launches_per_layer_and_step(monkeypatch, gen):
    """Two launches forward (coeff, wedge), three backward (wedge again for dW, wedge_bwd, lag_bwd)
    per Grassmann layer and step, counted at the stand-in and by the benchmark."""
    model = tiny_lm("grassmann", plucker_backend="cupy", n_layers=3)
    x = torch.randint(0, 40, (2, 12), generator=gen)
    with fake_cupy.installed(monkeypatch) as state:
        model(x).square().mean().backward()
        kernels = [
            re.fullmatch(r"(plucker_\w+?)_(?:r\d+_|upto\d+_)?(?:f32|f64|bf16)", name)[1]
            for name, *_ in state.launches
        ]
    assert len(kernels) == 3 * 5
    assert kernels.count("plucker_wedge") == 6 and kernels.count("plucker_lag_bwd") == 3
    counted = count_launches(CPU, r=4, d=16, T=12, B=2)
    assert sum(counted["grassmann"]["plucker_kernels"].values()) == 5
    assert counted["grassmann"]["aten_ops"] > counted["transformer"]["aten_ops"] > 0
