"""The planning that reads every task (above the tasks): the tasks' table (tasks), presets and their
checks (presets) and `grassflow plan` (preview: the estimates before a run, the measured times
beside them after it). What every task's planning shares is below the tasks, in grassflow.planning.
Imported by the Snakefile and by `grassflow plan`, never by a job (tested): what it decides reaches
a job as its params."""
