"""The planning every task's planning reads (below the tasks): a preset's sections as a task's grid
reads them (sections), the schema's sections made from their dataclasses (schema), the jobs'
estimates (estimate) and the code each job runs (staleness). It imports no task and nothing that
reads the tasks (tested); grassflow.pipeline, above the tasks, does. Imported by the Snakefile and
the planning, never by a job: what it decides reaches a job as its params."""
