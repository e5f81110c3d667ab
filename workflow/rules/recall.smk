# Multi-query associative recall (MQAR, zoology), for presets with a `recall` part:
#   recall_data (one job per (seq_len, kv) cell) → recall_train (one job per run)
#   → recall_evaluate (both in runs.smk) → recall_aggregate
if RECALL:

    rule recall_data:
        input:
            examples=spec("recall/examples", RECALL["data"]["examples"]),
        output:
            expand(f"{RECALL_DATA}/{{split}}.parquet", split=SPLITS, allow_missing=True),
        params:
            gf=GF,
            vocab=RECALL["data"]["vocab"],
            seed=RECALL["data"]["seed"],
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
            "--seed {params.seed} --examples {input.examples} --out-dir {params.out_dir} > {log} 2>&1"

    rule recall_aggregate:
        input:
            evals=recall_run_outputs("eval.json"),
            records=recall_run_outputs("run.json"),
            preset=spec("recall/aggregate", {"recall": {**RECALL, "train": run_train(RECALL["train"])}}),
        output:
            tables=[report(t, category="Recall", labels={"table": Path(t).name})
                    for t in recall_outputs() if not t.endswith(".png")],
            figures=[report(f, caption="../report/recall.rst", category="Recall", labels={"figure": Path(f).stem})
                     for f in recall_outputs() if f.endswith(".png")],
        params:
            gf=GF,
            preset_name=PRESET,
            out_dir=lambda wc, output: Path(output.tables[0]).parent,
            runs=" ".join(f"{RECALL_RES}/runs/{r}" for r in RECALL_RUNS),
            code=code_of("recall-aggregate"),
        conda:
            "../../envs/report.yaml"
        log:
            f"{RES}/logs/recall/aggregate.log",
        shell:
            "{params.gf} recall-aggregate --preset {input.preset} --preset-name {params.preset_name} "
            "--runs {params.runs} --out-dir {params.out_dir} > {log} 2>&1"

    rule recall:  # `snakemake recall`: just the recall grid, its runs, table and figures
        input:
            recall_outputs(),
