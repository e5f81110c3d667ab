"""The rules as Snakemake parses them (through its API, in this process, as `grassflow plan` does;
no text of the rule files is read): each rule's shell, conda environment and container, the stage
module its shell runs, and what its `code` param is, checked against that module's fingerprints
(grassflow.planning.staleness): for each of its jobs in the demo's plan (demo, and demo with
train.fuse_seeds for train_fused), the model kinds whose code it holds, or None where it matches
none of the module's fingerprints. A rule whose `code` is one value (not a function of its
wildcards) is judged once, without a job."""

from __future__ import annotations

import re
from functools import cache
from types import SimpleNamespace

import yaml

from helpers import ROOT

KIND_SETS = ((), ("transformer",), ("grassmann",), ("transformer", "grassmann"))


def _parse():
    """Snakemake's own parse of the Snakefile (preset demo). No public API lists a rule's settings:
    they are read from the workflow it parsed, as grassflow.pipeline.preview reads its local
    rules."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings import types as st

    with SnakemakeApi(st.OutputSettings(quiet={st.Quietness.ALL})) as api:
        wf = api.workflow(
            snakefile=ROOT / "Snakefile",
            workdir=ROOT,
            resource_settings=st.ResourceSettings(cores=1),
            config_settings=st.ConfigSettings(config={"preset": "demo"}),
        )
        return list(wf._workflow.rules)


def _jobs(tmp) -> dict[str, list[dict]]:
    """{rule: each planned job's wildcards} of the demo's full plan, with and without fused
    seeds."""
    from grassflow.pipeline.preview import dry_run

    fused = tmp / "fused.yaml"
    fused.write_text(yaml.safe_dump({"presets": {"demo": {"train": {"fuse_seeds": True}}}}))
    out = {}
    for configfiles in ([], [str(fused)]):
        for job in dry_run(ROOT, configfiles=configfiles, preset="demo", forceall=True)[0]:
            out.setdefault(job["rule"], []).append(job["wildcards"])
    return out


@cache
def rules() -> dict[str, SimpleNamespace]:
    """{rule: shell (its template, `{params.stage}` filled in), conda, container, runs (a job is a
    command: shell, run or script), module (what `python -m` runs, or None), code (None: no code
    param; else [(a job's wildcards, or None for a single value; the kinds it fingerprints, or
    None)])}."""
    import tempfile
    from pathlib import Path

    from grassflow.planning.staleness import fingerprint, job_code

    parsed = _parse()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _jobs(Path(tmp))
    out = {}
    for rule in parsed:
        params = dict(rule.params.items())
        shell = (rule.shellcmd or "").replace("{params.stage}", str(params.get("stage")))
        module = m.group(1) if (m := re.search(r"python -m (grassflow[\w.]*)", shell)) else None
        # fingerprint: the fewest kinds that give it (a module that runs no model: none)
        prints = {}
        for kinds in KIND_SETS if module else ():
            prints.setdefault(fingerprint(job_code(module, kinds, ROOT)), kinds)
        code = params.get("code")
        if code is None:
            codes = None
        elif callable(code):
            codes = [
                (wc, prints.get(code(SimpleNamespace(**wc)))) for wc in jobs.get(rule.name, [])
            ]
        else:
            codes = [(None, prints.get(code))]
        out[rule.name] = SimpleNamespace(
            shell=shell,
            conda=rule.conda_env,
            container=rule.container_img,
            runs=not rule.norun,
            module=module,
            code=codes,
        )
    return out


def rule_codes() -> dict[str, tuple[str, str]]:
    """{rule: (the module its code param fingerprints, which kinds: "" none, "run" its run's own,
    "*" all)}."""
    out = {}
    for name, r in rules().items():
        kinds = {k for _, k in r.code or []}
        if kinds and None not in kinds:
            out[name] = (
                r.module,
                "*" if kinds == {KIND_SETS[-1]} else "" if kinds == {()} else "run",
            )
    return out
