#!/usr/bin/env bash
# One GPU lease in one or two commands (`make gpu-paper-window`): the paper's Tables 1 and 2 at the
# paper's settings on Wikitext-2 v1 (paper_v1: 3 seeds x 2 models each, 30 epochs), by the DAG itself.
#   0. the copy checked: by content against the prepared commit's tree (.gpu-tree.json, from make
#      gpu-paper-prepare: git's blob ids, modes ignored; the copy's own .git may lag), else by git;
#      a file that differs, is missing or is new is refused, named: runs trace to a commit
#   1. the preflight (the DAG's own job, run first here so that a broken GPU stops the window); then
#      the first minute (python -m grassflow.lease choose, at most BOX seconds): each candidate setting
#      (train.compile x head_loss) checked against the reference's loss and gradients on a fused
#      group of each table's config, and timed; the fastest that passed is trained with (none
#      passing: no training), and the seeds whose groups finish within the LEASE (its command time
#      across its commands; runs finished in an earlier lease, FINISHED, are adopted from their
#      committed records, not trained again; the progress a last.pt holds counted), said before
#      training. The lease's next command (CARRY=/none) reuses that choice and times nothing
#   2. `snakemake $TARGETS` (tables or grids; default: the sweep, Table 1's runs in FINISHED) with train.fuse_seeds
#      (each config's seeds to train one job), the jobs side by side on the GPU (train.runs_per_gpu;
#      MPS=1: under CUDA's MPS), their evaluations and the tables; at DEADLINE seconds from this
#      command's start (or on SIGUSR1) every training job gets SIGTERM, checkpoints and exits 75, and
#      Snakemake finishes what it can: the same command again, on the same machine, resumes them
#      (--keep-incomplete: a stopped run's metrics.jsonl, its epochs so far, stays); once a group's
#      first epoch is in, its projected finish against the deadline and the lease
#   3. what comes back, without weights or checkpoints, packed into $OUT (at most 8 files of 16 MiB):
#      window.log, records.tar.gz (each run's records and log, the tables and figures, Snakemake's
#      benchmark files, the GPU's load); each run's epochs and best validation PPL so far
#   4. with the time left, if any, the benchmark rows (old vs new kernels, graph vs eager, the head)
# Before the lease, on any machine (`make gpu-paper-prepare`): the token files and the commit's tree, and
# the wheels the GPU machine lacks (`make gpu-wheels`: snakemake for its Python), carried along.
# The decisions are Python's (python -m grassflow.lease <verb>, its exit codes read here; every line
# it prints is for the log); this script keeps the environment, the wheels, the tar, MPS, the load log,
# the background Snakemake, its signals and the pack. Tested on the CPU with the demo preset
# (tests/gpu/test_paper_window.py).
set -u
START=$(date +%s)
OUT=${OUT:-results/window-out}  # what comes back (on the device: its $OUT); outside the tracked tree
PY=${PY:-python3}
PRESET=${PRESET:-paper_v1}
TARGETS=${TARGETS:-sweep}  # #108's order: Table 1's sweep (its 3e-4 runs are Table 1's, in FINISHED: adopted), then table2
CONFIGFILES=${CONFIGFILES:-config.yaml workflow/overlays/wikitext2-v1-local.yaml}
DEADLINE=${DEADLINE:-520}        # seconds from this command's start to the SIGTERM of its training jobs
LEASE=${LEASE:-}                 # the lease's command time left, seconds from this command's start (default:
                                 # LEASE_S for a first command; what the first left for the next, which reuses its choice)
