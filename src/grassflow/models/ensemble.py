"""A config's seeds as one model: E models of one shape, their parameters stacked (E, ...), run as
an ensemble by the layers of models/layers.py (horizontal fusion, as HFTA, arXiv 2102.02344). Each
member is built as its own run builds it (its own seed, then stacked, so its initial weights are
that run's bit for bit), and its weights come back out as a plain state dict."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


def _tied_names(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (a tied LM head), each group in order."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return list(groups.values())


def _set(model: nn.Module, name: str, value) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, attr, value)


def stack(models: list[nn.Module]) -> nn.Module:
    """One ensemble of `models` (same class and shapes): a copy of the first whose every parameter
    is the members' stacked, tied parameters tied again. Its `ensemble_size` is E."""
    if len(models) < 2:
        raise ValueError(f"an ensemble needs at least 2 members, got {len(models)}")
    ens = copy.deepcopy(models[0])
    params = [dict(m.named_parameters(remove_duplicate=False)) for m in models]
    for names in _tied_names(models[0]):
        stacked = nn.Parameter(
            torch.stack([p[names[0]].detach() for p in params]),
            requires_grad=params[0][names[0]].requires_grad,
        )
        for name in names:
            _set(ens, name, stacked)
    if any(True for _ in ens.buffers()):
        raise ValueError("stack: models with buffers are not supported")
    ens.ensemble_size = len(models)
    return ens


def member_state(ens: nn.Module, e: int) -> dict[str, torch.Tensor]:
    """Member e's state dict, as its own run's model would have it."""
    return {k: v[e] for k, v in ens.state_dict().items()}
