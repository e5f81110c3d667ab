"""Lines of code of the pipeline at a git revision: the non-blank lines of src/**/*.py,
workflow/**/*.{py,smk} and the Snakefile that hold code (not only a comment or a docstring; a
function's docstring in a .smk file counts, since Snakemake's syntax is not Python's and is not
parsed: the count the earlier notes of #37 quoted).

    python bench/loc.py [REV ...]             the count at each revision (default HEAD)
    python bench/loc.py --per-commit A..B     each commit's change of the count, with its subject

Read from git objects (no checkout). The measure of #37's "lines of code not up": reports/loc.md.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize

SKIP = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def docstring_lines(text: str) -> set[int]:
    try:
        tree = ast.parse(text)
    except SyntaxError:  # a .smk file: Snakemake's syntax; its comments still count as comments
        return set()
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and body
        ):
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def code_lines(text: str) -> int:
    """The lines that a code token touches, less docstrings."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    doc = docstring_lines(text)
    return len(
        {n for t in tokens if t.type not in SKIP for n in range(t.start[0], t.end[0] + 1)} - doc
    )


def counted(path: str) -> bool:
    return (
        (path.startswith("src/") and path.endswith(".py"))
        or path == "Snakefile"
        or (path.startswith("workflow/") and path.endswith((".py", ".smk")))
    )


def loc(rev: str) -> int:
    files = [f for f in git("ls-tree", "-r", "--name-only", rev).splitlines() if counted(f)]
    total = 0
    for f in files:
        try:
            total += code_lines(git("show", f"{rev}:{f}"))
        except (tokenize.TokenError, SyntaxError) as e:
            raise SystemExit(f"error: {rev}:{f}: not tokenizable, not counted: {e}") from None
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("revs", nargs="*", default=["HEAD"])
    ap.add_argument("--per-commit", metavar="A..B")
    a = ap.parse_args(argv)
    if a.per_commit:
        start = a.per_commit.split("..")[0]
        prev = loc(start)
        print(f"{prev:6d}        {start}")
        for rev in git("rev-list", "--reverse", a.per_commit).split():
            n = loc(rev)
            if n != prev:
                print(
                    f"{n:6d} {n - prev:+5d}  {rev[:7]} "
                    f"{git('log', '-1', '--format=%s', rev).strip()[:100]}"
                )
            prev = n
        return 0
    for rev in a.revs:
        print(f"{loc(rev):6d}  {rev}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
