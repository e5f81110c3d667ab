"""A tracker that fails mid-run never kills the run (grassflow.trackers.Trackers), through the real
DAG:
train.trackers: [mlflow] with its store (MLFLOW_TRACKING_URI, as a cluster would name a server's)
made unusable once the run's first epoch is recorded. In process, with TensorBoard beside it:
tests/core/test_trackers.py."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from helpers.dag import BIN, copy_repo, pipeline_env

RUN = "table1-grassmann-s0"
OVERLAY = {
    "presets": {
        "demo_tracked": {
            "base": "demo",
            "models": ["grassmann"],
            "seeds": [0],
            "experiments": {"table2": None},
            "ablations": None,
            "sweep": None,
            "snli": None,
            "recall": None,
            "train": {"trackers": ["mlflow"]},
        }
    }
}


@pytest.mark.slow
def test_a_tracker_store_damaged_mid_run_leaves_the_run_and_its_table_whole(tmp_path):
    """The store's file overwritten after the first epoch (a store on a disk gone bad; a read-only
    remount is refused while SQLite holds the file open): the run trains its epochs, its table is
    written, its log warns once, and run.json says which tracker failed and when (mutation: a
    tracker's failure propagated, as before: the training job fails and no table is written)."""
    (tmp_path / "work").mkdir()
    work = copy_repo(tmp_path / "work")
    (work / "tracked.yaml").write_text(yaml.safe_dump(OVERLAY))
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    env = {**pipeline_env(work), "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    metrics = work / "results/demo_tracked/runs" / RUN / "metrics.jsonl"
    proc = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "table1",
            "--cores",
            "2",
            "--configfile",
            "tracked.yaml",
            "--config",
            "preset=demo_tracked",
        ],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    while proc.poll() is None and not (metrics.exists() and metrics.read_text().strip()):
        time.sleep(0.01)
    assert store.is_file()  # the runs logged to the store the variable names
    store.write_bytes(b"this is not an SQLite database\n" * 512)
    out, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-3000:]
    rec = json.loads(metrics.with_name("run.json").read_text())
    assert rec["status"]["state"] == "completed" and rec["epochs_completed"] == 3
    (failed,) = rec["trackers_failed"]
    assert failed["tracker"] == "mlflow" and failed["run"] == RUN and failed["at"] > 0, failed
    # its table, written
    assert "### table1:" in (work / "results/demo_tracked/report/table1.md").read_text()
    log = (work / "results/demo_tracked/logs/train" / f"{RUN}.log").read_text()
    assert log.count("warning: tracker mlflow failed") == 1
