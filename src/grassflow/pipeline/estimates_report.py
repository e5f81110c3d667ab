"""The estimates report: every training and evaluation job's estimated time (grassflow.pipeline.estimate)
beside its measured wall time (Snakemake's benchmark files), per rule and per job."""

from __future__ import annotations

import sys
from pathlib import Path

from grassflow import job, markdown
from grassflow.pipeline.plan import benchmark_seconds
from grassflow.pipeline.tasks import RUN_RULES, job_estimate


def estimates_report(preset: dict, preset_name: str, estimate: dict, results, out) -> list[dict]:
    """Every training and evaluation job's estimate, requested limit and memory beside its
    measured wall time; per rule the totals and the ratio measured / estimated."""
    import pandas as pd

    from grassflow.io import atomic_path, write_text

    results = Path(results)
    rows = []
    for rule, (task, stage) in RUN_RULES.items():
        files = task.files(results, preset)
        for run_id, spec in task.specs(preset_name, preset).items():  # none where the preset has no such part
            est = job_estimate(rule, spec, preset, estimate, files)
            measured = benchmark_seconds(task.bench_file(results, stage, run_id))
            rows.append({"rule": rule, "run": run_id, "estimate_s": round(est.seconds, 1),
                         "limit_min": est.minutes(estimate), "mem_mb": est.request_mb(), "measured_s": measured,
                         "measured_over_estimate": round(measured / est.seconds, 2) if measured and est.seconds else None,
                         "basis": est.basis})
    df = pd.DataFrame(rows)
    out = Path(out)
    with atomic_path(out.with_suffix(".csv")) as tmp:  # never a partial table, as every table is written
        df.to_csv(tmp, index=False)
    lines = [f"# Estimated and measured wall time — preset `{preset_name}`", "",
             "Each training and evaluation job asked for its estimate × safety as its time limit "
             "(grassflow.pipeline.estimate); the measured times are Snakemake's benchmark files. A ratio far from 1 "
             "means workflow/resources/throughput.csv needs a row for this device or size "
             "(per job: `estimates.csv`).", ""]
    table = []
    for rule, g in df.groupby("rule", sort=False):
        done = g.dropna(subset=["measured_s"])
        table.append([rule, len(g), f"{g.estimate_s.sum() / 60:.1f}", g.limit_min.sum(), f"{done.measured_s.sum() / 60:.1f}",
                      f"{done.measured_s.sum() / done.estimate_s.sum():.2f}" if len(done) else "—",
                      f"{done.measured_over_estimate.max():.2f}" if len(done) else "—"])
    lines += markdown.table(["rule", "jobs", "estimated (min)", "requested limits (min)", "measured (min)",
                             "measured / estimated", "worst job (measured / estimated)"], table)
    lines += ["", f"Basis of the estimates: {df.basis.iloc[0]}." if len(df) else ""]
    write_text(out, "\n".join(lines) + "\n")
    return rows


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    for name in ("preset", "estimate"):
        p.add_argument(f"--{name}", required=True, type=job.json_arg, help=job.JSON)
    for name in ("preset-name", "results", "out"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args(argv)
    return job.run(estimates_report, a.preset, a.preset_name, a.estimate, a.results, a.out)


if __name__ == "__main__":
    sys.exit(main())
