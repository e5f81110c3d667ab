#!/usr/bin/env bash
# One GPU lease in one or two commands (`make gpu-paper-window`): the paper's Tables 1 and 2 at the
# paper's settings on Wikitext-2 v1 (paper_v1: 3 seeds x 2 models each, 30 epochs), by the DAG itself.
#   0. the copy checked: by content against the prepared commit's tree (.gpu-tree.json, from make
#      gpu-paper-prepare: git's blob ids, modes ignored; the copy's own .git may lag), else by git;
#      a file that differs, is missing or is new is refused, named: runs trace to a commit
#   1. the preflight (the DAG's own job, run first here so that a broken GPU stops the window); then
#      the first minute (grassflow.bench.lease, at most BOX seconds): each candidate setting
#      (train.compile x head_loss) checked against the reference's loss and gradients on a fused
#      group of each table's config, and timed; the fastest that passed is trained with (none
#      passing: no training), and the seeds whose groups finish within the LEASE (its command time
#      across its commands; runs finished in an earlier lease, FINISHED, are adopted from their
#      committed records, not trained again; the progress a last.pt holds counted), said before
#      training. The lease's next command (CARRY=/none) reuses that choice and times nothing
#   2. `snakemake $TARGETS` (default: Table 2; Table 1's runs are all in FINISHED) with train.fuse_seeds
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
# The plumbing is tested on the CPU with the demo preset (tests/gpu/test_paper_window.py).
set -u
START=$(date +%s)
OUT=${OUT:-results/window-out}  # what comes back (on the device: its $OUT); outside the tracked tree
PY=${PY:-python3}
PRESET=${PRESET:-paper_v1}
TARGETS=${TARGETS:-table2}  # Table 1 is in reports/ (FINISHED: adopted, not trained again); Table 2 next (#99)
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
CANDIDATES=${CANDIDATES:-}       # compile:head_loss pairs the first minute tries (default: grassflow.bench.lease's)
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
ALLOWED="preflight adopt_run train train_fused evaluate aggregate table1 table2"  # the jobs a window may run
PREFLIGHT=${PREFLIGHT:-$RES/preflight/auto_auto.json}  # the preflight the runs depend on (train.device auto)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$OUT" "$RES/logs"
LOG="$OUT/window.log"
trap 'DEADLINE=0' USR1  # kill -USR1 <this script>: the deadline is now (the jobs checkpoint)
say() { echo "[window $(( $(date +%s) - START )) s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }

if [ -d .whl ]; then  # wheels carried for a machine that lacks them (make gpu-wheels)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || { say "error: the carried wheels did not install"; exit 2; }
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
if [ -f "$CARRY" ]; then  # the prepared tree as it was (make gpu-paper-prepare): file times, Snakemake's records, the commit's tree
  tar xf "$CARRY" || { say "error: $CARRY did not unpack"; exit 2; }
fi
# a lease's runs trace to a commit. A copy with the prepared commit's tree (.gpu-tree.json) is
# checked by content: every file the commit's, none missing, none added (git's blob ids; modes and
# the copy's own .git, which may lag, not asked), and every record made here names that commit,
# clean (GRASSFLOW_TREE). Without it, git's own state: uncommitted changes to tracked files
# (run.json's `dirty`) or a tree outside git are refused. Either before anything runs.
TREE=.gpu-tree.json
if [ -f "$TREE" ]; then
  if ! commit=$($PY -m grassflow.provenance check "$TREE" 2> "$OUT/tree-check.txt"); then
    say "error: $(cat "$OUT/tree-check.txt") differ from the prepared commit $($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["commit"][:7])' "$TREE") ($TREE, by content): commit them and run make gpu-paper-prepare again (a lease's runs must trace to a commit)"
    exit 2
  fi
  export GRASSFLOW_TREE=$PWD/$TREE
  say "tree: the prepared commit ${commit:0:12}, every file its own (by content)"
else
  uncommitted=$($PY - <<'PY'
import subprocess
from grassflow.provenance import git_state
state = git_state("src/grassflow")
if state["commit"] is None:
    print("this tree is not a git checkout (or git is missing): a lease's runs must trace to a commit")
elif state["dirty"]:
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True).stdout.split("\n")
    names = [line[3:] for line in changed if line.strip()]
    print(f"uncommitted changes to {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}: commit them first "
          f"(a lease's runs must trace to a commit, and {state['commit'][:7]} is not what would run)")
PY
)
  if [ -n "$uncommitted" ]; then
    say "error: $uncommitted"
    exit 2
  fi
