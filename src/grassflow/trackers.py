"""Live training curves (`train.trackers`): TensorBoard event files, Weights & Biases runs, MLflow
runs.

The loop hands every tracker Python floats it already has at its periodic host sync (every
`train.log_every` steps: the window's mean loss and gradient norm, the learning rate, the
throughput) and each epoch's validation metrics, at the run's global step; a tracker never reads a
tensor, so it adds no host sync. Each tracker is an optional extra, imported only when chosen
(`pip install 'grassflow[tensorboard]'`, `'grassflow[wandb]'`); one that cannot start is an error
before the first step, naming the setting.

- tensorboard: event files in `<run dir>/tensorboard/` (`tensorboard --logdir results/`), the
  spec as the run's hyperparameters and as text.
- wandb: a run named after the run id, the spec as its config, in `<run dir>/wandb/`; offline
  unless WANDB_MODE says otherwise (`wandb sync <run dir>/wandb/offline-run-*` later, from a
  node with internet); project WANDB_PROJECT (default "grassflow").
- mlflow: one store for a results tree, `<tree>/mlflow.db` (SQLite, MLflow's local store for
  its version 3: the file store is deprecated; its artifacts in `<tree>/mlartifacts/`), the tree
  being the directory that holds `<preset>/` (results/), else the run's own directory; or
  MLFLOW_TRACKING_URI's. An experiment per table, `<preset>/<table>` (MLFLOW_EXPERIMENT_NAME's
  where set), so that `mlflow ui --backend-store-uri sqlite:///results/mlflow.db` shows a table's
  runs side by side; a run named after its run id, tagged with its directory, the spec as its
  parameters, the curves as its metrics, metrics.jsonl as an artifact at the end. A resumed run
  continues its MLflow run; a run started afresh marks an abandoned attempt's deleted. Several
  runs at once write the one store: its creation and a table's experiment are made under a file
  lock, and SQLite waits for the others' writes (MLflow's store creates its schema once).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from grassflow.errors import ConfigError

CHOICES = ("tensorboard", "wandb", "mlflow")


def _flat(d: dict, prefix: str = "") -> dict:
    """A nested spec as hparams: dotted keys, values a scalar or their JSON text."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, int | float | str | bool) else json.dumps(v)
    return out


class TensorBoard:
    def __init__(self, spec: dict, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        for summary in hparams(_flat(spec), {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("spec", "```json\n" + json.dumps(spec, indent=1) + "\n```")

    def log(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, spec: dict, out_dir: Path):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "grassflow"),
            name=spec["run_id"],
            config=spec,
            dir=str(out_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
        )

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def _tree(spec: dict, out_dir: Path) -> Path:
    """The results tree a run's directory is in: the parent of its `<preset>/` (results/), else the
    run's own directory."""
    out = out_dir.resolve()
    return next((p.parent for p in out.parents if p.name == spec.get("preset")), out)


class MLflow:
    def __init__(self, spec: dict, out_dir: Path, fresh: bool = True):
        import fcntl

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.out_dir, tree = out_dir, _tree(spec, out_dir)
        # a server (or any store) the user names, else the tree's SQLite store, which waits a minute
        # for another run's write (its default, 5 s, is short for a busy disk): one machine's
        # (tracking.md)
        given = os.environ.get("MLFLOW_TRACKING_URI")
        uri = given or f"sqlite:///{tree / 'mlflow.db'}?timeout=60"
        name = (
            os.environ.get("MLFLOW_EXPERIMENT_NAME")
            or f"{spec.get('preset')}/{spec.get('experiment') or spec.get('task')}"
        )
        where = (
            str(out_dir.resolve().relative_to(tree))
            if out_dir.resolve().is_relative_to(tree)
            else str(out_dir)
        )
        tree.mkdir(parents=True, exist_ok=True)
        with open(
            tree / ".mlflow.lock", "w"
        ) as lock:  # the tree store's schema and the experiment, made once
            # a server orders its own writes; a lock on a cluster's file system may not hold
            if not given:
                fcntl.flock(lock, fcntl.LOCK_EX)
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(name)
            exp_id = (
                exp.experiment_id
                if exp
                else self.client.create_experiment(
                    name, artifact_location=(tree / "mlartifacts" / name).as_uri()
                )
            )
        runs = self.client.search_runs(
            [exp_id],
            f"tags.`grassflow.run_dir` = '{where}'",
            order_by=["attributes.start_time DESC"],
        )
        if runs and not fresh:  # a resumed run continues its MLflow run
            self.run_id = runs[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        for old in runs:  # an abandoned attempt's curves are not this run's
            self.client.delete_run(old.info.run_id)
        self.run_id = self.client.create_run(
            exp_id, run_name=spec["run_id"], tags={"grassflow.run_dir": where}
        ).info.run_id
        params = [Param(k, str(v)) for k, v in _flat(spec).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, values: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()]
        )

    def close(self) -> None:
        metrics = self.out_dir / "metrics.jsonl"
        if metrics.is_file():
            self.client.log_artifact(self.run_id, str(metrics))
        self.client.set_terminated(self.run_id)


# each tracker's directory in the run directory (MLflow's: the tree's store)
DIRS = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
}


class Trackers:
    """The chosen trackers as one: log(values, step) to each, close() all. A run started afresh
    (`fresh`) starts its trackers' directories afresh: an abandoned attempt's curves are not this
    run's; a resumed run appends to them. A tracker that cannot start stops the run before its first
    step; one that fails later (its store locked, read-only, unreachable) is dropped with one
    warning in the job's log, the run trains on, and `failed` says which and when (run.json's
    trackers_failed): a run of hours does not die for its curves."""

    def __init__(self, names, spec: dict, out_dir, fresh: bool = True):
        self.open, self.failed, self.run_id = [], [], spec.get("run_id")
        if fresh:
            import shutil

            for name in DIRS.values():
                shutil.rmtree(Path(out_dir) / name, ignore_errors=True)
        for name in names or ():
            if name not in CHOICES:
                raise ConfigError(
                    f"train.trackers: unknown tracker {name!r} (choices: {', '.join(CHOICES)})"
                )
            try:
                self.open.append(
                    (
                        name,
                        MLflow(spec, Path(out_dir), fresh)
                        if name == "mlflow"
                        else {"tensorboard": TensorBoard, "wandb": WandB}[name](
                            spec, Path(out_dir)
                        ),
                    )
                )
            except Exception as e:  # ImportError without the extra, or the tracker's own refusal
                self.close()
                raise ConfigError(
                    f"train.trackers: {name!r} could not start ({type(e).__name__}: {e}); "
                    f"install it with pip install 'grassflow[{name}]', or leave it out"
                ) from e

    def _each(self, call, step: int | None) -> None:
        for name, tracker in list(self.open):
            try:
                call(tracker)
            except Exception as e:  # any tracker's failure: its curves stop, the run goes on
                self.open.remove((name, tracker))
                said = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                self.failed.append(
                    {
                        "tracker": name,
                        "run": self.run_id,
                        "step": step,
                        "at": time.time(),
                        "error": said,
                    }
                )
                print(
                    f"[train] warning: tracker {name} failed at step {step} ({said}); the run "
                    "trains on without it (run.json: trackers_failed)",
                    file=sys.stderr,
                )
                with contextlib.suppress(Exception):
                    tracker.close()

    def log(self, values: dict, step: int) -> None:
        self._each(lambda t: t.log(values, step), step)

    def close(self) -> None:
        self._each(lambda t: t.close(), None)
        self.open = []
