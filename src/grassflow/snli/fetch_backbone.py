"""SNLI's fetch_backbone stage: save the pretrained backbone's files where Snakemake runs (on a
cluster, the login node: the only one with internet)."""

import sys

from grassflow import job
from grassflow.snli.backbone import fetch_backbone


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument(
        "--backbone",
        required=True,
        type=job.json_arg,
        help="the snli.backbone section: " + job.JSON,
    )
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    return job.run(fetch_backbone, a.backbone, a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
