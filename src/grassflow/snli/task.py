"""SNLI (paper Table 3): the preset's `snli` part; its rules: workflow/rules/snli.smk."""

from grassflow.pipeline.tasks import Task
from grassflow.snli.grid import check_model, check_snli, estimate, snli_runs

TASK = Task(
    name="snli",
    part_key="snli",
    runs=snli_runs,
    estimate=estimate,
    check=check_snli,
    check_model=check_model,
    schema="schema.yaml",
)
