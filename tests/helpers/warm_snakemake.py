"""Snakemake's dry runs without its start-up: a server process imports Snakemake and its plugins
once (about half of a dry run's CPU time on the demo), then runs each dry run in a fork of itself,
through the `snakemake` command's own entry point (snakemake.cli.main) with the run's argv, working
directory and environment. The workflow's own code (the Snakefile, grassflow) is imported in the
fork, as in a fresh process: the server never imports it. Runs that execute jobs stay processes of
their own (helpers.dag.snakemake), so that signals, locks and exits are Snakemake's as users meet
them.

A request may instead ask for grassflow's own in-process plan (grassflow.pipeline.preview.dry_run,
what `grassflow plan` reads): its jobs come back as JSON, read from Snakemake's log records, not its
text.

Run as a script, this module is the server: one request per stdin line (JSON), one exit code per
stdout line; the fork writes its stdout and stderr to the request's files."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def _serve() -> None:
    # as the `snakemake` script's: not this directory
    sys.path[0] = str(Path(sys.executable).parent)
    import snakemake.cli

    snakemake.cli.get_argument_parser()  # collects every plugin (their registries are singletons)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req, snakemake.cli.main)  # exits; never back into this loop
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


def _child(req: dict, main) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the server's requests are not the dry run's stdin
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # what PYTHONPATH would have put on the path of a fresh `snakemake` (its own src/, for a copy)
    sys.path[:0] = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    # grassflow's in-process plan (grassflow.pipeline.preview.dry_run): its jobs as JSON
    if "plan" in req:
        from grassflow.pipeline.preview import dry_run

        jobs, _ = dry_run(Path(req["cwd"]), **req["plan"])
        print(json.dumps(jobs, default=str))
        sys.exit(0)
    sys.argv = ["snakemake", *req["argv"]]
    sys.exit(main(req["argv"]))  # as the `snakemake` script: main() exits with the run's status


class WarmSnakemake:
    """One server per test process, started on the first dry run."""

    def __init__(self):
        self._proc = None
        self._lock = threading.Lock()

    def plan(self, cwd, env: dict, timeout: float = 600, **plan_args) -> list[dict]:
        """The jobs Snakemake plans in `cwd` (grassflow.pipeline.preview.dry_run's arguments), as
        `grassflow plan` reads them: rule, wildcards, resources, reason."""
        res = self.run([], cwd, env, timeout, plan=plan_args)
        if res.returncode != 0:
            raise AssertionError(f"the plan failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return json.loads(res.stdout)

    def run(
        self, argv: list[str], cwd, env: dict, timeout: float, plan=None
    ) -> subprocess.CompletedProcess:
        with self._lock, tempfile.TemporaryDirectory() as tmp:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, __file__],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=_server_env(),
                )
            out, err = Path(tmp, "out"), Path(tmp, "err")
            req = {
                "argv": [str(a) for a in argv],
                "cwd": str(cwd),
                "env": dict(env),
                "out": str(out),
                "err": str(err),
            }
            if plan is not None:
                req["plan"] = plan
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
            if not select.select([self._proc.stdout], [], [], timeout)[0]:
                self._proc.kill()
                self._proc = None
                raise subprocess.TimeoutExpired(["snakemake", *argv], timeout)
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the warm Snakemake server died (exit {self._proc.wait()})")
            return subprocess.CompletedProcess(
                ["snakemake", *argv], int(line), out.read_text(), err.read_text()
            )


def _server_env() -> dict:
    # nothing of a test's own environment: each dry run brings its whole environment
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


if __name__ == "__main__":
    _serve()
