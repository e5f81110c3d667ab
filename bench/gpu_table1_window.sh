#!/usr/bin/env bash
# One short GPU lease as one command (`make gpu-table1-window`): the measurement that
# train.runs_per_gpu is chosen from (docs/gpu.md), then the paper's Table 1 on Wikitext-2 v1 (paper_v1:
# 3 seeds x 2 models, the paper's settings) for as long as the window lasts.
#   1. the preflight the DAG runs first (results/paper_v1/preflight/auto_auto.json)
#   2. K = 1, 2, 4, 8 Table 1 steps side by side (python -m grassflow.bench --concurrency)
#   3. the six training jobs side by side (K = 6 slots), each exactly as the `train` rule runs it,
#      with TensorBoard on (the rule's shell command, copied: tests/test_pipeline_outputs.py checks they match); when the window ends each gets SIGTERM, checkpoints and exits 75, so
#      `snakemake table1` resumes them later. Every finished epoch is in its metrics.jsonl.
# It needs the token files and specs, which any machine makes in a minute:
#   T=results/paper_v1; snakemake $T/data/tokens/bert-base-uncased/{train,validation,test}.parquet \
#     $(for m in transformer grassmann; do for s in 0 1 2; do echo $T/specs/run/table1-$m-s$s.json; done; done) \
#     --cores all --configfile config.yaml workflow/overlays/wikitext2-v1-local.yaml
# then carry results/paper_v1 to the GPU machine.
# What comes out (no weights, no checkpoints) goes to $OUT: nvidia-smi, the concurrency report,
# and records.tar.gz (each run's metrics.jsonl, TensorBoard events, log, the GPU's load).
set -u
OUT=${OUT:-reports/gpu-window}
PY=${PY:-python3}
WINDOW=${WINDOW:-550}          # seconds from the start to the SIGTERM of the training jobs
BENCH_ARGS=${BENCH_ARGS:---device cuda --concurrency 1,2,4,8 --steps 30}
RES=results/paper_v1
RUNS="table1-transformer-s0 table1-grassmann-s0 table1-transformer-s1 table1-grassmann-s1 table1-transformer-s2 table1-grassmann-s2"
start=$(date +%s)
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
mkdir -p "$OUT" $RES/logs/train $RES/logs/preflight
for run in $RUNS; do
  [ -f $RES/specs/run/$run.json ] || { echo "error: $RES/specs/run/$run.json is missing: make the specs first (see the top of $0)"; exit 2; }
done

{ nvidia-smi; $PY -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)"; } > "$OUT/machine.txt" 2>&1

$PY -m grassflow preflight --device auto --backend auto --snli --out $RES/preflight/auto_auto.json \
  > $RES/logs/preflight/auto_auto.log 2>&1 || { cat $RES/logs/preflight/auto_auto.log; exit 1; }
echo "[window] preflight done at $(( $(date +%s) - start )) s"

timeout 170 $PY -m grassflow.bench $BENCH_ARGS --out "$OUT" \
  || echo "[window] the concurrency benchmark did not finish (exit $?)"
echo "[window] concurrency done at $(( $(date +%s) - start )) s"

(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > $RES/logs/gpu-load.csv 2>&1 &)
export GRASSFLOW_RUNS_PER_GPU=6
pids=""
for run in $RUNS; do
  $PY -m grassflow.stage lm train --spec $RES/specs/run/$run.json \
    --train-tokens $RES/data/tokens/bert-base-uncased/train.parquet \
    --val-tokens $RES/data/tokens/bert-base-uncased/validation.parquet --out-dir $RES/runs/$run \
    --preflight $RES/preflight/auto_auto.json --compile auto --compile-mode default --trackers tensorboard \
    > $RES/logs/train/$run.log 2>&1 &
  pids="$pids $!"
done
while [ $(( $(date +%s) - start )) -lt "$WINDOW" ] && kill -0 $pids 2>/dev/null; do sleep 5; done
echo "[window] SIGTERM at $(( $(date +%s) - start )) s"
kill -TERM $pids 2>/dev/null
for p in $pids; do wait "$p"; echo "[window] job $p exit $?"; done
pkill -f "nvidia-smi --query-gpu" || true

tar czf "$OUT/records.tar.gz" --exclude='*.pt' --exclude='*.safetensors' --exclude='checkpoint*' \
  $RES/runs $RES/logs $RES/preflight
for run in $RUNS; do
  echo "$run: $(wc -l < $RES/runs/$run/metrics.jsonl 2>/dev/null || echo 0) epochs; $(tail -c 300 $RES/runs/$run/metrics.jsonl 2>/dev/null)"
done
echo "[window] done at $(( $(date +%s) - start )) s"
