"""The GPU path, rehearsed on the CPU: the code a GPU runs, under CUDA's autocast rules
(tests/helpers/cuda_autocast.py) and the real CPU bf16 autocast, and the `cupy` backend end to end
through a CuPy stand-in that enforces CuPy's and torch's contracts (tests/helpers/fake_cupy.py).

Each of these would have failed the first GPU run: a bf16 gate beside fp32 activations in torch.lerp
(gated_mix), fp32 counts index-added into a bf16 tensor (windowed op), tensors that require grad
handed to cupy.asarray (cupy backend). What is left only to a GPU (pytest -m gpu, make gpu-check):
the real CUDA kernels' compile and speed, cuBLAS/cuDNN, and memory.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grassflow import runtime
from grassflow.bench import bench_step
from grassflow.lm.evaluate import chunked_nll, evaluate_run
from grassflow.lm.rolling import documents_split
from grassflow.lm.train import train
from grassflow.models import ModelConfig, build_model
from grassflow.models.grassmann import gated_mix
from grassflow.ops.plucker import kernel_abi, plucker_mix, plucker_mix_reference
from grassflow.ops.plucker.windowed import windowed_plucker_mix, windowed_plucker_mix_reference
from grassflow.preflight import PreflightError, preflight
from grassflow.snli.config import HeadConfig
from grassflow.snli.evaluate import evaluate_snli_run
from grassflow.snli.model import ScratchEmbedding, SNLIClassifier
from grassflow.snli.train import predict, train_snli
from helpers import fake_cupy
from helpers.cuda_autocast import POLICIES, CudaAutocast, Recorded
from helpers.margins import close
from helpers.specs import LM_SPEC, snli_spec

CPU = torch.device("cpu")
BF16 = torch.bfloat16


@pytest.fixture(params=sorted(POLICIES))
def policy(request, monkeypatch):
    """CPU steps run under CUDA's bf16 autocast rules, or under the real CPU bf16 autocast;
    afterwards the test fails unless the policy ran (Recorded.check)."""
    recorded = Recorded(POLICIES[request.param])
    monkeypatch.setitem(runtime.AUTOCAST, "cpu", recorded)
    yield recorded
    recorded.check()


@pytest.fixture
def cuda_rules(monkeypatch):
    recorded = Recorded(CudaAutocast)
    monkeypatch.setitem(runtime.AUTOCAST, "cpu", recorded)
    yield
    recorded.check()


@pytest.fixture
def standin(monkeypatch):
    with fake_cupy.installed(monkeypatch) as state:
        yield state


# --- the rehearsal itself is CUDA's policy ------------------------------------------------------
def test_cuda_rules_cast_as_aten_lists_them(gen):
    x = torch.randn(4, 8, generator=gen)
    lin = torch.nn.Linear(8, 8)
    with CudaAutocast():
        assert lin(x).dtype == BF16  # lower_precision_fp
        xb = x.to(BF16)
        assert F.layer_norm(xb, (8,)).dtype == torch.float32  # fp32
        # fp32_set_opt_dtype
        assert xb.cumsum(1).dtype == torch.float32 and xb.sum().dtype == torch.float32
        assert torch.softmax(xb, -1).dtype == torch.float32
        assert (xb * xb).dtype == BF16 and torch.sigmoid(xb).dtype == BF16  # unlisted: input dtype
        assert torch.cat([xb, x]).dtype == torch.float32  # promote
        assert x.double().sum().dtype == torch.float64  # float64 is never cast
        with pytest.raises(RuntimeError):  # lerp has no rule: mixed dtypes fail, as on CUDA
            torch.lerp(x, x, torch.sigmoid(lin(x)))
        with pytest.raises(RuntimeError):  # index_add_ is in place: no rule either
            torch.zeros(4, dtype=BF16).index_add_(0, torch.arange(4), xb.sum(1))


# --- models, heads and the windowed op under autocast --------------------------------------------
def _lm(kind, norm, backend="fast"):
    torch.manual_seed(0)
    return build_model(
        kind,
        ModelConfig(
            vocab_size=80,
            context_len=24,
            n_layers=2,
            d_model=32,
            d_ff=64,
            n_heads=4,
            r=6,
            lags=(1, 2, 4),
            norm=norm,
            dropout=0.0,
            plucker_backend=backend,
        ),
    )


def _step(model, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with runtime.autocast(CPU):
        loss = loss_fn()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    return loss.item()


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_lm_trains_and_evaluates_under_autocast(kind, norm, policy, gen):
    model = _lm(kind, norm)
    x = torch.randint(0, 80, (4, 25), generator=gen)
    _step(
        model,
        lambda: F.cross_entropy(model(x[:, :-1]).float().reshape(-1, 80), x[:, 1:].reshape(-1)),
    )
    nll, n = chunked_nll(model, np.asarray(torch.randint(0, 80, (200,), generator=gen)), 24, 4, CPU)
    assert n > 0 and math.isfinite(nll)


@pytest.mark.parametrize(
    "kind, switches",
    [
        ("transformer", {"attention_window": 3}),
        ("transformer", {"ffn": False}),
        ("grassmann", {"ffn": False}),
    ],
    ids=["window", "no-ffn-T", "no-ffn-G"],
)
def test_recall_switches_train_and_recall_under_autocast(kind, switches, policy, gen):
    """The recall task's model switches (the windowed attention's boolean mask beside bf16 q/k/v;
    blocks without an FFN) and its loss and accuracy at the answer positions, under both
    policies."""
    from grassflow.recall.data import IGNORE
    from grassflow.recall.train import predict

    torch.manual_seed(0)
    model = build_model(
        kind,
        ModelConfig(
            vocab_size=80,
            context_len=24,
            n_layers=2,
            d_model=32,
            d_ff=64,
            n_heads=4,
            r=6,
            lags=(1, 2, 4),
            dropout=0.0,
            **switches,
        ),
    )
    x = torch.randint(0, 80, (4, 24), generator=gen)
    y = torch.full((4, 24), IGNORE).index_fill_(1, torch.tensor([9, 15, 21]), 5)
    _step(
        model,
        lambda: F.cross_entropy(
            model(x).float().reshape(-1, 80), y.reshape(-1), ignore_index=IGNORE
        ),
    )
    hits, nll = predict(model, {"inputs": x.numpy(), "labels": y.numpy()}, 2, CPU)
    assert hits.shape == (12,) and math.isfinite(nll)


def test_gated_mix_takes_one_dtype(cuda_rules, gen):
    """The defect: under CUDA autocast the gate's linear is bf16, h (a LayerNorm's output) fp32."""
    gate = torch.nn.Linear(16, 8)
    h, g = torch.randn(2, 5, 8, generator=gen), torch.randn(2, 5, 8, generator=gen, dtype=BF16)
    with runtime.autocast(CPU):
        out = gated_mix(gate, F.layer_norm(h, (8,)), g)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "kind, pairs",
    [("transformer", "bidirectional"), ("grassmann", "bidirectional"), ("grassmann", "causal")],
)  # pairs: a Grassmann-head switch
def test_snli_heads_train_and_predict_under_autocast(kind, pairs, policy, gen):
    torch.manual_seed(0)
    cfg = HeadConfig(
        d_model=16,
        d_ff=32,
        n_heads=2,
        d_proj=8,
        mix_heads=2,
        dropout=0.0,
        pairs=pairs,
        plucker_backend="fast",
    )
    model = SNLIClassifier(kind, cfg, embedding=ScratchEmbedding(50, 12, 40, 0.0), feat_dim=12)
    ids = torch.randint(0, 50, (6, 21), generator=gen)
    mask = torch.arange(21)[None] < torch.tensor([21, 3, 9, 17, 1, 12])[:, None]
    label = torch.tensor([0, 1, 2, 0, 1, 2])
    _step(model, lambda: F.cross_entropy(model({"ids": ids, "mask": mask}).float(), label))
    data = {
        "premise": [[5, 6, 7]] * 3,
        "hypothesis": [[8, 9], [10], [11, 12, 13, 14]],
        "label": np.array([0, 1, 2]),
    }
    meta = {"cls_id": 1, "sep_id": 2, "pad_id": 0}
    pred, nll = predict(model, data, meta, "joint", 2, CPU)
    assert pred.shape == (3,) and math.isfinite(nll)


@pytest.mark.parametrize("pairs", ["bidirectional", "causal"])
def test_windowed_op_under_autocast(pairs, policy, gen):
    """z as the head makes it (a Linear's output: bf16 under autocast), against the fp64 loop."""
    lin = torch.nn.Linear(12, 6).double()
    h = torch.randn(3, 19, 12, generator=gen, dtype=torch.float64)
    W, b = (
        torch.randn(5, 15, generator=gen, dtype=torch.float64) / 4,
        torch.randn(5, generator=gen, dtype=torch.float64),
    )
    mask = torch.arange(19)[None] < torch.tensor([19, 10, 4])[:, None]
    ref = windowed_plucker_mix_reference(lin(h), mask, W, b, pairs=pairs)
    lin32, W32, b32 = lin.float(), W.float().requires_grad_(), b.float().requires_grad_()
    with runtime.autocast(CPU):
        g = windowed_plucker_mix(lin32(h.float()), mask, W32, b32, pairs=pairs, backend="fast")
    g.float().square().sum().backward()
    close(g, ref, 5e-2, "windowed op under autocast")
    assert torch.isfinite(W32.grad).all() and torch.isfinite(lin32.weight.grad).all()


@pytest.mark.parametrize("kind", ["transformer", "grassmann"])
@pytest.mark.parametrize("with_head", [True, False])
def test_bench_step_under_autocast(kind, with_head, policy):
    row = bench_step(
        CPU, kind, L=32, tokens=64, n_layers=1, vocab=100, with_head=with_head, backend="fast"
    )
    assert row["seconds"] > 0 and row["peak_mem_mb"] > 0


def test_training_loop_under_autocast_lm(policy, tokens, tmp_path):
    spec = {**LM_SPEC, "train": {**LM_SPEC["train"], "epochs": 1}}
    rec = train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    assert rec["status"] == {"state": "completed"} and math.isfinite(rec["best_val_ppl"])
    # and its evaluation job with the documents stage's files (lm-eval's word-level perplexity)
    docs = {s: tmp_path / "docs" / f"{s}.parquet" for s in ("validation", "test")}
    for split, path in docs.items():
        documents_split(
            {"name": "trained"}, tokens / f"raw_{split}.parquet", path, tokens / "tok.json"
        )
    ev = evaluate_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        tmp_path / "eval.json",
        val_docs=docs["validation"],
        test_docs=docs["test"],
    )
    assert (
        math.isfinite(ev["test"]["harness"]["word_ppl"])
        and ev["test"]["harness"]["documents"] == 10
    )


