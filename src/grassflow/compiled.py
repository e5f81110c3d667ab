"""`train.compile`: how the training step runs.

    auto   what measured fastest on the device type (AUTO; recorded in run.json)
    true   torch.compile(fullgraph=True, dynamic=False): one graph per shape, no graph breaks
           (the Plücker op is one custom op, grassflow::plucker_mix), backward by AOTAutograd
    false  eager
    graph  eager kernels, and the whole training step (forward, backward, gradient clipping,
           fused AdamW, the epoch's loss bookkeeping) captured as one CUDA graph and replayed
           every step (grassflow.train_step); the validation forward too. CUDA only.
    compiled-graph
           both: the loss compiled as `true` compiles it (during the eager warm-up steps, before
           the capture), then the whole step captured as `graph` captures it, the compiled kernels
           in it; the validation forward compiled, then captured. CUDA only.

The loss (forward + loss; backward through AOTAutograd) and the evaluation forward are compiled
separately: each has its own shapes and training mode, so neither recompiles the other.
`train.compile_mode` is torch.compile's mode for the training loss ("default", or "reduce-overhead":
torch.compile's own CUDA graphs, of the loss only); evaluation always compiles in the default mode.
"""

from __future__ import annotations

import torch

# Device type -> what `auto` runs there ("eager", "compiled" or "graph"), from
# `python -m grassflow.bench` (compile and graph rows). CUDA: eager until a GPU measurement says
# otherwise (a GPU default is only what ran on one).
AUTO = {"cpu": "eager", "cuda": "eager"}
SETTINGS = ("auto", True, False, "graph", "compiled-graph")


def resolve(setting, device) -> str:
    """The way `setting` runs on `device`: eager, compiled or graph."""
    if setting not in SETTINGS:
        raise ValueError(
            f"train.compile must be auto, true, false, graph or compiled-graph, got {setting!r}"
        )
    if setting == "auto":
        return AUTO.get(device.type, "eager")
    if setting in ("graph", "compiled-graph") and device.type != "cuda":
        raise ValueError(
            f"train.compile: {setting} captures CUDA graphs; this run is on {device.type}"
        )
    return {True: "compiled", False: "eager"}.get(setting, setting)


def static_shapes(setting, device) -> bool:
    """Whether the batches must keep one shape (a compiled or captured step needs it)."""
    return resolve(setting, device) != "eager"


class Compiled:
    """`loss(batch)` (objective.loss of the model) and `eval_model` (the model's, or the plain model
    an ensemble's members are validated in), compiled where `setting` says (`enabled`); `graph`:
    whether the training step is to be captured (grassflow.train_step)."""

    def __init__(self, model, objective, setting, mode: str, device, eval_model=None):
        self.setting, self.mode = setting, mode
        self.how = resolve(setting, device)
        self.enabled = self.how in ("compiled", "compiled-graph")
        self.graph = self.how in ("graph", "compiled-graph")

        def loss(batch):
            return objective.loss(model, batch)

        if self.enabled and self.graph and mode == "reduce-overhead":
            raise ValueError(
                "train.compile_mode: reduce-overhead captures CUDA graphs of its own; "
                "compiled-graph captures the whole step (use compile_mode default)"
            )
        if self.enabled:
            self.loss = torch.compile(loss, fullgraph=True, dynamic=False, mode=mode)
            self.eval_model = torch.compile(eval_model or model, fullgraph=True, dynamic=False)
        else:
            self.loss, self.eval_model = loss, eval_model or model

    def record(self) -> dict:
        return {
            "setting": self.setting,
            "enabled": self.enabled,
            "mode": self.mode if self.enabled else None,
            "cuda_graph": self.graph,
        }
