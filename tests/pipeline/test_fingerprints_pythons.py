"""A Python upgrade reruns nothing: every rule's code fingerprint (grassflow.planning.staleness) is
the same under each CPython that pyproject.toml allows, 3.10 to 3.14. The fingerprints hash syntax
trees, whose shape Python changes between versions (3.12 gave every function `type_params`); the
other versions run here as Pyodide (CPython compiled to WebAssembly, from the npm registry, run by
node), reading this checkout through a mount, so each computes the fingerprints from the same
files."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.procs import skip_or_fail_in_ci

pytestmark = pytest.mark.slow  # default tier under 5 min: Pyodide under four Pythons (node, npm)

ROOT = Path(__file__).resolve().parents[2]
# Pyodide release → the CPython it is (pinned: npm checks each tarball against the registry's hash)
PYODIDES = {"0.22.1": "3.10", "0.27.7": "3.12", "0.29.5": "3.13", "314.0.7": "3.14"}
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grassflow" / "pyodide"

# Run by this interpreter and by each Pyodide: {what: hash} of every fingerprint a rule can carry
# (each job's stage module, as the rules' shells name them, with no model kind, each one, both) and
# of each file's code, tests/data's sampler of syntax included (constructs src/ may come to use).
FINGERPRINTS = r"""
import json, re, sys
from pathlib import Path
sys.path.insert(0, str(Path(ROOT) / "src"))
from grassflow.planning import staleness as s

kinds = [(), *((k,) for k in s.kind_code()), tuple(s.kind_code())]
rules = "".join(f.read_text() for f in sorted((Path(ROOT) / "workflow/rules").glob("*.smk")))
jobs = sorted(set(re.findall(r"python -m (grassflow[\w.]*) ", rules)))
out = {
    f"{m} {' '.join(k)}".strip(): s.fingerprint(s.job_code(m, k, Path(ROOT)))
    for m in jobs
    for k in kinds
}
files = [*sorted((Path(ROOT) / "src").rglob("*.py")), Path(ROOT) / "tests/data/syntax_sampler.py"]
out.update({str(f.relative_to(ROOT)): s.code_hash(f) for f in files})
RESULT = json.dumps({"python": sys.version.split()[0], "hashes": out})
"""

# node: boot a Pyodide, mount the checkout at the same path, run FINGERPRINTS, print RESULT
NODE = r"""
const [dir, root, code] = process.argv.slice(1);  // node -e: the arguments follow argv[0]
const { loadPyodide } = require(`${dir}/node_modules/pyodide/pyodide.js`);
(async () => {
  const py = await loadPyodide({ indexURL: `${dir}/node_modules/pyodide/` });
  py.FS.mkdirTree(root);
  py.FS.mount(py.FS.filesystems.NODEFS, { root }, root);
  py.globals.set("ROOT", root);
  py.runPython(code);
  process.stdout.write(py.globals.get("RESULT"));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def pyodide(version: str) -> Path:
    """The Pyodide release, installed once under the user's cache (npm install --ignore-scripts)."""
    where = CACHE / version
    if not (where / "node_modules/pyodide/pyodide.js").is_file():
        if shutil.which("npm") is None:
            skip_or_fail_in_ci("no npm (apt-get install nodejs npm)")
        where.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(where),
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--silent",
                f"pyodide@{version}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if res.returncode != 0:
            skip_or_fail_in_ci(f"npm install pyodide@{version} failed: {res.stderr[-500:]}")
    return where


@functools.cache
def fingerprints_here() -> dict:
    scope = {"ROOT": str(ROOT)}
    exec(FINGERPRINTS, scope)
    return json.loads(scope["RESULT"])


@pytest.mark.parametrize("release", sorted(PYODIDES, key=lambda r: PYODIDES[r]))
def test_every_fingerprint_is_the_same_under_each_allowed_python(release):
    where = pyodide(release)
    res = subprocess.run(
        ["node", "-e", NODE, str(where), str(ROOT), FINGERPRINTS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    there, here = json.loads(res.stdout), fingerprints_here()
    assert there["python"].startswith(PYODIDES[release] + "."), there["python"]
    assert len(here["hashes"]) > 100 and there["hashes"].keys() == here["hashes"].keys()
    differ = sorted(k for k, v in here["hashes"].items() if there["hashes"][k] != v)
    assert not differ, (
        f"under Python {there['python']} (here {here['python']}) these hash differently: {differ}"
    )
