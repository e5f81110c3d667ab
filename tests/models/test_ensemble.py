"""A config's seeds trained as one ensemble (train.fuse_seeds; lm.train.train_fused): each member is
what its own run would be — initial weights bit for bit, its batches, its clipping, its divergence,
its best weights, its own run directory that evaluates, loads and exports alone."""

from __future__ import annotations

import json
import math

import pytest
import torch

import grassflow.loop as loop
from grassflow.checkpoint import load_weights
from grassflow.lm.evaluate import evaluate_run
from grassflow.lm.train import LanguageModelObjective, train, train_fused
from grassflow.models.ensemble import member_state, stack
from helpers.specs import LM_SPEC

SEEDS = (0, 1, 2)


def _specs(kind="grassmann", seeds=SEEDS, **train_keys):
    out = []
    for seed in seeds:
        spec = json.loads(json.dumps(LM_SPEC))
        spec.update(seed=seed, run_id=f"t-{kind}-s{seed}", model_kind=kind)
        spec["model"]["dropout"] = 0.0  # members equal separate runs exactly where no RNG is drawn
        spec["train"].update(
            {
                "epochs": 2,
                "max_steps_per_epoch": 7,
                "checkpoint_every": 0,
                "log_every": 3,
                **train_keys,
            }
        )
        out.append(spec)
    return out


def _fused(tokens, tmp_path, specs, name="fused"):
    dirs = [tmp_path / name / s["run_id"] for s in specs]
    recs = train_fused(
        specs,
        tokens / "train.parquet",
        tokens / "validation.parquet",
        dirs,
        tmp_path / name / "work",
    )
    return recs, dirs


def _separate(tokens, tmp_path, specs):
    dirs = [tmp_path / "separate" / s["run_id"] for s in specs]
    recs = [
        train(s, tokens / "train.parquet", tokens / "validation.parquet", d)
        for s, d in zip(specs, dirs)
    ]
    return recs, dirs


def _metrics(d):
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # trains 3 runs twice: CI's slow tier
@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_fused_seeds_equal_separate_runs(kind, tokens, tmp_path):
    """fp32, dropout 0, 14 steps: each member's losses, validation and best weights within 1e-6 of
    its own run's; each record names its group and index."""
    specs = _specs(kind)
    fused, fdirs = _fused(tokens, tmp_path, specs)
    sep, sdirs = _separate(tokens, tmp_path, specs)
    for e, (f, s, fd, sd) in enumerate(zip(fused, sep, fdirs, sdirs)):
        assert f["status"] == s["status"] == {"state": "completed"}
        assert (
            f["fused"]
            == {
                "runs": [x["run_id"] for x in specs],
                "work_dir": str(tmp_path / "fused" / "work"),
                "index": e,
            }
            and "fused" not in s
        )
        for a, b in zip(_metrics(fd), _metrics(sd), strict=True):
            for k in ("train_loss", "val_loss"):
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=0), (e, k)
        wf, ws = load_weights(fd / "model.safetensors"), load_weights(sd / "model.safetensors")
        assert wf.keys() == ws.keys()
        for k in wf:
            a, b = wf[k], ws[k]
            # the keys' bias: softmax is blind to it, its true gradient is
            if k.endswith("attn.qkv.bias"):
                # 0, and AdamW moves it by ±lr per step at the sign of rounding noise
                d = a.shape[0] // 3
                a, b = torch.cat([a[:d], a[2 * d :]]), torch.cat([b[:d], b[2 * d :]])
            assert (a - b).abs().max() <= 1e-6 * max(b.abs().max(), 1.0), (e, k)
    # the members trained apart from one another: three different models
    assert not torch.equal(
        *(load_weights(d / "model.safetensors")["tok_emb.weight"] for d in fdirs[:2])
    )


