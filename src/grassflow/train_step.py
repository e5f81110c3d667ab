"""One training step, written so that CUDA can capture it whole as one graph.

The region (`TrainStep.region`): forward and loss under autocast, backward, gradient clipping, the
AdamW step and the epoch's loss bookkeeping (EpochLoss). A CUDA graph replays the region's kernels
with the arguments and addresses they had when it was captured, so the region is written such that
every op gets the same non-tensor arguments at every step and reads only tensors that stay where
they are:
  - the batch is copied into static buffers before the region (`stage`);
  - the learning rate is the fused optimizer's device tensor, filled before the region;
  - the step within the epoch is a device counter that the region advances (EpochLoss);
  - nothing in it reads a value back to the host, and nothing but torch allocates (the cupy
    Plücker backend launches on torch's stream with torch's memory).
tests/gpu/test_capture.py rehearses all of this on the CPU, op by op.

With train.compile `graph` on CUDA the region runs eagerly for WARMUP steps on a side stream (lazy
initialisations: AdamW's state, cuBLAS workspaces, the op's cached tensors), is then captured, and
every later step replays it; the replay of the capture step is that step. Everywhere else the region
runs eagerly: the very same code.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import torch

from grassflow.models import layers
from grassflow.runtime import autocast

WARMUP = 3  # eager steps before the capture (torch.cuda.graphs' own examples take 3)


class EpochLoss:
    """The epoch's training loss of each of E runs (one, or an ensemble's members), summed on the
    device in float64 so that no step waits for the GPU: a run's sum stops at its first non-finite
    loss, whose step (within the epoch) it records; beside it the gradient norms' sum (for the
    trackers). read() is the one host sync, taken every `train.log_every` steps, at checkpoints and
    at the end of the epoch. float64 holds the fp32 losses' sum exactly as the Python float it is
    checkpointed as, so a resumed sum is bitwise the uninterrupted one. Its tensors never move
    (reset() writes them in place), so a captured step keeps adding to them."""

    def __init__(self, device, runs: int = 1):
        self.sum = torch.zeros(runs, dtype=torch.float64, device=device)
        self.first_bad = torch.full((runs,), -1, dtype=torch.int64, device=device)
        self.grad_norm_sum = torch.zeros(runs, dtype=torch.float64, device=device)
        self.step = torch.zeros((), dtype=torch.int64, device=device)  # the next step's index

    def reset(self, loss_sums: list[float], step: int) -> None:
        """A new epoch (or a resumed one) at `step`, each run's loss so far in `loss_sums`."""
        self.sum.copy_(torch.tensor(loss_sums, dtype=torch.float64))
        self.first_bad.fill_(-1)
        self.grad_norm_sum.zero_()
        self.step.fill_(step)

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """The losses (a scalar or one per run) of the step the counter points at; then the counter
        moves on."""
        loss = loss.detach().to(torch.float64).reshape(-1)
        bad = ~torch.isfinite(loss) & (self.first_bad < 0)
        self.first_bad.copy_(torch.where(bad, self.step, self.first_bad))
        self.sum.add_(torch.where(self.first_bad < 0, loss, 0.0))
        self.grad_norm_sum.add_(grad_norm.detach().to(torch.float64).reshape(-1))
        self.step.add_(1)

    def read(self) -> tuple[list[float], list[int | None], list[float]]:
        """Per run: (sum of the finite losses so far, step of the first non-finite one or None, sum
        of the gradient norms since the last reset)."""
        sums, first_bad, grad_norm_sums = torch.stack(
            [self.sum, self.first_bad.to(torch.float64), self.grad_norm_sum]
        ).tolist()
        return sums, [None if b < 0 else int(b) for b in first_bad], grad_norm_sums


