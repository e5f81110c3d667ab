"""SNLI (paper Table 3): the preset's `snli` part; its rules: workflow/rules/snli.smk."""

from grassflow.declaration import Task


def _outputs(part: dict) -> list[str]:
    exps = list(part["experiments"])
    return ([f"snli_{exp}.{ext}" for exp in exps for ext in ("md", "csv", "tex")]
            + [f"snli_curves_{exp}.png" for exp in exps] + ["snli_summary.md"])


TASK = Task(
    name="snli",
    part_key="snli",
    runs="grassflow.snli.grid:snli_runs",
    train="grassflow.snli.train:train_snli",
    evaluate="grassflow.snli.evaluate:evaluate_snli_run",
    estimate="grassflow.snli.grid:estimate",
    token_dir=lambda d, p: d / "data" / "tokens" / p["snli"]["tokenizer"]["name"],
    aggregate="grassflow.report.snli:aggregate_snli",
    outputs=_outputs,
    check="grassflow.snli.grid:check_snli",
    download="grassflow.snli.data:download",
    train_tokenizer="grassflow.snli.data:train_tokenizer",
    tokenize="grassflow.snli.data:tokenize_split",
    model_key="head",
    dirs=("backbone",),
    schema="schema.yaml",
    title="SNLI",
)
