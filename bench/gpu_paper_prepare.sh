#!/usr/bin/env bash
# Before a GPU lease, on any machine (`make gpu-paper-prepare`), in a clean checkout: what the
# window's targets need upstream of the preflight and training (the token files), made by the
# pipeline's own jobs, then packed with Snakemake's records and the commit's tree into $CARRY. A tar
# keeps the files' times: a plain copy to the GPU machine loses them, and the data stages would then
# replan there, where their sources (../shared, the hub) are not (bench/gpu_paper_window.sh unpacks
# it and refuses to start then). The tree (.gpu-tree.json: the commit and each file's git blob id,
# python -m grassflow.provenance) is what the window checks the copy against, by content: a copy's
# own .git may lag its files, and its files lose their modes.
set -eu
PRESET=${PRESET:-paper_v1}
TARGETS=${TARGETS:-table1 table2 sweep}
CONFIGFILES=${CONFIGFILES:-config.yaml workflow/overlays/wikitext2-v1-local.yaml}
CARRY=${CARRY:-.gpu-carry.tar}
SNAKEMAKE=${SNAKEMAKE:-snakemake}
PY=${PY:-python3}
TREE=.gpu-tree.json
$PY -m grassflow.provenance manifest "$TREE"  # refuses a checkout with uncommitted changes or untracked files
$SNAKEMAKE $TARGETS --cores all --omit-from preflight train --configfile $CONFIGFILES --config preset=$PRESET
tar cf "$CARRY" --exclude="results/$PRESET/window-choice.json" --exclude="results/$PRESET/window.yaml" \
  "$TREE" "results/$PRESET" $(ls -d .snakemake/metadata .snakemake/grassflow 2>/dev/null)
echo "$CARRY: $(du -h "$CARRY" | cut -f1), commit $(git rev-parse --short=12 HEAD); carry it with .whl to the GPU machine"
