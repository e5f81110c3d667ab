"""Language modelling (the paper's Tables 1-2 and the ablations): the preset's own top-level part.
Its data and tables have their own rules (workflow/rules/data.smk, report.smk)."""

from grassflow.tasks import Task

TASK = Task(
    name="lm",
    part_key=None,
    runs="grassflow.config:runs",
    train="grassflow.lm.train:train",
    evaluate="grassflow.lm.evaluate:evaluate_run",
    estimate="grassflow.estimate:lm_job",
    token_dir=lambda d, p: d / "data" / "tokens" / p["tokenizer"]["name"],
    check="grassflow.config:check_lm",
    title="Language modelling",
)
