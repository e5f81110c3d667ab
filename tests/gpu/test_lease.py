"""A lease's first minute (grassflow.lease: trials, budget, first_minute) on the CPU: each candidate
setting runs the loop's own step on a fused group of a table's config, is checked against the
reference's losses and gradients, and timed; the fastest that computes the reference's loss for
every model is chosen. A candidate whose loss differs (planted: a head scaled by 1.05) or that fails
is dropped, said in one line, and not tried for the models left; none passing is no choice at all. A
capture that fails drops its candidate with the capture's error; the box's alarm, held while a
capture runs, stops its candidate once the capture is done. The seeds that fit are those whose
groups finish within the lease, counting the progress a last.pt holds, the epochs' checkpoints and,
past this command's deadline, a resumed command; the lease's next command reuses the decision and
times nothing."""

from __future__ import annotations

import json
import signal
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import yaml

from grassflow import compiled as compiled_mod
from grassflow import train_step as ts
from grassflow.checkpoint import save_checkpoint
from grassflow.io import spec_hash
from grassflow.lease import __main__ as lease_cli
from grassflow.lease import budget, first_minute, trials
from grassflow.lm import train as lm_train
from grassflow.run_spec import RunSpec
from helpers.dag import ROOT
from helpers.specs import LM_SPEC

CPU = torch.device("cpu")


def _spec(kind, seed=0):
    spec = {
        **LM_SPEC,
        "model_kind": kind,
        "seed": seed,
        "run_id": f"table1-{kind}-s{seed}",
        "model": {**LM_SPEC["model"], "dropout": 0.1},
    }
    return RunSpec.of(spec)


IDS = (np.arange(4000) * 7919) % 40


@pytest.fixture
def planted(monkeypatch):
    """`chunked` computes 1.05 × the loss; `fused` fails (its kernels are not on this machine)."""
    real = lm_train.linear_cross_entropy

    def head(h, w, y, backend):
        loss = real(h, w, y, backend=backend)
        return loss * 1.05 if backend == "chunked" else loss

    monkeypatch.setattr(lm_train, "linear_cross_entropy", head)


def test_the_first_minute_picks_a_setting_that_computes_the_references_loss(planted, tmp_path):
    tables = {"table1": {k: (_spec(k), [0, 1]) for k in ("transformer", "grassmann")}}
    cands = [("false", "chunked"), ("false", "fused"), ("false", "reference")]
    result = trials.choose(
        tables, IDS, 40, CPU, cands, box_s=600, timed_steps=2, checkpoint_dir=tmp_path
    )
    refs = [r for r in result["rows"] if r["status"] == "reference"]
    rows = {(r["model"], r["head_loss"]): r for r in result["rows"] if r["status"] != "reference"}
    assert len(refs) == 2 and len(rows) == 6
    # each group's, timed
    assert all(r["checkpoint_s"] > 0 and r["checkpoint_write_s"] > 0 for r in refs)
    assert not list(tmp_path.iterdir())  # the timed checkpoint's file removed
    # dropped where it first fails, and not tried for the other model
    assert rows["transformer", "chunked"]["status"] == "differs"
    assert rows["transformer", "chunked"]["loss_rel_diff"] == pytest.approx(0.05, rel=1e-3)
    assert rows["grassmann", "chunked"] == {
        **rows["grassmann", "chunked"],
        "status": "skipped",
        "error": "dropped for table1 transformer",
    }
    assert (
        rows["transformer", "fused"]["status"] == "failed"
        and "fused" in rows["transformer", "fused"]["error"]
    )
    assert rows["grassmann", "fused"]["status"] == "skipped"
    for kind in ("transformer", "grassmann"):
        ok = rows[kind, "reference"]
        assert ok["status"] == "ok" and ok["loss_rel_diff"] == 0 and ok["grad_rel_diff"] == 0
        assert ok["step_s"] > 0 and ok["members"] == 2 and ok["captured"] is False
    assert result["choice"] == ("false", "reference")
    said = "\n".join(result["lines"])
    assert (
        "table1 transformer: dropped compile=false head_loss=chunked: it differs from the "
        "reference (loss 5.0e-02"
        in said
        and "(not tried for the models left)" in said
    )
    assert "table1 grassmann: dropped compile=false head_loss=chunked" not in said
    assert (
        "chosen: compile=false head_loss=reference (the fastest of 1 that compute the reference's "
        "loss, of 3 tried)" in said
    )
    md = trials.to_markdown(result, "cpu")
    assert (
        "| table1 | grassmann | 2 | false | chunked | skipped (dropped for table1 transformer) |"
        in md
    )


