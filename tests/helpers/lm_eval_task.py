"""lm-eval's own wikitext task, reading local documents instead of the hub."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def wikitext_task(tmp_path: Path, docs: list[str]):
    """lm-eval's own wikitext task (its YAML, its preprocess_wikitext.py), reading `docs` as its
    test split from a local parquet file instead of the hub."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    src = Path(lm_eval.__file__).parent / "tasks" / "wikitext"
    d = tmp_path / "wikitext_local"
    d.mkdir()
    shutil.copy(src / "preprocess_wikitext.py", d)
    pq.write_table(pa.table({"page": docs}), tmp_path / "docs.parquet")
    yaml = (src / "wikitext.yaml").read_text()
    assert (
        "dataset_path: EleutherAI/wikitext_document_level\ndataset_name: wikitext-2-raw-v1\n"
        in yaml
    )
    yaml = yaml.replace("task: wikitext\n", "task: wikitext_local\n").replace(
        "dataset_path: EleutherAI/wikitext_document_level\ndataset_name: wikitext-2-raw-v1\n",
        (
            "dataset_path: parquet\ndataset_kwargs:\n  data_files:\n    test: "
            f"{tmp_path / 'docs.parquet'}\n"
        ),
    )
    yaml = yaml.replace("training_split: train\nvalidation_split: validation\n", "")
    (d / "wikitext_local.yaml").write_text(yaml)
    return TaskManager(include_path=str(d)), "wikitext_local"
