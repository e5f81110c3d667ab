"""Preflight: check the software stack of the machine the training jobs will run on, in seconds,
before two dozen of them fail one by one.

`python -m grassflow.preflight --device auto --backend auto --out preflight.json` checks, per device
asked for (the preset's train.device values):
  device    it is visible (train.device: cuda without a CUDA device fails; auto on a CPU-only
            node passes and says the jobs will train on the CPU)
  backend   each Plücker op backend the preset uses resolves there (what `auto` becomes),
            compiles, and matches the reference loop, output and every gradient, in fp32 and
            (where the backend takes it) bf16
  step      one AdamW step of each model (both LMs; both SNLI heads when the preset has SNLI)
            under the autocast the jobs use (bf16 on CUDA) gives a finite loss and gradients
and writes what it found (device, torch/CUDA/cuDNN/CuPy/NVRTC versions, backends) to a small JSON
that the training jobs keep in their run.json. On failure: one `error:` line, exit 1, no JSON. It
checks the software, not every node: a job on a node of another kind still says in its own log line
which device it got.
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

from grassflow import job
from grassflow.errors import PreflightError  # raised here, one `error:` line (grassflow.job)
from grassflow.io import write_json
from grassflow.models import ModelConfig, build_model
from grassflow.ops.plucker import cupy_backend, plucker_mix, plucker_mix_reference, resolve_backend
from grassflow.provenance import machine, package_versions
from grassflow.runtime import autocast, claim_device, configure_torch, device_name

LAGS = (1, 2, 4, 8, 12, 16)
# relative error of a backend against the float64 reference, per input dtype
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
BF16_BACKENDS = ("fast", "cupy", "kernel-cpu")  # fused-cpu: float32/float64 only


def versions() -> dict:
    out = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    try:
        import cupy

        out["cupy"] = cupy.__version__
        try:
            out["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
            out["nvrtc"] = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
        except Exception as e:  # a driver-only node: NVRTC missing is exactly what to report
            out["nvrtc"] = f"unavailable ({type(e).__name__}: {e})"
    except Exception:
        out["cupy"] = None
    return out


def _rel_err(x, y) -> float:
    return ((x.double() - y.double()).abs().max() / y.double().abs().max().clamp_min(1e-300)).item()


def check_backend(backend: str, device: torch.device) -> dict:
    """Resolve `backend` on `device`, then compare it with the reference: g, dz, dW, db."""
    try:
        resolved = resolve_backend(backend, device)
    except RuntimeError as e:
        raise PreflightError(f"plucker_backend {backend!r} on {device.type}: {e}") from None
    gen = torch.Generator().manual_seed(0)
    B, T, r, d = 2, 40, 32, 24
    z, W, b = (
        torch.randn(*s, generator=gen, dtype=torch.float64)
        for s in ((B, T, r), (d, r * (r - 1) // 2), (d,))
    )
    W, dg = W / 20, torch.randn(B, T, d, generator=gen, dtype=torch.float64)

    def grads(fn, dtype, dev):
        leaves = [x.to(dev, dtype).requires_grad_() for x in (z, W, b)]
        g = fn(*leaves)
        return [g.detach(), *torch.autograd.grad((g * dg.to(dev, g.dtype)).sum(), leaves)]

    ref = grads(lambda z_, W_, b_: plucker_mix_reference(z_, LAGS, W_, b_), torch.float64, "cpu")
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.bfloat16 and resolved not in BF16_BACKENDS:
            continue
        got = grads(
            lambda z_, W_, b_: plucker_mix(z_, LAGS, W_, b_, backend=resolved), dtype, device
        )
        for name, x, y in zip(("g", "dz", "dW", "db"), got, ref):
            err = _rel_err(x.cpu(), y)
            errors[f"{str(dtype).removeprefix('torch.')}/{name}"] = err
            if not err < TOLERANCE[dtype]:
                raise PreflightError(
                    f"plucker_backend {resolved!r} on {device_name(device)}: {name} in {dtype} "
                    f"differs from the reference by {err:.3g} (tolerance {TOLERANCE[dtype]})"
                )
    # why `auto` did not become cupy on a CUDA device (another CUDA major, no NVRTC): the record
    # says it
    fallback = (
        cupy_backend.why_not(device)
        if backend == "auto" and cupy_backend.CUDA.is_cuda(device)
        else None
    )
    return {"requested": backend, "resolved": resolved, "rel_err": errors, "fallback": fallback}


def _lm_step(kind: str, backend: str, device) -> float:
    cfg = ModelConfig(
        vocab_size=96,
        context_len=24,
        n_layers=2,
        d_model=32,
        d_ff=64,
        n_heads=4,
        r=8,
        dropout=0.0,
        plucker_backend=backend,
    )
    model = build_model(kind, cfg).to(device)
    x = torch.randint(
        0, cfg.vocab_size, (4, cfg.context_len + 1), generator=torch.Generator().manual_seed(0)
    )
    x = x.to(device)

    def loss():
        logits = model(x[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))

    return _adamw_step(model, loss, device)


def _snli_step(kind: str, backend: str, device) -> float:
    from grassflow.snli.config import HeadConfig
    from grassflow.snli.model import ScratchEmbedding, SNLIClassifier

    cfg = HeadConfig(
        d_model=32, d_ff=64, n_heads=2, d_proj=16, mix_heads=2, dropout=0.0, plucker_backend=backend
    )
    model = SNLIClassifier(kind, cfg, embedding=ScratchEmbedding(64, 24, 40, 0.0), feat_dim=24).to(
        device
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (4, 19), generator=gen).to(device)
    mask = (torch.arange(19)[None] < torch.tensor([[19], [12], [7], [16]])).to(device)
    label = torch.tensor([0, 1, 2, 1], device=device)
    return _adamw_step(
        model, lambda: F.cross_entropy(model({"ids": ids, "mask": mask}).float(), label), device
    )


def _adamw_step(model, loss_fn, device) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with autocast(device):
        loss = loss_fn()
    loss.backward()
    finite = torch.isfinite(loss).item() and all(
        torch.isfinite(p.grad).all().item() for p in model.parameters() if p.grad is not None
    )
    opt.step()
    return loss.item() if finite else math.nan


def check_steps(device, backends: list[str], snli: bool) -> dict:
    """One step of each model under the jobs' autocast: {name: loss}; raise if not finite."""
    out = {"transformer_lm": _lm_step("transformer", "auto", device)}
    for b in backends:
        out[f"grassmann_lm[{b}]"] = _lm_step("grassmann", b, device)
    if snli:
        out["snli_transformer_head"] = _snli_step("transformer", "auto", device)
        for b in backends:
            out[f"snli_grassmann_head[{b}]"] = _snli_step("grassmann", b, device)
    bad = [k for k, v in out.items() if not math.isfinite(v)]
    if bad:
        raise PreflightError(
            f"one training step on {device_name(device)} gave a non-finite loss or "
            f"gradient for {', '.join(bad)}"
        )
    return out


