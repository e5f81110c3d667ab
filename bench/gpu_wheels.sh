#!/usr/bin/env bash
# The wheels a GPU lease's machine lacks (`make gpu-wheels`), into .whl/ (git-ignored; the window
# installs them: bench/gpu_paper_window.sh): snakemake and everything it needs, for the GPU
# machine's Python (PYVER, 3.12), less what its image already holds (SKIP; docs: the device tool's
# KINDS.md). The versions are constraints.txt's, as CI tests them. A package with no wheel on PyPI
# (connection-pool: pure Python, an sdist) is built into one here.
set -eu
PY=${PY:-.venv/bin/python}
PYVER=${PYVER:-3.12}
SKIP=${SKIP:-"attrs certifi charset-normalizer idna jinja2 markupsafe packaging psutil pyyaml requests tabulate typing-extensions urllib3 wrapt"}
rm -rf .whl && mkdir -p .whl
# snakemake's dependency closure as installed here (the versions CI tested)
specs=$($PY - <<'PY'
import importlib.metadata as md, re
from packaging.requirements import Requirement
seen, todo = {}, ["snakemake"]
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    dist = md.distribution(name)
    seen[key] = dist.version
    todo += [r.name for r in map(Requirement, dist.requires or []) if not r.marker or r.marker.evaluate({"extra": ""})]
print(" ".join(f"{k}=={v}" for k, v in sorted(seen.items())))
PY
)
for spec in $specs; do
  case " $SKIP " in *" ${spec%%==*} "*) continue;; esac
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$spec" 2>/dev/null \
    || $PY -m pip wheel -q --no-deps -w .whl "$spec"  # an sdist only: a pure-Python wheel built here
done
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/"
