"""The LM's summary: summary.md of a preset's tables, and the scaling figure."""

import sys

from grassflow import job
from grassflow.report.aggregate import summary


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
