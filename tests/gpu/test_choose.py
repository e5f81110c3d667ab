"""A lease's first minute (grassflow.bench.choose) on the CPU: each candidate setting runs the loop's
own step on a fused group of a table's config, is checked against the reference's losses and
gradients, and timed; the fastest that computes the reference's loss is chosen. A candidate whose
loss differs (planted: a head scaled by 1.05) or that fails is dropped, said in one line; the seeds
that fit the time left are those the overlay gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grassflow.bench import choose
from grassflow.lm import train as lm_train
from grassflow.run_spec import RunSpec
from helpers.specs import LM_SPEC

CPU = torch.device("cpu")


def _spec(kind, seed=0):
    spec = {**LM_SPEC, "model_kind": kind, "seed": seed, "run_id": f"table1-{kind}-s{seed}",
            "model": {**LM_SPEC["model"], "dropout": 0.1}}
    return RunSpec.of(spec)


@pytest.fixture
def planted(monkeypatch):
    """`chunked` computes 1.05 × the loss; `fused` fails (its kernels are not on this machine)."""
    real = lm_train.linear_cross_entropy

    def head(h, w, y, backend):
        loss = real(h, w, y, backend=backend)
        return loss * 1.05 if backend == "chunked" else loss

    monkeypatch.setattr(lm_train, "linear_cross_entropy", head)


def test_the_first_minute_picks_a_setting_that_computes_the_references_loss(planted):
    tables = {"table1": {k: (_spec(k), [0, 1]) for k in ("transformer", "grassmann")}}
    vocab = 40
    ids = (np.arange(4000) * 7919) % vocab
    cands = [("false", "chunked"), ("false", "fused"), ("false", "reference")]
    result = choose.choose(tables, ids, vocab, CPU, cands, box_s=600, timed_steps=2)
    rows = {(r["model"], r["head_loss"]): r for r in result["rows"]}
    assert len(rows) == 6
    for kind in ("transformer", "grassmann"):
        assert rows[kind, "chunked"]["status"] == "differs"
        assert rows[kind, "chunked"]["loss_rel_diff"] == pytest.approx(0.05, rel=1e-3)
        assert rows[kind, "fused"]["status"] == "failed" and "fused" in rows[kind, "fused"]["error"]
        ok = rows[kind, "reference"]
        assert ok["status"] == "ok" and ok["loss_rel_diff"] == 0 and ok["grad_rel_diff"] == 0
        assert ok["step_s"] > 0 and ok["members"] == 2
    assert result["choice"] == ("false", "reference")
    said = "\n".join(result["lines"])
    assert "table1 grassmann: dropped compile=false head_loss=chunked: it differs from the reference (loss 5.0e-02" in said
    assert "table1 transformer: dropped compile=false head_loss=fused: " in said
    assert "chosen: compile=false head_loss=reference (the fastest of 1 that compute the reference's loss, of 3 tried)" in said


def test_the_seeds_that_fit_are_those_whose_groups_finish_in_the_time_left():
    tables = {"table1": {k: (_spec(k), [0, 1, 2]) for k in ("transformer", "grassmann")}}
    ids = (np.arange(4000) * 7919) % 40
    spec = tables["table1"]["transformer"][0]
    steps = (len(ids) - 1) // spec.model["context_len"] // spec.train.batch_size * spec.train.epochs
    # measured step times per members: 3 members 1 s, 2 members 0.5 s, 1 member 0.2 s (both models)
    step_s = {("table1", k, n): s for k in ("transformer", "grassmann") for n, s in ((3, 1.0), (2, 0.5), (1, 0.2))}
    need = {n: 2 * steps * s * (1 + choose.VALIDATION_SHARE) for n, s in ((3, 1.0), (2, 0.5), (1, 0.2))}
    for seconds, want in ((need[3] + 1, [0, 1, 2]), (need[3] - 1, [0, 1]), (need[2] - 1, [0]), (need[1] - 1, [])):
        fit, lines = choose.seeds_that_fit(tables, ids, 40, CPU, choose.REFERENCE, seconds, dict(step_s))
        assert fit == {"table1": want}, (seconds, lines)
        assert f"table1: seeds {', '.join(map(str, want)) or 'none'} this lease" in lines[0]


def test_a_candidate_past_its_share_of_the_box_is_dropped():
    tables = {"table1": {"transformer": (_spec("transformer"), [0, 1])}}
    ids = (np.arange(4000) * 7919) % 40
    result = choose.choose(tables, ids, 40, CPU, [("false", "chunked")], box_s=0.0, timed_steps=2)
    (row,) = result["rows"]
    assert row["status"] == "failed" and row["error"].startswith("TimeoutError: still running after 0 s"), row
    assert result["choice"] == choose.REFERENCE
    assert "chosen: none of the candidates computes the reference's loss" in result["lines"][-1]