def check_device(requested: str) -> tuple[torch.device, dict]:
    try:
        device = claim_device(requested)
    except RuntimeError as e:
        raise PreflightError(str(e)) from None
    info = {"requested": requested, "type": device.type, "name": device_name(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            count=torch.cuda.device_count(),
        )
    elif requested == "auto":
        info["note"] = "no CUDA device visible: train.device=auto jobs will train on the CPU"
    return device, info


def preflight(devices: list[str], backends: list[str], snli: bool = False) -> dict:
    """Run every check; return the record, or raise PreflightError naming the first failure."""
    configure_torch()
    t0 = time.time()
    record = {
        "ok": False,
        "versions": versions(),
        "machine": machine(),
        "packages": package_versions(),
        "devices": [],
    }
    for requested in dict.fromkeys(devices):
        device, info = check_device(requested)
        info["backends"] = [check_backend(b, device) for b in dict.fromkeys(backends)]
        resolved = list(dict.fromkeys(x["resolved"] for x in info["backends"]))
        info["steps"] = check_steps(device, resolved, snli)
        record["devices"].append(info)
    record.update(ok=True, seconds=time.time() - t0)
    return record


def check(devices, backends, snli, out) -> dict:
    try:
        record = preflight(devices, backends, snli)
    except PreflightError as e:
        raise PreflightError(f"preflight: {e}") from None
    write_json(out, record)
    for d in record["devices"]:
        used = ", ".join(f"{b['requested']} -> {b['resolved']}" for b in d["backends"])
        print(
            f"[preflight] train.device={d['requested']} -> {d['type']} ({d['name']}); plucker "
            f"backends: {used}; "
            f"{len(d['steps'])} training steps finite" + (f"; {d['note']}" if "note" in d else "")
        )
    return record


def main(argv=None, prog=None) -> int:
    from grassflow.models.config import PLUCKER_BACKENDS

    p = job.parser(__spec__.name, __doc__, prog)
    p.add_argument(
        "--device",
        nargs="+",
        default=["auto"],
        dest="devices",
        choices=("auto", "cpu", "cuda"),
        help="train.device value(s)",
    )
    p.add_argument(
        "--backend",
        nargs="+",
        default=["auto"],
        dest="backends",
        choices=PLUCKER_BACKENDS,
        help="the Plücker op backend(s) the jobs use",
    )
    p.add_argument("--snli", action="store_true", help="also step both SNLI heads")
    p.add_argument("--out", required=True, help="the JSON record the training jobs keep")
    a = p.parse_args(argv)
    return job.run(check, a.devices, a.backends, a.snli, a.out)


if __name__ == "__main__":
    sys.exit(main())
