# Stage 3: one training job per run (experiment × model × seed), after the preflight of its
# device and op backend (whose record it keeps in run.json; see common.smk). The spec param holds all
# the run depends on; the code param the hash of its model's source: changing a Grassmann
# setting or file reruns Grassmann runs only.


rule train:
    input:
        train=f"{TOKENS}/train.parquet",
        val=f"{TOKENS}/validation.parquet",
        preflight=lm_preflight,
    output:
        best=f"{RUN_DIR}/best.pt",
        metrics=f"{RUN_DIR}/metrics.jsonl",
        record=f"{RUN_DIR}/run.json",
    threads: P["train"]["threads"]
    params:
        gf=GF,
        spec=lambda wc: quoted_json(RUNS[wc.run]),
        code=lambda wc: code_of("train", RUNS[wc.run]["model_kind"]),
        out_dir=RUN_DIR,
    resources:
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
        **LM_EXEC,
        **estimated("train", lambda wc: RUNS[wc.run], LM_FILES),
    conda:
        "../../envs/train.yaml"
    log:
        f"{RES}/logs/train/{{run}}.log",
    benchmark:
        f"{RES}/benchmarks/train/{{run}}.tsv"
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} {params.gf} train --spec {params.spec} --train-tokens {input.train} "
        "--val-tokens {input.val} --out-dir {params.out_dir} --preflight {input.preflight} --compile {resources.compile} --compile-mode {resources.compile_mode} > {log} 2>&1"

