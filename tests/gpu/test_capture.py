"""The training step as CUDA captures it, rehearsed on the CPU (grassflow.train_step).

A CUDA graph replays the kernels of the step it captured, with the arguments and addresses they had
then. So the region a graph captures must, at every step, issue the same ops with the same
non-tensor arguments, read tensors made outside it at the same places, never read a value back to
the host, and allocate only through torch. The rehearsal records every op of the region (a
TorchDispatchMode) through the CuPy stand-in in capture mode (a launch off the capture stream, a
CuPy allocation or compile fails) and the host-sync detector, and compares two consecutive steps. It
catches what the loop did before the region existed: the learning rate set with a Python float
inside the step, the step number as a Python int in the loss bookkeeping, and a batch sliced from
the epoch's order at a moving offset.
"""

from __future__ import annotations

import functools
import math
from contextlib import ExitStack, contextmanager, nullcontext

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from grassflow import train_step as ts
from grassflow.lm.train import LanguageModelObjective
from grassflow.loop import fit, lr_at, make_optimizer, set_lr, tensor_lr
from grassflow.models import ModelConfig, build_model, layers
from grassflow.models.ensemble import stack
from grassflow.train_config import TrainConfig
from helpers import fake_cupy
from helpers.host_syncs import HostSyncs
from helpers.specs import LM_SPEC

CPU = torch.device("cpu")
# a spec's train section
TCFG_DICT = {
    **LM_SPEC["train"],
    "lr": 3e-3,
    "warmup_frac": 0.5,
    "grad_clip": 0.5,
}
TCFG = TrainConfig.from_dict(TCFG_DICT)


