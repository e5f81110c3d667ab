# Stage 4: perplexities (chunked, strided, word-level) of each run's best checkpoint.


rule evaluate:
    input:
        best=f"{RUN_DIR}/best.pt",
        record=f"{RUN_DIR}/run.json",
        val=f"{TOKENS}/validation.parquet",
        test=f"{TOKENS}/test.parquet",
        preflight=lm_preflight,
    output:
        f"{RUN_DIR}/eval.json",
    threads: P["train"]["threads"]
    params:
        gf=GF,
        code=lambda wc: code_of("evaluate", RUNS[wc.run]["model_kind"]),
    resources:
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
        **estimated("evaluate", lambda wc: RUNS[wc.run], LM_FILES),
    conda:
        "../../envs/train.yaml"
    log:
        f"{RES}/logs/evaluate/{{run}}.log",
    benchmark:
        f"{RES}/benchmarks/evaluate/{{run}}.tsv"
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} evaluate --checkpoint {input.best} --run-json {input.record} "
        "--val-tokens {input.val} --test-tokens {input.test} --out {output} > {log} 2>&1"
