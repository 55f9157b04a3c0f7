"""State formats (replayssm/state_format.py) for the baselines' speculative state (torch / ref backends).

A commit-replay CommitReplayCache (frozen checkpoint) and a native SpecStates (T snapshots per slot) carry what a
ReplaySSM ring carries (state_scale, sr_step, sr_seed, state_format): every format on the torch and ref backends,
the plain ones on triton / cpu (refused before any launch). Their torch and ref code paths stay the plain ones:
`formatted_pool` hands them a shadow of the cache whose state is the live slots' state read by the format
(dequantised; float32 for torch, float64 for ref), pool-indexed so the stash and the cursors keep their slot
indexing, and on exit stores what the call wrote back by the format's rule (a cast, a fresh per-(slot, head) scale,
or stochastic rounding keyed by the slot's sr_step, one draw set per call): the state is rounded where the kernels
store it, once per commit (commit replay: the checkpoint) or once per verify (native: the T snapshots, one block
per slot, a scale per (slot, snapshot, head)). A commit-replay verify only reads (nothing is written back).

    with formatted_pool(cache, slots, batch, backend, writes=True) as work_cache: _commit_torch(work_cache, ...)
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.state_format import format_of, read_state, write_state


def live_slot_ids(slots: torch.Tensor | None, batch: int, null_slot: int, device) -> torch.Tensor:
    """The long ids of the live rows' slots (rows 0..batch-1 own slots 0..batch-1 when slots is None)."""
    if slots is None:
        return torch.arange(batch, device=device)
    return slots[slots != null_slot].long()


class formatted_pool:
    """Context manager: the cache itself for a plain format, else a shadow whose `state` is a pool-sized working
    tensor holding the live slots' checkpoints (the other slots' rows are unset and never touched) and whose
    stash tensors are the cache's own. `writes`: store the live slots' working states back on exit."""

    def __init__(self, cache, slots: torch.Tensor | None, batch: int, backend: str, writes: bool,
                 snapshot: torch.Tensor | None = None):
        """`snapshot`: the per-slot index along dim 1 of a snapshot state (SpecStates.last: the one snapshot a
        verify reads), None for a [num_slots, heads, a, b] state."""
        self.cache, self.writes = cache, writes
        self.formatted = not format_of(cache).plain
        if self.formatted:
            self.ids = live_slot_ids(slots, batch, cache.null_slot, cache.device)
            self.dtype = torch.float64 if backend == "ref" else torch.float32
            self.key = self.ids if snapshot is None else (self.ids, snapshot[self.ids].long())

    def __enter__(self):
        if not self.formatted:
            return self.cache
        c = self.cache
        self.work = torch.empty(c.state.shape, dtype=self.dtype, device=c.device)
        self.work[self.key] = read_state(c, self.key, self.dtype)
        return dataclasses.replace(c, state=self.work, state_scale=None, sr_step=None, state_format=None)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.formatted and self.writes and exc_type is None and self.ids.numel():
            write_state(self.cache, self.ids, self.work[self.ids])