class Recorder(TorchDispatchMode):
    """Each op of a region: its name, its non-tensor arguments, and for each tensor argument either
    that the region made it (in a capture: memory of the graph's own pool, wherever it is) or, for a
    tensor from outside, where it lives (storage, offset, shape, strides, dtype): what a replay
    would read."""

    def __init__(self):
        super().__init__()
        self.ops, self.made = [], set()

    def _arg(self, x):
        if not isinstance(x, torch.Tensor):
            return ("value", repr(x))
        key = x.untyped_storage().data_ptr()
        if key in self.made:
            return ("made", tuple(x.shape), x.dtype)
        return ("outside", key, x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if str(func).startswith("profiler."):  # record_function's markers: no kernel
            return out
        leaves = tree_flatten((args, kwargs))[0]
        self.ops.append((str(func), tuple(self._arg(x) for x in leaves)))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not any(
                t is x for x in tree_flatten((args, kwargs))[0]
            ):
                self.made.add(t.untyped_storage().data_ptr())
        return out


class _Stream:
    def __init__(self, capturing):
        self.capturing = capturing

    def is_capturing(self):
        return self.capturing


@contextmanager
def cuda_as_torch_sees_it(capturing: bool):
    """torch's accelerator probes answering as on a GPU: the accelerator is CUDA and its current
    stream is (or is not) capturing. Then the libraries' own CUDA-only checks run on the CPU:
    Optimizer._accelerator_graph_capture_health_check refuses a captured step() of an optimizer
    whose param groups are not capturable, exactly as it does at a real capture."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            torch.accelerator,
            "current_accelerator",
            lambda check_available=False: torch.device("cuda"),
        )
        mp.setattr(torch.accelerator, "current_stream", lambda device=None: _Stream(capturing))
        yield


class Rehearsal:
    """A TrainStep's region_context: each step's region recorded with its host syncs; after the
    first (the warm-up, eager on CUDA too: lazy initialisations run there) in capture mode, with
    torch's probes saying CUDA is capturing (cuda_as_torch_sees_it)."""

    def __init__(self, recorder=None):
        self.steps, self.syncs = [], []
        self.recorder = recorder or Recorder

    @contextmanager
    def __call__(self):
        rec = self.recorder()
        with ExitStack() as stack:
            syncs = stack.enter_context(HostSyncs())
            stack.enter_context(cuda_as_torch_sees_it(capturing=bool(self.steps)))
            if self.steps:
                stack.enter_context(fake_cupy.capturing())
            stack.enter_context(rec)
            yield
        self.steps.append(rec.ops)
        self.syncs.append(dict(syncs.seen))


def _differences(a, b):
    if len(a) != len(b):
        return [f"{len(a)} ops, then {len(b)}"]
    return [f"op {i}: {x[0]} {x[1]} then {y[1]}" for i, (x, y) in enumerate(zip(a, b)) if x != y]


def _model(kind="grassmann", **kw):
    torch.manual_seed(0)
    cfg = dict(
        vocab_size=40,
        context_len=12,
        n_layers=2,
        d_model=16,
        d_ff=32,
        n_heads=2,
        r=4,
        lags=(1, 2, 4),
        dropout=0.0,
        plucker_backend="cupy" if kind == "grassmann" else "auto",
    )
    return build_model(kind, ModelConfig(**{**cfg, **kw}))


def _task(model, head_loss="auto", members=1):
    ids = np.arange(900) % 37
    return LanguageModelObjective(
        ids,
        ids[:100],
        model.cfg.context_len,
        4,
        list(range(members)) if members > 1 else 0,
        8,
        CPU,
        "t",
        head_loss,
    )


def _rehearse(kind, region=None, steps=3, opt=None, head_loss="auto", members=1):
    """Steps 0..steps-1 of a tiny LM (or a fused group of `members` of it) through TrainStep, each
    region recorded; the optimizer the loop makes for a captured step unless `opt` (a function of
    the model) makes it."""
    model = _model(kind) if members == 1 else stack([_model(kind) for _ in range(members)])
    task = _task(model, head_loss, members)
    opt, impl = opt(model) if opt else make_optimizer(model, TCFG, CPU, capture=True)
    assert impl == "fused"
    losses = ts.EpochLoss(CPU, members)
    losses.reset([0.0] * members, 0)
    step = ts.TrainStep(
        model, lambda b: task.loss(model, b), opt, TCFG.grad_clip, CPU, losses, static=True
    )
    rehearsal = Rehearsal()
    step.region_context = rehearsal
    if region is not None:
        step.region = lambda: region(step, task)
    for i in range(steps):
        step.counter = i
        set_lr(opt, lr_at(i, 10, TCFG))
        step(task.batch(0, i))
    return rehearsal, losses


@pytest.mark.parametrize(
    "kind, head_loss, members",
    [
        ("grassmann", "auto", 1),
        ("transformer", "auto", 1),
        ("transformer", "fused", 1),
        ("grassmann", "auto", 3),
    ],
)
def test_the_region_repeats_itself_exactly_and_neither_syncs_nor_allocates_outside_torch(
    kind, head_loss, members, monkeypatch
):
    """After the first step (AdamW's state is made lazily: the warm-up's work), two consecutive
    regions issue the same ops with the same arguments on the same outside tensors; with the fused
    head too (its kernels compiled by the warm-up, launched on the capture's stream), and for a
    fused group of seeds (train.fuse_seeds: the GPU's batched GEMMs, the members' clipping)."""
    monkeypatch.setattr(layers, "GEMM_PER_MEMBER", set())
    with fake_cupy.installed(monkeypatch) as state:
        rehearsal, _ = _rehearse(kind, head_loss=head_loss, members=members)
        # the fused head's check compiles plucker.cu (the CuPy backend's), then cross_entropy.cu
        assert state.allocations == 0 and state.compiles == (
            1 if kind == "grassmann" else 0
        ) + 2 * (head_loss == "fused")
        # the warm-up's on torch's stream, the two captured steps' on the capture's
        if kind == "grassmann" or head_loss == "fused":
            streams = [s for *_, s in state.launches]
            assert set(streams) == {fake_cupy.STREAM, fake_cupy.CAPTURE}
            assert streams.count(fake_cupy.CAPTURE) == 2 * streams.count(fake_cupy.STREAM)
    assert rehearsal.syncs == [{}, {}, {}]
    assert len(rehearsal.steps[1]) > 100
    assert _differences(rehearsal.steps[1], rehearsal.steps[2]) == []


def test_torchs_own_capture_check_runs_and_refuses_an_optimizer_that_is_not_capturable(monkeypatch):
    """What failed on main before a GPU ever ran it: loop.make_optimizer's fused AdamW without
    capturable, which torch refuses at the first CUDA capture (and only there)."""
    with fake_cupy.installed(monkeypatch):
        with pytest.raises(
            RuntimeError, match="Attempting CUDA graph capture of step.* capturable is False"
        ):
            _rehearse("transformer", steps=2, opt=lambda m: make_optimizer(m, TCFG, CPU))
        _rehearse("transformer", steps=2)  # the loop's optimizer for a captured step


def test_a_resumed_optimizer_is_capturable_again(monkeypatch):
    """A checkpoint written by an eager run holds capturable False in its param groups, which
    load_state_dict restores; tensor_lr, as the loop calls it on resuming, sets this run's flag."""

    def resumed(model, fix):
        eager, _ = make_optimizer(model, TCFG, CPU)
        state = eager.state_dict()
        opt, impl = make_optimizer(model, TCFG, CPU, capture=True)
        opt.load_state_dict(state)
        if fix:
            tensor_lr(opt, CPU, capture=True)
        return opt, impl

    with fake_cupy.installed(monkeypatch):
        with pytest.raises(RuntimeError, match="capturable is False"):
            _rehearse("transformer", steps=2, opt=lambda m: resumed(m, fix=False))
        _rehearse("transformer", steps=2, opt=lambda m: resumed(m, fix=True))


def _lr_inside(step, task):  # loop.py before the region: set_lr in the step, a Python float
    set_lr(step.opt, lr_at(step.counter, 10, TCFG))
    ts.TrainStep.region(step)


def _batch_inside(step, task):  # the batch sliced from the epoch's order within the step
    step.batch = task.batch(0, step.counter)
    ts.TrainStep.region(step)


def _int_step_add(self, loss, grad_norm):  # EpochLoss.add with the step as a Python int
    loss = loss.detach().to(torch.float64)
    bad = ~torch.isfinite(loss) & (self.first_bad < 0)
    self.first_bad.copy_(torch.where(bad, self.counter, self.first_bad))
    self.counter += 1
    self.sum.add_(torch.where(self.first_bad < 0, loss, 0.0))
    self.grad_norm_sum.add_(grad_norm.detach().to(torch.float64))


@pytest.mark.parametrize(
    "regression, where",
    [
        (dict(region=_lr_inside), "aten.fill_.Scalar"),
        (dict(region=_batch_inside), "aten.slice.Tensor"),
        (dict(add=_int_step_add), "aten.scalar_tensor.default (('value', '1')"),
    ],
    ids=["lr-float-in-step", "batch-slice-in-step", "python-int-step"],
)
def test_the_rehearsal_catches_what_a_replay_would_freeze(regression, where, monkeypatch):
    if "add" in regression:
        monkeypatch.setattr(ts.EpochLoss, "counter", 0, raising=False)
        monkeypatch.setattr(ts.EpochLoss, "add", regression["add"])
    with fake_cupy.installed(monkeypatch):
        rehearsal, _ = _rehearse("grassmann", region=regression.get("region"))
    diffs = _differences(rehearsal.steps[1], rehearsal.steps[2])
    assert diffs and any(where in d for d in diffs), diffs[:5]


def test_the_rehearsal_catches_a_host_read_and_a_cupy_allocation(monkeypatch):
    def reading(step, task):
        ts.TrainStep.region(step)
        step.losses.sum.item()

    def allocating(step, task):
        __import__("cupy").empty((4,))

    with fake_cupy.installed(monkeypatch):
        rehearsal, _ = _rehearse("grassmann", region=reading, steps=2)
        assert rehearsal.syncs[1]
        with pytest.raises(RuntimeError, match="CuPy's memory pool allocates during a capture"):
            _rehearse("grassmann", region=allocating, steps=2)


def _plain_steps(kind, n):
    """The eager step as the loop took it before the region existed: the batch as sliced, the loss
    summed on the host."""
    model = _model(kind, plucker_backend="fast") if kind == "grassmann" else _model(kind)
    task = _task(model)
    opt, _ = make_optimizer(model, TCFG, CPU)
    total = 0.0
    for i in range(n):
        set_lr(opt, lr_at(i, n, TCFG))
        loss = task.loss(model, task.batch(0, i))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TCFG.grad_clip)
        opt.step()
        total += loss.item()
    return model, total


