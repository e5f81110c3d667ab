# Multi-query associative recall (MQAR), the preset's `recall` part: one recall_data job per
# (seq_len, kv) cell, then recall_train → recall_evaluate per run (each reading its cell's data) →
# recall_aggregate. `snakemake recall`: its tables, their runs and data only.
from grassflow.recall.layout import recall_layout

# its names (grassflow.recall.layout)
RECALL = recall_layout(PRESET_CFG, TASK_RUNS["recall"], RESULTS)


wildcard_constraints:
    recall_run=alternatives(RECALL.runs),
    recall_cell=alternatives(RECALL.cells),


rule recall_data:
    output:
        expand(f"{RECALL.res}/data/{{{{recall_cell}}}}/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/recall/data/{{recall_cell}}.log",
    conda:
        "../../envs/data.yaml"
    params:
        data=lambda wc: as_json(RECALL.cells[wc.recall_cell]),
        out_dir=lambda wc, output: Path(output[0]).parent,
        code=code_of("grassflow.recall.data"),
    shell:
        "python -m grassflow.recall.data --data {params.data:q} --out-dir {params.out_dir} > {log} 2>&1"


use rule train as recall_train with:
    input:
        train=lambda wc: f"{RECALL.data[wc.recall_run]}/train.parquet",
        val=lambda wc: f"{RECALL.data[wc.recall_run]}/validation.parquet",
        preflight=run_preflight(RECALL.runs, "recall_run"),
    output:
        **run_outputs(f"{RECALL.res}/runs/{{recall_run}}"),
    log:
        f"{RESULTS}/logs/recall/train/{{recall_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recall/train/{{recall_run}}.tsv"
    threads: THREADS["recall"]
    resources:
        **run_resources("recall", "train", RECALL.runs, "recall_run"),
    params:
        stage="grassflow.recall.train",
        spec=lambda wc: quoted_json([RECALL.runs[wc.recall_run]]),
        code=lambda wc: code_of("grassflow.recall.train", RECALL.runs[wc.recall_run]["model_kind"]),
        out_dir=f"{RECALL.res}/runs/{{recall_run}}",
        extra="",


use rule evaluate as recall_evaluate with:
    input:
        weights=f"{RECALL.res}/runs/{{recall_run}}/model.safetensors",
        config=f"{RECALL.res}/runs/{{recall_run}}/config.json",
        record=f"{RECALL.res}/runs/{{recall_run}}/run.json",
        val=lambda wc: f"{RECALL.data[wc.recall_run]}/validation.parquet",
        test=lambda wc: f"{RECALL.data[wc.recall_run]}/test.parquet",
        preflight=run_preflight(RECALL.runs, "recall_run"),
    output:
        f"{RECALL.res}/runs/{{recall_run}}/eval.json",
    log:
        f"{RESULTS}/logs/recall/evaluate/{{recall_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recall/evaluate/{{recall_run}}.tsv"
    threads: THREADS["recall"]
    resources:
        **run_resources("recall", "evaluate", RECALL.runs, "recall_run"),
    params:
        stage="grassflow.recall.evaluate",
        code=lambda wc: code_of(
            "grassflow.recall.evaluate", RECALL.runs[wc.recall_run]["model_kind"]
        ),
        extra="",


use rule snli_aggregate as recall_aggregate with:
    input:
        evals=run_files(RECALL.res, RECALL.runs, "eval.json"),
        records=run_files(RECALL.res, RECALL.runs, "run.json"),
        metrics=run_files(RECALL.res, RECALL.runs, "metrics.jsonl"),
    output:
        shown(RECALL.outputs, "Recall"),
    log:
        f"{RESULTS}/logs/recall/aggregate.log",
    params:
        stage="grassflow.recall.aggregate",
        preset=as_json(table_part(RECALL.part, "recall")),
        runs=" ".join(f"{RECALL.res}/runs/{run}" for run in RECALL.runs),
        code=code_of("grassflow.recall.aggregate"),


rule recall:  # `snakemake recall`: its table and figures, every run's evaluation, their data
    input:
        RECALL.outputs,
        run_files(RECALL.res, RECALL.runs, "eval.json"),
