"""The code a pipeline stage runs, derived from its imports: what a rule's code fingerprint
covers, so that an edit reruns exactly the stages whose output it can change.

A stage is a CLI command (`python -m grassflow <command>`, as its rule's shell runs it). A
task's job runs `python -m grassflow.stage <task> <stage>` instead (its rule's shell), and a hub
fetch `python -m grassflow.fetch <command>`: neither imports cli.py or the planning
(grassflow.tasks). A command's code is, read from the source without importing anything:
  - of its command line's module (cli.py, stage.py, fetch.py), the slice the command runs
    (cli_slice): main(), its own rows of the command tables and the functions they name; the
    package's __init__ (and __main__.py for cli.py); the module of the function the command
    calls by name (cli.COMMANDS' "module:function" rows, a task's entry points) and, for a task's
    job, that task's declaration only;
  - transitively, every grassflow module those import, at module level or inside a function
    (a superset of what one run executes: an edit to a lazily imported module reruns the stage),
    with the __init__ of every package on the way (importing a.b runs a/__init__.py); every
    task's declaration where a module reads them all (grassflow.tasks.TASKS, ...);
  - the kernel sources a module declares it loads (KERNEL_SOURCES, paths under kernels/);
  - of the model kinds' code (models.KIND_CODE), only the kinds the job runs: a Transformer
    run imports the Grassmann model (the registry loads both) but never runs it.
A file counts by its code, not its text (code_hash): a Python module's syntax tree without
docstrings, so a comment, a docstring or reformatting reruns nothing; a kernel source's bytes.

`python -m grassflow.staleness <command> [--kinds grassmann ...]` prints a stage's files.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from functools import cache
from pathlib import Path

from grassflow.tasks import COMMANDS as TASK_COMMANDS
from grassflow.tasks import PLANNING_HOOKS, declarations

PKG = Path(__file__).resolve().parent
KERNELS_CANDIDATES = (PKG / "_kernels", PKG.parents[1] / "kernels")


def kernels_root() -> Path:
    return next((k for k in KERNELS_CANDIDATES if k.is_dir()), KERNELS_CANDIDATES[-1])


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
def _parse(text: str, name: str) -> ast.Module:  # by content: a file edited in this process is read anew
    return ast.parse(text, name)
# What is derived from a tree is cached by the tree (one per content, _parse): the Snakefile asks
# for the code of every (command, model kinds), and those closures share most of their files.


def _resolve(node: ast.ImportFrom, here: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_pkg else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported(nodes, here: str, is_pkg: bool) -> set[str]:
    """The grassflow modules named by the import statements in `nodes` (any depth)."""
    out = set()
    for node in nodes:
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                out |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom):
                mod = _resolve(n, here, is_pkg)
                out.add(mod)
                out |= {f"{mod}.{a.name}" for a in n.names if module_path(f"{mod}.{a.name}")}
    return {m for m in out if module_path(m)}


def _literal(path: Path, name: str):
    for node in _tree(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def kind_code() -> dict[str, tuple[str, ...]]:
    return _literal(module_path("grassflow.models"), "KIND_CODE")


def _owned_by(name: str, kinds) -> bool:
    return any(name == m or name.startswith(m + ".") for k in kinds for m in kind_code()[k])


def _reads_declarations(path: Path, mod: str) -> bool:
    """Whether a module reads every task's declaration: imports from grassflow.tasks, which loads
    them all (a job reads its own task's only, through grassflow.declaration: command_roots)."""
    return _reads_tasks(_tree(path), mod, path.name == "__init__.py")


@cache
def _reads_tasks(tree: ast.Module, mod: str, is_pkg: bool) -> bool:
    return any(isinstance(n, ast.ImportFrom) and _resolve(n, mod, is_pkg) == "grassflow.tasks" for n in ast.walk(tree))


@cache
def _module_imports(tree: ast.Module, mod: str, is_pkg: bool) -> frozenset[str]:
    return frozenset(imported([tree], mod, is_pkg))


def _entry_modules(pkg: str) -> set[str]:
    """The modules of a task's planning hooks (its declaration's PLANNING_HOOKS: run grid, cells,
    checks, estimate), which a module that reads the declarations calls in its own process (the
    estimates report); the other entry points are commands, each fingerprinted as its own job."""
    calls = [n for n in ast.walk(_tree(module_path(f"grassflow.{pkg}.task"))) if isinstance(n, ast.Call)]
    refs = {k.value.value for c in calls for k in c.keywords
            if k.arg in PLANNING_HOOKS and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
    return {r.split(":")[0] for r in refs if module_path(r.split(":")[0])}


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(roots, kinds=(), opaque=()) -> set[Path]:
    """The files of `roots` (module names) and everything they import, transitively, less the
    code of the model kinds not in `kinds`; plus the kernel sources the modules declare.
    `opaque` modules count as files but their imports are not followed (the command line: each
    command's own path through it is in its roots)."""
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
            if mod in opaque:
                continue
            todo += _module_imports(_tree(path), mod, path.name == "__init__.py")
            if _reads_declarations(path, mod):  # a module that reads every task's declaration (TASKS, ...)
                todo += [m for pkg in declarations() for m in (f"grassflow.{pkg}.task", *_entry_modules(pkg))]
            for src in _literal(path, "KERNEL_SOURCES") or ():
                files.add(kernels_root() / src)
    return files


# --- the commands: the CLI's (cli.py), a task's jobs (stage.py), the hub fetches (fetch.py) ----------
CLI = PKG / "cli.py"
STAGE = PKG / "stage.py"
FETCH = PKG / "fetch.py"
# the command tables of the command lines: a command's slice holds its own row of each, not the others'
TABLES = ("COMMANDS", "OWN_PARSERS", "STAGE_COMMANDS")


def _defs(path: Path) -> dict[str, ast.stmt]:
    """A module's module-level functions and assignments, by name."""
    out = {}
    for n in _tree(path).body:
        if isinstance(n, ast.FunctionDef):
            out[n.name] = n
        elif isinstance(n, ast.Assign):
            out.update({t.id: n for t in n.targets if isinstance(t, ast.Name)})
    return out


def _rows(command: str) -> tuple[list[ast.expr], str | None]:
    """The command's own rows of its module's tables, and the module of the function it calls by
    name (a COMMANDS "module:function" row, an OWN_PARSERS entry, a task's entry point) or None."""
    if command in TASK_COMMANDS:
        _, stage, ref = TASK_COMMANDS[command]
        table = _defs(STAGE)["STAGE_COMMANDS"].value
        return [v for k, v in zip(table.keys, table.values) if k.value == stage], ref.split(":")[0]
    defs = _defs(_dispatcher(command)[0])
    rows, module = [], None
    for row in defs["COMMANDS"].value.elts:
        if row.elts[0].value == command:
            rows.append(row)
            fn = row.elts[2]
            module = fn.value.split(":")[0] if isinstance(fn, ast.Constant) else None
    own = _defs(CLI)["OWN_PARSERS"].value
    for k, v in zip(own.keys, own.values):
        if k.value == command:
            rows.append(v)
            module = v.elts[1].value.split(":")[0]
    if not rows:
        raise ValueError(f"no grassflow command {command!r}; commands: {', '.join(commands())}")
    return rows, module


def _commands(path: Path) -> set[str]:
    """The names of a command line's COMMANDS rows."""
    return {r.elts[0].value for r in _defs(path)["COMMANDS"].value.elts}


def commands() -> list[str]:
    """Every command a rule can fingerprint: the CLI's, the hub fetches', the tasks' jobs."""
    own = {k.value for k in _defs(CLI)["OWN_PARSERS"].value.keys}
    return sorted(_commands(CLI) | _commands(FETCH) | set(TASK_COMMANDS) | own)


def _dispatcher(command: str) -> tuple[Path, str]:
    """The module whose slice is the command's command line: stage.py for a task's job, fetch.py
    for a hub fetch, else cli.py."""
    if command in TASK_COMMANDS:
        return STAGE, "grassflow.stage"
    return (FETCH, "grassflow.fetch") if command in _commands(FETCH) else (CLI, "grassflow.cli")


@cache
def cli_slice(command: str) -> tuple[ast.AST, ...]:
    """The part of its command line's module (cli.py, stage.py or fetch.py) that `command`
    runs: the module's imports, main() and the `__main__` guard, the command's own rows of the
    tables, and every module-level function or value those name, transitively (a table named on
    the way stands for the command's rows of it). An edit to another command's row or handler, or
    a function nobody calls, is outside it."""
    path, _ = _dispatcher(command)
    defs = _defs(path)
    rows, _ = _rows(command)
    fixed = [n for n in _tree(path).body if isinstance(n, ast.Import | ast.ImportFrom | ast.If)]
    reached, todo = {}, [defs["main"], *fixed, *rows]
    while todo:
        node = todo.pop()
        if id(node) in reached:
            continue
        reached[id(node)] = node
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in defs and n.id not in TABLES:
                todo.append(defs[n.id])
    order = {id(n): i for i, n in enumerate(ast.walk(_tree(path)))}
    return tuple(sorted(reached.values(), key=lambda n: order[id(n)]))


def command_roots(command: str) -> set[str]:
    """The grassflow modules a command imports: those its slice names (at module level or in its
    functions), the module of the function it calls, and for a task's job its task's declaration
    (its entry points, its arguments), which grassflow.stage loads by name."""
    _, module = _rows(command)
    _, dispatcher = _dispatcher(command)
    roots = imported(cli_slice(command), dispatcher, False) | {dispatcher}
    if command in TASK_COMMANDS:
        roots.add(f"grassflow.{TASK_COMMANDS[command][0].name}.task")
    elif dispatcher == "grassflow.cli":  # run as `python -m grassflow`
        roots.add("grassflow.__main__")
    return roots | ({module} if module else set())


def command_files(command: str, kinds=()) -> list[Path]:
    opaque = {_dispatcher(command)[1], "grassflow.__main__"}  # each command's own path through them: its roots
    return sorted(closure(command_roots(command), kinds, opaque=opaque))


# --- what a file's fingerprint covers ------------------------------------------------------------
def _is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _canonical(node) -> str:
    """A syntax tree as text: node types and fields, without positions, docstrings, empty fields
    (which Python versions add: 3.12 gave every function an empty `type_params`) or comments
    (which the tree never holds). The same under CPython 3.10 to 3.14 (tests/test_staleness_pythons.py)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if name == "body" and isinstance(value, list) and value and _is_docstring(value[0]) and isinstance(
                    node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                value = value[1:]
            if name == "type_comment" or value is None or value == []:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(map(_canonical, node)) + "]"
    return repr(node)


def code_hash(path: Path, command: str | None = None) -> str:
    """sha256 (16 hex digits) of what can change a result in a file: a Python module's syntax
    tree (comments, docstrings and formatting cannot change what runs); of the command's command
    line (cli.py, stage.py or fetch.py), the slice the command runs (cli_slice); a kernel source's bytes (NVRTC and the C++ compiler read all of it)."""
    path = Path(path)
    if path.suffix != ".py":
        text = path.read_bytes()
    elif command is not None and path.resolve() == _dispatcher(command)[0]:
        text = "\n".join(map(_canonical, cli_slice(command))).encode()
    else:
        return _tree_hash(_tree(path.resolve()))
    return hashlib.sha256(text).hexdigest()[:16]


@cache
def _tree_hash(tree: ast.Module) -> str:
    return hashlib.sha256(_canonical(tree).encode()).hexdigest()[:16]


def command_code(command: str, kinds=(), base: Path | None = None) -> dict[str, str]:
    """{file (relative to `base`, the checkout): its code hash} of everything a command runs."""
    base = base or PKG.parents[1]
    return {_rel(f, base): code_hash(f, command) for f in command_files(command, kinds)}


def _rel(path: Path, base: Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)


def fingerprint(code: dict[str, str]) -> str:
    """One job's code fingerprint (16 hex digits) from its files' code hashes."""
    return hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:16]


CODE_INDEX = ".snakemake/grassflow/code"  # under the working directory: {fingerprint}.json per fingerprint


def remember(code: dict[str, str], index: Path) -> str:
    """The fingerprint of `code`, its per-file hashes kept as `index/<fingerprint>.json` (written
    once, atomically: the Snakefile is parsed by many jobs at once on a cluster)."""
    from grassflow.io import write_json

    fp = fingerprint(code)
    if not (index / f"{fp}.json").is_file():
        write_json(index / f"{fp}.json", code)
    return fp


def recalled(fp: str, index: Path) -> dict[str, str] | None:
    """The per-file hashes a fingerprint was made of, if they were kept (data: JSON, never run)."""
    path = index / f"{fp}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m grassflow.staleness", description=__doc__.split("\n")[0])
    ap.add_argument("command")
    ap.add_argument("--kinds", nargs="*", default=[], help="model kinds the job runs (transformer, grassmann)")
    a = ap.parse_args(argv)
    base = PKG.parents[1]
    for f in command_files(a.command, a.kinds):
        print(f.relative_to(base) if f.is_relative_to(base) else f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
