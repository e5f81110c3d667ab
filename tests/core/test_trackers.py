"""train.trackers: what the loop sends to TensorBoard and to an offline W&B run, read back from the
files each tracker wrote (the event file; the offline run's record log), against the loop's own
numbers: the windows' losses make up each epoch's train_loss, the gradient norms are
clip_grad_norm_'s, the learning rate lr_at's, the validation metrics metrics.jsonl's. The host-sync
count with trackers on: tests/core/test_train_step.py; the demo's event files:
tests/pipeline/test_demo_outputs.py."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import sys

import pytest
import torch

from grassflow.errors import ConfigError
from grassflow.loop import fit
from helpers.procs import import_or_skip
from helpers.records import tensorboard_scalars
from helpers.steps import Toy, toy_spec

import_or_skip("tensorboard", module_level=True)
import_or_skip("wandb", module_level=True)
import_or_skip("mlflow", module_level=True)

STEPS, LOG_EVERY = Toy.steps_per_epoch, 3
WINDOWS = [3, 6, 9, 10]  # the log steps within an epoch: every LOG_EVERY, and the epoch's last


def tensorboard_hparams(log_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    events = EventAccumulator(str(log_dir))
    events.Reload()
    out = {}
    for content in events.PluginTagToContent("hparams").values():
        data = HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            out.update(
                {
                    k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                    for k, v in data.session_start_info.hparams.items()
                }
            )
    return out


def wandb_records(path):
    """The records of an offline W&B run (run-*.wandb): a LevelDB-style log of 32 KiB blocks after a
    7-byte header, each chunk (crc32c, length, type) and protobuf Records inside."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, pos, pending = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header: padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending, pos = pending + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or a record's last chunk
            yield Record.FromString(pending)
            pending = b""


def wandb_run(run_dir) -> tuple[dict, dict, dict]:
    """(the run record: name, config; history: {key: [(step, value)]})."""
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    name, config, history = None, {}, {}
    for r in wandb_records(log):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            name = r.run.display_name
            config = {
                u.key: json.loads(u.value_json) for u in r.run.config.update if u.key != "_wandb"
            }
        elif kind == "history":
            for item in r.history.item:
                # "train/loss" is stored as a nested key
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                    history.setdefault(key, []).append(
                        (r.history.step.num, json.loads(item.value_json))
                    )
    return name, config, history


@pytest.fixture
def tracked_run(tmp_path, monkeypatch):
    """The toy task for three epochs with both trackers on; clip_grad_norm_'s results kept."""
    norms = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording(*a, **k):
        norm = clip(*a, **k)
        norms.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline: the default
    spec = toy_spec(log_every=LOG_EVERY)
    torch.manual_seed(0)
    status, metrics, ran = fit(
        torch.nn.Linear(3, 1),
        Toy(),
        spec,
        tmp_path,
        torch.device("cpu"),
        header={},
        execution={"trackers": ["tensorboard", "wandb", "mlflow"]},
    )
    # run.json's
    assert status == {"state": "completed"} and ran["trackers"] == [
        "tensorboard",
        "wandb",
        "mlflow",
    ]
    return spec, metrics, norms, tmp_path


def _lr_by_hand(step: int, total: int, t: dict) -> float:
    """The schedule docs/scale/training-step.md states, written here apart from loop.lr_at: linear
    warm-up to lr over max(1, ⌊warmup_frac · total⌋) steps, then a cosine to min_lr_frac · lr."""
    warmup = max(1, math.floor(t["warmup_frac"] * total))
    if step < warmup:
        return t["lr"] * (step + 1) / warmup
    floor = t["min_lr_frac"] * t["lr"]
    return (
        floor
        + (t["lr"] - floor)
        * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))
        / 2
    )


