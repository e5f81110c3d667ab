"""The dry runs the tests make from a warm Snakemake (tests/helpers/warm_snakemake.py) are the
`snakemake` command's: the same output, exit status and errors as a fresh process."""

from __future__ import annotations

import subprocess

from helpers.dag import BIN, copy_repo, pipeline_env, run_snakemake


def _fresh(args, cwd, env):
    return subprocess.run(
        [str(BIN / "snakemake"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_warm_dry_run_is_a_fresh_snakemakes(tmp_path):
    """Every job and command of the demo's dry run, from a copy (its own src/ on PYTHONPATH), in
    that copy's directory; and a failing one's status and error line, from its environment."""
    work = copy_repo(tmp_path)
    env = pipeline_env(work)
    args = ["-n", "-p", "--forceall", "--cores", "1", "--config", "preset=demo"]
    warm, fresh = run_snakemake(args, work, env), _fresh(args, work, env)
    assert warm.returncode == fresh.returncode == 0, warm.stderr[-2000:]

    def jobs(out):  # the job and command lines (the rest holds times and a random job order)
        return sorted(
            line
            for line in out.splitlines()
            if line.startswith(("rule ", "localrule ", "    python "))
        )

    assert len(jobs(fresh.stdout)) > 50 and jobs(warm.stdout) == jobs(fresh.stdout)
    # the bad preset from the environment alone (the profile SNAKEMAKE_PROFILE names): the run's own
    profile = tmp_path / "nope"
    profile.mkdir()
    (profile / "profile.yaml").write_text("config: [preset=nope]\n")
    bad, env = ["-n", "--cores", "1"], {**env, "SNAKEMAKE_PROFILE": str(profile)}
    warm, fresh = run_snakemake(bad, work, env), _fresh(bad, work, env)
    assert warm.returncode == fresh.returncode != 0
    error = "error: config preset: 'nope' is not defined"
    assert error in warm.stderr and error in fresh.stderr and "Traceback" not in warm.stderr
