# One cheap job on the kind of node the GPU jobs use checks the device, a Plücker op backend and a
# training step of each model first; every GPU job depends on the preflight of its (train.device,
# backend): a Transformer's on the backend `auto` (run_preflight, common.smk). The preflight has no
# params or code fingerprint: it reruns only when its record is missing (then all it guards rerun:
# Snakemake cannot order a job before others without their rerunning after it). ancient() would not
# do: when an ancient input's producer must rerun, Snakemake 9 skips the dependent jobs' own rerun
# reasons (changed params), so they would silently stay stale. Its threads: those of the pipeline
# run's training jobs (grassflow.pipeline.tasks.pipeline_train).
PREFLIGHT_THREADS = pipeline_train(PRESET_CFG)["threads"]
# the op's backends: the one list (grassflow.models.config)
from grassflow.models.config import PLUCKER_BACKENDS


wildcard_constraints:
    pf_device="auto|cpu|cuda",
    pf_backend=alternatives(PLUCKER_BACKENDS),


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
        "python -m grassflow.preflight "
        "--device {wildcards.pf_device} --backend {wildcards.pf_backend} --snli --out {output} > {log} 2>&1"