class TrainStep:
    """`step(batch)`: one optimizer step of `loss_fn` (the task's loss of the model) on batch, the
    learning rate already set (loop.set_lr). `capture`: replay it as a CUDA graph; `static` (implied
    by capture): run the region on static buffers, as a capture does, without one."""

    def __init__(
        self,
        model,
        loss_fn,
        opt,
        grad_clip: float,
        device,
        losses: EpochLoss,
        capture: bool = False,
        static: bool = False,
    ):
        self.model, self.loss_fn, self.opt, self.grad_clip = model, loss_fn, opt, grad_clip
        self.device, self.losses, self.capture, self.static_buffers = (
            device,
            losses,
            capture,
            static or capture,
        )
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.members = layers.members(model)
        # the batch's tensors' buffers (from the first batch); the batch the region reads
        self.buffers = self.batch = None
        self.graph, self.eager_steps = None, 0
        self.capture_error = None  # why the capture failed, if it did: the run goes on eagerly
        self.side = None  # the warm-up's stream
        self.region_context = nullcontext  # tests wrap the region (tests/gpu/test_capture.py)

    def __call__(self, batch) -> None:
        if self.static_buffers:
            self.stage(batch)
        else:
            self.batch = batch
        if not self.capture:
            with self.region_context():
                self.region()
        elif self.graph is not None:
            self.graph.replay()
        elif self.eager_steps < WARMUP:
            self._warm_up()
        elif self._capture():
            self.graph.replay()
        # the capture failed: this step (none of the capture's kernels ran) and all later ones eager
        else:
            with self.region_context():
                self.region()

    def stage(self, batch) -> None:
        """The batch on the static buffers: its tensors copied into them (the first batch makes
        them), anything else as it is (a captured region would keep the value it was captured
        with)."""
        if self.buffers is None:
            self.buffers = _map(lambda t: t.clone(), batch)
        self.batch = _restage(self.buffers, batch)

    def region(self) -> None:
        """What a CUDA graph captures: everything of a step but the batch copy and the LR."""
        self.opt.zero_grad(set_to_none=True)  # in a capture: the graph's backward makes the grads
        with autocast(self.device, cache=not self.capture):
            loss = self.loss_fn(self.batch)
        if self.members:  # an ensemble: a loss per member, clipped per member
            loss.sum().backward()
            grad_norm = clip_per_member(self.params, self.grad_clip, self.members)
        else:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.opt.step()
        self.losses.add(loss, grad_norm)

    def _warm_up(self) -> None:
        if self.side is None:  # one side stream for all the warm-up steps
            self.side = torch.cuda.Stream(self.device)
        side = self.side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.region()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.eager_steps += 1

    def _capture(self) -> bool:
        """Capture the region; on failure (a library's check, an op that cannot be captured) say why
        once, drop the graph and run eagerly from here on (run.json: cuda_graph false, and the
        error). A captured op only records its kernel, so the failed capture changed no tensor."""
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.region()
        # any capture error: the eager step is the same step
        except Exception as err:
            self.capture, self.capture_error = False, f"{type(err).__name__}: {err}"
            print(
                "[train] warning: the CUDA graph capture failed, training on eagerly: "
                f"{self.capture_error}",
                file=sys.stderr,
            )
            torch.cuda.synchronize(self.device)
            return False
        self.graph = graph
        return True


def clip_per_member(params, max_norm: float, members: int) -> torch.Tensor:
    """clip_grad_norm_ for each member of an ensemble on its slices [e] of the stacked gradients, as
    its own run clips (the norm of the per-parameter norms, the coefficient max_norm / (norm + 1e-6)
    clamped at 1); returns the members' norms (E,). The slices' norms in one foreach op, as
    clip_grad_norm_ takes its run's (a norm per parameter was ~90 kernels a step), and each member's
    slices multiplied by its coefficient in one foreach op (a 0-d tensor: CUDA's multi-tensor
    kernel; one list of (E, ...) gradients times (E, 1, ...) coefficients takes its per-tensor path,
    a kernel per gradient: tests/helpers/step_ops.py counts as CUDA launches)."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack(torch._foreach_norm([g[e] for e in range(members) for g in grads]))
    total = torch.linalg.vector_norm(norms.view(members, len(grads)), dim=1)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for e in range(members):
        torch._foreach_mul_([g[e] for g in grads], coef[e])
    return total


class GraphedForward:
    """A model's forward for validation (no grad), captured once per input shape and replayed:
    train.compile `graph`'s evaluation. Its output lives in the graph's memory until the next call,
    which the validation loops read before they call again. Anything else (eval(), train(),
    attributes) is the model's."""

    def __init__(self, model, device):
        self.model, self.device, self.graphs = model, device, {}
        self.capture_error = None  # a failed capture: the forward runs eagerly from then on

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *inputs):
        if self.capture_error:
            with autocast(self.device):
                return self.model(*inputs)
        key = tuple(_map(lambda t: (tuple(t.shape), t.dtype), list(inputs)))
        if key not in self.graphs:
            buffers = _map(lambda t: t.clone(), list(inputs))
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side), autocast(self.device, cache=False):
                self.model(*buffers)  # the warm-up: lazy initialisations, outside the capture
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph), autocast(self.device, cache=False):
                    out = self.model(*buffers)
            except Exception as err:  # noqa: BLE001 - the eager forward computes the same
                self.capture_error = f"{type(err).__name__}: {err}"
                print(
                    "[train] warning: the validation forward's CUDA graph capture failed, "
                    f"validating eagerly: {self.capture_error}",
                    file=sys.stderr,
                )
                torch.cuda.synchronize(self.device)
                return self(*inputs)
            self.graphs[key] = (graph, buffers, out)
        graph, buffers, out = self.graphs[key]
        _restage(buffers, list(inputs))
        graph.replay()
        return out


def _map(fn, batch):
    """batch with fn applied to each tensor of it (tuples, lists and dicts of tensors)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map(fn, b) for b in batch)
    if isinstance(batch, dict):
        return {k: _map(fn, v) for k, v in batch.items()}
    return batch


def _restage(buffers, batch):
    """batch with each tensor copied into its buffer and replaced by it."""
    if isinstance(buffers, torch.Tensor):
        if buffers.shape != batch.shape:
            raise ValueError(
                f"a captured step's batch changed shape: {tuple(batch.shape)}, was "
                f"{tuple(buffers.shape)}"
            )
        return buffers.copy_(batch)
    if isinstance(buffers, (tuple, list)):
        return type(buffers)(_restage(s, b) for s, b in zip(buffers, batch, strict=True))
    if isinstance(buffers, dict):
        return {k: _restage(buffers[k], batch[k]) for k in buffers}
    return batch
