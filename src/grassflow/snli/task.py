"""SNLI (paper Table 3): the preset's `snli` part; its rules: workflow/rules/snli.smk."""

from grassflow.pipeline.tasks import Task
from grassflow.snli.grid import check_model, check_snli, estimate, snli_runs


def _outputs(part: dict) -> list[str]:
    exps = list(part["experiments"])
    return ([f"snli_{exp}.{ext}" for exp in exps for ext in ("md", "csv", "tex")]
            + [f"snli_curves_{exp}.png" for exp in exps] + ["snli_summary.md"])


TASK = Task(
    name="snli",
    part_key="snli",
    runs=snli_runs,
    estimate=estimate,
    check=check_snli,
    check_model=check_model,
    token_dir=lambda d, p: d / "data" / "tokens" / p["snli"]["tokenizer"]["name"],
    outputs=_outputs,
    tokenizer=True,
    model_key="head",
    schema="schema.yaml",
    title="SNLI",
)
