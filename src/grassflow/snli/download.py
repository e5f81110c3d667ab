"""SNLI's download stage: its data section's train, validation and test pairs as raw parquet files,
their records in checksums.json."""

import sys

from grassflow.data.sources import download_main
from grassflow.snli.data import download


def main(argv=None) -> int:
    return download_main(download, __spec__.name, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
