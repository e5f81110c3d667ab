"""A run's train section as a dataclass, free of torch: the training loop reads it, and the planning
states the config schema's train defaults from it (pipeline.presets.load_schema)."""

from __future__ import annotations

from dataclasses import dataclass

from grassflow.models.config import from_known_keys


@dataclass(frozen=True)
class TrainConfig:
    """A run's `train` section: a preset's train section less its execution keys, with epochs and
    batch_size from the run's experiment (or task part). Its defaults are the config schema's:
    pipeline.presets.load_schema states them from here, so each is written once."""

    epochs: int
    batch_size: int
    lr: float = 3.0e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    warmup_frac: float = 0.05  # of all steps, linear from 0
    min_lr_frac: float = 0.1  # the cosine decay's floor, of lr
    grad_clip: float = 1.0
    eval_batch_size: int = 32
    checkpoint_every: int = 0  # steps between mid-epoch checkpoints (0: at each epoch's end only)
    max_steps_per_epoch: int | None = None
    device: str = "auto"
    log_every: int = 50  # steps between the loop's host syncs
    # how a job runs, not what it computes: in a preset's section, never in a run's spec
    # (pipeline.sections.EXECUTION_KEYS); here for their defaults
    threads: int = 1
    compile: bool | str = "auto"
    compile_mode: str = "default"
    trackers: tuple[str, ...] = ()
    fuse_seeds: bool | str = "auto"
    head_loss: str = "auto"  # language modelling: ops.linear_ce's backend
    runs_per_gpu: int = 1

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return from_known_keys(
            cls, {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}, "train"
        )
