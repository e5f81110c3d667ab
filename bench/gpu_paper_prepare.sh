#!/usr/bin/env bash
# Before a GPU lease, on any machine (`make gpu-paper-prepare`): what the window's targets need
# upstream of the preflight and training (the token files), made by the pipeline's own
# jobs, then packed with Snakemake's records into $CARRY. A tar keeps the files' times: a plain copy
# to the GPU machine loses them, and the data stages would then replan there, where their sources
# (../shared, the hub) are not (bench/gpu_paper_window.sh unpacks it and refuses to start then).
set -eu
PRESET=${PRESET:-paper_v1}
TARGETS=${TARGETS:-table1 table2}
CONFIGFILES=${CONFIGFILES:-config.yaml workflow/overlays/wikitext2-v1-local.yaml}
CARRY=${CARRY:-.gpu-carry.tar}
SNAKEMAKE=${SNAKEMAKE:-snakemake}
$SNAKEMAKE $TARGETS --cores all --omit-from preflight train --configfile $CONFIGFILES --config preset=$PRESET
tar cf "$CARRY" "results/$PRESET" $(ls -d .snakemake/metadata .snakemake/grassflow 2>/dev/null)
echo "$CARRY: $(du -h "$CARRY" | cut -f1); carry it with .whl to the GPU machine"
