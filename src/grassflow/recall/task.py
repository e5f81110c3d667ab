"""Multi-query associative recall (MQAR, zoology): the preset's `recall` part: one data job per
(seq_len, kv) cell, then one run per cell × d_model × model × learning rate × seed."""

from grassflow.pipeline.tasks import Task
from grassflow.recall.grid import check_model, check_recall, estimate, recall_cells, recall_runs

TASK = Task(
    name="recall",
    part_key="recall",
    runs=recall_runs,
    estimate=estimate,  # sizes from the config: one data directory per cell
    check=check_recall,
    check_model=check_model,
    cells=recall_cells,
    outputs=lambda part: [f"recall.{ext}" for ext in ("md", "csv", "tex")]
    + ["recall_vs_dmodel.png", "recall_by_distance.png"],
    schema="schema.yaml",
    title="Recall",
)
