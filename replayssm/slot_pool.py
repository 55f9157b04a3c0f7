"""SlotPool: what every cache of this repo (ReplaySSM buffers and rings, baseline snapshots and stashes) shares.

Each cache is a dataclass whose tensor fields are persistent storage indexed by slot along dim 0, with the
recurrent state (checkpoint or snapshots) in `state`. The mixin derives the pool's size, dtypes, device,
footprint and copies from those fields, so a new cache declares only its tensors and its allocation.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch


class SlotPool:
    """Mixin for dataclass caches. `ACT_FIELD` names the tensor that holds activation-dtype inputs."""

    ACT_FIELD: ClassVar[str | None] = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every persistent tensor of the cache, by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)}

    @property
    def num_slots(self) -> int:
        return self.state.shape[0]

    @property
    def state_dtype(self) -> torch.dtype:
        return self.state.dtype

    @property
    def act_dtype(self) -> torch.dtype:
        if self.ACT_FIELD is None:
            raise AttributeError(f"{type(self).__name__} stores no activations")
        return getattr(self, self.ACT_FIELD).dtype

    @property
    def device(self) -> torch.device:
        return self.state.device

    def nbytes(self) -> int:
        """Persistent bytes of the whole pool: states, buffers, cursors and scratch."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def clone(self):
        """A deep copy (every tensor cloned), e.g. to snapshot a cache before a correctness check."""
        return dataclasses.replace(self, **{name: t.clone() for name, t in self.tensors().items()})