def _check_curves(curves, spec, metrics, norms, rel):
    steps = [e * STEPS + w for e in range(3) for w in WINDOWS]
    assert {k: [s for s, _ in v] for k, v in curves.items()} == {
        "train/loss": steps,
        "train/grad_norm": steps,
        "train/lr": steps,
        "train/items_per_s": steps,
        "val/loss": [10, 20, 30],
    }
    losses, grads, lrs = (dict(curves[k]) for k in ("train/loss", "train/grad_norm", "train/lr"))
    for e, row in enumerate(metrics):
        bounds = [e * STEPS] + [e * STEPS + w for w in WINDOWS]
        # the windows' mean losses, weighted by their steps, are the epoch's train_loss
        total = sum(losses[b] * (b - a) for a, b in zip(bounds, bounds[1:]))
        assert total / STEPS == pytest.approx(row["train_loss"], rel=rel)
        for a, b in zip(bounds, bounds[1:]):
            assert grads[b] == pytest.approx(sum(norms[a:b]) / (b - a), rel=rel)
            assert lrs[b] == pytest.approx(_lr_by_hand(b - 1, 3 * STEPS, spec["train"]), rel=rel)
    assert [v for _, v in curves["val/loss"]] == pytest.approx(
        [m["val_loss"] for m in metrics], rel=rel
    )
    assert all(v > 0 for _, v in curves["train/items_per_s"])


def test_tensorboard_event_files_hold_the_loops_curves_and_the_spec(tracked_run):
    spec, metrics, norms, out = tracked_run
    # float32 in the file
    _check_curves(tensorboard_scalars(out / "tensorboard"), spec, metrics, norms, rel=1e-6)
    hparams = tensorboard_hparams(out / "tensorboard")
    assert hparams["run_id"] == "toy" and hparams["train.lr"] == spec["train"]["lr"]
    assert hparams["train.betas"] == json.dumps(spec["train"]["betas"])


def test_the_offline_wandb_run_holds_the_loops_curves_named_after_the_run(tracked_run):
    spec, metrics, norms, out = tracked_run
    name, config, history = wandb_run(out)
    assert name == spec["run_id"] and config == json.loads(json.dumps(spec))
    _check_curves(history, spec, metrics, norms, rel=1e-12)


def mlflow_run(run_dir) -> tuple[str, dict, dict, list[str]]:
    """(name, parameters, {metric: [(step, value)]}, artifacts) of the one MLflow run in the store
    of a run outside a results tree (<run_dir>/mlflow.db), experiment <preset>/<table>, read through
    MLflow's own client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "test/t"]
    (run,) = client.search_runs([exp.experiment_id])
    history = {
        k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
        for k in run.data.metrics
    }
    return (
        run.info.run_name,
        run.data.params,
        history,
        [a.path for a in client.list_artifacts(run.info.run_id)],
    )


def test_the_mlflow_store_holds_the_loops_curves_and_the_spec(tracked_run):
    spec, metrics, norms, out = tracked_run
    name, params, history, artifacts = mlflow_run(out)
    assert name == spec["run_id"] and params["train.lr"] == str(spec["train"]["lr"])
    assert params["train.betas"] == json.dumps(spec["train"]["betas"])
    _check_curves(history, spec, metrics, norms, rel=1e-12)
    assert artifacts == ["metrics.jsonl"]


class _Stopped(Toy):
    """The toy task whose job gets SIGTERM at epoch 2, step 5: the loop checkpoints and exits 75."""

    def batch(self, epoch, step):
        if (epoch, step) == (1, 5):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().batch(epoch, step)


def test_a_resumed_run_is_one_mlflow_run_and_a_restarted_one_leaves_no_other(tmp_path):
    """Stopped in its second epoch and resumed, a run is one MLflow run holding its three epochs'
    validation losses, the metrics.jsonl's; a run started afresh in the same directory (its last.pt
    gone) marks the abandoned attempt's run deleted."""
    from mlflow.tracking import MlflowClient

    spec = toy_spec(log_every=LOG_EVERY)

    def run(task):
        return fit(
            torch.nn.Linear(3, 1),
            task,
            spec,
            tmp_path,
            torch.device("cpu"),
            header={},
            execution={"trackers": ["mlflow"]},
        )

    torch.manual_seed(0)
    with pytest.raises(SystemExit) as stopped:
        run(_Stopped())
    assert stopped.value.code == 75
    torch.manual_seed(0)
    status, metrics, _ = run(Toy())
    assert status == {"state": "completed"} and len(metrics) == 3
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "test/t"]
    (found,) = client.search_runs([exp.experiment_id])
    assert found.info.run_name == "toy" and found.info.status == "FINISHED"
    history = sorted(client.get_metric_history(found.info.run_id, "val/loss"), key=lambda m: m.step)
    assert [m.value for m in history] == pytest.approx([m["val_loss"] for m in metrics], rel=1e-12)
    (tmp_path / "last.pt").unlink()  # the same run started afresh
    torch.manual_seed(0)
    run(Toy())
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id != found.info.run_id
    assert client.get_run(found.info.run_id).info.lifecycle_stage == "deleted"


