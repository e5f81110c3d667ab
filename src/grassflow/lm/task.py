"""Language modelling (the paper's Tables 1-2 and the ablations): the preset's own top-level part.
Its rules: workflow/rules/lm.smk; its tables': report.smk."""

from grassflow.declaration import Task

TASK = Task(
    name="lm",
    part_key=None,
    runs="grassflow.config:runs",
    train="grassflow.lm.train:train",
    train_fused="grassflow.lm.train:train_fused",
    evaluate="grassflow.lm.evaluate:evaluate_run",
    estimate="grassflow.estimate:lm_job",
    token_dir=lambda d, p: d / "data" / "tokens" / p["tokenizer"]["name"],
    check="grassflow.config:check_lm",
    download="grassflow.lm.data:download",
    train_tokenizer="grassflow.lm.tokenize:train_tokenizer",
    tokenize="grassflow.lm.tokenize:tokenize_split",
    documents="grassflow.lm.rolling:documents_split",
    title="Language modelling",
)