def test_nothing_passing_is_one_line_and_no_choice(planted):
    tables = {"table1": {k: (_spec(k), [0, 1]) for k in ("transformer", "grassmann")}}
    result = trials.choose(tables, IDS, 40, CPU, [("false", "chunked")], box_s=600, timed_steps=2)
    assert result["choice"] is None
    assert [line for line in result["lines"] if line.startswith("chosen")] == [
        "chosen: none: no candidate (false:chunked) computes the reference's loss for every model "
        "(each dropped above); nothing trains on a setting nobody asked for "
        "(CANDIDATES=false:reference would train the reference)"
    ]


def test_a_candidate_past_its_share_of_the_box_is_dropped():
    tables = {"table1": {"transformer": (_spec("transformer"), [0, 1])}}
    result = trials.choose(tables, IDS, 40, CPU, [("false", "chunked")], box_s=0.0, timed_steps=2)
    row = result["rows"][-1]
    assert row["status"] == "failed" and row["error"].startswith(
        "BoxTimeout: still running after 0 s"
    ), row
    assert result["choice"] is None


@contextmanager
def _capture_on_cpu(monkeypatch, graph):
    """train.compile graph on the CPU: its warm-up eager, torch.cuda's graph API the stand-in
    `graph`."""
    real = compiled_mod.resolve
    monkeypatch.setattr(
        compiled_mod, "resolve", lambda s, d: "graph" if s == "graph" else real(s, d)
    )
    monkeypatch.setattr(
        ts.TrainStep,
        "_warm_up",
        lambda self: (self.region(), setattr(self, "eager_steps", self.eager_steps + 1)),
    )

    class Graph:
        def replay(self):
            raise AssertionError("not replayed in these tests")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    yield


def test_a_failed_capture_drops_its_candidate_with_the_captures_error(monkeypatch):
    @contextmanager
    def refused(g):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    tables = {"table1": {k: (_spec(k), [0, 1]) for k in ("transformer", "grassmann")}}
    with _capture_on_cpu(monkeypatch, refused):
        result = trials.choose(
            tables,
            IDS,
            40,
            CPU,
            [("graph", "reference"), ("false", "reference")],
            box_s=600,
            timed_steps=2,
        )
    row = next(r for r in result["rows"] if r["compile"] == "graph")
    assert row["status"] == "failed" and row["error"].startswith(
        "CaptureFailed: its capture failed: RuntimeError: "
        "operation not permitted when stream is capturing"
    )
    assert row["capture_error"] == "RuntimeError: operation not permitted when stream is capturing"
    assert result["choice"] == ("false", "reference")


def test_the_alarm_waits_for_a_capture_then_stops_its_candidate(monkeypatch):
    """A capture cut off midway would leave CUDA's stream capturing: the alarm rings during it, is
    held, and stops the candidate as the capture returns, not one of the capture's own fallbacks."""
    done = []

    @contextmanager
    def slow(g):
        signal.setitimer(signal.ITIMER_REAL, 0.01)  # the box's alarm rings now, inside the capture
        time.sleep(0.3)
        yield
        done.append("captured")

    tables = {"table1": {"transformer": (_spec("transformer"), [0, 1])}}
    with _capture_on_cpu(monkeypatch, slow):
        result = trials.choose(
            tables, IDS, 40, CPU, [("graph", "reference")], box_s=600, timed_steps=2
        )
    row = result["rows"][-1]
    assert done == ["captured"]
    assert row["status"] == "failed" and row["error"].startswith(
        "BoxTimeout: still running after"
    ), row
    assert "capture_error" not in row and result["choice"] is None


