"""`make gpu-paper-window`'s plumbing on the CPU (bench/gpu_paper_window.sh), with the demo preset
in place of paper_v1: the preflight, the profile (its graph capture refused off CUDA: the window
then runs eager and says so), `snakemake table1` with fused seeds; stopped at its deadline (here:
SIGUSR1 once a group has checkpointed), its training jobs (and no other pipeline's) checkpoint and
exit 75, and the same command again resumes them and makes the table; what comes back holds no
weights or checkpoints."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from pipeline import BIN, ROOT, copy_repo, pipeline_env
from procs import HANG

pytestmark = pytest.mark.slow


def _window(work, out, deadline=3000):
    env = {**pipeline_env(work), "PY": str(BIN / "python"), "PRESET": "demo", "TARGETS": "table1",
           "CONFIGFILES": "config.yaml", "PREFLIGHT": "results/demo/preflight/cpu_auto.json", "DEADLINE": str(deadline),
           "THREADS": "1", "PROFILE_ARGS": "--device cpu --quick", "BENCH_ARGS": "--device cpu --quick --parts fused",
           "OUT": str(out)}
    return subprocess.Popen(["bash", "bench/gpu_paper_window.sh"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_gpu_window_stops_at_its_deadline_and_resumes(tmp_path):
    (tmp_path / "work").mkdir()
    work = copy_repo(tmp_path / "work")
    shutil.copytree(ROOT / "bench", work / "bench")
    # another pipeline's training job on the same machine (here: a process whose command line reads as one)
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "grassflow.lm.train ",
                              "--out-dir", "another/pipeline"])
    proc = _window(work, tmp_path / "first")
    fused = work / "results/demo/fused"
    t0 = time.time()
    while not list(fused.glob("*/last.pt")):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() - t0 < HANG, "no group checkpointed"
        time.sleep(1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode != 0, out[-3000:]  # the interrupted jobs failed: Snakemake says so
    log = (tmp_path / "first/window.log").read_text()
    assert "deadline: SIGTERM to the training jobs" in log and "warning: the profile under compile graph failed" in log
    logs = "".join(p.read_text() for p in (work / "results/demo/logs/train_fused").glob("*.log"))
    assert "SIGTERM: checkpointed at epoch" in logs
    assert not list((work / "results/demo/runs").glob("*/run.json"))  # an interrupted run never looks complete
    assert decoy.poll() is None, "the deadline signalled a training job that was not the window's"
    decoy.kill()

    proc = _window(work, tmp_path / "second")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, out[-3000:]
    logs = "".join(p.read_text() for p in (work / "results/demo/logs/train_fused").glob("*.log"))
    assert logs.count("[train] resuming") >= 1
    assert (work / "results/demo/report/table1.md").is_file()
    with tarfile.open(tmp_path / "second/records.tar.gz") as tar:
        names = tar.getnames()
    assert "results/demo/report/table1.md" in names and "results/demo/runs/table1-grassmann-s1/run.json" in names
    assert not [n for n in names if n.endswith((".pt", ".safetensors", ".parquet"))]
    assert all(p.stat().st_size < 16 * 2**20 for p in (tmp_path / "second").iterdir())
    assert len(list((tmp_path / "second").iterdir())) <= 8
