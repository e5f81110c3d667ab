"""A failing stage's one `error:` line where the user reads Snakemake's output: the rule's shell
hands the job its own stderr on a descriptor (the Snakefile's shell.prefix;
grassflow.job.say_error), so the line arrives whole and in order with Snakemake's output redirected
to a file (`snakemake … > run.log 2>&1`, a login node's or nohup's way), through a pipe, and, under
the SLURM executor, in the SLURM job's output as well as the rule's log
(tests/pipeline/test_slurm.py). The failing stage: the adoption of records that disagree with each
other (grassflow.report.agreement), through the real DAG. The full disk:
tests/pipeline/test_full_disk_dag.py."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

from helpers.dag import BIN, copy_demo, pipeline_env

RUN = "table1-grassmann-s0"


def _disagreeing_records(demo, tmp_path):
    """The demo run's records, its eval.json's validation PPL 5 % off its best epoch's."""
    records = tmp_path / "records" / RUN
    records.mkdir(parents=True)
    for f in ("run.json", "eval.json", "metrics.jsonl"):
        shutil.copy2(demo / "results/demo/runs" / RUN / f, records / f)
    ev = json.loads((records / "eval.json").read_text())
    ev["validation"]["chunked_ppl"] *= 1.05
    (records / "eval.json").write_text(json.dumps(ev))
    return records


def _ours(text: str, records) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(f"error: {records}/eval.json: validation.chunked_ppl ")
        and line.endswith(": not adopted")
    ]


def test_a_failing_stage_says_its_line_whole_in_a_file_snakemake_was_redirected_to_and_a_pipe(
    demo, tmp_path
):
    """With Snakemake's output in a file: the job's line is there whole, before Snakemake's
    `Error in rule` (and again in the failed log Snakemake shows after it); through a pipe the same
    (mutation: the job writes its line to its log only: it is found only inside the log Snakemake
    shows)."""
    work = tmp_path / "copy"
    copy_demo(demo, work)
    records = _disagreeing_records(demo, tmp_path)
    # the adoption's own output as the target: a job that failed loses its outputs, and a table that
    # looks current would not plan them again (Snakemake's rule for intermediate files)
    cmd = [
        str(BIN / "snakemake"),
        f"results/demo/runs/{RUN}/adopted.json",
        "--cores",
        "2",
        "--config",
        "preset=demo",
        f'finished_runs=["{records.parent}"]',
    ]
    log = tmp_path / "run.log"
    res = subprocess.run(
        f"{shlex.join(cmd)} > {log} 2>&1", shell=True, cwd=work, env=pipeline_env(work), timeout=900
    )
    assert res.returncode != 0
    for text in (
        log.read_text(),
        (lambda r: r.stdout + r.stderr)(
            subprocess.run(
                cmd, cwd=work, env=pipeline_env(work), capture_output=True, text=True, timeout=900
            )
        ),
    ):
        said = _ours(text, records)
        assert said, text[-3000:]
        first, error_in_rule = text.index(said[0]), text.index("Error in rule adopt_run:")
        # the job's own, not only the log's that Snakemake shows
        assert first < error_in_rule, text[-3000:]
        assert re.search(
            r"is not the best epoch's val_ppl in metrics\.jsonl \(epoch \d+: [\d.]+\)", said[0]
        )
    assert not (work / "results/demo/runs" / RUN / "adopted.json").exists()  # nothing adopted
