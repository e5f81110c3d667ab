"""`train.compile`: the training loss and the evaluation forward through torch.compile.

    auto   what measured faster on the device type (COMPILE_WINS; recorded in run.json)
    true   torch.compile(fullgraph=True, dynamic=False): one graph per shape, no graph breaks
           (the Plücker op is one custom op, grassflow::plucker_mix), backward by AOTAutograd
    false  eager

The loss (forward + loss; backward through AOTAutograd) and the evaluation forward are
compiled separately: each has its own shapes and training mode, so neither recompiles the
other. `train.compile_mode` is torch.compile's mode for the training loss ("default", or
"reduce-overhead": CUDA graphs on a GPU, which needs the sync-free loop and static shapes
this project keeps); evaluation always compiles in the default mode.
"""

from __future__ import annotations

import torch

# Device type -> whether `auto` compiles there, from `python -m grassflow.bench` (compile rows).
# CUDA: eager until a GPU measurement says otherwise (a GPU default is only what ran on one).
COMPILE_WINS = {"cpu": False, "cuda": False}
SETTINGS = ("auto", True, False)


def use_compile(setting, device) -> bool:
    if setting not in SETTINGS:
        raise ValueError(f"train.compile must be auto, true or false, got {setting!r}")
    return COMPILE_WINS.get(device.type, False) if setting == "auto" else setting


class Compiled:
    """`loss(batch)` (task.loss of the model) and `eval_model`, compiled where `setting` says."""

    def __init__(self, model, task, setting, mode: str, device):
        self.setting, self.mode = setting, mode
        self.enabled = use_compile(setting, device)

        def loss(batch):
            return task.loss(model, batch)

        if self.enabled:
            self.loss = torch.compile(loss, fullgraph=True, dynamic=False, mode=mode)
            self.eval_model = torch.compile(model, fullgraph=True, dynamic=False)
        else:
            self.loss, self.eval_model = loss, model

    def record(self) -> dict:
        return {"setting": self.setting, "enabled": self.enabled,
                "mode": self.mode if self.enabled else None}