@pytest.mark.slow  # trains 3 runs twice: CI's slow tier
def test_initial_weights_are_each_runs_bit_for_bit(tokens, tmp_path):
    """At lr 0 (AdamW then moves nothing) the best weights are the initial ones: each member's equal
    its own run's bit for bit (built with its own seed, then stacked)."""
    specs = _specs(lr=0.0, epochs=1, max_steps_per_epoch=1)
    _, fdirs = _fused(tokens, tmp_path, specs)
    _, sdirs = _separate(tokens, tmp_path, specs)
    for fd, sd in zip(fdirs, sdirs):
        wf, ws = load_weights(fd / "model.safetensors"), load_weights(sd / "model.safetensors")
        assert all(torch.equal(wf[k], ws[k]) for k in ws)


def test_stacking_keeps_each_member_and_its_tied_head():
    from grassflow.models import ModelConfig, build_model

    cfg = ModelConfig(
        vocab_size=30, context_len=8, n_layers=1, d_model=16, d_ff=32, n_heads=2, r=4, lags=(1, 2)
    )
    members = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        members.append(build_model("grassmann", cfg))
    ens = stack(members)
    assert ens.ensemble_size == 3 and ens.head.weight is ens.tok_emb.weight
    for e, m in enumerate(members):
        assert all(torch.equal(v, m.state_dict()[k]) for k, v in member_state(ens, e).items())
    with pytest.raises(ValueError, match="at least 2 members"):
        stack(members[:1])


class _OnCuda(torch.Tensor):
    """CPU values that say they are on CUDA: the device check of layers.linear takes the GPU's
    branch."""

    @property
    def device(self):
        return torch.device("cuda")


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_gpus_batched_gemm_equals_a_gemm_per_member(with_bias, rows):
    """layers.linear on a GPU: one (b)addbmm over the members; on the CPU: a GEMM per member. The
    GPU's branch, taken on CPU values, gives each member's rows its own x Wᵀ + b, in value and in
    every gradient (x, weight, bias)."""
    from grassflow.models.layers import linear

    torch.manual_seed(0)
    E, d_in, d_out = 3, 7, 5
    x = torch.randn(E * rows, 4, d_in, requires_grad=True)
    w = torch.randn(E, d_out, d_in, requires_grad=True)
    b = torch.randn(E, d_out, requires_grad=True) if with_bias else None
    g = torch.randn(E * rows, 4, d_out)
    leaves = [x, w] + ([b] if with_bias else [])
    cpu = linear(x, w, b)
    cpu_grads = torch.autograd.grad(cpu, leaves, g)
    gpu = linear(
        x.as_subclass(_OnCuda),
        w.as_subclass(_OnCuda),
        b.as_subclass(_OnCuda) if with_bias else None,
    )
    assert type(gpu) is _OnCuda  # the branch taken was the GPU's
    gpu_grads = torch.autograd.grad(gpu, leaves, g)
    by_hand = torch.stack(
        [x[e * rows : (e + 1) * rows] @ w[e].t() + (b[e] if with_bias else 0) for e in range(E)]
    )
    assert torch.allclose(gpu.as_subclass(torch.Tensor), by_hand.reshape(gpu.shape), atol=1e-5)
    assert torch.allclose(cpu, by_hand.reshape(cpu.shape), atol=1e-5)
    for a, c in zip(gpu_grads, cpu_grads):
        assert torch.allclose(a.as_subclass(torch.Tensor), c, atol=1e-5)


def _poison(monkeypatch, seed, epoch, step):
    """The loss of the run with `seed` becomes NaN at (epoch, step), fused or not."""
    batch, loss = LanguageModelObjective.batch, LanguageModelObjective.loss

    def batch_at(self, e, s):
        self.at = (e, s)
        return batch(self, e, s)

    def poisoned(self, model, b):
        out = loss(self, model, b)
        if self.at != (epoch, step):
            return out
        seeds = [o.seed for o in self.orders]
        scale = torch.tensor([math.nan if s == seed else 1.0 for s in seeds])
        return out * (scale if self.members else scale[0])

    monkeypatch.setattr(LanguageModelObjective, "batch", batch_at)
    monkeypatch.setattr(LanguageModelObjective, "loss", poisoned)