def _tables(seeds=(0, 1, 2)):
    return {"table1": {k: (_spec(k), list(seeds)) for k in ("transformer", "grassmann")}}


STEP_S = {
    ("table1", k, n): s
    for k in ("transformer", "grassmann")
    for n, s in ((3, 1.0), (2, 0.5), (1, 0.2))
}


def _untimed(spec, seeds):
    pytest.fail(f"a group of {len(seeds)} was timed again")


def _still():
    return 0.0  # a clock at rest: nothing but the trials a test makes takes time


def test_the_seeds_that_fit_are_those_whose_groups_finish_in_the_time_left():
    """The command's jobs start once (JOB_START_S), on top of each group's steps and validation."""
    spec = _spec("transformer")
    per_epoch, epochs = budget.steps_of(spec, len(IDS))
    steps = per_epoch * epochs
    need = {
        n: 2 * steps * s * (1 + budget.VALIDATION_SHARE) + budget.JOB_START_S
        for n, s in ((3, 1.0), (2, 0.5), (1, 0.2))
    }
    for seconds, want in (
        (need[3] + 1, [0, 1, 2]),
        (need[3] - 1, [0, 1]),
        (need[2] - 1, [0]),
        (need[1] - 1, []),
    ):
        fit, lines = budget.seeds_that_fit(
            _tables(), _untimed, len(IDS), seconds, dict(STEP_S), clock=_still
        )
        assert fit == {"table1": want}, (seconds, lines)
        assert f"table1: seeds {', '.join(map(str, want)) or 'none'} this lease" in lines[0]


def test_the_smaller_groups_trials_count_against_the_lease_inside_the_box():
    """Only the three-seed groups timed: the two- and one-seed groups' trials run now, and the time
    they take is the lease's too (mutation: the trials outside the need fits two seeds here)."""
    per_epoch, epochs = budget.steps_of(_spec("transformer"), len(IDS))
    steps = per_epoch * epochs
    # two seeds need 40 s more than one
    step = {
        1: 0.2,
        2: 0.2 + 40 / (2 * steps * (1 + budget.VALIDATION_SHARE)),
    }
    need = {
        n: 2 * steps * step[n] * (1 + budget.VALIDATION_SHARE) + budget.JOB_START_S for n in (1, 2)
    }
    now, timed = [0.0], []

    def measure(spec, seeds):  # each trial takes 10 s of the lease
        timed.append((spec.model_kind, len(seeds)))
        now[0] += 10.0
        return step[len(seeds)]

    three = {k: v for k, v in STEP_S.items() if k[2] == 3}
    # without the two-seed trials' 20 s, two seeds would fit; with them, one (its trials' 20 s
    # counted too)
    fit, lines = budget.seeds_that_fit(
        _tables(), measure, len(IDS), need[2] + 15, dict(three), clock=lambda: now[0]
    )
    assert fit == {"table1": [0]}, lines
    assert timed == [("transformer", 2), ("grassmann", 2), ("transformer", 1), ("grassmann", 1)]
    assert (
        f"about {need[1]:.0f} s of training for 1 seed(s) of 3 to train; {need[2] + 15 - 40:.0f} s "
        "of the lease's" in lines[0]
    )

    # a trial that fails (the box's alarm, a capture) fits nowhere, said
    def fails(spec, seeds):
        raise budget.TrialFailed("BoxTimeout: still running after 3 s, its share of the time box")

    fit, lines = budget.seeds_that_fit(_tables(), fails, len(IDS), 1e9, dict(three), clock=_still)
    assert fit == {"table1": [0, 1, 2]}  # the timed three-seed group fits: nothing measured
    fit, lines = budget.seeds_that_fit(
        _tables(), fails, len(IDS), need[2] + 15, dict(three), clock=_still
    )
    assert fit == {"table1": []}, lines
    assert (
        "table1 transformer with 2 seed(s): not timed (BoxTimeout: still running after 3 s, its "
        "share of the time box): it does not fit"
    ) in lines


