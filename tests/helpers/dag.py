"""The DAG end to end, shared by the tests/pipeline/ files: a scratch copy of the repository, real
Snakemake runs and dry runs in it, and what they compare."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import yaml

from grassflow.planning import staleness
from helpers import ROOT
from helpers.warm_snakemake import WarmSnakemake

# run=, snli_run=, recall_run= (each task's rule file names its own)
RUN_WILDCARDS = r"(?:\w+_)?run"

BIN = Path(sys.executable).parent
COPY = [
    "Snakefile",
    "config.yaml",
    "workflow",
    "src",
    "kernels",
    "profiles",
    "envs",
    "pyproject.toml",
]


def copy_demo(demo: Path, dst: Path) -> Path:
    """The finished demo as its build left it, copied to dst (mtimes kept): from the snapshot the
    `demo` fixture takes, since the staleness tests edit and touch the demo itself while the SLURM
    tests copy it (a copy taken mid-edit replanned 13 jobs)."""
    shutil.copytree(demo.parent / "demo.pristine", dst, symlinks=True)
    return dst


def copy_repo(dst: Path) -> Path:
    """The files the workflow needs, in a scratch directory (so edits never touch the repo)."""
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def pipeline_env(work: Path) -> dict:
    """The venv's snakemake first, offline, importing the copy's package (its src/ on PYTHONPATH:
    the venv's is the repository's, and the Snakefile refuses a package that is not its own)."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(Path(work) / "src"),
    }


# the demo fixture's stand-in pool of two GPUs (grassflow.gpu_slots)
POOL_ENV = {"GRASSFLOW_GPUS": "0,1"}


def pool_flag(work, env) -> list[str]:
    """`grassflow gpus`'s flag for the stand-in pool and the demo's train.runs_per_gpu overlay."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "grassflow",
            "gpus",
            "--preset",
            "demo",
            "--configfile",
            str(work / "pool.yaml"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
        env={**pipeline_env(work), **env},
    ).stdout.split()


# Flags of a Snakemake command that runs no job: such a command runs in a fork of a process that has
# imported Snakemake once (helpers.warm_snakemake), every other as a process of its own.
NO_JOBS = {"-n", "--dry-run", "--dryrun", "--lint", "--list-rules"}
_WARM = WarmSnakemake()


def run_snakemake(args, cwd, env, timeout=2700) -> subprocess.CompletedProcess:
    """`snakemake *args` in `cwd` with environment `env` (whole), its output captured."""
    args = [str(a) for a in args]
    if NO_JOBS & set(args):
        return _WARM.run(args, cwd, env, timeout)
    return subprocess.run(
        [str(BIN / "snakemake"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def snakemake(cwd, *args, check=True, preset="demo", env=None):
    # --config last: a target right after it would be read as a config entry
    res = run_snakemake(
        ["--cores", "2", *args, "--config", f"preset={preset}"],
        cwd,
        {**pipeline_env(cwd), **(env or {})},
    )
    if check and res.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
        )
    return res


def plan_jobs(cwd, overlay: dict | None = None, targets=()) -> list[dict]:
    """The jobs of a dry run, from Snakemake's own plan in process
    (grassflow.pipeline.preview.dry_run, what `grassflow plan` reads) with each one's reasons read
    (`why`: grassflow.pipeline.preview.explain); `overlay`: preset keys for the demo, given as a
    --configfile (as a user changes a setting)."""
    from grassflow.pipeline.preview import explain
    from grassflow.planning.staleness import CODE_INDEX

    configfiles = []
    if overlay:
        path = Path(cwd) / "overlay.yaml"
        path.write_text(yaml.safe_dump({"presets": {"demo": overlay}}))
        configfiles.append(str(path))
    jobs = _WARM.plan(
        cwd, pipeline_env(cwd), targets=list(targets), configfiles=configfiles, preset="demo"
    )
    return [{**j, "why": explain(j["reason"], Path(cwd) / CODE_INDEX, Path(cwd))} for j in jobs]


def job_key(job: dict) -> tuple:
    """(rule, its run wildcard or None)."""
    return job["rule"], next(
        (v for k, v in job["wildcards"].items() if re.fullmatch(RUN_WILDCARDS, k)), None
    )


def planned(cwd, overlay: dict | None = None) -> Counter:
    """(rule, run wildcard or None) → count, of plan_jobs."""
    return Counter(job_key(j) for j in plan_jobs(cwd, overlay))


def by_rule(jobs: Counter) -> Counter:
    """rule → planned jobs, from planned()'s (rule, run) counts."""
    return Counter(rule for (rule, _), n in jobs.items() for _ in range(n))


