"""The .tex tables compile: every table the demo writes and every .tex committed under reports/,
each \\input into an article with booktabs and run through a real pdflatex (Debian's
texlive-latex-base and texlive-latex-recommended; .ci/run installs them, and under CI=true a
missing pdflatex fails the test instead of skipping it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from grassflow.report.aggregate import TEX, latex, tex_escape
from helpers.procs import skip_or_fail_in_ci

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n\\input{%s}\n\\end{document}\n"


def compile_tex(tex: Path, work: Path) -> None:
    """pdflatex over a document that inputs `tex`; fails with the log's error lines."""
    if shutil.which("pdflatex") is None:
        skip_or_fail_in_ci("no pdflatex (apt-get install texlive-latex-base texlive-latex-recommended)")
    work.mkdir(parents=True, exist_ok=True)
    (work / "doc.tex").write_text(DOCUMENT % tex.resolve().as_posix())
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=work,
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in res.stdout.splitlines() if line.startswith("!") or "Error" in line]
    assert res.returncode == 0 and (work / "doc.pdf").is_file(), f"{tex} does not compile: {errors[:5]}"


def test_every_special_character_compiles(tmp_path):
    """Every character tex_escape knows, in a cell and in the caption: one table that compiles."""
    plain = "".join(TEX) + " plain_text 50% a&b #1 {x} ~ ^ <unk> → ± … −3 ≥ ≤ ×2"
    f = tmp_path / "t.tex"
    f.write_text(latex(["Model", plain], [[plain, "1.0 ± 0.1"], ["b", "--"]], plain))
    compile_tex(f, tmp_path / "build")


def test_a_character_without_latex_is_refused_by_name():
    with pytest.raises(ValueError, match=r"no LaTeX for \['☃'\]"):
        tex_escape("snow ☃")


def test_the_demos_tables_compile(demo, tmp_path):
    tables = sorted((demo / "results/demo/report").glob("*.tex"))
    assert {"table1.tex", "table2.tex", "ablations.tex", "snli_table3.tex", "recall.tex"} <= {t.name for t in tables}
    for tex in tables:
        compile_tex(tex, tmp_path / tex.stem)


@pytest.mark.parametrize("tex", sorted(ROOT.glob("reports/**/*.tex")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_committed_reports_tables_compile(tex, tmp_path):
    compile_tex(tex, tmp_path)