LEASE_S=${LEASE_S:-780}          # a lease's command time: 15 min of device time less the machine's start (docs/scale/gpu.md)
MPS=${MPS:-0}                    # 1: the training jobs share the GPU under CUDA's MPS (started and stopped here)
COMPILE=${COMPILE:-choose}       # train.compile of the window's jobs (choose: the first minute's)
RUNS_PER_GPU=${RUNS_PER_GPU:-4}  # the window's fused jobs side by side (Tables 1 and 2: 4)
THREADS=${THREADS:-4}
HEAD_LOSS=${HEAD_LOSS:-choose}   # train.head_loss of the window's jobs (choose: the first minute's)
CANDIDATES=${CANDIDATES:-}       # compile:head_loss pairs the first minute tries (default: grassflow.lease.trials' CANDIDATES)
BOX=${BOX:-90}                   # the first minute's time box, seconds
TIMED_STEPS=${TIMED_STEPS:-10}   # the steps each candidate is timed over
MARGIN=${MARGIN:-60}             # seconds kept after training for the evaluations and tables
SEEDS=${SEEDS:-}                 # this lease's seeds, comma-separated (default: those that fit)
FINISHED=${FINISHED:-reports/wikitext2-v1-gpu/runs}  # committed records of runs finished in earlier leases
PROFILE_ARGS=${PROFILE_ARGS:---device cuda}
BENCH_ARGS=${BENCH_ARGS:---device cuda --parts kernels,graph,head,fused}
RES=results/$PRESET
CARRY=${CARRY:-.gpu-carry.tar}  # make gpu-paper-prepare's tar of $RES and .snakemake's records
EXPECT=${EXPECT:-cuda cupy}  # the preflight's resolved device type and op backend(s), or the window stops
PREFLIGHT=${PREFLIGHT:-$RES/preflight/auto_auto.json}  # the preflight the runs depend on (train.device auto)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$OUT" "$RES/logs"
LOG="$OUT/window.log"
trap 'DEADLINE=0' USR1  # kill -USR1 <this script>: the deadline is now (the jobs checkpoint)
say() { echo "[window $(( $(date +%s) - START )) s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# python -m grassflow.lease <verb> ...: each line it prints said (after $PREFIX), its exit code returned
PREFIX=""
lease() {
  local said rc
  said=$(mktemp)
  $PY -m grassflow.lease "$@" > "$said" 2>&1
  rc=$?
  while IFS= read -r line; do say "$PREFIX$line"; done < "$said"
  rm -f "$said"
  return $rc
}

if [ -d .whl ]; then  # wheels carried for a machine that lacks them (make gpu-wheels)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || { say "error: the carried wheels did not install"; exit 2; }
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
if [ -f "$CARRY" ]; then  # the prepared tree as it was (make gpu-paper-prepare): file times, Snakemake's records, the commit's tree
  tar xf "$CARRY" || { say "error: $CARRY did not unpack"; exit 2; }
fi
# a lease's runs trace to a commit: the copy checked by content against the prepared commit's tree
# (.gpu-tree.json), every record made here naming that commit, clean (GRASSFLOW_TREE); without it,
# git's own state. Before anything runs.
TREE=.gpu-tree.json
lease tree --manifest "$TREE" || exit 2
[ -f "$TREE" ] && export GRASSFLOW_TREE=$PWD/$TREE
SNAKEMAKE="$PY -m snakemake"
OVERLAY=$RES/window.yaml
SMARGS="--configfile $CONFIGFILES $OVERLAY --config preset=$PRESET"
PRESET_ARGS="--preset $PRESET --configfile $CONFIGFILES --overlay $OVERLAY"
# the lease: a first command's LEASE_S, or what the first command left (its choice's record), and
# this command's deadline within it (its evaluations and tables, MARGIN, before the lease's end)
CHOICE=$RES/window-choice.json  # the first command's decision; CHOOSE_AGAIN=1 times the candidates anew
REUSE=""
if [ -f "$CHOICE" ] && [ "${CHOOSE_AGAIN:-0}" != 1 ]; then
  REUSE=1
  [ -n "$LEASE" ] || LEASE=$($PY -m grassflow.lease left --record "$CHOICE" --start "$START") || exit 2
fi
LEASE=${LEASE:-$LEASE_S}
LEASE_END=$(( START + LEASE ))
if [ "$DEADLINE" -gt $(( LEASE - MARGIN )) ]; then DEADLINE=$(( LEASE - MARGIN )); fi
{ nvidia-smi 2>&1 || true; $PY -m pip list 2>/dev/null | grep -iE "^(torch|cupy|snakemake) " || true; } > "$OUT/machine.txt"
say "preset $PRESET, targets $TARGETS, deadline $DEADLINE s, lease $LEASE s, compile $COMPILE, head loss $HEAD_LOSS, $RUNS_PER_GPU jobs per GPU$([ "$MPS" = 1 ] && echo ', under MPS')"
[ -d "$FINISHED" ] || FINISHED=""
# the first minute replaces compile and head_loss (and the seeds); until then, what the dry run may plan
lease overlay $PRESET_ARGS --runs-per-gpu "$RUNS_PER_GPU" --threads "$THREADS" --compile "$COMPILE" \
  --head-loss "$HEAD_LOSS" --finished "$FINISHED" || exit 2
# 0. the gate: Snakemake's dry run plans only the window's jobs (a copy whose file times or records
#    were lost would replan the data stages here: 2), and something to train (else 3, in seconds)
lease gate $PRESET_ARGS --targets $TARGETS --finished "$FINISHED" --carry "$CARRY"; rc=$?
[ $rc = 0 ] || exit $(( rc == 3 ? 3 : 2 ))

# 1. the preflight, as the DAG names it (its device and backend: auto), then what it resolved
$SNAKEMAKE "$PREFLIGHT" --cores all $SMARGS \
  > "$RES/logs/window-preflight.log" 2>&1 || { say "error: the preflight failed"; tail -20 "$RES/logs/window-preflight.log" | tee -a "$LOG"; exit 1; }
lease device --preflight "$PREFLIGHT" --expect "$EXPECT" || exit 2
# the first minute: the setting to train with (checked against the reference's loss, timed) and the
# seeds that finish within the lease; a pinned setting (COMPILE and HEAD_LOSS) is still checked.
# The lease's next command reuses the first's decision (its record), timing nothing.
if [ -n "$REUSE" ]; then
  lease reuse $PRESET_ARGS --targets $TARGETS --record "$CHOICE" || exit 2
else
  PINNED=""
  if [ "$COMPILE" != choose ] || [ "$HEAD_LOSS" != choose ]; then
    if [ "$COMPILE" = choose ] || [ "$HEAD_LOSS" = choose ]; then
      say "error: COMPILE and HEAD_LOSS are chosen together or pinned together"
      exit 2
    fi
    CANDIDATES="$COMPILE:$HEAD_LOSS" PINNED=--pinned
  fi
  TOKENS=$(ls "$RES"/data/tokens/*/train.parquet | head -1)
  now=$(( $(date +%s) - START ))
  PREFIX="first minute: "
  lease choose $PRESET_ARGS --targets $TARGETS --record "$CHOICE" --train-tokens "$TOKENS" --results "$RES" \
    --finished $FINISHED --seconds $(( LEASE - now - MARGIN )) --deadline $(( DEADLINE - now )) --lease-end $LEASE_END \
    --box "$BOX" --timed-steps "$TIMED_STEPS" ${CANDIDATES:+--candidates $CANDIDATES} $PINNED ${SEEDS:+--seeds $SEEDS} \
    --device "${EXPECT%% *}" --out "$OUT"; rc=$?
  PREFIX=""
  [ $rc = 0 ] || exit $rc
fi
TARGETS=$($PY -m grassflow.lease targets --record "$CHOICE") || exit 2  # a table no seed of which fits: left out

# 2. the tables: fused seeds, side by side on the GPU, their evaluations and tables
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$RES/logs/gpu-load.csv" 2>&1 &
GPU_LOAD=$!
SLOTS=$($PY -m grassflow gpus --preset $PRESET --configfile $CONFIGFILES "$OVERLAY")  # K jobs per GPU
if [ "$MPS" = 1 ]; then  # the jobs' kernels side by side on the GPU, not time-sliced (docs/scale/gpu.md)
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/grassflow-mps CUDA_MPS_LOG_DIRECTORY=/tmp/grassflow-mps
  mkdir -p /tmp/grassflow-mps
  nvidia-cuda-mps-control -d && say "MPS: started" || { say "error: MPS did not start (MPS=0 trains time-sliced)"; exit 2; }
fi
$SNAKEMAKE $TARGETS --cores all $SLOTS --keep-going --rerun-incomplete --keep-incomplete $SMARGS \
  > "$RES/logs/window-snakemake.log" 2>&1 &
SM=$!
# this window's training jobs: under its Snakemake, never another pipeline's on the same machine
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
own_training() {
  local p
  for p in $(descendants $SM); do
    case "$(cat "/proc/$p/comm" 2>/dev/null)" in python*) ;; *) continue;; esac  # the trainer, not its shell
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qE "grassflow[.]lm[.]train " && echo "$p"
  done
}
# the budget, from the jobs themselves: once a group's first epoch is in, its projected finish
# against this command's deadline and the lease's end (a table that cannot finish in this lease is
# said so now, not at the end; one that finishes in the lease's next command counts its restart)
SAID=$RES/logs/window-budget-said
rm -f "$SAID"
budget() { lease budget $PRESET_ARGS --results "$RES" --said "$SAID" --start "$START" --deadline "$DEADLINE" --lease $(( LEASE - MARGIN )); }
while kill -0 $SM 2>/dev/null && [ "$(left)" -gt 0 ]; do
  budget
  sleep 2
done
if kill -0 $SM 2>/dev/null; then
  say "deadline: SIGTERM to the training jobs (each checkpoints and exits 75; rerun to resume)"
  TRAINERS=""
  while kill -0 $SM 2>/dev/null; do  # and to any Snakemake starts after it; it finishes the rest
    for p in $(own_training); do kill -TERM "$p" 2>/dev/null && TRAINERS="$TRAINERS $p"; done
    sleep 2
  done
  for p in $TRAINERS; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done  # their last.pt written
  # the groups whose first epoch came in too late for the loop above (or as the deadline passed):
  # their projected finish, for the lease's next command, once every stopped job's epochs are in
  budget
fi
wait $SM; rc=$?
kill $GPU_LOAD 2>/dev/null || true
if [ "$MPS" = 1 ]; then echo quit | nvidia-cuda-mps-control; fi
say "snakemake exit $rc"
grep -E "^(rule|localrule) |Finished jobid|Error in rule" "$RES/logs/window-snakemake.log" | tail -40 >> "$LOG"

# 3. what comes back: records, tables, figures, logs, benchmark files; no weights, no checkpoints
tar czf "$OUT/records.tar.gz" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.parquet' \
  --exclude="$RES/fused" $(ls -d "$RES/runs" "$RES/report" "$RES/logs" "$RES/benchmarks" "$RES/preflight" 2>/dev/null)
if [ "$(stat -c %s "$OUT/records.tar.gz")" -gt 16000000 ]; then
  split -b 15m -d "$OUT/records.tar.gz" "$OUT/records.tar.gz.part" && rm "$OUT/records.tar.gz"
fi
[ -d "$RES/runs" ] && lease runs --results "$RES"
# 4. the benchmark rows, with the time left (at least 2 minutes)
if [ "$(left)" -gt 0 ] || [ -n "${BENCH_ANYWAY:-}" ]; then
  timeout $(( $(left) > 120 ? $(left) : 120 )) $PY -m grassflow.bench $BENCH_ARGS --out "$OUT" >> "$LOG" 2>&1 \
    || say "the benchmark did not finish (exit $?)"
fi

say "done"
exit $rc
