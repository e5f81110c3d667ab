"""The planning: presets and their checks (presets), the tasks' declarations (tasks), the schema's
generated sections (schema), the jobs' estimates (estimate), `grassflow plan` (plan: the
estimates before a run, the measured times beside them after it) and the code each job runs
(staleness). Imported by the Snakefile and by `grassflow plan`, never by a job (tested): what it
decides reaches a job as its params."""
