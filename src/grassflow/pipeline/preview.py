"""`grassflow plan`: what a preset will do and cost, before anything runs.

Jobs come from Snakemake's own plan (its dry run, made in this process with the same --config /
--configfile and targets: the jobs as its log records carry them), so the table never disagrees with
what `snakemake` will schedule: per rule, its jobs, the partition the cluster profile sends them to,
the estimated device-hours, the time limits requested, the largest memory request, and the tokens
(or examples) trained on: the resources the rules computed (common.smk's `run_resources`: the
estimate their limits come from). With --measured, the wall time of finished jobs from Snakemake's
benchmark files beside the estimate, and their ratio: far from 1, workflow/resources/throughput.csv
needs a row for this device or size.
"""

from __future__ import annotations

import ast
import csv
import json
import re
import shlex
import sys
from pathlib import Path

import yaml

from grassflow import markdown
from grassflow.compare import flat
from grassflow.job import ArgumentParser


def load_config(project: Path, configfiles=(), preset: str | None = None) -> dict:
    """The config as the Snakefile sees it: config.yaml, then each --configfile deep-merged, then
    preset=...; bases resolved, checked, defaults filled."""
    from snakemake.utils import update_config  # Snakemake's own merge: a null overrides, as a null

    from grassflow.errors import ConfigError
    from grassflow.pipeline.presets import validate_or_exit

    config = yaml.safe_load((project / "config.yaml").read_text())
    for f in configfiles:
        if not Path(f).is_file():
            raise ConfigError(f"--configfile {f}: no such file")
        update_config(config, yaml.safe_load(Path(f).read_text()))
    if preset:
        config["preset"] = preset
    validate_or_exit(config, project / "workflow" / "schemas" / "config.schema.yaml")
    return config


def dry_run(
    project: Path, targets=(), configfiles=(), preset=None, forceall=False
) -> tuple[list[dict], set[str]]:
    """Snakemake's own dry run, made in this process with the same --configfile / --config /
    targets:
    each job it plans as its job-info log record carries it (rule, wildcards, resources, reason,
    benchmark file), and the rules it runs where it runs (`localrule: True`, `localrules:`) from the
    workflow it parsed (a dry run does not say which)."""
    import logging

    from snakemake.api import SnakemakeApi
    from snakemake.settings import types as st
    from snakemake_interface_logger_plugins.common import LogEvent

    jobs = []

    class JobInfo(logging.Handler):
        def emit(self, r):
            if getattr(r, "event", None) == LogEvent.JOB_INFO and r.rule_name != "all":
                jobs.append(
                    {
                        "rule": r.rule_name,
                        "wildcards": dict(r.wildcards),
                        "resources": dict(r.resources),
                        "reason": r.reason,
                        "benchmark": r.benchmark,
                    }
                )

    log, handler = logging.getLogger("snakemake.logging"), JobInfo()
    with SnakemakeApi(st.OutputSettings(quiet={st.Quietness.ALL})) as api:
        try:
            wf = api.workflow(
                snakefile=project / "Snakefile",
                workdir=project,
                resource_settings=st.ResourceSettings(cores=1),
                config_settings=st.ConfigSettings(
                    config={"preset": preset} if preset else {},
                    configfiles=[Path(f) for f in configfiles],
                ),
            )
            log.addHandler(handler)
            # as `snakemake` plans here: with profiles/default's rerun-incomplete (Snakemake reads
            # that profile for every command in the project; its API does not)
            default = project / "profiles" / "default" / "profile.yaml"
            incomplete = (
                bool((yaml.safe_load(default.read_text()) or {}).get("rerun-incomplete"))
                if default.is_file()
                else False
            )
            wf.dag(
                st.DAGSettings(targets=set(targets), forceall=forceall, force_incomplete=incomplete)
            ).execute_workflow(pseudo_executor="dryrun")
        except Exception as e:  # its log is silenced (the jobs are read from it): its error, here
            sys.exit(f"error: snakemake's dry run failed: {type(e).__name__}: {e}")
        finally:
            log.removeHandler(handler)  # a caller's next dry run reads its own jobs only
        # Snakemake's parse of the rule files: its own set of local rules. No public API says which
        # rules are local (a dry run's job records leave `local` False by design), nor gives a job's
        # reasons but as their text (explain reads it)
        workflow = wf._workflow
        return jobs, {r.name for r in workflow.rules if r.name in workflow._localrules}


