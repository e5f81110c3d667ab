"""The code a pipeline job runs, derived from its imports: what a rule's `code` param hashes, so
that an edit reruns exactly the jobs whose output it can change.

A job is one stage module run as `python -m grassflow.<task>.<stage>` (its rule's shell). Its code
is, read from the source without importing anything:
  - that module and, transitively, every grassflow module it imports, at module level or inside
    a function (a superset of what one run executes), with the __init__ of every package on the
    way (importing a.b runs a/__init__.py);
  - the kernel sources a module declares it loads (KERNEL_SOURCES, paths under kernels/);
  - of the model kinds' code (models.KIND_CODE), only the kinds the job runs: a Transformer
    run imports the Grassmann model (the registry loads both) but never runs it.
A file counts by its code, not its text (code_hash): a Python module's syntax tree without
docstrings or the wording of raised messages, so a comment, a docstring, reformatting or a reworded
error reruns nothing; a kernel source's bytes.

`python -m grassflow.planning.staleness grassflow.lm.train --kinds grassmann` prints a job's files.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import sys
from functools import cache
from pathlib import Path

from grassflow.kernel_sources import kernels_dir

PKG = Path(__file__).resolve().parents[1]  # src/grassflow


def module_path(name: str) -> Path | None:
    """grassflow.a.b -> .../a/b.py or .../a/b/__init__.py; None if it is not a grassflow module."""
    if name != "grassflow" and not name.startswith("grassflow."):
        return None
    rel = Path(*name.split(".")[1:])
    for p in (PKG / rel / "__init__.py", (PKG / rel).with_suffix(".py")):
        if p.is_file():
            return p
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("grassflow", *parts))


def _tree(path: Path) -> ast.Module:
    return _parse(path.read_text(), str(path))


@cache
def _parse(
    text: str, name: str
) -> ast.Module:  # by content: a file edited in this process is read anew
    return ast.parse(text, name)


# What is derived from a tree is cached by the tree (one per content, _parse): the Snakefile asks
# for the code of every (job, model kinds), and those closures share most of their files.


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _statements(nodes):
    """Every statement in `nodes`, at any depth. Only statements can import (an expression cannot
    hold one), so the walk skips expressions, which are most of a tree's nodes."""
    todo = list(nodes)
    while todo:
        node = todo.pop()
        yield node
        for field in node._fields:
            value = getattr(node, field, None)
            if (
                isinstance(value, list)
                and value
                and isinstance(value[0], ast.stmt | ast.excepthandler | ast.match_case)
            ):
                todo += value


def imported(nodes, here: str, is_pkg: bool) -> set[str]:
    """The grassflow modules named by the import statements in `nodes` (any depth)."""
    out = set()
    for n in _statements(nodes):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            mod = _resolve(n, here, is_pkg)
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in n.names if module_path(f"{mod}.{a.name}")}
    return {m for m in out if module_path(m)}


