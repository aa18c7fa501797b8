"""The outer state that the trainers of a run agree on and share: parameters, momentum, step.

It is what a late joiner or an out-of-sync peer downloads from the others
(`node.collective.state_service`), what a checkpoint holds and what `training.diloco` updates
every outer step. `state_hash` fingerprints it, so peers can tell whether they agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["OuterState", "state_hash"]


@dataclass
class OuterState:
    """What every peer of a run agrees on after an outer step: parameters, momentum, step number."""

    params: list[torch.Tensor]
    """Outer parameters theta_t (float32, one tensor per model parameter)."""

    momentum: list[torch.Tensor]
    """Outer momentum buffers (float32, same shapes)."""

    step: int
    """Number of outer steps applied so far (the next round averages for this step)."""

    def clone(self) -> OuterState:
        """A deep copy."""
        return OuterState([p.clone() for p in self.params], [m.clone() for m in self.momentum], self.step)

    @classmethod
    def from_model(cls, model: torch.nn.Module, step: int = 0) -> OuterState:
        """The outer state of a freshly initialised model: its parameters (on the CPU), zero momentum."""
        params = [p.detach().to(device="cpu", dtype=torch.float32, copy=True) for p in model.parameters()]
        return cls(params, [torch.zeros_like(p) for p in params], step)

    def matches(self, model: torch.nn.Module) -> bool:
        """Whether the shapes fit `model`'s parameters."""
        shapes = [tuple(p.shape) for p in model.parameters()]
        return [tuple(p.shape) for p in self.params] == shapes and [
            tuple(m.shape) for m in self.momentum
        ] == shapes

    def hash(self) -> str:
        """`state_hash` of the parameters and momentum."""
        return state_hash(self.params, self.momentum)


def state_hash(*groups: Sequence[torch.Tensor]) -> str:
    """SHA-256 (first 16 hex digits) over the raw bytes of every tensor, in order."""
    digest = hashlib.sha256()
    for tensors in groups:
        for tensor in tensors:
            digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
