#!/usr/bin/env bash
# Stop the daemons tests/slurm/start.sh started (by their recorded PIDs) and restore the
# SLURM config files it replaced. Idempotent.
set -uo pipefail
STATE=${GRASSFLOW_SLURM_STATE:-/tmp/grassflow-slurm}
for d in slurmd slurmctld munged; do
  f="$STATE/$d.pid"
  if [ -f "$f" ] && kill -0 "$(cat "$f" 2>/dev/null)" 2>/dev/null; then
    kill "$(cat "$f")" 2>/dev/null
    pid=$(cat "$f" 2>/dev/null)
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$f"
done
for f in slurm.conf gres.conf; do
  if [ -f "$STATE/$f.orig" ]; then mv "$STATE/$f.orig" "/etc/slurm/$f"
  elif [ -f "$STATE/$f" ] && cmp -s "$STATE/$f" "/etc/slurm/$f"; then rm -f "/etc/slurm/$f"; fi
done
exit 0
