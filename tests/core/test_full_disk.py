"""A file system that fills mid-write (a real tmpfs, mounted small): every writer goes through
io.atomic_path, so the job fails with one `error:` line naming the file and the lack of space, the
temporary file is gone, and a complete file already there (the last checkpoint) is untouched; once
space is freed the same write succeeds. Needs root to mount (CI runs as root)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from grassflow import job
from grassflow.checkpoint import load_checkpoint, save_checkpoint
from grassflow.errors import DiskSpaceError
from grassflow.io import write_text


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs; skipped where this user cannot mount one."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}): needs root")
    yield mnt
    # lazy: a file a failed writer left open cannot keep it
    subprocess.run(["umount", "--lazy", str(mnt)], check=True)


def _fill(mnt, leave: int):
    """A file filling the file system up to `leave` bytes free."""
    import shutil

    free = shutil.disk_usage(mnt).free
    (mnt / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_checkpoint_that_finds_the_disk_full_keeps_the_last_one(small_fs, capfd):
    last = small_fs / "last.pt"
    save_checkpoint(last, {"step": 1, "w": torch.ones(1000)})
    before = last.read_bytes()
    _fill(small_fs, leave=100_000)  # less than the next checkpoint's 400 kB: it fails mid-write
    rc = job.run(save_checkpoint, last, {"step": 2, "w": torch.ones(100_000)})
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert (
        err[0].startswith(f"error: {last}: no space left on its file system")
        and "untouched" in err[0]
    )
    assert last.read_bytes() == before and load_checkpoint(last)["step"] == 1  # the last good one
    # no temporary file left
    assert sorted(p.name for p in small_fs.iterdir()) == [
        "filler",
        "last.pt",
    ]
    (small_fs / "filler").unlink()  # space freed: the same write succeeds
    save_checkpoint(last, {"step": 2, "w": torch.ones(100_000)})
    assert load_checkpoint(last)["step"] == 2


@pytest.mark.parametrize("writer", ["table", "parquet", "figure", "weights", "best state"])
def test_every_kind_of_file_a_job_writes_fails_by_name_on_a_full_disk(writer, small_fs):
    import matplotlib.pyplot as plt
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grassflow.checkpoint import save_data, save_weights
    from grassflow.io import atomic_path
    from grassflow.report.figures import save

    _fill(small_fs, leave=2_000)
    target = (
        small_fs
        / {
            "table": "table1.md",
            "parquet": "train.parquet",
            "figure": "gap.png",
            "weights": "model.safetensors",
            "best state": "best_state.pt",
        }[writer]
    )
    with pytest.raises(DiskSpaceError, match=f"^{target}: no space left on its file system"):
        if writer == "table":
            write_text(target, "x" * 100_000)
        elif writer == "parquet":
            with atomic_path(target) as tmp:
                pq.write_table(pa.table({"ids": list(range(200_000))}), tmp)
        elif writer == "figure":
            fig, ax = plt.subplots(figsize=(20, 20))
            ax.imshow(torch.rand(500, 500).numpy())
            save(fig, target)
        elif writer == "weights":
            save_weights(target, {"w": torch.rand(100_000)})
        # the loop's best weights so far (torch's own file writer would say only `iostream error`)
        else:
            save_data(target, {"model": {"w": torch.rand(100_000)}, "epoch": 1})
    # nothing that looks complete, no temporary
    assert [p.name for p in small_fs.iterdir()] == ["filler"]
