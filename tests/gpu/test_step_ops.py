"""The kernels one captured training step launches, counted on the CPU (tests/helpers/step_ops.py):
the number the step's speed work tracks without a GPU. reports/bench/step-ops.md's counts are the
code's; they do not depend on the widths they are counted at; and the members' clipping, done in one
foreach op, is each member's own run's clip_grad_norm_."""

from __future__ import annotations

import torch

from grassflow.train_step import clip_per_member
from helpers.dag import ROOT
from helpers.step_ops import count, table


def test_the_reports_counts_are_the_steps():
    report = (ROOT / "reports/bench/step-ops.md").read_text()
    assert table() in report, (
        "the step's kernel counts changed: rerun `python tests/helpers/step_ops.py` and "
        "update reports/bench/step-ops.md (before and after)"
    )


def test_the_counts_do_not_depend_on_widths():
    for kind in ("transformer", "grassmann"):
        small, wide = count(kind, 2, 24), count(kind, 2, 24, d_model=48, B=5, vocab=300)
        assert (small["ops"], small["cupy"]) == (wide["ops"], wide["cupy"]), kind
        assert small["ops"] > 100


def test_a_member_is_clipped_as_its_own_run_clips(gen):
    E, shapes = 3, [(5, 7), (7,), (2, 3, 4)]
    grads = [torch.randn(E, *s, generator=gen) * (1 + 3 * i) for i, s in enumerate(shapes)]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    for max_norm in (0.5, 1e3):  # clipped, and not
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norms = clip_per_member(params, max_norm, E)
        for e in range(E):
            own = [torch.nn.Parameter(torch.zeros_like(g[e])) for g in grads]
            for p, g in zip(own, grads):
                p.grad = g[e].clone()
            norm = torch.nn.utils.clip_grad_norm_(own, max_norm)
            assert torch.equal(norms[e], norm), (e, max_norm)
            assert all(torch.equal(p.grad[e], q.grad) for p, q in zip(params, own)), (e, max_norm)
