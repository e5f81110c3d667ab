# train.fuse_seeds: a config's seeds (FUSED, common.smk) trained as one ensemble by one job, each
# run's outputs in its own directory as rule `train` writes them; the evaluations read them as
# any run's. The resume state is the group's (results/<preset>/fused/<group>/last.pt).
if FUSED:

    rule train_fused:
        input:
            specs=lambda wc: [f"{RES}/specs/run/{r}.json" for r in FUSED[wc.group]],
            train=f"{TOKENS}/train.parquet",
            val=f"{TOKENS}/validation.parquet",
            preflight=run_preflight("lm"),
        output:
            **{
                f"{f}_s{seed}": f"{RES}/runs/{{group}}-s{seed}/{name}"
                for seed in P["seeds"]
                for f, name in (
                    ("weights", "model.safetensors"),
                    ("config", "config.json"),
                    ("metrics", "metrics.jsonl"),
                    ("record", "run.json"),
                )
            },
        log:
            f"{RES}/logs/train_fused/{{group}}.log",
        benchmark:
            f"{RES}/benchmarks/train_fused/{{group}}.tsv"
        wildcard_constraints:
            group="|".join(map(re.escape, FUSED)),
        conda:
            "../../envs/train.yaml"
        threads: P["train"]["threads"]
        resources:
            **EXEC["lm"],
            **fused_estimated(),
            gpu=1,
            runs_per_gpu=RUNS_PER_GPU,
        params:
            code=lambda wc: code_of("train-fused", RUNS[FUSED[wc.group][0]]["model_kind"]),
            out_dirs=lambda wc: " ".join(f"{RES}/runs/{r}" for r in FUSED[wc.group]),
            work_dir=lambda wc: f"{RES}/fused/{wc.group}",
        shell:
            "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} "
            "python -m grassflow.stage lm train_fused --specs {input.specs} --train-tokens {input.train} "
            "--val-tokens {input.val} --out-dirs {params.out_dirs} --work-dir {params.work_dir} "
            "--preflight {input.preflight} --compile {resources.compile} --compile-mode {resources.compile_mode} "
            "--trackers {resources.trackers} > {log} 2>&1"
