"""What one captured training step launches on a GPU, counted on the CPU: the number the step's
speed work tracks without a GPU (issue #82; reports/bench/step-ops.md).

The step is the loop's own (grassflow.train_step.TrainStep.region on the LM task: forward and loss
under autocast, backward, per-member clipping, fused AdamW, the loss bookkeeping) of a fused group
(a config's seeds as one ensemble, train.fuse_seeds), run the way CUDA runs it: CUDA's bf16 autocast
lists (helpers.cuda_autocast: its casts are kernels), the CuPy kernels through the stand-in
(helpers.fake_cupy: each launch counted), the ensemble's batched GEMMs
(models.layers.GEMM_PER_MEMBER empty), the optimizer made for a capture. Counted after one warm-up
step (AdamW's state exists then, as in the graph a capture makes):
  ops     ATen ops that run a kernel, as CUDA launches them: every op but views (an op whose outputs
          alias an input without writing it) and bare allocations counts one, but a foreach op off
          CUDA's fast route (cuda_launches: lists whose i-th tensors differ in size, a broadcast
          operand) counts a kernel per tensor of its list, as CUDA's per-tensor path runs it; most
          are
          one CUDA kernel, a few several (a reduction; a multi-tensor launch splits a list longer
          than
          its kernel's argument limit: ~100 tensors)
  cupy    the CuPy kernel launches (the Plücker op's, the fused head's)
The counts depend on the layers, the members, the model's kind and the head, not on the widths or
the batch: they are counted at a table's layers and context with small widths (test_step_ops checks
that a wider model counts the same).

`python tests/helpers/step_ops.py` prints the table of reports/bench/step-ops.md's counts.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grassflow import runtime  # noqa: E402
from grassflow.lm.train import LanguageModelObjective  # noqa: E402
from grassflow.loop import make_optimizer  # noqa: E402
from grassflow.models import ModelConfig, build_model, layers  # noqa: E402
from grassflow.models.ensemble import stack  # noqa: E402
from grassflow.train_config import TrainConfig  # noqa: E402
from grassflow.train_step import EpochLoss, TrainStep  # noqa: E402
from helpers import fake_cupy  # noqa: E402
from helpers.cuda_autocast import CudaAutocast  # noqa: E402

CPU = torch.device("cpu")
# the paper's tables (config.yaml, paper): layers, context, batch
TABLES = {"table1": (6, 128, 32), "table2": (12, 256, 16)}
ALLOCATIONS = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default"}


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill its storage span exactly, in some order of its
    dims."""
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for st, n in dims:
        if st != expected:
            return False
        expected *= n
    return True


def cuda_launches(func, args) -> int:
    """The kernels CUDA launches for one dispatched op: 1, but a kernel per tensor for a foreach op
    (`aten._foreach_*`) off CUDA's fast route (ATen's ForeachUtils.h, check_fast_path_restrictions:
    every tensor of every list of one dtype and device, dense and non-overlapping, the lists' i-th
    tensors of one size and stride; else the op's slow path, a loop over the tensors)."""
    if not str(func).startswith("aten._foreach_"):
        return 1
    lists = [
        a
        for a in args
        if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a)
    ]
    first = lists[0]
    fast = all(
        t.dtype == first[0].dtype and t.device == first[0].device and _dense(t)
        for lst in lists
        for t in lst
    )
    fast = fast and all(
        lst[i].shape == first[i].shape and lst[i].stride() == first[i].stride()
        for lst in lists[1:]
        for i in range(len(first))
    )
    return 1 if fast else len(first)


class KernelOps(TorchDispatchMode):
    """The ATen ops dispatched under it that run a kernel (no views, no bare allocations), each
    counted as CUDA launches it (cuda_launches)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not (name.startswith("profiler.") or name in ALLOCATIONS or _is_view(func)):
            self.ops[name] += cuda_launches(func, args)
        return func(*args, **(kwargs or {}))


def count(
    kind: str,
    n_layers: int,
    L: int,
    members: int = 3,
    head_loss: str = "reference",
    d_model: int = 16,
    B: int = 2,
    vocab: int = 64,
) -> dict:
    """{"ops": ATen kernel ops, "cupy": CuPy launches, "by_op": Counter} of one captured step of a
    fused group of `members` (1: a single run) of model `kind`."""
    with pytest.MonkeyPatch.context() as mp, fake_cupy.installed(mp) as cupy:
        mp.setitem(runtime.AUTOCAST, "cpu", lambda **kw: CudaAutocast())
        mp.setattr(layers, "GEMM_PER_MEMBER", set())
        cfg = ModelConfig(
            vocab_size=vocab,
            context_len=L,
            n_layers=n_layers,
            d_model=d_model,
            d_ff=4 * d_model,
            n_heads=4,
            r=8,
            dropout=0.1,
            plucker_backend="cupy",
        )
        models = []
        for seed in range(members):
            torch.manual_seed(seed)
            models.append(build_model(kind, cfg))
        model = models[0] if members == 1 else stack(models)
        ids = np.arange(L * B * 4 + 1) % vocab
        task = LanguageModelObjective(
            ids, ids, L, B, list(range(members)) if members > 1 else 0, B, CPU, "ops", head_loss
        )
        opt, _ = make_optimizer(
            model, TrainConfig(epochs=1, batch_size=B, lr=1e-3), CPU, capture=True
        )
        losses = EpochLoss(CPU, members)
        losses.reset([0.0] * members, 0)
        step = TrainStep(model, lambda b: task.loss(model, b), opt, 1.0, CPU, losses, static=True)
        step(task.batch(0, 0))  # the warm-up: AdamW's state
        step.stage(task.batch(0, 1))
        launched = len(cupy.launches)
        with KernelOps() as rec:
            step.region()
        return {
            "ops": sum(rec.ops.values()),
            "cupy": len(cupy.launches) - launched,
            "by_op": rec.ops,
        }


def table(head_losses=("reference", "fused")) -> str:
    """The counts of each model, table shape and head, as reports/bench/step-ops.md tables them."""
    lines = [
        "| model | table (N, L) | members | head | ATen kernel ops | CuPy launches | in all |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for name, (n, L, _) in TABLES.items():
        for kind in ("transformer", "grassmann"):
            for head in head_losses:
                c = count(kind, n, L, head_loss=head)
                lines.append(
                    f"| {kind} | {name} ({n}, {L}) | 3 | {head} | {c['ops']} | {c['cupy']} | "
                    f"{c['ops'] + c['cupy']} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
