# One cheap job per (device, op backend) on the kind of node the GPU jobs use: it checks the
# device, the Plücker op backend and a training step of each model first (see common.smk).
rule preflight:
    output:
        preflight_file("{pf_device}", "{pf_backend}"),
    log:
        f"{RESULTS}/logs/preflight/{{pf_device}}_{{pf_backend}}.log",
    conda:
        "../../envs/train.yaml"
    threads: PREFLIGHT_THREADS
    resources:
        gpu=1,
        runs_per_gpu=RUNS_PER_GPU,
    shell:
        "OMP_NUM_THREADS={threads} GRASSFLOW_RUNS_PER_GPU={resources.runs_per_gpu} python -m grassflow.preflight "
        "--device {wildcards.pf_device} --backend {wildcards.pf_backend} --snli --out {output} > {log} 2>&1"