@pytest.mark.slow  # trains 3 runs twice: CI's slow tier
def test_a_diverging_member_stops_alone_with_its_runs_record(tokens, tmp_path, monkeypatch):
    """Member s1's loss turns NaN at epoch 2, step 4: it records the divergence its own run records
    (found at the next periodic read, step 6) and keeps its epoch-1 weights; s0 and s2 train on,
    equal to their own runs."""
    _poison(monkeypatch, seed=1, epoch=1, step=4)
    specs = _specs()
    fused, fdirs = _fused(tokens, tmp_path, specs)
    sep, sdirs = _separate(tokens, tmp_path, specs)
    assert sep[1]["status"]["state"] == "diverged" and sep[0]["status"] == {"state": "completed"}
    for e in range(3):
        fs, ss = dict(fused[e]["status"]), dict(sep[e]["status"])
        if "last_finite_loss" in ss:
            assert fs.pop("last_finite_loss") == pytest.approx(ss.pop("last_finite_loss"), rel=1e-6)
        assert fs == ss, e
        assert [m["epoch"] for m in _metrics(fdirs[e])] == [m["epoch"] for m in _metrics(sdirs[e])]
        assert fused[e]["best_epoch"] == sep[e]["best_epoch"]
    assert fused[1]["status"] == {
        **sep[1]["status"],
        "last_finite_loss": fused[1]["status"]["last_finite_loss"],
    }
    assert fused[1]["status"]["step"] == 4 and fused[1]["status"]["detected_at_step"] == 6


class _StopAt:
    """A StopRequest whose signal arrives once the loop has asked `after` times."""

    def __init__(self, after):
        self.after, self.asked = after, 0

    def __call__(self, signum, frame):
        pass

    @property
    def signal(self):
        self.asked += 1
        return "SIGTERM" if self.asked > self.after else None


@pytest.mark.slow  # trains 3 runs twice: CI's slow tier
def test_a_fused_group_resumes_mid_epoch_as_if_uninterrupted(tokens, tmp_path, monkeypatch):
    specs = _specs()
    _, full = _fused(tokens, tmp_path, specs, "full")
    monkeypatch.setattr(loop, "StopRequest", lambda: _StopAt(10))  # epoch 2, step 3
    with pytest.raises(SystemExit) as stopped:
        _fused(tokens, tmp_path, specs, "cut")
    assert stopped.value.code == 75 and (tmp_path / "cut" / "work" / "last.pt").exists()
    assert not (tmp_path / "cut" / specs[0]["run_id"] / "run.json").exists()
    monkeypatch.undo()
    _, cut = _fused(tokens, tmp_path, specs, "cut")
    for a, b in zip(full, cut):
        assert _metrics(a) == [
            {
                **m,
                "seconds": _metrics(a)[i]["seconds"],
                "tokens_per_s": _metrics(a)[i]["tokens_per_s"],
            }
            for i, m in enumerate(_metrics(b))
        ]
        wa, wb = load_weights(a / "model.safetensors"), load_weights(b / "model.safetensors")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_each_fused_run_directory_evaluates_loads_and_exports_alone(tokens, tmp_path):
    from grassflow.export import export_run
    from grassflow.pretrained import load_model

    recs, dirs = _fused(tokens, tmp_path, _specs(epochs=1))
    for rec, d in zip(recs, dirs):
        ev = evaluate_run(
            d / "model.safetensors",
            d / "run.json",
            tokens / "validation.parquet",
            tokens / "test.parquet",
            d / "eval.json",
        )
        assert ev["run_id"] == rec["run_id"] and ev["validation"]["chunked_ppl"] > 1
        assert ev["validation"]["chunked_ppl"] == pytest.approx(rec["best_val_ppl"], rel=1e-5)
        model = load_model(d)
        assert model.tok_emb.weight.dim() == 2 and not hasattr(model, "ensemble_size")
        out = export_run(d, tmp_path / "export" / rec["run_id"], tokenizer=tokens / "tok.json")
        assert (out / "model.safetensors").exists() and (out / "config.json").exists()