def settings_changed(jobs: list[dict]) -> set[tuple]:
    """The jobs (job_key) of plan_jobs whose own settings changed (a params change of a spec, a data
    section, a table's slice), not only their inputs."""
    return {job_key(j) for j in jobs if any(w.startswith("settings changed") for w in j["why"])}


# the demo's Grassmann runs: its tables', its `pre_norm` ablation's (`paper` is the table's) and its
# sweep's other learning rates (3e-3 is the table's)
DEMO_GRASSMANN_RUNS = {
    f"{t}-grassmann-s{s}"
    for t in ("table1", "table2", "table1_lr_1e-3", "table1_lr_1e-2")
    for s in (0, 1)
} | {"table1_pre_norm-grassmann-s0"}
DEMO_LM_RUNS = 18  # 8 of Tables 1-2, 2 of the ablation, 8 of the sweep


@contextmanager
def replaced(path: Path, old: str, new: str):
    """Replace the first `old` in a file with `new` for the duration of the block."""
    original = path.read_text()
    assert old in original, f"{path}: {old!r} not found"
    path.write_text(original.replace(old, new, 1))
    try:
        yield
    finally:
        path.write_text(original)


# An edit that changes a module's code (a new module-level name), and edits that cannot change what
# runs (a comment, a docstring, reformatting): fingerprints cover code
# (grassflow.planning.staleness)
CODE_EDIT = "\n_EDITED = 1\n"
COMMENT_EDIT = "\n# edited\n"


def edited(path: Path, text: str = CODE_EDIT):
    """Append text (a code line unless told) to a file for the duration of the block."""
    return replaced(path, original := path.read_text(), original + text)


def job_stats(stdout: str) -> Counter:
    """The 'Job stats' table of a dry run: rule → count."""
    table = stdout.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return Counter(
        {
            m.group(1): int(m.group(2))
            for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
            if m.group(1) != "total"
        }
    )


def assert_same_tables(a_dir, b_dir, names=None, subset=None):
    """The numbers of two demo runs agree exactly: LM perplexities, SNLI and recall accuracies (of
    the tables `names`, default all), row by row (one row per run). `subset`: `b_dir` ran this
    preset, a part of the demo's runs (tests/slurm/demo-small.yaml): each of its rows equals the
    demo's row of the same run."""
    # equal weights, equal weights_sha256, wherever and however the checkpoints were written
    lm = [
        "run_id",
        "status",
        "best_epoch",
        "val_ppl",
        "test_ppl",
        "test_strided_ppl",
        "test_word_ppl",
        "weights_sha256",
    ]
    snli = [
        "run_id",
        "status",
        "best_epoch",
        "val_acc",
        "test_acc",
        "backbone_sha256",
        "weights_sha256",
    ]
    recall = ["run_id", "status", "lr", "val_acc", "test_acc", "reach", "weights_sha256"]
    for name, cols in [
        ("table1", lm),
        ("table2", lm),
        ("ablations", ["variant"] + lm),
        ("snli_table3", snli),
        ("snli_table3_scratch", snli),
        ("recall", recall),
    ]:
        if names is not None and name not in names:
            continue
        a = pd.read_csv(a_dir / f"results/demo/report/{name}.csv")[cols]
        b = pd.read_csv(b_dir / f"results/{subset or 'demo'}/report/{name}.csv")[cols]
        if subset:
            assert len(b) and set(b.run_id) <= set(a.run_id), (
                name,
                sorted(set(b.run_id) - set(a.run_id)),
            )
            a = a[a.run_id.isin(b.run_id)].reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, check_exact=True)


DEMO_RECALL_RUNS = {
    f"L32-kv4-d32-{m}-lr0.001-s0"
    for m in ("transformer", "transformer_window2", "grassmann", "grassmann_geometric")
}


def plan_rows(md: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("| rule")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


def assert_closure_holds(record: dict, module: str, kinds=()) -> None:
    """What the job loaded ⊆ its closure, less the other kinds' code and what only that code imports
    (loaded with the models package, never run by this job)."""
    others = [k for k in staleness.kind_code() if k not in kinds]
    theirs = staleness.closure([m for k in others for m in staleness.kind_code()[k]], others)
    loaded = {Path(f).resolve() for f in record["files"]}
    owned = {p for p in loaded if staleness._owned_by(staleness.module_name(p), others)}
    missing = loaded - owned - theirs - set(staleness.job_files(module, kinds))
    assert not missing, (
        f"{module} {kinds}: loaded but not fingerprinted: {sorted(map(str, missing))}"
    )
