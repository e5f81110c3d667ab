# Multi-query associative recall (MQAR, zoology), for presets with a `recall` part:
#   recall_data (one job per (seq_len, kv) cell) → recall_train (one job per run)
#   → recall_evaluate → recall_aggregate
# A run's spec param holds all it depends on; its code param the hash of the code it runs.
if RECALL:

    rule recall_data:
        output:
            expand(f"{RECALL_DATA}/{{split}}.parquet", split=SPLITS, allow_missing=True),
        params:
            gf=GF,
            vocab=RECALL["data"]["vocab"],
            seed=RECALL["data"]["seed"],
            examples=quoted_json(RECALL["data"]["examples"]),
            seq_len=lambda wc: RECALL_CELLS[wc.recall_cell]["seq_len"],
            kv=lambda wc: RECALL_CELLS[wc.recall_cell]["kv"],
            out_dir=lambda wc, output: Path(output[0]).parent,
            code=code_of("recall-data"),
        conda:
            "../../envs/data.yaml"
        log:
            f"{RES}/logs/recall/data/{{recall_cell}}.log",
        shell:
            "{params.gf} recall-data --vocab {params.vocab} --seq-len {params.seq_len} --kv {params.kv} "
            "--seed {params.seed} --examples {params.examples} --out-dir {params.out_dir} > {log} 2>&1"

    rule recall_train:
        input:
            train=recall_cell_file("train"),
            val=recall_cell_file("validation"),
            preflight=recall_preflight,
        output:
            best=f"{RECALL_RUN_DIR}/best.pt",
            metrics=f"{RECALL_RUN_DIR}/metrics.jsonl",
            record=f"{RECALL_RUN_DIR}/run.json",
        threads: RECALL["train"]["threads"]
        params:
            gf=GF,
            spec=lambda wc: quoted_json(RECALL_RUNS[wc.recall_run]),
            code=lambda wc: code_of("recall-train", RECALL_RUNS[wc.recall_run]["model_kind"]),
            out_dir=RECALL_RUN_DIR,
        resources:
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
            **RECALL_EXEC,
            **estimated("recall_train", lambda wc: RECALL_RUNS[wc.recall_run]),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/recall/train/{{recall_run}}.log",
        benchmark:
            f"{RES}/benchmarks/recall/train/{{recall_run}}.tsv"
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} recall-train --spec {params.spec} --train-tokens {input.train} "
            "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} --compile {resources.compile} --compile-mode {resources.compile_mode} > {log} 2>&1"

    rule recall_evaluate:
        input:
            best=f"{RECALL_RUN_DIR}/best.pt",
            record=f"{RECALL_RUN_DIR}/run.json",
            val=recall_cell_file("validation"),
            test=recall_cell_file("test"),
            preflight=recall_preflight,
        output:
            f"{RECALL_RUN_DIR}/eval.json",
        threads: RECALL["train"]["threads"]
        params:
            gf=GF,
            code=lambda wc: code_of("recall-evaluate", RECALL_RUNS[wc.recall_run]["model_kind"]),
        resources:
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
            **estimated("recall_evaluate", lambda wc: RECALL_RUNS[wc.recall_run]),
        conda:
            "../../envs/train.yaml"
        log:
            f"{RES}/logs/recall/evaluate/{{recall_run}}.log",
        benchmark:
            f"{RES}/benchmarks/recall/evaluate/{{recall_run}}.tsv"
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} recall-evaluate --checkpoint {input.best} --run-json {input.record} "
            "--val-tokens {input.val} --test-tokens {input.test} --out {output} > {log} 2>&1"

    rule recall_aggregate:
        input:
            evals=recall_run_outputs("eval.json"),
            records=recall_run_outputs("run.json"),
        output:
            tables=[report(t, category="Recall", labels={"table": Path(t).name})
                    for t in recall_outputs() if not t.endswith(".png")],
            figures=[report(f, caption="../report/recall.rst", category="Recall", labels={"figure": Path(f).stem})
                     for f in recall_outputs() if f.endswith(".png")],
        params:
            gf=GF,
            preset_name=PRESET,
            out_dir=lambda wc, output: Path(output.tables[0]).parent,
            preset=quoted_json({"recall": {**RECALL, "train": run_train(RECALL["train"])}}),
            runs=" ".join(f"{RECALL_RES}/runs/{r}" for r in RECALL_RUNS),
            code=code_of("recall-aggregate"),
        conda:
            "../../envs/report.yaml"
        log:
            f"{RES}/logs/recall/aggregate.log",
        shell:
            "{params.gf} recall-aggregate --preset {params.preset} --preset-name {params.preset_name} "
            "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"

    rule recall:  # `snakemake recall`: just the recall grid, its runs, table and figures
        input:
            recall_outputs(),
