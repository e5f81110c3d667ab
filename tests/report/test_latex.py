"""The .tex tables compile: every table the demo writes and every .tex committed under reports/,
each \\input into an article with booktabs and run through a real pdflatex (Debian's
texlive-latex-base and texlive-latex-recommended; .ci/run installs them, and under CI=true a missing
pdflatex fails the test instead of skipping it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grassflow.report.tables import TEX, latex, tex_escape
from helpers.latex import compile_tex

ROOT = Path(__file__).resolve().parents[2]


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
    assert {"table1.tex", "table2.tex", "ablations.tex", "snli_table3.tex", "recall.tex"} <= {
        t.name for t in tables
    }
    for tex in tables:
        compile_tex(tex, tmp_path / tex.stem)


@pytest.mark.parametrize(
    "tex", sorted(ROOT.glob("reports/**/*.tex")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_committed_reports_tables_compile(tex, tmp_path):
    compile_tex(tex, tmp_path)
