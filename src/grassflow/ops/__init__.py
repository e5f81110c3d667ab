"""Custom sequence-mixing ops."""

from grassflow.ops.plucker import plucker_mix, plucker_mix_reference

__all__ = ["plucker_mix", "plucker_mix_reference"]
