"""The code a pipeline stage runs, derived from its imports: what a rule's code fingerprint
covers, so that an edit reruns exactly the stages whose output it can change.

A stage is a CLI command (`python -m grassflow <command>`, as its rule's shell runs it). Its
code is, read from the source without importing anything:
  - cli.py, __main__.py and the package's __init__, and the command's handler in cli.py with
    the cli.py functions it calls; for a command that calls a function by name (cli.COMMANDS'
    "module:function" rows, a task's entry points: grassflow.tasks), that function's module;
  - transitively, every grassflow module those import, at module level or inside a function
    (a superset of what one run executes: an edit to a lazily imported module reruns the stage),
    with the __init__ of every package on the way (importing a.b runs a/__init__.py);
  - the kernel sources a module declares it loads (KERNEL_SOURCES, paths under kernels/);
  - of the model kinds' code (models.KIND_CODE), only the kinds the job runs: a Transformer
    run imports the Grassmann model (the registry loads both) but never runs it.

`python -m grassflow.staleness <command> [--kinds grassmann ...]` prints a stage's files.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from functools import cache
from pathlib import Path

from grassflow.tasks import COMMANDS as TASK_COMMANDS
from grassflow.tasks import declarations

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


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


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
            todo += imported([_tree(path)], mod, path.name == "__init__.py")
            if mod == "grassflow.tasks":  # it imports every task's declaration by name (grassflow/<task>/task.py)
                todo += [f"grassflow.{pkg}.task" for pkg in declarations()]
            for src in _literal(path, "KERNEL_SOURCES") or ():
                files.add(kernels_root() / src)
    return files


# --- the CLI commands ----------------------------------------------------------------------------
CLI = PKG / "cli.py"


def _cli_functions() -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in _tree(CLI).body if isinstance(n, ast.FunctionDef)}


def _cli_value(name: str) -> ast.expr:
    """The expression cli.py assigns to `name` at module level."""
    return next(n.value for n in _tree(CLI).body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))


def _handlers() -> dict[str, tuple[str, str | None]]:
    """command -> (its handler's name or None, the module of the function it calls or None): COMMANDS'
    (name, help, handler or "module:function", args) rows, OWN_PARSERS' (bench, plan: their module's
    main), and the commands made from the tasks' declarations (TASK_STAGES)."""
    out = {}
    for row in _cli_value("COMMANDS").elts:
        fn = row.elts[2]
        out[row.elts[0].value] = ("_call", fn.value.split(":")[0]) if isinstance(fn, ast.Constant) else (fn.id, None)
    own = _cli_value("OWN_PARSERS")  # their main, called from cli.main
    out.update({k.value: (None, v.elts[1].value.split(":")[0]) for k, v in zip(own.keys, own.values)})
    stages = _cli_value("TASK_STAGES")
    handler = {k.value: v.elts[1].id for k, v in zip(stages.keys, stages.values)}
    out.update({cmd: (handler[stage], ref.split(":")[0]) for cmd, (_, stage, ref) in TASK_COMMANDS.items()})
    return out


def command_roots(command: str) -> set[str]:
    """The modules a command imports: through cli.py's module level and main(), its handler and
    the cli.py functions the handler calls."""
    handlers = _handlers()
    if command not in handlers:
        raise ValueError(f"no grassflow command {command!r}; commands: {', '.join(sorted(handlers))}")
    fns = _cli_functions()
    common = [n for n in _tree(CLI).body if not isinstance(n, ast.FunctionDef)] + [fns["main"]]
    handler, module = handlers[command]
    todo, done = [handler] if handler else [], set()
    while todo:
        fn = todo.pop()
        if fn in done:
            continue
        done.add(fn)
        todo += [n.id for n in ast.walk(fns[fn]) if isinstance(n, ast.Name) and n.id in fns and n.id != fn]
    roots = imported(common + [fns[f] for f in done], "grassflow.cli", False)
    return roots | {"grassflow.cli", "grassflow.__main__"} | ({module} if module else set())


def command_files(command: str, kinds=()) -> list[Path]:
    return sorted(closure(command_roots(command), kinds, opaque={"grassflow.cli", "grassflow.__main__"}))


def fingerprint(files, base: Path) -> str:
    """sha256 over the files' paths (relative to `base`) and bytes, 16 hex digits."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(Path(f).resolve().relative_to(base)).encode())
        h.update(b"\0")
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:16]


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