def _stepped(kind, n, **step_kw):
    """A fresh model trained n steps through TrainStep (its static-buffer or capture path: step_kw),
    with the eager optimizer; (model, step, its epoch's losses)."""
    model = _model(kind, plucker_backend="fast") if kind == "grassmann" else _model(kind)
    task = _task(model)
    opt, _ = make_optimizer(model, TCFG, CPU)  # not capturable: a capture of it fails
    losses = ts.EpochLoss(CPU)
    losses.reset([0.0], 0)
    step = ts.TrainStep(
        model, lambda b: task.loss(model, b), opt, TCFG.grad_clip, CPU, losses, **step_kw
    )
    for i in range(n):
        set_lr(opt, lr_at(i, n, TCFG))
        step(task.batch(0, i))
    return model, step, losses


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_the_step_written_for_capture_trains_exactly_as_the_eager_step(kind):
    """Static buffers and device-side counters change nothing: after 6 steps every parameter is
    bitwise the plain eager loop's, and the device-side loss sum is its host sum."""
    n = 6
    want, total = _plain_steps(kind, n)
    model, step, losses = _stepped(kind, n, static=True)
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        assert torch.equal(p, q), name
    (loss_sum,), (bad,), _ = losses.read()
    assert bad is None and loss_sum == pytest.approx(total, rel=0, abs=1e-12)
    assert step.buffers[0] is step.batch[0]  # the region read the static buffers


