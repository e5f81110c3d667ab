"""A .tex table through a real pdflatex (Debian's texlive-latex-base and texlive-latex-recommended;
.ci/run installs them, and under CI=true a missing pdflatex fails the test instead of skipping
it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from helpers.procs import skip_or_fail_in_ci

DOCUMENT = (
    "\\documentclass{article}\n\\usepackage{booktabs}\n"
    "\\begin{document}\n\\input{%s}\n\\end{document}\n"
)


def need_pdflatex() -> None:
    """Skip (fail under CI) where there is no pdflatex: called before anything runs by a test whose
    end compiles a table, so that a skip never takes the checks before it along."""
    if shutil.which("pdflatex") is None:
        skip_or_fail_in_ci(
            "no pdflatex (apt-get install texlive-latex-base texlive-latex-recommended)"
        )


def compile_tex(tex: Path, work: Path) -> None:
    """pdflatex over a document that inputs `tex`; fails with the log's error lines."""
    need_pdflatex()
    work.mkdir(parents=True, exist_ok=True)
    (work / "doc.tex").write_text(DOCUMENT % tex.resolve().as_posix())
    res = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in res.stdout.splitlines() if line.startswith("!") or "Error" in line]
    assert res.returncode == 0 and (work / "doc.pdf").is_file(), (
        f"{tex} does not compile: {errors[:5]}"
    )