@cache
def _assigned(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def kind_code() -> dict[str, tuple[str, ...]]:
    return _assigned(_tree(module_path("grassflow.models")), "KIND_CODE")


def _owned_by(name: str, kinds) -> bool:
    return any(name == m or name.startswith(m + ".") for k in kinds for m in kind_code()[k])


@cache
def _imports(tree: ast.Module, mod: str, is_pkg: bool) -> frozenset[str]:
    return frozenset(imported([tree], mod, is_pkg))


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(roots, kinds=()) -> set[Path]:
    """The files of `roots` (module names) and everything they import, transitively, less the code
    of the model kinds not in `kinds`; plus the kernel sources the modules declare."""
    unknown = set(kinds) - set(kind_code())
    if unknown:
        raise ValueError(f"unknown model kind(s) {sorted(unknown)}; known: {sorted(kind_code())}")
    others = [k for k in kind_code() if k not in kinds]
    seen, todo, files = set(), list(roots), set()
    while todo:
        name = todo.pop()
        for mod in _with_parents(name):
            if mod in seen or _owned_by(mod, others):
                continue
            seen.add(mod)
            path = module_path(mod)
            files.add(path)
            tree = _tree(path)
            todo += _imports(tree, mod, path.name == "__init__.py")
            for src in _assigned(tree, "KERNEL_SOURCES") or ():
                files.add(kernels_dir(required=False) / src)
    return files


def job_files(module: str, kinds=()) -> list[Path]:
    """The files of the job `python -m <module>` running model kinds `kinds` (of a package: its
    __main__, which is what runs)."""
    path = module_path(module)
    if path is None:
        raise ValueError(
            f"no grassflow module {module!r} (a job is `python -m grassflow.<task>.<stage>`)"
        )
    runs = (
        f"{module}.__main__"
        if path.name == "__init__.py" and module_path(f"{module}.__main__")
        else module
    )
    return sorted(closure([runs], kinds))


# --- what a file's fingerprint covers ------------------------------------------------------------
def _is_docstring(node) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _unworded(node: ast.Raise) -> ast.Raise:
    """A copy of a raise with its message's wording blanked: each positional argument of the raised
    call that is a string, and an f-string argument's literal parts (what it formats is code). A
    raise ends the job, so its wording reaches no result; the exception's type and whatever else the
    call computes still count."""
    if not isinstance(node.exc, ast.Call):
        return node
    node = copy.deepcopy(node)
    for arg in node.exc.args:
        for part in arg.values if isinstance(arg, ast.JoinedStr) else [arg]:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                part.value = ""
    return node


def _canonical(node) -> str:
    """A syntax tree as text: node types and fields, without positions, docstrings, empty fields
    (which Python versions add: 3.12 gave every function an empty `type_params`), comments (which
    the tree never holds) or the wording of a raised exception's message (_unworded). The same under
    CPython 3.10 to 3.14 (tests/pipeline/test_fingerprints_pythons.py)."""
    if isinstance(node, ast.AST):
        if isinstance(node, ast.Raise):
            node = _unworded(node)
        fields = []
        for name, value in ast.iter_fields(node):
            if (
                name == "body"
                and isinstance(value, list)
                and value
                and _is_docstring(value[0])
                and isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
                )
            ):
                value = value[1:]
            if name == "type_comment" or value is None or value == []:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(map(_canonical, node)) + "]"
    return repr(node)


def code_hash(path: Path) -> str:
    """sha256 (16 hex digits) of what can change a result in a file: a Python module's syntax tree
    (comments, docstrings, formatting and an error's wording cannot change what a job writes); a
    kernel source's bytes (NVRTC and the C++ compiler read all of it)."""
    path = Path(path)
    if path.suffix == ".py":
        return _tree_hash(_tree(path.resolve()))
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@cache
def _tree_hash(tree: ast.Module) -> str:
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()[:16]


def job_code(module: str, kinds=(), base: Path | None = None) -> dict[str, str]:
    """{file (relative to `base`, the checkout): its code hash} of everything a job runs."""
    base = base or PKG.parents[1]
    return {_rel(f, base): code_hash(f) for f in job_files(module, kinds)}


def _rel(path: Path, base: Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)


def fingerprint(code: dict[str, str]) -> str:
    """One job's code fingerprint (16 hex digits) from its files' code hashes."""
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:16]


# under the working directory: {fingerprint}.json per fingerprint
CODE_INDEX = ".snakemake/grassflow/code"


def remember(codes: dict[str, dict[str, str]], index: Path) -> None:
    """Keep each fingerprint's per-file hashes as `index/<fingerprint>.json` (once, atomically), so
    that `grassflow plan --why` can name the files a later edit changed. Called when jobs are about
    to run (the Snakefile's onstart), never while the workflow parses."""
    from grassflow.io import write_json

    for fp, code in codes.items():
        if not (index / f"{fp}.json").is_file():
            write_json(index / f"{fp}.json", code)


def recalled(fp: str, index: Path) -> dict[str, str] | None:
    """The per-file hashes a fingerprint was made of, if they were kept (data: JSON, never run)."""
    path = index / f"{fp}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m grassflow.planning.staleness", description=__doc__.split("\n")[0]
    )
    ap.add_argument("module", help="a job's stage module, e.g. grassflow.lm.train")
    ap.add_argument(
        "--kinds", nargs="*", default=[], help="model kinds the job runs (transformer, grassmann)"
    )
    a = ap.parse_args(argv)
    base = PKG.parents[1]
    for f in job_files(a.module, a.kinds):
        print(f.relative_to(base) if f.is_relative_to(base) else f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