fi
SNAKEMAKE="$PY -m snakemake"
SMARGS="--configfile $CONFIGFILES $RES/window.yaml --config preset=$PRESET"
# the lease: a first command's LEASE_S, or what the first command left (its choice's record), and
# this command's deadline within it (its evaluations and tables, MARGIN, before the lease's end)
CHOICE=$RES/window-choice.json  # the first command's decision; CHOOSE_AGAIN=1 times the candidates anew
REUSE=""
if [ -f "$CHOICE" ] && [ "${CHOOSE_AGAIN:-0}" != 1 ]; then
  REUSE=1
  [ -n "$LEASE" ] || LEASE=$($PY -c 'import json, sys; print(max(0, int(json.load(open(sys.argv[1]))["lease_end"] - float(sys.argv[2]))))' "$CHOICE" "$START")
fi
LEASE=${LEASE:-$LEASE_S}
LEASE_END=$(( START + LEASE ))
if [ "$DEADLINE" -gt $(( LEASE - MARGIN )) ]; then DEADLINE=$(( LEASE - MARGIN )); fi
{ nvidia-smi 2>&1 || true; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/machine.txt" 2>&1
say "preset $PRESET, targets $TARGETS, deadline $DEADLINE s, lease $LEASE s, compile $COMPILE, head loss $HEAD_LOSS, $RUNS_PER_GPU jobs per GPU$([ "$MPS" = 1 ] && echo ', under MPS')"
[ -d "$FINISHED" ] || FINISHED=""
# the first minute replaces compile and head_loss (and the seeds); until then, what the dry run may plan
cat > "$RES/window.yaml" <<EOF
presets:
  $PRESET:
    train: {fuse_seeds: true, runs_per_gpu: $RUNS_PER_GPU, threads: $THREADS, compile: $([ "$COMPILE" = choose ] && echo false || echo "$COMPILE"), head_loss: $([ "$HEAD_LOSS" = choose ] && echo auto || echo "$HEAD_LOSS")}
finished_runs: [$([ -n "$FINISHED" ] && printf '"%s"' "$FINISHED")]
EOF
# 0. the gate: a copy whose file times or records were lost would replan the data stages here,
#    where the sources (../shared, the hub) are not: stop in one line instead of spending the lease
planned=$($SNAKEMAKE $TARGETS -n --quiet rules --cores all $SMARGS 2>&1) \
  || { say "error: the dry run failed"; echo "$planned" | tail -20 | tee -a "$LOG"; exit 2; }
# its job counts, "<rule> <count>" a line (its first table, without the total), read three ways below
counts=$(echo "$planned" | awk 'f == 1 && NF == 2 && $2 ~ /^[0-9]+$/ && $1 != "total" {print $1, $2} /^job +count/ {f++}')
extra=$(echo "$counts" | awk -v ok=" $ALLOWED " 'NF && index(ok, " " $1 " ") == 0 {print $1}')
if [ -n "$extra" ]; then
  say "error: the dry run plans $(echo $extra) besides the preflight, training, evaluation and tables; carry $CARRY from make gpu-paper-prepare"
  exit 2
fi
# a lease spent adopting records trains nothing: a target whose runs are all in FINISHED (and whose
# evaluations are done) stops here, in seconds, not after the preflight and the first minute
if ! echo "$counts" | grep -qE '^(train|train_fused|evaluate) '; then
  say "error: the dry run of $TARGETS plans no training or evaluation: its runs are all finished (${FINISHED:-in this tree}); name the next target (TARGETS=…, docs/scale/gpu.md) before spending the lease"
  exit 3
fi
say "planned: $(echo "$counts" | awk '{printf "%s %s, ", $1, $2}')"

# 1. the preflight, as the DAG names it (its device and backend: auto)
$SNAKEMAKE "$PREFLIGHT" --cores all $SMARGS \
  > "$RES/logs/window-preflight.log" 2>&1 || { say "error: the preflight failed"; tail -20 "$RES/logs/window-preflight.log" | tee -a "$LOG"; exit 1; }
# what the jobs will run on, as the preflight resolved it: a lease is for CUDA and the CuPy kernels,
# never for a silent fallback (a CPU device, the slower `fast` op after a failed compile)
resolved=$($PY -c 'import json, sys
d = json.load(open(sys.argv[1]))["devices"][0]
print(d.get("type", "cpu"), *sorted({b["resolved"] for b in d["backends"]}))' "$PREFLIGHT")
if [ "$resolved" != "$EXPECT" ]; then
  say "error: the preflight resolved '$resolved' (device, op backends), not '$EXPECT': not spending the lease on it"
  exit 2
fi
say "preflight done: $resolved"
# the first minute: the setting to train with (checked against the reference's loss, timed) and the
# seeds that finish within the lease; a pinned setting (COMPILE and HEAD_LOSS) is still checked.
# The lease's next command reuses the first's decision (its record), timing nothing.
CHOOSE="$PY -m grassflow.bench.lease --configfile $CONFIGFILES --preset $PRESET --targets $TARGETS --overlay $RES/window.yaml --record $CHOICE"
if [ -n "$REUSE" ]; then
  $CHOOSE --reuse > "$RES/logs/window-choose.log" 2>&1 || { say "error: the first command's choice cannot be reused"; tail -5 "$RES/logs/window-choose.log" | tee -a "$LOG"; exit 2; }
  while read -r line; do say "$line"; done < "$RES/logs/window-choose.log"
else
  if [ "$COMPILE" != choose ] || [ "$HEAD_LOSS" != choose ]; then
    if [ "$COMPILE" = choose ] || [ "$HEAD_LOSS" = choose ]; then
      say "error: COMPILE and HEAD_LOSS are chosen together or pinned together"
      exit 2
    fi
    CANDIDATES="$COMPILE:$HEAD_LOSS"
  fi
  TOKENS=$(ls "$RES"/data/tokens/*/train.parquet | head -1)
  now=$(( $(date +%s) - START ))
  $CHOOSE --train-tokens "$TOKENS" --results "$RES" --finished $FINISHED --seconds $(( LEASE - now - MARGIN )) \
    --deadline $(( DEADLINE - now )) --lease-end $LEASE_END --box $BOX --timed-steps $TIMED_STEPS \
    ${CANDIDATES:+--candidates $CANDIDATES} ${SEEDS:+--seeds $SEEDS} --device "${EXPECT%% *}" --out "$OUT" \
    > "$RES/logs/window-choose.log" 2>&1 || { say "error: the first minute failed"; tail -20 "$RES/logs/window-choose.log" | tee -a "$LOG"; exit 1; }
  while read -r line; do say "first minute: $line"; done < <(grep -v '^\[grassflow\]' "$RES/logs/window-choose.log")
  if [ "$COMPILE" != choose ] && ! grep -q "^chosen: compile=$COMPILE head_loss=$HEAD_LOSS " "$RES/logs/window-choose.log"; then
    say "error: compile=$COMPILE head_loss=$HEAD_LOSS does not compute the reference's loss here, or failed: not training with it"
    exit 1
  fi
  if grep -q "^chosen: none" "$RES/logs/window-choose.log"; then
    say "error: no setting computes the reference's loss for every model: not training (the step's figures are in $OUT)"
    exit 3
  fi
  if grep -q "^table[0-9]*: seeds none this lease" "$RES/logs/window-choose.log"; then
    say "error: no seed of a table finishes within the lease: not training (the step's figures are in $OUT)"
    rm -f "$CHOICE"
    exit 3
  fi
fi

# 2. the tables: fused seeds, side by side on the GPU, their evaluations and tables
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$RES/logs/gpu-load.csv" 2>&1 &
GPU_LOAD=$!
SLOTS=$($PY -m grassflow gpus --preset $PRESET --configfile $CONFIGFILES "$RES/window.yaml")  # K jobs per GPU
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
RESUME_S=$($PY -c 'from grassflow.bench.lease import RESUME_S; print(RESUME_S)')  # once: it imports torch
budget() {  # prints "<group> <line>" for each group whose first run trained here has an epoch and is not in $1
  $PY - "$RES" "$1" "$(( $(date +%s) - START ))" "$DEADLINE" "$(( LEASE - MARGIN ))" "$RESUME_S" "$PRESET" $CONFIGFILES "$RES/window.yaml" <<'PY'
import json, sys
from pathlib import Path
from grassflow.pipeline.preview import load_config
from grassflow.pipeline.presets import select_preset
from grassflow.pipeline.tasks import TASKS
res, done, now, deadline, lease = Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
RESUME_S = float(sys.argv[6])  # grassflow.bench.lease's: a resumed command's start
specs = TASKS["lm"].specs(*select_preset(load_config(Path("."), sys.argv[8:], sys.argv[7])))  # the runs' specs, as planned
first = {}  # each group's first run trained here (not adopted from an earlier lease's records)
for m in sorted(res.glob("runs/*/metrics.jsonl"), key=lambda m: int(m.parent.name.rsplit("-s", 1)[1])):
    if not (m.parent / "adopted.json").exists():
        first.setdefault(m.parent.name.rsplit("-s", 1)[0], m)
for group, m in sorted(first.items()):
    rows = [json.loads(line) for line in m.read_text().splitlines() if line.strip()]
    if group in done or not rows:
        continue
    epochs = specs[m.parent.name]["train"]["epochs"]
    per_epoch = rows[-1]["seconds"]
    finish = now + (epochs - len(rows)) * per_epoch
    by_deadline = min(epochs, len(rows) + int(max(0, deadline - now) // per_epoch))
    verdict = ("fits in this command" if finish <= deadline else
               f"fits in the lease: about {by_deadline} of {epochs} epochs by the deadline, the rest in its next command"
               if finish + RESUME_S <= lease else f"does NOT fit: about {by_deadline} of {epochs} epochs by the deadline")
    print(f"{group} budget: epoch {len(rows)} took {per_epoch:.0f} s; all {epochs} epochs done at about "
          f"{finish:.0f} s of the window, deadline {deadline} s, lease {lease} s: {verdict}")
PY
}
BUDGETED=""
while kill -0 $SM 2>/dev/null && [ "$(left)" -gt 0 ]; do
  while read -r group line; do
    [ -n "$group" ] && say "$group $line" && BUDGETED="$BUDGETED $group"
  done < <(budget "$BUDGETED")
  sleep 2
done
if kill -0 $SM 2>/dev/null; then
  while read -r group line; do  # the groups whose first epoch came in too late for the loop above
    [ -n "$group" ] && say "$group $line"
  done < <(budget "$BUDGETED")
  say "deadline: SIGTERM to the training jobs (each checkpoints and exits 75; rerun to resume)"
  TRAINERS=""
  while kill -0 $SM 2>/dev/null; do  # and to any Snakemake starts after it; it finishes the rest
    for p in $(own_training); do kill -TERM "$p" 2>/dev/null && TRAINERS="$TRAINERS $p"; done
    sleep 2
  done
  for p in $TRAINERS; do while kill -0 "$p" 2>/dev/null; do sleep 1; done; done  # their last.pt written
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
shopt -s nullglob
for d in "$RES"/runs/*/; do
  say "$(basename "$d"): $($PY - "$d/metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    rows = []
best = min((r["val_ppl"] for r in rows if "val_ppl" in r), default=None)
print(f"{len(rows)} epochs" + (f", best validation PPL so far {best:.1f}" if best is not None else ""))
PY
)$([ -f "$d/run.json" ] && echo ", finished")"
done
# 4. the benchmark rows, with the time left (at least 2 minutes)
if [ "$(left)" -gt 0 ] || [ -n "${BENCH_ANYWAY:-}" ]; then
  timeout $(( $(left) > 120 ? $(left) : 120 )) $PY -m grassflow.bench $BENCH_ARGS --out "$OUT" >> "$LOG" 2>&1 \
    || say "the benchmark did not finish (exit $?)"
fi

say "done"
exit $rc
