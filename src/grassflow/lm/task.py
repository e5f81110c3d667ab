"""Language modelling (the paper's Tables 1-2 and the ablations): the preset's own top-level part.
Its rules: workflow/rules/lm.smk; its tables': report.smk."""

from grassflow.pipeline.estimate import lm_job
from grassflow.pipeline.presets import check_lm, runs
from grassflow.pipeline.tasks import Task

TASK = Task(
    name="lm",
    part_key=None,
    runs=runs,
    estimate=lm_job,
    check=check_lm,
    token_dir=lambda d, p: d / "data" / "tokens" / p["tokenizer"]["name"],
    tokenizer=True,
    title="Language modelling",
)