def test_training_loop_under_autocast_snli(policy, snli_tokens, tmp_path):
    rec = train_snli(
        snli_spec({"kind": "backbone"}, epochs=1),
        snli_tokens / "train.parquet",
        snli_tokens / "validation.parquet",
        tmp_path,
    )
    assert rec["status"] == {"state": "completed"} and math.isfinite(rec["best_val_acc"])
    # and its evaluation job, as the pipeline runs it (arguments by name, as the CLI passes them)
    ev = evaluate_snli_run(
        weights=tmp_path / "model.safetensors",
        run_json=tmp_path / "run.json",
        val_tokens=snli_tokens / "validation.parquet",
        test_tokens=snli_tokens / "test.parquet",
        out=tmp_path / "eval.json",
    )
    assert (
        0 <= ev["test"]["accuracy"] <= 100
        and json.loads((tmp_path / "eval.json").read_text()) == ev
    )


# --- the cupy backend through the CuPy stand-in ---------------------------------------------------
# r exact (4, 8, 16, 32) and bounded (5, 6, 17); T=1, T < max Δ, duplicate offsets
CASES = [
    (2, 37, 8, 5, (1, 2, 4, 8, 12, 16)),
    (1, 1, 6, 3, (1, 2)),
    (3, 5, 4, 7, (1, 1, 3)),
    (2, 9, 5, 2, (4, 40)),
    (1, 19, 16, 6, (1, 2, 4, 8, 12, 16)),
    (1, 23, 32, 4, (1, 2, 4, 8, 12, 16)),
    (2, 7, 17, 3, (1, 3)),
]