def test_a_non_finite_loss_is_found_at_its_step_by_the_device_counter():
    losses = ts.EpochLoss(CPU)
    losses.reset([5.0], 7)  # a resumed epoch: step 7, 5.0 so far
    for loss in (1.0, 2.0, math.nan, 4.0):
        losses.add(torch.tensor(loss), torch.tensor(1.0))
    assert losses.read() == ([8.0], [9], [4.0])
    members = ts.EpochLoss(CPU, 3)  # an ensemble's: each member its own sum and first bad step
    members.reset([0.0, 1.0, 2.0], 0)
    for losses_of_step in ((1.0, 1.0, math.nan), (math.inf, 1.0, 1.0), (1.0, 1.0, 1.0)):
        members.add(torch.tensor(losses_of_step), torch.ones(3))
    assert members.read() == ([1.0, 4.0, 2.0], [1, None, 0], [3.0, 3.0, 3.0])


def test_graph_is_refused_off_cuda(tmp_path):
    model = _model("transformer")
    spec = {
        **LM_SPEC,
        "run_id": "t",
        "train": {
            **TCFG_DICT,
            "epochs": 1,
            "max_steps_per_epoch": 1,
            "checkpoint_every": 0,
            "log_every": 10,
        },
    }
    with pytest.raises(
        ValueError, match="train.compile: graph captures CUDA graphs; this run is on cpu"
    ):
        fit(model, _task(model), spec, tmp_path, CPU, header={}, execution={"compile": "graph"})


