# Multi-query associative recall (MQAR), the preset's `recall` part: one recall_data job per
# (seq_len, kv) cell, then recall_train → recall_evaluate per run (each reading its cell's data)
# → recall_aggregate. `snakemake recall`: its tables, their runs and data only.


from grassflow.recall.grid import recall_cells

# Recall (recall.smk), the preset's `recall` part: its data per (seq_len, kv) cell
RECALL = PRESET_CFG.get("recall") or {}
RECALL_RUNS = TASK_RUNS["recall"]
RECALL_RES = f"{RESULTS}/recall"
RECALL_CELLS = recall_cells(RECALL) if RECALL else {}  # {cell: its data section}
RECALL_THREADS = part_threads(RECALL)
RECALL_OUTPUTS = (
    [f"{REPORT}/recall.{ext}" for ext in ("md", "csv", "tex")]
    + [f"{REPORT}/recall_vs_dmodel.png", f"{REPORT}/recall_by_distance.png"]
    if RECALL
    else []
)


wildcard_constraints:
    recall_run=alternatives(RECALL_RUNS),
    recall_cell=alternatives(RECALL_CELLS),


SPECS.update(
    {
        "recall/aggregate": aggregate_part(RECALL, "recall"),
        **{f"recall/data/{cell}": data for cell, data in RECALL_CELLS.items()},
        **run_specs("recall/", RECALL_RUNS),
    }
)


# {run: the directory of its cell's token files (recall_data)}
RECALL_DATA = {run: f"{RECALL_RES}/data/{spec['data_cell']}" for run, spec in RECALL_RUNS.items()}


rule recall_data:
    input:
        data=spec("recall/data", "recall_cell"),
    output:
        expand(f"{RECALL_RES}/data/{{{{recall_cell}}}}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/recall/data/{{recall_cell}}.log",
    conda:
        "../../envs/data.yaml"
    params:
        out_dir=lambda wc, output: Path(output[0]).parent,
        code=code_of("grassflow.recall.data"),
    shell:
        "python -m grassflow.recall.data --data {input.data} --out-dir {params.out_dir} > {log} 2>&1"


rule recall_train:
    input:
        spec=spec("recall/run", "recall_run"),
        train=lambda wc: f"{RECALL_DATA[wc.recall_run]}/train.parquet",
        val=lambda wc: f"{RECALL_DATA[wc.recall_run]}/validation.parquet",
        preflight=run_preflight(RECALL_RUNS, "recall_run"),
    output:
        weights=f"{RECALL_RES}/runs/{{recall_run}}/model.safetensors",
        config=f"{RECALL_RES}/runs/{{recall_run}}/config.json",
        metrics=f"{RECALL_RES}/runs/{{recall_run}}/metrics.jsonl",
        record=f"{RECALL_RES}/runs/{{recall_run}}/run.json",
    log:
        f"{RESULTS}/logs/recall/train/{{recall_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recall/train/{{recall_run}}.tsv"
    conda:
        "../../envs/train.yaml"
    threads: RECALL_THREADS
    resources:
        **execution(RECALL),
        **estimated("recall_train", RECALL_RUNS, "recall_run"),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of("grassflow.recall.train", RECALL_RUNS[wc.recall_run]["model_kind"]),
        out_dir=f"{RECALL_RES}/runs/{{recall_run}}",
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.recall.train --spec {input.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} > {log} 2>&1"


rule recall_evaluate:
    input:
        weights=f"{RECALL_RES}/runs/{{recall_run}}/model.safetensors",
        config=f"{RECALL_RES}/runs/{{recall_run}}/config.json",
        record=f"{RECALL_RES}/runs/{{recall_run}}/run.json",
        val=lambda wc: f"{RECALL_DATA[wc.recall_run]}/validation.parquet",
        test=lambda wc: f"{RECALL_DATA[wc.recall_run]}/test.parquet",
        preflight=run_preflight(RECALL_RUNS, "recall_run"),
    output:
        f"{RECALL_RES}/runs/{{recall_run}}/eval.json",
    log:
        f"{RESULTS}/logs/recall/evaluate/{{recall_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recall/evaluate/{{recall_run}}.tsv"
    conda:
        "../../envs/train.yaml"
    threads: RECALL_THREADS
    resources:
        **estimated("recall_evaluate", RECALL_RUNS, "recall_run"),
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    params:
        code=lambda wc: code_of(
            "grassflow.recall.evaluate", RECALL_RUNS[wc.recall_run]["model_kind"]
        ),
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
        "python -m grassflow.recall.evaluate --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} > {log} 2>&1"


rule recall_aggregate:
    input:
        evals=run_files(RECALL_RES, RECALL_RUNS, "eval.json"),
        records=run_files(RECALL_RES, RECALL_RUNS, "run.json"),
        metrics=run_files(RECALL_RES, RECALL_RUNS, "metrics.jsonl"),
        # its own part only, without execution keys: other tasks' edits leave its tables alone
        preset=spec("recall/aggregate"),
    output:
        shown(RECALL_OUTPUTS, "Recall"),
    log:
        f"{RESULTS}/logs/recall/aggregate.log",
    conda:
        "../../envs/report.yaml"
    params:
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=" ".join(f"{RECALL_RES}/runs/{run}" for run in RECALL_RUNS),
        code=code_of("grassflow.recall.aggregate"),
    shell:
        "python -m grassflow.recall.aggregate --preset {input.preset} --preset-name {params.preset_name} "
        "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"


rule recall:  # `snakemake recall`: its table and figures, every run's evaluation, their data
    input:
        RECALL_OUTPUTS,
        run_files(RECALL_RES, RECALL_RUNS, "eval.json"),
