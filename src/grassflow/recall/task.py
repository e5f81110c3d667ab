"""Multi-query associative recall (MQAR, zoology): the preset's `recall` part: one data job per
(seq_len, kv) cell, then one run per cell × d_model × model × learning rate × seed."""

from grassflow.declaration import Task

TASK = Task(
    name="recall",
    part_key="recall",
    runs="grassflow.recall.grid:recall_runs",
    train="grassflow.recall.train:train_recall",
    evaluate="grassflow.recall.evaluate:evaluate_recall_run",
    estimate="grassflow.recall.grid:estimate",  # sizes from the config: one data directory per cell
    aggregate="grassflow.report.recall:aggregate_recall",
    outputs=lambda part: [f"recall.{ext}" for ext in ("md", "csv", "tex")]
    + ["recall_vs_dmodel.png", "recall_by_distance.png"],
    check="grassflow.recall.grid:check_recall",
    data="grassflow.recall.data:make_cell",
    cells="grassflow.recall.grid:recall_cells",
    schema="schema.yaml",
    title="Recall",
)