class _FakeCudaGraphs:
    """torch.cuda's stream and graph API on the CPU: the region runs as it would be captured, under
    torch's probes saying CUDA is capturing (so torch's own capture checks run)."""

    class Stream:
        made = 0

        def __init__(self, device=None):
            _FakeCudaGraphs.Stream.made += 1

        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def replay(self):
            raise AssertionError("a graph whose capture failed was replayed")

    @staticmethod
    @contextmanager
    def graph(g):
        with cuda_as_torch_sees_it(capturing=True):
            yield

    @staticmethod
    def install(mp):
        for name in ("Stream", "CUDAGraph", "graph"):
            mp.setattr(torch.cuda, name, getattr(_FakeCudaGraphs, name))
        mp.setattr(torch.cuda, "stream", lambda s: nullcontext())
        mp.setattr(torch.cuda, "current_stream", lambda device=None: _CURRENT)
        mp.setattr(torch.cuda, "synchronize", lambda device=None: None)


_CURRENT = object.__new__(_FakeCudaGraphs.Stream)  # torch's current stream: not made by the step


@pytest.mark.parametrize("kind", ["grassmann", "transformer"])
def test_a_failed_capture_trains_on_eagerly_exactly(kind, monkeypatch, capsys):
    """A capture that raises (here torch's own check, given an optimizer that is not capturable) is
    not fatal: the step it failed on and every later one run eagerly, the parameters after n steps
    are bitwise the eager loop's, and the step says why."""
    n = 6
    want, total = _plain_steps(kind, n)
    _FakeCudaGraphs.install(monkeypatch)
    _FakeCudaGraphs.Stream.made = 0
    model, step, losses = _stepped(kind, n, capture=True)  # the optimizer is not capturable
    assert step.graph is None and "capturable is False" in step.capture_error
    # one side stream for the warm-up steps (current_stream makes none)
    assert _FakeCudaGraphs.Stream.made == 1
    assert "the CUDA graph capture failed, training on eagerly" in capsys.readouterr().err
    for (name, p), q in zip(model.named_parameters(), want.parameters()):
        assert torch.equal(p, q), name
    (loss_sum,), (bad,), _ = losses.read()
    assert bad is None and loss_sum == pytest.approx(total, rel=0, abs=1e-12)


def test_a_failed_validation_capture_validates_eagerly(monkeypatch, capsys):
    """GraphedForward (train.compile graph's validation forward): a capture that raises is said
    once, and this and every later call run the model eagerly, with its own output."""
    _FakeCudaGraphs.install(monkeypatch)
    model = _model("transformer")

    class RefusesCapture(torch.nn.Module):  # an op that cannot be captured, as CUDA would refuse it
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            if torch.accelerator.current_stream().is_capturing():
                raise RuntimeError("operation not permitted when stream is capturing")
            return self.model(x)

    graphed = ts.GraphedForward(RefusesCapture(), CPU)
    x = torch.arange(12).reshape(1, 12) % 37
    # capturing inside the stand-in graph only
    with (
        torch.no_grad(),
        cuda_as_torch_sees_it(capturing=False),
    ):
        want = model(x)
        assert torch.equal(graphed(x), want) and torch.equal(graphed(x), want)
    assert (
        graphed.graphs == {} and "not permitted when stream is capturing" in graphed.capture_error
    )
    assert capsys.readouterr().err.count("validating eagerly") == 1


class _KnownOutside(Recorder):
    """A Recorder for a region whose compiled code allocates past the dispatcher (inductor's
    buffers): a tensor is `outside` where it lives in one of `outside`'s storages (the parameters,
    their optimizer state and LR, the loss bookkeeping, the batch buffers: what a replay reads from
    outside its graph), else made by the region, as a capture's own pool makes it."""

    def __init__(self, outside):
        super().__init__()
        self.outside = outside

    def _arg(self, x):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in self.outside:
            return ("made", tuple(x.shape), x.dtype)
        return super()._arg(x)


