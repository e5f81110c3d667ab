"""A disk that fills under a real `snakemake`: the pipeline's results on a small tmpfs (its logs
beside it, on a disk with room), filled while each kind of job that writes is about to write (the
data stages, a training job between two checkpoints, the evaluations, the tables). Each job fails
with an `error:` line in its log naming its file and the lack of space; nothing that looks complete
is left; the last good checkpoint stays and loads; once space is freed the same command goes on (the
training resumes) and the table equals the uninterrupted demo's. Needs root to mount (CI runs as root)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from helpers.dag import BIN, assert_same_tables, copy_repo, pipeline_env, snakemake

PRESET = "demo_disk"
OVERLAY = {"presets": {PRESET: {"base": "demo", "models": ["grassmann"], "seeds": [0], "experiments": {"table2": None},
                                "ablations": None, "snli": None, "recall": None}}}
RUNS = ("table1-grassmann-s0",)


def _fill(fs: Path) -> None:
    """The file system full: a filler file written until it refuses more."""
    with open(fs / "filler", "ab") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def _free(fs: Path) -> None:
    (fs / "filler").unlink()


def _errors(logs: Path, rule: str) -> list[str]:
    """The `error:` lines of a rule's job logs (logs/<rule>.log, or logs/<rule>/<job>.log)."""
    files = [logs / f"{rule}.log"] if (logs / f"{rule}.log").is_file() else sorted((logs / rule).glob("*.log"))
    return [line for f in files for line in f.read_text().splitlines() if line.startswith("error: ")]


@pytest.mark.slow
def test_a_full_disk_fails_each_job_by_name_and_the_rerun_ends_as_the_demo(demo, tmp_path):
    import yaml

    from grassflow.checkpoint import load_checkpoint

    (tmp_path / "work").mkdir()
    work = copy_repo(tmp_path / "work")
    (work / "disk.yaml").write_text(yaml.safe_dump(OVERLAY))
    fs = work / "results"
    fs.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(fs)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}): needs root")
    try:
        logs = tmp_path / "logs"  # the jobs' logs on a disk with room, so that they can say what failed
        logs.mkdir()
        (fs / PRESET).mkdir()
        (fs / PRESET / "logs").symlink_to(logs)
        runs = fs / PRESET / "runs"

        def run(*args, check=False):
            return snakemake(work, "table1", "--configfile", "disk.yaml", *args, preset=PRESET, check=check)

        # the data stages: the download cannot write its first file
        _fill(fs)
        assert run().returncode != 0
        said = _errors(logs, "download")
        assert said and "no space left on its file system" in said[0] and f"results/{PRESET}/data/raw/" in said[0], said
        assert not list((fs / PRESET / "data" / "raw").glob("*.parquet"))
        _free(fs)

        # a training job between two checkpoints: the disk fills once its first is written
        proc = subprocess.Popen([str(BIN / "snakemake"), "table1", "--cores", "2", "--configfile", "disk.yaml",
                                 "--config", f"preset={PRESET}"], cwd=work, env=pipeline_env(work),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not any((runs / r / "last.pt").exists() for r in RUNS):
            time.sleep(0.02)
        _fill(fs)
        assert proc.wait(timeout=1200) != 0
        stopped = [r for r in RUNS if (runs / r / "last.pt").exists()]
        assert stopped, "no training job had checkpointed"
        for r in stopped:
            said = _errors(logs, "train")
            assert any("no space left on its file system" in line and f"runs/{r}/" in line for line in said), said
            assert load_checkpoint(runs / r / "last.pt")["pos"]  # the last good one, whole
            assert not (runs / r / "run.json").exists() and not [p for p in (runs / r).iterdir() if ".tmp" in p.name]
        _free(fs)
        assert run("--until", "train", "documents", "unigram", check=True).returncode == 0
        assert any("[train] resuming" in (logs / "train" / f"{r}.log").read_text() for r in stopped)

        # the evaluations, then the tables
        for rule, until in (("evaluate", ["--until", "evaluate"]), ("aggregate", [])):
            _fill(fs)
            assert run().returncode != 0
            said = _errors(logs, rule)
            assert said and all("no space left on its file system" in line for line in said), said
            _free(fs)
            assert run(*until, check=True).returncode == 0
        assert "Nothing to be done" in run("-n").stdout
        assert_same_tables(demo, work, names=["table1"], subset=PRESET)
    finally:
        subprocess.run(["umount", "--lazy", str(fs)], check=False)