# --- why a job is planned (grassflow plan --why) --------------------------------------------------
FINGERPRINT = re.compile(r"\b[0-9a-f]{16}\b")


def code_changes(before: str, index: Path, base: Path) -> list[str] | None:
    """The files whose code differs now from when the job last ran, from the fingerprint found in a
    params change (its per-file hashes kept when the job ran:
    grassflow.planning.staleness.remember); None where they were not kept. An empty list: the job's
    import closure gained or lost a file."""
    from grassflow.planning.staleness import code_hash, recalled

    old = [c for fp in FINGERPRINT.findall(before) if (c := recalled(fp, index)) is not None]
    if len(old) != 1:
        return None
    return sorted(
        f for f, h in old[0].items() if not (base / f).is_file() or code_hash(base / f) != h
    )


def _params(text: str) -> list:
    """The values of one side of Snakemake's params change ("before: 'a','b'": their reprs)."""
    try:
        return ast.literal_eval(f"[{text.strip()}]")
    except (ValueError, SyntaxError):  # "<nothing exclusive>"
        return []


def _settings(value) -> list[dict] | None:
    """A param holding settings (canonical JSON, or a fused group's as shell words), else None."""
    if not isinstance(value, str) or value[:2] not in ('{"', "'{"):
        return None
    try:
        return [json.loads(w) for w in (shlex.split(value) if value[0] == "'" else [value])]
    except ValueError:
        return None