def _compiled_outside_the_modes(fn):
    """The compiled loss called with the rehearsal's dispatch modes set aside (torch.compile runs
    under none: 'non-infra torch dispatch mode present'). Its backward (AOTAutograd's compiled
    graph) runs under them, recorded. No host read can hide inside it: fullgraph=True refuses the
    graph break one would be."""
    from torch.utils._python_dispatch import _disable_current_modes

    def call(*args):
        with _disable_current_modes():
            return fn(*args)

    return call


@pytest.mark.slow  # inductor compiles the loss on the CPU: ~15 s
def test_the_compiled_loss_captured_repeats_itself_syncs_nothing_and_computes_the_references_loss(
    monkeypatch,
):
    """train.compile compiled-graph: the loss as Compiled compiles it (torch.compile, fullgraph,
    static shapes), inside the region a capture records (the eager warm-up compiles it, as on CUDA).
    Its steps after the warm-up compile nothing more (a recompile inside a capture would be a new
    graph), two consecutive regions issue the same ops reading the same outside tensors at the same
    places, none syncs, the Plücker op's kernels launch on the capture's stream, and every step's
    loss is the eager reference's (within fp32's reordering)."""
    from torch._dynamo.utils import counters

    from grassflow import compiled as compiled_mod
    from grassflow.lease import setting_value

    monkeypatch.setattr(layers, "GEMM_PER_MEMBER", set())
    # compiled-graph on the CPU: the region as it would be captured, without CUDA
    real = compiled_mod.resolve
    monkeypatch.setattr(
        compiled_mod,
        "resolve",
        lambda s, d: "compiled-graph" if s == "compiled-graph" else real(s, d),
    )
    with fake_cupy.installed(monkeypatch) as state:
        losses_of = {}
        for setting in ("false", "compiled-graph"):
            model = _model("grassmann")
            task = _task(model)
            c = compiled_mod.Compiled(model, task, setting_value(setting), "default", CPU)
            assert (c.enabled, c.graph) == ((False, False) if setting == "false" else (True, True))
            opt, _ = make_optimizer(model, TCFG, CPU, capture=True)
            losses = ts.EpochLoss(CPU)
            losses.reset([0.0], 0)
            loss_fn = _compiled_outside_the_modes(c.loss) if c.enabled else c.loss
            step = ts.TrainStep(model, loss_fn, opt, TCFG.grad_clip, CPU, losses, static=True)
            rehearsal, seen, compiles = None, [], []
            for i in range(4):
                if i == 1:  # after the warm-up: what a capture, then its replays, would run
                    outside = {
                        t.untyped_storage().data_ptr()
                        for t in tree_flatten(
                            (
                                [p for p in model.parameters()],
                                opt.state_dict(),
                                [g["lr"] for g in opt.param_groups],
                                [losses.sum, losses.first_bad, losses.grad_norm_sum, losses.step],
                                step.buffers,
                            )
                        )[0]
                        if isinstance(t, torch.Tensor)
                    }
                    rehearsal = step.region_context = Rehearsal(
                        functools.partial(_KnownOutside, outside)
                    )
                set_lr(opt, lr_at(i, 10, TCFG))
                before, frames = losses.sum.clone(), counters["frames"]["ok"]
                step(task.batch(0, i))
                seen.append(float(losses.sum - before))
                compiles.append(counters["frames"]["ok"] - frames)
            losses_of[setting] = seen
        assert compiles[1:] == [0, 0, 0], compiles  # compiled once, in the warm-up
        assert rehearsal.syncs == [{}, {}, {}]
        # the compiled backward, the clipping, AdamW, the bookkeeping
        assert len(rehearsal.steps[1]) > 50
        assert _differences(rehearsal.steps[1], rehearsal.steps[2]) == []
        streams = [s for *_, s in state.launches]
        assert fake_cupy.CAPTURE in streams
    assert losses_of["compiled-graph"] == pytest.approx(losses_of["false"], rel=1e-5), losses_of
