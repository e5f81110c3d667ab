"""A run's spec as a dataclass, free of torch: what one training job computes from, as its task's
grid (grassflow.<task>.grid) builds it and its rule passes it (a param: `--spec`, JSON). The jobs
read a spec through RunSpec (typed, an unknown or missing key refused by name); its dict stays the
record:
run.json and config.json keep it, and its hash (grassflow.io.spec_hash) names the run's content."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from grassflow.models.config import from_known_keys
from grassflow.train_config import TrainConfig


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    preset: str
    task: str  # lm, snli, recall
    model_kind: str  # grassmann, transformer
    seed: int
    train: TrainConfig
    experiment: str | None = None  # lm, snli: the table the run belongs to
    tokenizer: str | None = None  # lm, snli: the tokenizer's name
    # lm, recall: ModelConfig's fields, less the data's (vocabulary, context)
    model: dict | None = None
    head: dict | None = None  # snli: HeadConfig's fields
    # snli: what the head reads (a frozen backbone's states, or its own embedding)
    features: dict | None = None
    backbone: dict | None = None  # snli, on a backbone's features: which
    max_tokens: int | None = None  # snli: per sentence
    cell: dict | None = None  # recall: the (seq_len, kv) cell
    data_cell: str | None = None  # recall: the cell's data directory
    model_name: str | None = None  # recall: the model variant
    # the spec's dict, as the job was given it
    source: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        if not isinstance(d, dict):
            raise ValueError(f"a run spec is a JSON object, not {type(d).__name__}")
        spec = from_known_keys(cls, d, f"run spec {d.get('run_id', '?')}", source=d)
        try:
            return replace(spec, train=TrainConfig.from_dict(spec.train))
        except ValueError as e:
            raise ValueError(f"run spec {spec.run_id}: {e}") from None

    @classmethod
    def of(cls, spec: RunSpec | dict) -> RunSpec:
        """The jobs' entry functions take a spec's dict too (called from Python: tests,
        notebooks)."""
        return spec if isinstance(spec, RunSpec) else cls.from_dict(spec)