def _grads(backend, z, lags, W, b, dg):
    leaves = [x.detach().requires_grad_() for x in (z, W, b)]
    g = plucker_mix(leaves[0], lags, leaves[1], leaves[2], backend=backend)
    if not g.requires_grad:  # the reference where no offset is valid (T=1): zero, a constant
        return [g.detach(), *(torch.zeros_like(x) for x in leaves)]
    return [
        g.detach(),
        *torch.autograd.grad((g * dg.to(g.dtype)).sum(), leaves, materialize_grads=True),
    ]


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-5), (BF16, 3e-2)]
)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}T{c[1]}r{c[2]}")
def test_cupy_backend_matches_reference_through_the_standin(dtype, tol, case, standin, gen):
    B, T, r, d, lags = case
    z, W, b, dg = (
        torch.randn(*s, generator=gen, dtype=torch.float64)
        for s in ((B, T, r), (d, r * (r - 1) // 2), (d,), (B, T, d))
    )
    # the reference sees the inputs the backend sees
    z, W, b, dg = (x.to(dtype) for x in (z, W, b, dg))
    ref = [
        x.detach()
        for x in _grads("reference", z.double(), lags, W.double(), b.double(), dg.double())
    ]
    got = _grads("cupy", z, lags, W, b, dg)
    for name, x, y in zip(("g", "dz", "dW", "db"), got, ref):
        assert x.dtype == dtype
        close(x, y, tol, name)
    assert standin.compiles == 1  # once per device and process
    assert {s for *_, s in standin.launches} == {fake_cupy.STREAM}  # on torch's current stream
    suffix = {torch.float64: "f64", torch.float32: "f32", BF16: "bf16"}[dtype]
    variant = (
        f"r{r}" if r in (4, 8, 16, 32) else f"upto{next(b for b in (8, 16, 32, 64) if r <= b)}"
    )
    assert {n for n, *_ in standin.launches} == {
        f"plucker_{k}_{variant}_{suffix}" for k in ("coeff", "wedge_bwd", "lag_bwd")
    } | {f"plucker_wedge_{suffix}"}
    # a thread per (token, component) of r (per coordinate of the wedge): the grid fills the GPU
    want = {
        "coeff": B * T * r,
        "wedge": B * T * r * (r - 1) // 2,
        "wedge_bwd": B * T * r,
        "lag_bwd": B * T * r,
    }
    for name, grid, block, _ in standin.launches:
        stage = re.fullmatch(r"plucker_(\w+?)_(?:r\d+_|upto\d+_)?(?:f32|f64|bf16)", name)[1]
        assert grid == -(-want[stage] // block), (name, grid)


def test_cupy_backend_in_an_lm_training_step_under_cuda_rules(standin, cuda_rules, gen):
    """GrassmannLM with backend cupy: same loss and gradients as fast on the same weights, under
    CUDA's bf16 rules. Gradients, not weights after an optimizer step: AdamW's first step moves each
    weight by ±lr·sign(g), so two backends' weights differ by 0 or by ≥ 2·lr wherever a gradient is
    near zero, whatever their agreement (seed 970887284 once failed that way)."""
    x = torch.randint(0, 80, (4, 25), generator=gen)
    out = {}
    for backend in ("fast", "cupy"):
        model = _lm("grassmann", "post", backend)
        with runtime.autocast(CPU):
            loss = F.cross_entropy(model(x[:, :-1]).float().reshape(-1, 80), x[:, 1:].reshape(-1))
        loss.backward()
        out[backend] = (
            loss.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    assert standin.launches, "the cupy backend never launched"
    close(out["cupy"][0], out["fast"][0], 1e-2, "loss")
    assert out["cupy"][1].keys() == out["fast"][1].keys()
    for name, g in out["fast"][1].items():  # bf16 on both sides: relative to the largest element
        close(out["cupy"][1][name], g, 5e-2, name)


def test_run_json_records_the_backend_that_ran(standin, cuda_rules, tokens, tmp_path):
    spec = {
        **LM_SPEC,
        "model": {**LM_SPEC["model"], "plucker_backend": "auto"},
        "train": {**LM_SPEC["train"], "epochs": 1},
    }
    rec = train(spec, tokens / "train.parquet", tokens / "validation.parquet", tmp_path)
    assert rec["plucker_backend"] == "cupy" and rec["device_requested"] == "cpu"
    assert json.loads((tmp_path / "run.json").read_text())["plucker_backend"] == "cupy"


def test_snli_grassmann_head_runs_and_records_cupy(standin, cuda_rules, snli_tokens, tmp_path):
    # the SNLI jobs on a GPU: the head's windowed op through the cupy backend (the stand-in holds
    # CuPy's contracts) under CUDA's autocast rules, trained, recorded and evaluated
    spec = snli_spec({"kind": "backbone"}, head={"plucker_backend": "auto"}, epochs=1)
    rec = train_snli(
        spec, snli_tokens / "train.parquet", snli_tokens / "validation.parquet", tmp_path
    )
    assert standin.launches, "the cupy backend never launched"
    assert rec["status"] == {"state": "completed"} and rec["plucker_backend"] == "cupy"
    ev = evaluate_snli_run(
        tmp_path / "model.safetensors",
        tmp_path / "run.json",
        snli_tokens / "validation.parquet",
        snli_tokens / "test.parquet",
        tmp_path / "eval.json",
    )
    assert 0 <= ev["test"]["accuracy"] <= 100


def test_auto_falls_back_to_fast_once_when_nvrtc_is_missing(monkeypatch, capfd, gen):
    from grassflow.ops.plucker import resolve_backend

    with fake_cupy.installed(monkeypatch, nvrtc_missing=True):
        z, W = torch.randn(2, 9, 4, generator=gen), torch.randn(3, 6, generator=gen)
        assert resolve_backend("auto", z) == "fast"
        g = plucker_mix(z, (1, 2), W)  # auto: runs, on fast
        assert torch.allclose(g, plucker_mix_reference(z, (1, 2), W), atol=1e-5)
        err = capfd.readouterr().err
        assert err.count("warning: CuPy cannot compile") == 1 and "libnvrtc" in err
        with pytest.raises(
            RuntimeError, match="plucker_backend 'cupy': CuPy cannot compile.*libnvrtc"
        ):
            plucker_mix(z, (1, 2), W, backend="cupy")


def test_the_standin_holds_cupys_contracts(standin, gen):
    """What the backend relies on: a kernel looked up by its extern "C" name (no template names, no
    name_expressions), its CUfunction launched through the driver on torch's stream with CUDA's
    argument array; a CuPy allocation or a launch on another stream fails in a capture."""
    import cupy

    mod_code = (fake_cupy.kernels_dir() / "plucker.cu").read_text()
    mod = cupy.RawModule(code=mod_code, options=("-std=c++17",))
    with pytest.raises(fake_cupy.CUDADriverError, match="CUDA_ERROR_NOT_FOUND"):
        mod.get_function("plucker_coeff_body<4, true, float>")  # templates are not exported
    with pytest.raises(NotImplementedError):  # and name_expressions bypass CuPy's disk cache
        cupy.RawModule(
            code=mod_code, options=("-std=c++17",), name_expressions=["plucker_coeff<float>"]
        )
    with pytest.raises(RuntimeError, match="outside a Device context"):
        _ = mod.get_function("plucker_coeff_r4_f32").kernel
    with cupy.cuda.Device(0):
        f = mod.get_function("plucker_coeff_r4_f32").kernel.ptr
    z, c, lags = (
        torch.randn(2, 3, 4, generator=gen),
        torch.zeros(2, 3, 4),
        torch.ones(1, dtype=torch.int32),
    )
    args = (z, lags, np.int32(1), np.int64(6), np.int32(3), np.int32(4), np.float32(1e-6), c)
    packed, _keep = kernel_abi.pack(
        kernel_abi.signatures(fake_cupy.kernels_dir() / "plucker.cu")["plucker_coeff_r4_f32"],
        args,
        lambda t: t.data_ptr(),
    )
    launch = cupy.cuda.driver.launchKernel
    with pytest.raises(fake_cupy.CUDADriverError, match="INVALID_HANDLE"):
        launch(f + 99, 1, 1, 1, 256, 1, 1, 0, fake_cupy.STREAM, ctypes.addressof(packed), 0)
    with pytest.raises(RuntimeError, match="torch's current stream"):
        launch(f, 1, 1, 1, 256, 1, 1, 0, fake_cupy.STREAM + 1, ctypes.addressof(packed), 0)
    launch(f, 1, 1, 1, 256, 1, 1, 0, fake_cupy.STREAM, ctypes.addressof(packed), 0)
    # the kernel ran on the arguments as packed: position 1 pairs with position 0 at lag 1
    assert torch.allclose(
        c[:, 1],
        z[:, 0]
        / torch.linalg.norm(
            torch.stack(
                [
                    z[:, 1, i] * z[:, 0, j] - z[:, 1, j] * z[:, 0, i]
                    for i in range(4)
                    for j in range(i + 1, 4)
                ],
                -1,
            ),
            dim=-1,
            keepdim=True,
        ),
    )
    assert (c[:, 0] == 0).all()
    with fake_cupy.capturing():
        with pytest.raises(RuntimeError, match="missing from the graph"):
            launch(f, 1, 1, 1, 256, 1, 1, 0, fake_cupy.STREAM, ctypes.addressof(packed), 0)
        with pytest.raises(RuntimeError, match="CuPy's memory pool allocates during a capture"):
            cupy.empty((4,))


# --- preflight ------------------------------------------------------------------------------------
def test_preflight_gpu_branch_through_the_standin(standin, cuda_rules):
    rec = preflight(["cpu"], ["auto", "cupy", "fast"], snli=True)
    dev = rec["devices"][0]
    assert rec["ok"] and [b["resolved"] for b in dev["backends"]] == ["cupy", "cupy", "fast"]
    assert {"float32/dz", "bfloat16/dz"} <= set(dev["backends"][1]["rel_err"])
    assert "grassmann_lm[cupy]" in dev["steps"] and "snli_grassmann_head[cupy]" in dev["steps"]
    assert rec["versions"]["cupy"] == "14.0-standin" and rec["versions"]["nvrtc"] == "12.4"


def test_preflight_names_a_broken_cupy(monkeypatch, cuda_rules):
    with fake_cupy.installed(monkeypatch, nvrtc_missing=True):
        with pytest.raises(PreflightError, match="plucker_backend 'cupy'.*libnvrtc"):
            preflight(["cpu"], ["cupy"])
        rec = preflight(["cpu"], ["auto"])  # auto falls back, and says so in the record
        assert rec["devices"][0]["backends"][0]["resolved"] == "fast"
        assert rec["versions"]["nvrtc"].startswith("unavailable")


@pytest.mark.parametrize("cupy_cuda,torch_cuda", [(12, 13), (13, 12)])
def test_a_cupy_for_another_cuda_major_is_refused_naming_the_extra(
    monkeypatch, capfd, cuda_rules, gen, cupy_cuda, torch_cuda
):
    """cupy-cuda12x beside a CUDA 13 torch (and the reverse): an explicit `cupy` and the preflight
    stop naming the extra that matches torch; `auto` runs `fast` with one warning line, and the
    preflight's record says why."""
    from grassflow.ops.plucker import resolve_backend

    why = (
        rf"CuPy for CUDA {cupy_cuda}, torch for CUDA {torch_cuda}: pip uninstall "
        rf"cupy-cuda{cupy_cuda}x; "
        rf"pip install 'grassflow\[gpu-cuda{torch_cuda}\]'"
    )
    with fake_cupy.installed(monkeypatch, cupy_cuda=cupy_cuda, torch_cuda=torch_cuda):
        z, W = torch.randn(2, 9, 4, generator=gen), torch.randn(3, 6, generator=gen)
        with pytest.raises(
            RuntimeError,
            match="plucker_backend 'cupy': CuPy and torch are built for different "
            "CUDA majors: " + why,
        ):
            plucker_mix(z, (1, 2), W, backend="cupy")
        with pytest.raises(PreflightError, match=why):
            preflight(["cpu"], ["cupy"])
        assert resolve_backend("auto", z) == "fast"
        rec = preflight(["cpu"], ["auto"])
        backend = rec["devices"][0]["backends"][0]
        assert backend["resolved"] == "fast" and backend["fallback"].startswith(
            "CuPy and torch are built for different"
        )
        assert f"grassflow[gpu-cuda{torch_cuda}]" in backend["fallback"]
        err = capfd.readouterr().err
        assert err.count("warning: CuPy and torch are built for different CUDA majors") == 1
        assert f"grassflow[gpu-cuda{torch_cuda}]" in err
    # matched: cupy runs
    with fake_cupy.installed(monkeypatch, cupy_cuda=torch_cuda, torch_cuda=torch_cuda):
        assert resolve_backend("auto", torch.zeros(1)) == "cupy"


def test_preflight_command_on_a_cpu_node(tmp_path):
    out = tmp_path / "preflight.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow",
            "preflight",
            "--device",
            "cpu",
            "auto",
            "--backend",
            "auto",
            "fused-cpu",
            "--snli",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    rec = json.loads(out.read_text())
    assert [d["requested"] for d in rec["devices"]] == ["cpu", "auto"]
    assert (
        all(d["type"] == "cpu" for d in rec["devices"])
        and "train on the CPU" in rec["devices"][1]["note"]
    )
    assert "train.device=auto -> cpu" in res.stdout
    if not torch.cuda.is_available():
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "grassflow",
                "preflight",
                "--device",
                "cuda",
                "--out",
                str(tmp_path / "gpu.json"),
            ],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 1 and not (tmp_path / "gpu.json").exists()
        lines = res.stderr.strip().splitlines()
        assert (
            len(lines) == 1
            and lines[0].startswith("error: preflight:")
            and "no CUDA device" in lines[0]
        )


@pytest.mark.parametrize("backend", ["reference", "chunked", "chunked-bf16", "fused"])
def test_lm_head_loss_under_autocast(backend, policy, gen):
    """The LM task's loss (the head and its loss as one op): `reference` is what CUDA runs (auto),
    `chunked` the CPU's, `chunked-bf16` and `fused` CUDA's candidates; under either autocast the
    loss is fp32 and finite and the gradients reach the final LayerNorm's input and the (tied) head
    weight in their dtypes."""
    from grassflow.ops.linear_ce import linear_cross_entropy

    policy.expect_lowered = backend == "reference"  # chunked: one opaque op, its dtypes its own
    x = torch.randn(24, 16, generator=gen, requires_grad=True)
    W = torch.nn.Parameter(torch.randn(50, 16, generator=gen) * 0.1)
    y = torch.randint(0, 50, (24,), generator=gen)
    with runtime.autocast(CPU):
        h = F.layer_norm(x, (16,))
        loss = linear_cross_entropy(h, W, y, backend=backend)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert x.grad.dtype == torch.float32 and W.grad.dtype == torch.float32
    assert torch.isfinite(x.grad).all() and torch.isfinite(W.grad).all()


def test_fused_head_under_cuda_rules_through_cupys_contracts(standin, policy, gen):
    """The fused LM head as a CUDA job runs it: under CUDA's autocast rules (and the CPU's), its
    kernels compiled and launched through the CuPy stand-in on torch's stream (arguments checked
    against cross_entropy.cu's signatures, nothing allocated by CuPy); fp32 loss and gradients in
    their parameters' dtypes."""
    from grassflow.ops.linear_ce import linear_cross_entropy

    policy.expect_lowered = False  # one opaque op: its dtypes its own
    x = torch.randn(24, 16, generator=gen, requires_grad=True)
    W = torch.nn.Parameter(torch.randn(50, 16, generator=gen) * 0.1)
    y = torch.randint(0, 50, (24,), generator=gen)
    with runtime.autocast(CPU):
        loss = linear_cross_entropy(F.layer_norm(x, (16,)), W, y, backend="fused")
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert (
        x.grad.dtype == torch.float32
        and W.grad.dtype == torch.float32
        and torch.isfinite(W.grad).all()
    )
    launches = [(name, stream) for name, _, _, stream in standin.launches]
    assert [n for n, _ in launches] == ["ce_partial_bf16", "ce_finish_bf16", "ce_grad_bf16"]
    assert {s for _, s in launches} == {fake_cupy.STREAM} and standin.allocations == 0


def test_compiled_cupy_op_under_bf16_autocast(standin):
    """The compiled path of the GPU: the Plücker custom op (its `cupy` backend through the stand-in,
    bf16 handed to CuPy as int16) inside a torch.compile'd LM loss under bf16 autocast (the real CPU
    one: Dynamo does not trace the CUDA-rules TorchFunctionMode). Same loss as eager under the same
    autocast, finite gradients, every launch on torch's stream."""
    import torch._dynamo

    from helpers.steps import lm_task, tiny_lm

    model = tiny_lm("grassmann", plucker_backend="cupy")
    task = lm_task(model)
    batch = task.batch(0, 0)
    with torch.autocast("cpu", dtype=BF16):
        eager = task.loss(model, batch).detach()
    torch._dynamo.reset()
    compiled = torch.compile(lambda b: task.loss(model, b), fullgraph=True, dynamic=False)
    standin.launches.clear()
    with torch.autocast("cpu", dtype=BF16):
        loss = compiled(batch)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.allclose(loss.detach(), eager, rtol=1e-3)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert any(name.endswith("_bf16") for name, *_ in standin.launches)
    assert {s for *_, s in standin.launches} == {fake_cupy.STREAM}