@pytest.mark.parametrize(
    "names, says",
    [
        (["wandb"], "train.trackers: 'wandb' could not start (ModuleNotFoundError"),
        (
            ["tensorboard", "comet"],
            "train.trackers: unknown tracker 'comet' (choices: tensorboard, wandb, mlflow)",
        ),
    ],
)
def test_a_tracker_that_cannot_start_stops_the_run_before_its_first_step(
    names, says, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as without the extra: import wandb fails

    class Untouchable(Toy):
        def batch(self, epoch, step):
            raise AssertionError("a step ran")

    with pytest.raises(ConfigError) as e:
        fit(
            torch.nn.Linear(3, 1),
            Untouchable(),
            toy_spec(),
            tmp_path,
            torch.device("cpu"),
            header={},
            execution={"trackers": names},
        )
    assert str(e.value).startswith(says)
    assert not (tmp_path / "last.pt").exists() and not (tmp_path / "metrics.jsonl").exists()


def test_a_fresh_start_clears_the_trackers_directories_and_a_resume_appends(tmp_path, monkeypatch):
    """An abandoned attempt's curves are not the run's: a run started afresh starts its trackers'
    directories afresh; a resumed one keeps what its first part wrote and adds to it."""
    import grassflow.loop as loop

    class StopAt:  # SIGTERM as the loop sees it, at the 5th step boundary
        asked = 0

        def __call__(self, *a):
            pass

        @property
        def signal(self):
            StopAt.asked += 1
            return "SIGTERM" if StopAt.asked > 5 else None

    spec = toy_spec(log_every=LOG_EVERY)
    stale = tmp_path / "tensorboard" / "stale-attempt.events"
    stale.parent.mkdir()
    stale.write_text("an abandoned attempt's")
    monkeypatch.setattr(loop, "StopRequest", StopAt)
    with pytest.raises(SystemExit):
        fit(
            torch.nn.Linear(3, 1),
            Toy(),
            spec,
            tmp_path,
            torch.device("cpu"),
            header={},
            execution={"trackers": ["tensorboard"]},
        )
    first = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    # fresh: the stale file gone, this attempt's events
    assert not stale.exists() and len(first) == 1
    monkeypatch.undo()
    status, _, _ = fit(
        torch.nn.Linear(3, 1),
        Toy(),
        spec,
        tmp_path,
        torch.device("cpu"),
        header={},
        execution={"trackers": ["tensorboard"]},
    )
    assert status == {"state": "completed"}
    after = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert set(first) < set(after)  # resumed: the first part's events kept, the rest added


def test_a_tracker_that_fails_mid_run_is_dropped_and_the_run_trains_on(
    tmp_path, monkeypatch, capfd
):
    """The MLflow store named by MLFLOW_TRACKING_URI (honoured: the runs log there) damaged after
    the first epoch: the run completes its three epochs, TensorBoard keeps every curve, one warning
    in the log, and the record says which tracker failed, at which step (mutation: the failure
    propagated, as before, kills the run)."""
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")

    class Damaged(Toy):
        def batch(self, epoch, step):
            if (epoch, step) == (1, 0):  # the store on a disk that went bad after epoch 1
                db.write_bytes(b"this is not an SQLite database\n" * 512)
            return super().batch(epoch, step)

    spec = toy_spec(log_every=LOG_EVERY)
    (tmp_path / "run").mkdir()
    torch.manual_seed(0)
    status, metrics, ran = fit(
        torch.nn.Linear(3, 1),
        Damaged(),
        spec,
        tmp_path / "run",
        torch.device("cpu"),
        header={},
        execution={"trackers": ["tensorboard", "mlflow"]},
    )
    assert status == {"state": "completed"} and len(metrics) == 3
    (failed,) = ran["trackers_failed"]
    assert (failed["tracker"], failed["run"], failed["step"]) == (
        "mlflow",
        "toy",
        STEPS + WINDOWS[0],
    )
    assert failed["at"] > 0 and failed["error"]
    warnings = [line for line in capfd.readouterr().err.splitlines() if "warning: tracker" in line]
    assert len(warnings) == 1 and "tracker mlflow failed at step 13" in warnings[0]
    # the other tracker, whole
    assert len(tensorboard_scalars(tmp_path / "run" / "tensorboard")["val/loss"]) == 3
