"""The planning: presets and their checks (presets), the tasks' declarations (tasks), the schema's
generated sections (schema), the jobs' estimates (estimate) and their report (estimates_report),
`grassflow plan` (plan) and the code each job runs (staleness). Imported by the Snakefile and by
`grassflow plan`, never by a job (tested): what it decides reaches a job through its spec file."""
