"""Multi-query associative recall (MQAR, zoology): the preset's `recall` part: one data job per
(seq_len, kv) cell, then one run per cell × d_model × model × learning rate × seed."""

from grassflow.pipeline.tasks import Task
from grassflow.recall.grid import check_model, check_recall, estimate, recall_runs

TASK = Task(
    name="recall",
    part_key="recall",
    runs=recall_runs,
    estimate=estimate,  # sizes from the config: one data directory per cell
    check=check_recall,
    check_model=check_model,
    schema="schema.yaml",
)
