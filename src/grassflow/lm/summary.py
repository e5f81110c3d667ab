"""The LM's summary: summary.md of a preset's tables, and the scaling figure."""

import json
import sys
from pathlib import Path

from grassflow import job
from grassflow.io import write_text
from grassflow.lm import figures


def summary(preset_name: str, tables, bench, out_dir) -> None:
    """summary.md (every table of the preset, under their one provenance line, and their figures:
    those `aggregate` wrote for them, not whatever else the directory holds when this runs) and the
    scaling figure from the benchmark."""
    out = Path(out_dir)
    figures.scaling(json.loads(Path(bench).read_text()), preset_name, out / "scaling.png")
    texts = [Path(t).read_text().split("\n\n", 1) for t in tables]  # (provenance line, table)
    lines = [f"# grassflow results — preset `{preset_name}`", "", texts[0][0], ""]
    for _, md in texts:
        lines += [md.rstrip("\n") + "\n", ""]
    pngs = [
        f"{kind}_{Path(t).stem}.png" for t in tables for kind in ("gap", "curves", "best_ppl")
    ] + ["scaling.png"]
    lines += ["Figures: " + ", ".join(f"`{p}`" for p in sorted(pngs))]
    write_text(out / "summary.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--preset-name", required=True)
    p.add_argument("--tables", required=True, nargs="+", help="the tables' .md files")
    p.add_argument("--bench", required=True, help="bench JSON for the scaling figure")
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    return job.run(summary, a.preset_name, a.tables, a.bench, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
