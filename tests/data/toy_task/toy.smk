# The toy task's rules (tests/pipeline/test_tasks.py copies this file to workflow/rules/toy.smk and includes
# it): toy_data → toy_train → toy_evaluate → toy_aggregate, and its target `toy`. Its data, training
# and evaluation are recall's stages; its table is its own (grassflow.toy.toy).
TOY = PRESET_CFG.get("toy") or {}
TOY_RUNS = TASK_RUNS["toy"]
TOY_RES = f"{RESULTS}/toy"
TOY_FILES = {s: f"{TOY_RES}/data/{s}.parquet" for s in SPLITS} if TOY else None
TOY_OUTPUTS = [f"{REPORT}/toy.md", f"{REPORT}/toy.csv"] if TOY else []


wildcard_constraints:
    toy_run=alternatives(TOY_RUNS),


rule toy_data:
    output:
        expand(f"{TOY_RES}/data/{{split}}.parquet", split=SPLITS),
    log:
        f"{RESULTS}/logs/toy/data.log",
    params:
        data=as_json(TOY.get("data")),
        out_dir=lambda wc, output: Path(output[0]).parent,
        code=code_of("grassflow.recall.data"),
    shell:
        "python -m grassflow.recall.data --data {params.data:q} --out-dir {params.out_dir} > {log} 2>&1"


rule toy_train:
    input:
        train=f"{TOY_RES}/data/train.parquet",
        val=f"{TOY_RES}/data/validation.parquet",
        preflight=run_preflight(TOY_RUNS, "toy_run"),
    output:
        weights=f"{TOY_RES}/runs/{{toy_run}}/model.safetensors",
        config=f"{TOY_RES}/runs/{{toy_run}}/config.json",
        metrics=f"{TOY_RES}/runs/{{toy_run}}/metrics.jsonl",
        record=f"{TOY_RES}/runs/{{toy_run}}/run.json",
    log:
        f"{RESULTS}/logs/toy/train/{{toy_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/toy/train/{{toy_run}}.tsv"
    threads: THREADS["toy"]
    resources:
        **run_resources("toy", "train", TOY_RUNS, "toy_run", TOY_FILES),
    params:
        spec=lambda wc: as_json(TOY_RUNS[wc.toy_run]),
        code=lambda wc: code_of("grassflow.recall.train", TOY_RUNS[wc.toy_run]["model_kind"]),
        out_dir=f"{TOY_RES}/runs/{{toy_run}}",
    shell:
        "python -m grassflow.recall.train --spec {params.spec:q} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} "
        "--compile {resources.compile} --compile-mode {resources.compile_mode} "
        "--trackers {resources.trackers} --code {params.code} > {log} 2>&1"


rule toy_evaluate:
    input:
        weights=f"{TOY_RES}/runs/{{toy_run}}/model.safetensors",
        record=f"{TOY_RES}/runs/{{toy_run}}/run.json",
        val=f"{TOY_RES}/data/validation.parquet",
        test=f"{TOY_RES}/data/test.parquet",
        preflight=run_preflight(TOY_RUNS, "toy_run"),
    output:
        f"{TOY_RES}/runs/{{toy_run}}/eval.json",
    log:
        f"{RESULTS}/logs/toy/evaluate/{{toy_run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/toy/evaluate/{{toy_run}}.tsv"
    threads: THREADS["toy"]
    resources:
        **run_resources("toy", "evaluate", TOY_RUNS, "toy_run", TOY_FILES),
    params:
        code=lambda wc: code_of("grassflow.recall.evaluate", TOY_RUNS[wc.toy_run]["model_kind"]),
    shell:
        "python -m grassflow.recall.evaluate --weights {input.weights} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} > {log} 2>&1"


rule toy_aggregate:
    input:
        evals=run_files(TOY_RES, TOY_RUNS, "eval.json"),
        records=run_files(TOY_RES, TOY_RUNS, "run.json"),
        metrics=run_files(TOY_RES, TOY_RUNS, "metrics.jsonl"),
    output:
        shown(TOY_OUTPUTS, "Toy"),
    log:
        f"{RESULTS}/logs/toy/aggregate.log",
    params:
        preset=as_json(table_part(TOY, "toy")),
        preset_name=PRESET,
        out_dir=lambda wc, output: Path(output[0]).parent,
        runs=" ".join(f"{TOY_RES}/runs/{run}" for run in TOY_RUNS),
        code=code_of("grassflow.toy.toy"),
    shell:
        "python -m grassflow.toy.toy --preset {params.preset:q} --preset-name {params.preset_name} "
        "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"


rule toy:
    input:
        TOY_OUTPUTS,
        run_files(TOY_RES, TOY_RUNS, "eval.json"),