def settings_changes(before: list, now: list) -> list[str]:
    """Each settings key whose value differs, `key: old → new`, of the settings params that
    changed."""
    old = [d for v in before if (ds := _settings(v)) for d in ds]
    new = [d for v in now if (ds := _settings(v)) for d in ds]
    a = {k: v for d in old for k, v in flat(d).items()}
    b = {k: v for d in new for k, v in flat(d).items()}
    return [
        f"{k}: {json.dumps(a.get(k))} → {json.dumps(b.get(k))}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def explain(reason: str, index: Path, base: Path) -> list[str]:
    """Snakemake's reason for a job, read: a code change names its files, a settings change its
    keys."""
    out = []
    for part in reason.split("; "):
        m = re.match(r"Params have changed since last execution: .*?before: (.*) now: (.*)$", part)
        if m:
            before, now = _params(m.group(1)), _params(m.group(2))
            fingerprints = [v for v in before if isinstance(v, str) and FINGERPRINT.fullmatch(v)]
            if fingerprints:
                changed = code_changes(" ".join(fingerprints), index, base)
                out.append(
                    f"code changed: {', '.join(changed)}"
                    if changed
                    else "code changed: its import closure gained or lost a file"
                    if changed == []
                    else f"code changed (which files: not known, {index} lacks the previous "
                    "fingerprint's)"
                )
            keys = settings_changes(before, now)
            out += [f"settings changed: {'; '.join(keys)}"] * bool(keys)
            plain = [
                [v for v in side if _settings(v) is None and not FINGERPRINT.fullmatch(str(v))]
                for side in (before, now)
            ]
            if any(plain) or not (fingerprints or keys):
                out.append(
                    "params changed: before "
                    f"{', '.join(map(str, plain[0])) or m.group(1).strip()}; "
                    f"now {', '.join(map(str, plain[1])) or m.group(2).strip()}"
                )
            continue
        m = re.match(r"Input files updated by another job: (.*)$", part)
        if m:
            out.append(f"inputs rerun: {m.group(1)}")
            continue
        out.append(part[0].lower() + part[1:])
    return out


def why(project: Path, **plan_args) -> list[dict]:
    """Each job Snakemake plans (dry_run's arguments), with what made it stale (explain)."""
    from grassflow.planning.staleness import CODE_INDEX

    return [
        {**job, "why": explain(job["reason"], project / CODE_INDEX, project)}
        for job in dry_run(project, **plan_args)[0]
    ]


def why_markdown(jobs: list[dict]) -> str:
    if not jobs:
        return "Nothing to do: every output is up to date.\n"
    rows = [
        [j["rule"], ", ".join(f"{k}={v}" for k, v in j["wildcards"].items()), "; ".join(j["why"])]
        for j in jobs
    ]
    return (
        "\n".join(
            [
                f"{len(jobs)} jobs planned, each with what made it stale:",
                "",
                *markdown.table(["rule", "job", "why"], rows),
            ]
        )
        + "\n"
    )


def cluster_resources(profile: Path | None) -> tuple[dict, dict]:
    """({rule: resources set by the profile}, the profile's default resources). On the cluster a
    profile's set-resources override a rule's own (so it sets no time or memory for the rules whose
    estimates the workflow computes)."""
    if profile is None or not (profile / "profile.yaml").is_file():
        return {}, {"slurm_partition": "local"}
    prof = yaml.safe_load((profile / "profile.yaml").read_text())
    return prof.get("set-resources") or {}, prof.get("default-resources") or {}


def benchmark_seconds(tsv: Path) -> float | None:
    """A Snakemake benchmark file's wall seconds (its last row), None if there is none."""
    if not tsv.is_file():
        return None
    with open(tsv, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return float(rows[-1]["s"]) if rows else None


def plan(project: Path, profile=None, measured=False, each=None, **plan_args) -> list[dict]:
    """Per rule of Snakemake's plan (dry_run's arguments), what its jobs ask for and, of the run
    jobs, their estimates: the resources the rules computed (common.smk: `run_resources`), as the
    cluster will see them; `measured`: every job's (forceall) with the wall time of those that ran;
    `each`: a list that gets one row per estimated job (its rule, run or group, estimate, limit)."""
    by_rule, default = cluster_resources(profile)
    jobs, local = dry_run(project, forceall=measured, **plan_args)
    rows = {}
    for job in jobs:
        if each is not None and "estimate_ms" in job["resources"]:
            r = job["resources"]
            each.append(
                {
                    "rule": job["rule"],
                    "job": ", ".join(map(str, job["wildcards"].values())),
                    "est_hours": int(r["estimate_ms"]) / 3.6e6 / int(r.get("runs_per_gpu", 1)),
                    "limit_hours": int(r.get("runtime", 0)) / 60,
                    "items": int(r["trained_items"]),
                }
            )
        rule = job["rule"]
        # as the cluster will see them
        res = {
            **default,
            **job["resources"],
            **by_rule.get(rule, {}),
        }
        row = rows.setdefault(
            rule,
            {
                "rule": rule,
                "jobs": 0,
                "est_hours": 0.0,
                "est_wall_hours": 0.0,
                "limit_hours": 0.0,
                "max_mem_mb": 0,
                "items": 0,
                "estimated": "estimate_ms" in res,
                "ran": [],
                "partition": "login node (local)" if rule in local else res.get("slurm_partition"),
            },
        )
        row["jobs"] += 1
        if rule not in local:
            row["limit_hours"] += int(res.get("runtime", 0)) / 60
            row["max_mem_mb"] = max(row["max_mem_mb"], int(res.get("mem_mb", 0)))
        if row["estimated"]:  # K runs share a GPU: a job's device-hours are 1/K of its wall time
            row["est_wall_hours"] += int(res["estimate_ms"]) / 3.6e6
            row["est_hours"] += int(res["estimate_ms"]) / 3.6e6 / int(res.get("runs_per_gpu", 1))
            row["items"] += int(res["trained_items"])
        if (
            measured
            and job["benchmark"]
            and (s := benchmark_seconds(project / job["benchmark"])) is not None
        ):
            row["ran"].append(s)
    for row in rows.values():
        ran = row.pop("ran")  # filled only when measured
        row["measured_hours"] = sum(ran) / 3600 if ran else None
    return list(rows.values())


def _ratio(row: dict) -> str:
    """Measured over estimated wall time, of a rule whose jobs are estimated and ran."""
    m, e = row.get("measured_hours"), row.get("est_wall_hours")
    return f"{m / e:.2f}" if m is not None and e else "—"


def to_markdown(rows: list[dict], preset: str, settings: dict) -> str:
    from grassflow.planning.estimate import DEFAULTS

    s = {**DEFAULTS, **settings}
    has_measured = any(r.get("measured_hours") is not None for r in rows)
    lines = [
        f"Plan of preset **{preset}** (from `snakemake -n`; estimates for device `{s['device']}`, "
        f"time limits = estimate × {s['safety']:g}, at least {s['min_minutes']} min):",
        "",
        *markdown.table(
            [
                "rule",
                "jobs",
                "partition",
                "estimated device-hours",
                "requested hours (limits)",
                "max memory per job (MB)",
                "tokens / examples trained",
            ]
            + ["measured hours", "measured / estimated"] * has_measured,
            [
                [
                    r["rule"],
                    r["jobs"],
                    r["partition"],
                    f"{r['est_hours']:.2f}" if r["estimated"] else "—",
                    f"{r['limit_hours']:.2f}",
                    f"{r['max_mem_mb']:,}" if r["max_mem_mb"] else "—",
                    f"{r['items']:,}" if r["items"] else "—",
                ]
                + (
                    [f"{m:.3f}" if (m := r.get("measured_hours")) is not None else "—", _ratio(r)]
                    if has_measured
                    else []
                )
                for r in sorted(rows, key=lambda r: (-r["est_hours"], r["rule"]))
            ],
        ),
    ]
    total = sum(r["est_hours"] for r in rows)
    gpu = sum(r["est_hours"] for r in rows if r["partition"] == "gpu")
    lines += [
        "",
        f"Total: {sum(r['jobs'] for r in rows)} jobs; estimated {total:.1f} device-hours"
        + (f", {gpu:.1f} of them on the `gpu` partition" if gpu else "")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def jobs_markdown(each: list[dict]) -> str:
    """One row per estimated job (plan's `each`): which run it is, what it costs."""
    rows = [
        [
            j["rule"],
            j["job"],
            f"{j['est_hours']:.3f}",
            f"{j['limit_hours']:.2f}",
            f"{j['items']:,}" if j["items"] else "—",
        ]
        for j in sorted(each, key=lambda j: (j["rule"], j["job"]))
    ]
    return (
        "\n".join(
            [
                "Each estimated job:",
                "",
                *markdown.table(
                    [
                        "rule",
                        "run",
                        "estimated device-hours",
                        "requested hours (limit)",
                        "tokens / examples trained",
                    ],
                    rows,
                ),
            ]
        )
        + "\n"
    )


def main(argv=None) -> int:
    ap = ArgumentParser(prog="grassflow plan", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--preset", help="the preset to plan (default: config.yaml's, or the configfiles')"
    )
    ap.add_argument(
        "--configfile", nargs="*", default=[], help="config overlays, as snakemake --configfile"
    )
    ap.add_argument(
        "--profile", default="profiles/slurm", help="cluster profile whose partitions to show"
    )
    ap.add_argument(
        "--measured",
        action="store_true",
        help="plan every job (--forceall) and add the measured wall time of those that ran "
        "(Snakemake's benchmark files)",
    )
    ap.add_argument(
        "--why",
        action="store_true",
        help="list each planned job with what made it stale (the files whose code changed, the "
        "settings that changed, a missing output) instead of the cost table",
    )
    ap.add_argument(
        "--runs",
        action="store_true",
        help="also list each training and evaluation job: its run, estimate and time limit",
    )
    ap.add_argument("--project", default=".", help="the project directory (where the Snakefile is)")
    ap.add_argument("targets", nargs="*", help="snakemake targets (default: all)")
    a = ap.parse_args(argv)
    project = Path(a.project).resolve()
    plan_args = {
        "targets": a.targets,
        "configfiles": [str(Path(f).resolve()) for f in a.configfile],
        "preset": a.preset,
    }
    # its errors name the key or file
    config = load_config(project, plan_args["configfiles"], a.preset)
    if a.why:
        print(why_markdown(why(project, **plan_args)), end="")
        return 0
    each = [] if a.runs else None
    rows = plan(project, project / a.profile if a.profile else None, a.measured, each, **plan_args)
    print(to_markdown(rows, config["preset"], config.get("estimate") or {}))
    if each:
        print(jobs_markdown(each))
    return 0
