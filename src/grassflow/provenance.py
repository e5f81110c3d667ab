"""Provenance: where a number came from (code commit, data hashes, software, machine).

A copy of a checkout (a GPU lease's machine gets one) may carry a `.git` that lags its files, and
lose the files' modes: `git status` then calls the files that ran dirty, at the wrong commit. Such a
copy is trusted by its content instead: `make gpu-paper-prepare` writes the prepared commit and its
tree (each file's git blob id: `python -m grassflow.provenance manifest`), the window checks the
copy's files against it (`check`), and with GRASSFLOW_TREE naming that manifest every record made in
the copy says that commit, clean where every file is the commit's (`"checked": "content"`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "torch",
    "numpy",
    "tokenizers",
    "transformers",
    "datasets",
    "pyarrow",
    "pandas",
    "snakemake",
)
# import names whose distribution depends on the build installed (CuPy: cupy-cuda12x, cupy-cuda13x,
# cupy)
BY_IMPORT = ("cupy",)
# a manifest (`manifest` below): records name its commit, checked by content
TREE_ENV = "GRASSFLOW_TREE"


def _git(cwd, *args, git_dir=None):
    env = {
        **os.environ,
        **({"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(cwd)} if git_dir else {}),
    }
    return subprocess.run(
        ["git", "-c", "core.excludesFile=", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def git_state(cwd=None) -> dict:
    if os.environ.get(TREE_ENV):
        return tree_state(Path(os.environ[TREE_ENV]))
    cwd = cwd or Path.cwd()
    try:
        head = _git(cwd, "rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}


def blob_id(path: Path) -> str:
    """git's object id of the file's content (`git hash-object`), whatever its mode."""
    data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def manifest(root: Path) -> dict:
    """{"commit": HEAD, "files": {path: blob id}} of the checkout at `root`, which must be clean: no
    change to a tracked file and no file git would track but does not (what would travel with
    it)."""
    status = _git(root, "status", "--porcelain")
    if status.returncode != 0:
        raise RuntimeError(f"{root}: not a git checkout ({status.stderr.strip()})")
    if status.stdout.strip():
        names = [line[3:] for line in status.stdout.splitlines() if line.strip()]
        raise RuntimeError(
            f"uncommitted changes or files git does not track: {', '.join(names[:5])}"
            f"{' ...' if len(names) > 5 else ''}: commit them (or ignore them) first"
        )
    listing = _git(root, "ls-tree", "-r", "-z", "HEAD").stdout
    files = {}
    for entry in filter(None, listing.split("\0")):
        info, path = entry.split("\t", 1)
        _, kind, oid = info.split()
        if kind == "blob":
            files[path] = oid
    return {"commit": _git(root, "rev-parse", "HEAD").stdout.strip(), "files": files}


MANIFEST = ".gpu-tree.json"  # where make gpu-paper-prepare writes it (git-ignored)


def differences(root: Path, tree: dict) -> list[str]:
    """The files at `root` that are not `tree`'s (a manifest): changed or missing, and any file git
    would track there (not ignored) that the tree lacks. By content, modes ignored; what the copy's
    own .git says is not asked (a throwaway index lists the files, by the copy's .gitignore)."""
    root = Path(root)
    files = tree["files"]
    changed = [
        p
        for p, oid in files.items()
        if not ((root / p).is_file() or (root / p).is_symlink()) or blob_id(root / p) != oid
    ]
    with tempfile.TemporaryDirectory() as git_dir:
        subprocess.run(["git", "init", "-q", "--bare", git_dir], capture_output=True, check=True)
        listed = _git(root, "ls-files", "-z", "--others", "--exclude-standard", git_dir=git_dir)
        if listed.returncode != 0:
            raise RuntimeError(f"{root}: git could not list the files ({listed.stderr.strip()})")
    extra = [p for p in filter(None, listed.stdout.split("\0")) if p not in files and p != MANIFEST]
    return sorted(changed + extra)


def tree_state(path: Path) -> dict:
    """git_state of a copy checked against its manifest at `path` (its directory the copy's
    root)."""
    tree = json.loads(Path(path).read_text())
    try:
        dirty = bool(differences(Path(path).parent, tree))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        dirty = None
    return {"commit": tree["commit"], "dirty": dirty, "checked": "content"}


def package_versions() -> dict:
    """The versions of the packages a number depends on, each under its installed distribution's
    name."""
    provided = metadata.packages_distributions()
    out = {"python": sys.version.split()[0]}
    for name in (*PACKAGES, *(d for m in BY_IMPORT for d in provided.get(m, []))):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    return {"platform": platform.platform(), "hostname": platform.node()}


def main(argv=None) -> int:
    """`manifest OUT` (at the checkout's root: its clean HEAD's commit and files) or
    `check MANIFEST` (this copy against it: exit 1 naming what differs)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("manifest", "check"):
        print(
            "usage: python -m grassflow.provenance manifest OUT | check MANIFEST", file=sys.stderr
        )
        return 2
    if args[0] == "manifest":
        try:
            tree = manifest(Path.cwd())
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        Path(args[1]).write_text(json.dumps(tree, indent=0, sort_keys=True))
        print(f"{args[1]}: commit {tree['commit'][:12]}, {len(tree['files'])} files")
        return 0
    tree = json.loads(Path(args[1]).read_text())
    diff = differences(Path(args[1]).resolve().parent, tree)
    if diff:
        print(
            f"{', '.join(diff[:8])}{f' and {len(diff) - 8} more' if len(diff) > 8 else ''}",
            file=sys.stderr,
        )
        return 1
    print(tree["commit"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
