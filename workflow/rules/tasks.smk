# The rules every declared task (grassflow.tasks) gets beyond its runs' (runs.smk): its tables
# (`<task>_aggregate`, for a task that declares `aggregate`: SNLI, recall), its target
# (`snakemake snli`: its tables, their runs and data only) and, for a task that declares `data`,
# its data job (`<task>_data`; one per cell for a task with `cells`: recall's). The LM's tables
# have their own rules (report.smk), as the text tasks' data have (data.smk).


def _task_rules(task):
    part = task.part(P)
    caption = Path(workflow.basedir, "workflow", "report", f"{task.name}.rst")
    captioned = {"caption": f"../report/{task.name}.rst"} if caption.is_file() else {}

    if task.data:
        cells = entry(task.cells)(part) if task.cells else None  # one job per cell, else one
        cell = f"{{{task.name}_cell}}" if cells else None
        log = f"{RES}/logs/{task.name}/" + (f"data/{cell}" if cells else "data") + ".log"

        rule:
            name:
                task.rule("data")
            input:
                data=(
                    specs(f"{task.subdir}data", cells, f"{task.name}_cell")
                    if cells
                    else spec(f"{task.subdir}data", part["data"])
                ),
            output:
                [str(f) for f in task.files(RES, P, cell).values()],
            log:
                log,
            conda:
                "../../envs/data.yaml"
            params:
                out_dir=lambda wc, output: Path(output[0]).parent,
                code=code_of(task.command("data")),
            shell:
                f"{task.job('data')} --data {{input.data}} --out-dir {{params.out_dir}} > {{log}} 2>&1"

    if not task.aggregate:
        return

    rule:
        name:
            task.rule("aggregate")
        input:
            evals=task_run_outputs(task, "eval.json"),
            records=task_run_outputs(task, "run.json"),
            metrics=task_run_outputs(task, "metrics.jsonl"),
            # only its own part, without execution keys: other tasks' edits leave its tables alone
            preset=spec(
                f"{task.name}/aggregate",
                {task.part_key: {**part, "train": run_train(part["train"])}},
            ),
        output:
            [
                report(
                    f,
                    category=task.title,
                    labels={"figure" if f.endswith(".png") else "table": Path(f).name},
                    **captioned,
                )
                for f in task_outputs(task)
            ],
        log:
            f"{RES}/logs/{task.name}/aggregate.log",
        conda:
            "../../envs/report.yaml"
        params:
            preset_name=PRESET,
            out_dir=lambda wc, output: Path(output[0]).parent,
            runs=" ".join(str(Path(f).parent) for f in task_run_outputs(task, "eval.json")),
            code=code_of(task.command("aggregate")),
        shell:
            f"{task.job('aggregate')} --preset {{input.preset}} --preset-name {{params.preset_name}} "
            "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"

    rule:
        name:
            task.name
        input:
            task_outputs(task),


for _task in ACTIVE:
    _task_rules(_task)
