"""The workflow where users keep results: the checkout in one place, the results in another.

Run as `snakemake -s <checkout>/Snakefile --directory <scratch>` (config.yaml copied there), and as
the Snakemake workflow catalog deploys a published workflow (snakedeploy's `module` with
`use rule * from`, the user's own `config/config.yaml` beside it), a part of the demo (one model,
one seed, Table 1) runs from a user's directory: its results under that directory, its tables equal
to the demo's rows of the same runs, and nothing written into the checkout (Python's bytecode cache
aside)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from helpers.dag import BIN, assert_same_tables, copy_repo, pipeline_env

PRESET = "demo_elsewhere"
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
# snakedeploy deploy-workflow's workflow/Snakefile, with the module read from a local clone (the
# jobs run the grassflow installed from it)
MODULE = """configfile: "config/config.yaml"


module grassflow:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from grassflow
"""


def _files(root):
    """Every file under `root` with its size and modification time, Python's bytecode cache
    aside."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.slow
@pytest.mark.parametrize("how", ["directory", "module"])
def test_the_demo_runs_from_a_users_directory(how, demo, tmp_path):
    (tmp_path / "checkout").mkdir()
    checkout = copy_repo(tmp_path / "checkout")
    before = _files(checkout)
    user = tmp_path / "user"
    if how == "directory":  # results on scratch: the checkout's Snakefile, the user's config
        user.mkdir()
        shutil.copy(checkout / "config.yaml", user / "config.yaml")
        (user / "elsewhere.yaml").write_text(yaml.safe_dump(OVERLAY))
        # from another directory: the command line's config files as the shell gives them (here:
        # absolute)
        args = [
            "-s",
            str(checkout / "Snakefile"),
            "--directory",
            str(user),
            "--configfile",
            str(user / "config.yaml"),
            str(user / "elsewhere.yaml"),
        ]
    else:  # deployed: the user's Snakefile a module of the checkout's, its config/ the user's
        (user / "workflow").mkdir(parents=True)
        (user / "config").mkdir()
        (user / "workflow/Snakefile").write_text(MODULE.format(snakefile=checkout / "Snakefile"))
        shutil.copy(checkout / "config.yaml", user / "config/config.yaml")
        (user / "config/elsewhere.yaml").write_text(yaml.safe_dump(OVERLAY))
        args = ["--configfile", "config/config.yaml", "config/elsewhere.yaml"]
    res = subprocess.run(
        [str(BIN / "snakemake"), "table1", "--cores", "2", *args, "--config", f"preset={PRESET}"],
        cwd=user if how == "module" else tmp_path,
        env=pipeline_env(checkout),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert (user / f"results/{PRESET}/report/table1.md").is_file()
    assert_same_tables(demo, user, names=["table1"], subset=PRESET)
    assert _files(checkout) == before, sorted(set(_files(checkout)) ^ set(before))
    assert not (checkout / "results").exists() and not (checkout / ".snakemake").exists()
    # and planned again from there: nothing to do
    again = subprocess.run(
        [
            str(BIN / "snakemake"),
            "table1",
            "-n",
            "--cores",
            "2",
            *args,
            "--config",
            f"preset={PRESET}",
        ],
        cwd=user if how == "module" else tmp_path,
        env=pipeline_env(checkout),
        capture_output=True,
        text=True,
    )
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    assert os.listdir(user)