def test_a_smaller_groups_trial_runs_inside_the_box(monkeypatch):
    """first_minute.boxed: the trial of a smaller group under the box's alarm (the box long past:
    MIN_SHARE), its overrun a TrialFailed naming the alarm (mutation: no alarm, and it times)."""

    def slow(*args, **kwargs):
        time.sleep(trials.MIN_SHARE + 2)
        pytest.fail("the box's alarm did not stop the trial")

    monkeypatch.setattr(first_minute, "trial", slow)
    measure = first_minute.boxed(
        IDS, 40, CPU, trials.REFERENCE, 2, box_end=time.perf_counter() - 100
    )
    with pytest.raises(budget.TrialFailed, match="BoxTimeout: still running after 3 s"):
        measure(_spec("transformer"), [0])


def test_tables_fitting_different_seeds_train_those_every_one_fits():
    """The preset's seeds are one list: a table that fits three seeds beside one that fits one
    trains one (mutation: the union trains three in the table that fits one); one that fits none is
    left out."""
    fit, lines = budget.common_seeds({"table1": [0, 1, 2], "table2": [0]})
    assert fit == {"table1": [0], "table2": [0]}
    assert (
        "table1: seeds 0 this lease, as every target's (the preset's seeds are one list)" in lines
    )
    fit, lines = budget.common_seeds({"table1": [0, 1], "table2": []})
    assert fit == {"table1": [0, 1]} and lines == [
        "table2: left out of this lease's targets (no seed fits)"
    ]
    assert budget.common_seeds({"table1": [], "table2": []}) == ({}, [])


