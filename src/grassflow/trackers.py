"""Live training curves (`train.trackers`): TensorBoard event files and Weights & Biases runs.

The loop hands every tracker Python floats it already has at its periodic host sync (every
`train.log_every` steps: the window's mean loss and gradient norm, the learning rate, the
throughput) and each epoch's validation metrics, at the run's global step; a tracker never
reads a tensor, so it adds no host sync. Each tracker is an optional extra, imported only when
chosen (`pip install 'grassflow[tensorboard]'`, `'grassflow[wandb]'`); one that cannot start
is an error before the first step, naming the setting.

- tensorboard: event files in `<run dir>/tensorboard/` (`tensorboard --logdir results/`), the
  spec as the run's hyperparameters and as text.
- wandb: a run named after the run id, the spec as its config, in `<run dir>/wandb/`; offline
  unless WANDB_MODE says otherwise (`wandb sync <run dir>/wandb/offline-run-*` later, from a
  node with internet); project WANDB_PROJECT (default "grassflow").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from grassflow.errors import ConfigError

CHOICES = ("tensorboard", "wandb")


def _flat(d: dict, prefix: str = "") -> dict:
    """A nested spec as hparams: dotted keys, values a scalar or their JSON text."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, int | float | str | bool) else json.dumps(v)
    return out


class TensorBoard:
    def __init__(self, spec: dict, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        for summary in hparams(_flat(spec), {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("spec", "```json\n" + json.dumps(spec, indent=1) + "\n```")

    def log(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, spec: dict, out_dir: Path):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "grassflow"), name=spec["run_id"],
                              config=spec, dir=str(out_dir), mode=os.environ.get("WANDB_MODE", "offline"))

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


DIRS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # each tracker's directory in the run directory


class Trackers:
    """The chosen trackers as one: log(values, step) to each, close() all. A run started afresh
    (`fresh`) starts its trackers' directories afresh: an abandoned attempt's curves are not
    this run's; a resumed run appends to them."""

    def __init__(self, names, spec: dict, out_dir, fresh: bool = True):
        self.open = []
        if fresh:
            import shutil

            for name in DIRS.values():
                shutil.rmtree(Path(out_dir) / name, ignore_errors=True)
        for name in names or ():
            if name not in CHOICES:
                raise ConfigError(f"train.trackers: unknown tracker {name!r} (choices: {', '.join(CHOICES)})")
            try:
                self.open.append({"tensorboard": TensorBoard, "wandb": WandB}[name](spec, Path(out_dir)))
            except Exception as e:  # ImportError without the extra, or the tracker's own refusal
                self.close()
                raise ConfigError(f"train.trackers: {name!r} could not start ({type(e).__name__}: {e}); "
                                  f"install it with pip install 'grassflow[{name}]', or leave it out") from e

    def log(self, values: dict, step: int) -> None:
        for tracker in self.open:
            tracker.log(values, step)

    def close(self) -> None:
        for tracker in self.open:
            tracker.close()
        self.open = []
