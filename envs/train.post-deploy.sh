#!/usr/bin/env bash
# Snakemake runs an env's <env>.post-deploy.sh in the new env (--sdm conda), in the project
# directory: the jobs need this checkout's package there, as make installs it in the venv
# (Snakemake strips PYTHONPATH from conda jobs). The env file holds its dependencies: --no-deps.
set -euo pipefail
python -m pip install --no-deps -e .