def test_the_lease_not_this_command_bounds_the_seeds_and_a_resumed_command_is_counted():
    """A lease of two commands: seeds whose runs need more than this command's deadline fit when the
    lease covers them, with one resumed command (RESUME_S and the setting's setup again) on top;
    each epoch's checkpoint counts; the first command's jobs start once (JOB_START_S and the setup);
    the progress in a last.pt is not trained again."""
    per_epoch, epochs = budget.steps_of(_spec("transformer"), len(IDS))
    train3 = 2 * per_epoch * epochs * 1.0 * (1 + budget.VALIDATION_SHARE)
    ckpt = {
        "checkpoint_s": {("table1", k): 0.5 for k in ("transformer", "grassmann")},
        "setup_s": {("table1", "transformer"): 7.0, ("table1", "grassmann"): 9.0},
    }
    need3 = train3 + 2 * epochs * 0.5 + budget.JOB_START_S + 9.0
    restart = budget.RESUME_S + 9.0

    def fit_of(seconds, **kw):
        return budget.seeds_that_fit(
            _tables(), _untimed, len(IDS), seconds, dict(STEP_S), costs=ckpt, clock=_still, **kw
        )

    # this command's deadline alone would fit one seed at most; the lease covers three, and the
    # restart
    fit, lines = fit_of(need3 + restart + 1, deadline=need3 / 4)
    assert fit == {"table1": [0, 1, 2]}, lines
    assert f"about {need3 + restart:.0f} s of training for 3 seed(s)" in lines[0]
    assert "they finish in the lease's next command" in lines[0]
    # without room for the restart: two seeds (which need their own restart too)
    fit, lines = fit_of(need3 + restart - 1, deadline=need3 / 4)
    assert fit == {"table1": [0, 1]}, lines
    # within this command: no restart counted
    fit, lines = fit_of(need3 + 1, deadline=need3 + 1)
    assert fit == {"table1": [0, 1, 2]} and "within this command" in lines[0], lines
    # half the steps already in last.pt: only the rest is needed (its steps, its epochs'
    # checkpoints)
    left = per_epoch * epochs - (per_epoch * epochs) // 2
    need_rest = (
        2 * left * 1.0 * (1 + budget.VALIDATION_SHARE)
        + 2 * -(-left // per_epoch) * 0.5
        + budget.JOB_START_S
        + 9.0
    )
    assert need_rest + 1 < need3
    fit, lines = fit_of(
        need_rest + 1,
        done=lambda table, kind, seeds, pe: pe * epochs - left if len(seeds) == 3 else 0,
    )
    assert fit == {"table1": [0, 1, 2]}, lines
    assert f"about {need_rest:.0f} s of training for 3 seed(s)" in lines[0]


def test_progress_is_read_from_the_groups_own_last_pt(tmp_path):
    specs = {
        f"table1-grassmann-s{s}": {
            **_spec("grassmann", s).source,
            "seed": s,
            "run_id": f"table1-grassmann-s{s}",
        }
        for s in (0, 1, 2)
    }
    group = [specs[f"table1-grassmann-s{s}"] for s in (0, 1, 2)]
    last = tmp_path / "fused/table1-grassmann/last.pt"
    last.parent.mkdir(parents=True)
    save_checkpoint(last, {"spec_hash": spec_hash({"runs": group}), "pos": {"epoch": 2, "step": 5}})
    assert first_minute.progress(tmp_path, specs, "table1-grassmann", [0, 1, 2], 10) == 25
    # another group's seeds
    assert first_minute.progress(tmp_path, specs, "table1-grassmann", [0, 1], 10) == 0
    save_checkpoint(last, {"spec_hash": "0" * 16, "pos": {"epoch": 2, "step": 5}})  # another spec's
    assert first_minute.progress(tmp_path, specs, "table1-grassmann", [0, 1, 2], 10) == 0
    single = tmp_path / "runs/table1-grassmann-s1/last.pt"  # a lone run's, in its run directory
    single.parent.mkdir(parents=True)
    save_checkpoint(
        single,
        {"spec_hash": spec_hash(specs["table1-grassmann-s1"]), "pos": {"epoch": 0, "step": 7}},
    )
    assert first_minute.progress(tmp_path, specs, "table1-grassmann", [1], 10) == 7


def test_the_next_command_reuses_the_decision_and_times_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    record, overlay = tmp_path / "choice.json", tmp_path / "window.yaml"
    overlay.write_text(
        "presets: {demo: {train: {fuse_seeds: true, compile: false, head_loss: "
        "auto}}}\nfinished_runs: []\n"
    )
    record.write_text(
        json.dumps(
            {
                "preset": "demo",
                "asked": ["table1"],
                "targets": ["table1"],
                "choice": ["false", "chunked"],
                "seeds": {"table1": [1]},
                "finished_seeds": [0],
                "finished": ["their/runs"],
                "chosen_at": "2026-12-02T01:02:03+00:00",
                "lease_end": 1.7e9,
            }
        )
    )
    monkeypatch.setattr(
        first_minute, "trial", lambda *a, **k: pytest.fail("the next command timed a setting")
    )
    args = ["--preset", "demo", "--overlay", str(overlay), "--record", str(record)]
    assert lease_cli.main(["reuse", *args, "--targets", "table1"]) == 0
    assert capsys.readouterr().out.startswith(
        "reusing compile=false head_loss=chunked chosen at "
        "2026-12-02T01:02:03+00:00 (table1 seeds 1;"
    )
    got = yaml.safe_load(overlay.read_text())
    assert got["presets"]["demo"]["train"] == {
        "fuse_seeds": True,
        "compile": False,
        "head_loss": "chunked",
    }
    assert got["presets"]["demo"]["seeds"] == [0, 1] and got["finished_runs"] == ["their/runs"]
    # chosen for other targets: refused, in one line
    assert lease_cli.main(["reuse", *args, "--targets", "table2"]) == 1
    assert (
        "chosen for preset demo, targets table1; this command makes demo table2"
        in capsys.readouterr().err
    )
    assert (
        lease_cli.main(["targets", "--record", str(record)]) == 0
        and capsys.readouterr().out == "table1\n"
    )


def test_a_grid_is_a_target_its_groups_with_a_run_left_each_trained(tmp_path):
    """The sweep as the window's target (#108's first step): each value's group of each model, less
    those whose runs are finished elsewhere (the base's own value: Table 1's committed runs); the
    decision's seeds are the preset's and its grids' (a grid's runs fuse over the preset's)."""
    from grassflow.errors import CommandError
    from grassflow.pipeline.preview import load_config

    done = tmp_path / "done"
    for kind in ("transformer", "grassmann"):
        for s in (0, 1):
            (done / f"table1-{kind}-s{s}").mkdir(parents=True)
            (done / f"table1-{kind}-s{s}" / "run.json").write_text("{}")
    config = load_config(ROOT, [], "demo")
    name, p, tables, finished, specs = first_minute.tables_to_train(config, ["sweep"], [done])
    groups = {f"table1_lr_{v}-{k}" for v in ("1e-3", "1e-2") for k in ("transformer", "grassmann")}
    assert set(tables["sweep"]) == groups and finished == []
    for group, (spec, seeds) in tables["sweep"].items():
        assert spec.run_id == f"{group}-s0" and seeds == [0, 1]
        assert spec.train.lr == (1e-3 if "1e-3" in group else 1e-2)
    # Table 1 as the target: every run finished elsewhere, nothing to train, both seeds finished
    assert first_minute.tables_to_train(config, ["table1"], [done])[2:4] == ({}, [0, 1])
    with pytest.raises(
        CommandError,
        match="--targets lags: not a table of preset demo .* nor one "
        "of its grids \\(sweep, ablations\\)",
    ):
        first_minute.tables_to_train(config, ["lags"], [done])
    overlay = tmp_path / "window.yaml"
    decision = {"choice": ["false", "chunked"], "seeds": {"sweep": [0]}, "finished_seeds": []}
    first_minute.write_decision(overlay, name, p, {**decision, "finished": [str(done)]})
    got = yaml.safe_load(overlay.read_text())["presets"]["demo"]
    assert got["seeds"] == got["sweep"]["seeds"] == got["ablations"]["seeds"] == [0]


def test_groups_of_one_shape_are_timed_once(monkeypatch):
    """A sweep's values step alike (trials.shape: the model, batch and members, not the learning
    rate): the first minute times the first group of each shape, the others take its rows, said;
    the budget's smaller-group trials too (mutation: shape with the spec's lr in it times 4 groups,
    the smaller one twice)."""
    import dataclasses

    def at(kind, lr):
        s = _spec(kind)
        return dataclasses.replace(s, train=dataclasses.replace(s.train, lr=lr))

    tables = {
        "sweep": {
            f"table1_lr_{lr}-{k}": (at(k, lr), [0, 1])
            for lr in (1e-3, 1e-2)
            for k in ("transformer", "grassmann")
        }
    }
    calls = []
    real = trials.trial
    monkeypatch.setattr(trials, "trial", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    result = trials.choose(tables, IDS, 40, CPU, [trials.REFERENCE], box_s=600, timed_steps=2)
    assert [(s.model_kind, s.train.lr) for s in calls] == [
        ("transformer", 1e-3),
        ("grassmann", 1e-3),
    ] * 2
    rows = {(r["model"], r["status"]): r for r in result["rows"]}
    copied = rows["table1_lr_0.01-grassmann", "ok"]
    assert copied["timed_as"] == "sweep table1_lr_0.001-grassmann"
    assert copied["step_s"] == rows["table1_lr_0.001-grassmann", "ok"]["step_s"]
    assert len(result["rows"]) == 8 and result["choice"] == trials.REFERENCE
    assert (
        "sweep table1_lr_0.01-transformer: timed as sweep table1_lr_0.001-transformer, its shape"
        in result["lines"]
    )
    assert "ok (timed as sweep table1_lr_0.001-grassmann)" in trials.to_markdown(result, "cpu")
    # the budget's smaller groups: one trial a shape
    monkeypatch.setattr(first_minute, "trial", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    calls.clear()
    measure = first_minute.boxed(IDS, 40, CPU, trials.REFERENCE, 2, time.perf_counter() + 600)
    assert measure(at("transformer", 1e-3), [0]) == measure(at("transformer", 1e-2), [0]) > 0
    assert len(calls) == 1
