# Multi-query associative recall (MQAR, zoology), for presets with a `recall` part:
#   recall_data (one job per (seq_len, kv) cell) → recall_train (one job per run)
#   → recall_evaluate (both in runs.smk) → recall_aggregate (tasks.smk)
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

    RUN_DATA["recall"] = recall_cell_file  # a run reads its cell's files (runs.smk)
