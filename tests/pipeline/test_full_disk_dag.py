"""A disk that fills under a real `snakemake`: the pipeline's results on a small tmpfs, its jobs'
logs on it too (as a scratch quota holds both), filled while each kind of job that writes is about
to write (the data stages, a training job between two checkpoints, the evaluations, the tables).
Each job fails with one `error:` line naming its file and the lack of space, in Snakemake's output,
where the user looks (the log that would hold it is on the full disk); nothing that looks complete
is left; the last good checkpoint stays and loads; once space is freed the same command goes on (the
training resumes) and the table equals the uninterrupted demo's. Needs root to mount (CI runs as
root)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from helpers.dag import BIN, assert_same_tables, copy_repo, pipeline_env, snakemake

PRESET = "demo_disk"
OVERLAY = {
    "presets": {
        PRESET: {
            "base": "demo",
            "models": ["grassmann"],
            "seeds": [0],
            "experiments": {"table2": None},
            "ablations": None,
            "snli": None,
            "recall": None,
        }
    }
}
RUNS = ("table1-grassmann-s0",)


def _fill(fs: Path) -> None:
    """The file system full, to its last page: a filler file written until it refuses a byte."""
    with open(fs / "filler", "ab", buffering=0) as f:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass


def _free(fs: Path) -> None:
    (fs / "filler").unlink()


def _errors(output: str) -> list[str]:
    """The jobs' `error:` lines in Snakemake's output."""
    return [line for line in output.splitlines() if line.startswith("error: ")]


@pytest.mark.slow
def test_a_full_disk_fails_each_job_by_name_and_the_rerun_ends_as_the_demo(demo, tmp_path):
    import yaml

    from grassflow.checkpoint import load_checkpoint

    (tmp_path / "work").mkdir()
    work = copy_repo(tmp_path / "work")
    (work / "disk.yaml").write_text(yaml.safe_dump(OVERLAY))
    fs = work / "results"
    fs.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(fs)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}): needs root")
    try:
        logs = fs / PRESET / "logs"  # the jobs' logs on the full disk too
        runs = fs / PRESET / "runs"

        def run(*args, check=False):
            res = snakemake(
                work, "table1", "--configfile", "disk.yaml", *args, preset=PRESET, check=check
            )
            return res, res.stdout + res.stderr

        def failed_in(output: str, rule: str, where: str) -> None:
            """A job of `rule` failed, its one line (its file, and space) in Snakemake's output."""
            said = _errors(output)
            assert f"Error in rule {rule}:" in output and said, output[-3000:]
            assert all("no space left on its file system" in line for line in said), said
            assert any(where in line for line in said), said

        # the data stages: the download cannot write its first file
        _fill(fs)
        res, out = run()
        assert res.returncode != 0
        failed_in(out, "download", f"results/{PRESET}/data/raw/")
        assert not list((fs / PRESET / "data" / "raw").glob("*.parquet"))
        _free(fs)

        # a training job between two checkpoints: the disk fills once its first is written
        proc = subprocess.Popen(
            [
                str(BIN / "snakemake"),
                "table1",
                "--cores",
                "2",
                "--configfile",
                "disk.yaml",
                "--config",
                f"preset={PRESET}",
            ],
            cwd=work,
            env=pipeline_env(work),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while proc.poll() is None and not any((runs / r / "last.pt").exists() for r in RUNS):
            time.sleep(0.02)
        _fill(fs)
        out, _ = proc.communicate(timeout=1200)
        assert proc.returncode != 0
        stopped = [r for r in RUNS if (runs / r / "last.pt").exists()]
        assert stopped, "no training job had checkpointed"
        for r in stopped:
            failed_in(out, "train", f"runs/{r}/")
            assert load_checkpoint(runs / r / "last.pt")["pos"]  # the last good one, whole
            assert not (runs / r / "run.json").exists() and not [
                p for p in (runs / r).iterdir() if ".tmp" in p.name
            ]
        _free(fs)
        assert run("--until", "train", "documents", "unigram", check=True)[0].returncode == 0
        assert any("[train] resuming" in (logs / "train" / f"{r}.log").read_text() for r in stopped)

        # the evaluations, then the tables
        for rule, until, where in (
            ("evaluate", ["--until", "evaluate"], "eval.json"),
            ("aggregate", [], "report/"),
        ):
            _fill(fs)
            res, out = run()
            assert res.returncode != 0
            failed_in(out, rule, where)
            _free(fs)
            assert run(*until, check=True)[0].returncode == 0
        assert "Nothing to be done" in run("-n")[1]
        assert_same_tables(demo, work, names=["table1"], subset=PRESET)
    finally:
        subprocess.run(["umount", "--lazy", str(fs)], check=False)
