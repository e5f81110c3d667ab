"""SNLI's download stage: its data section's train, validation and test pairs as raw parquet
files, their records in checksums.json."""

import sys
from pathlib import Path

from grassflow import job
from grassflow.io import write_json
from grassflow.snli.data import download


def download_splits(data: dict, out_dir: Path) -> None:
    write_json(out_dir / "checksums.json",
               {split: download(data, split, out_dir / f"{split}.parquet") for split in ("train", "validation", "test")})


def main(argv=None) -> int:
    p = job.parser(__spec__.name, __doc__)
    p.add_argument("--data", required=True, type=job.json_arg, help="its data section: " + job.JSON)
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    return job.run(download_splits, a.data, Path(a.out_dir))


if __name__ == "__main__":
    sys.exit(main())
