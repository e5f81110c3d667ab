"""Language modelling (the paper's Tables 1-2 and the ablations): the preset's own top-level part.
Its rules, its tables' too: workflow/rules/lm.smk."""

from grassflow.lm.grid import check_lm, check_model, estimate, runs
from grassflow.pipeline.tasks import Task

TASK = Task(
    name="lm",
    part_key=None,
    runs=runs,
    estimate=estimate,
    check=check_lm,
    check_model=check_model,
)
