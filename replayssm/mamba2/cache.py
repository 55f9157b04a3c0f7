"""ReplaySSM caches for Mamba-2: the AR buffer (ReplayCache) and the speculative ring (SpecRing).

Everything persistent is allocated once here; no kernel allocates per step. Cursors live on the device
and are advanced by kernels, so a decode step is CUDA-graph capturable.

AR protocol (the official fork Johnny-Liou/ReplaySSM), per slot with h = write_pos[slot], L = buffer_len:
    h <  L-1: output from checkpoint + h cached entries + current token; append the token at h; h += 1
    h == L-1: flush: fold the L-1 entries and the current token into the checkpoint; h = 0
L = 1 flushes every step, which is exactly the baseline selective state update.

State formats (ReplayCache; replayssm/state_format.py): state_dtype is a format name or a torch dtype. Besides
the plain float32 / float16 / bfloat16, the torch and ref backends store float16_sr / bfloat16_sr (stochastic
rounding keyed by (sr_seed, sr_step[slot], slot, element)) and int8 / float8_e4m3fn (a float32 per-(slot, head)
scale `state_scale`), rounded only where the checkpoint is written (a flush, set_state). SpecRing takes the same
formats, rounded where its checkpoint is written: the flush fold of a verify (spec_torch / spec_ref; Triton and the C
kernels store the plain formats and refuse the others before any launch) and set_state. A request's state enters a
ring slot through state_format.set_state (the SR counter restarts, the scale is recomputed), then spec_reset.

Spec protocol (§3.2, §3.3), history B, window T, logical length L = B + T, physical ring next_pow2(L):
    verify: window token s sits at ring row (origin + write_pos + s) & (ring_len - 1); all T outputs come
            from one checkpoint. Rows with is_flush first fold the committed history into the checkpoint.
    commit: if the step flushed: origin += write_pos, write_pos = accepted; else write_pos += accepted;
            is_flush = write_pos + 2T > L (early flush: the next window always fits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm.checks import (
    NULL_SLOT,
    check_pool_alloc,
    check_ring_lengths,
    next_pow2,
)
from replayssm.geometry import Mamba2Geometry
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed


@dataclass
class ReplayCache(SlotPool):
    """Checkpoint + linear input buffer for AR decode.

    state     [num_slots, nheads, headdim, dstate]   checkpoint S0 (state_dtype)
    x         [num_slots, nheads, buffer_len, headdim] cached x (act_dtype)
    B         [num_slots, ngroups, buffer_len, dstate] cached B (act_dtype)
    dt        [num_slots, nheads, buffer_len]          cached processed dt (fp32, after bias + softplus)
    write_pos [num_slots] int32                        entries cached since the checkpoint
    bc        [num_slots, ngroups, buffer_len] fp32    scratch: B_j . C_t of the output-only route
    state_scale [num_slots, nheads] fp32               int8 / fp8 checkpoint only (else None): S0 = state * scale
    sr_step   [num_slots] int32                        float16_sr / bfloat16_sr only: checkpoint writes so far
    """

    ACT_FIELD: ClassVar[str] = "x"

    geometry: Mamba2Geometry
    buffer_len: int
    state: torch.Tensor
    x: torch.Tensor
    B: torch.Tensor
    dt: torch.Tensor
    write_pos: torch.Tensor
    bc: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    shared_cursor: bool = False      # write_pos is a DecodeCursor's (replayssm/ring_cursors.py), shared by layers
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry: Mamba2Geometry, num_slots: int, buffer_len: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu", cursor=None, sr_seed: int = 0) -> ReplayCache:
        """`cursor`: a ring_cursors.DecodeCursor whose write_pos this cache uses (one per decode row for every
        layer; replay_step then leaves it to cursor.advance); None allocates the cache's own. `state_dtype`: a
        state format name or a torch dtype; `sr_seed`: the 32-bit seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, Mamba2Geometry, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, buffer_len=buffer_len)
        g, n, L = geometry, num_slots, buffer_len
        state = torch.zeros(n, g.nheads, g.headdim, g.dstate, dtype=storage, device=device)
        return cls(
            geometry=g, buffer_len=L, state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
            x=torch.zeros(n, g.nheads, L, g.headdim, dtype=act_dtype, device=device),
            B=torch.zeros(n, g.ngroups, L, g.dstate, dtype=act_dtype, device=device),
            dt=torch.zeros(n, g.nheads, L, dtype=torch.float32, device=device),
            write_pos=(torch.zeros(n, dtype=torch.int32, device=device) if cursor is None
                       else cursor.check_cache(n, L, device)),
            shared_cursor=cursor is not None,
            bc=torch.zeros(n, g.ngroups, L, dtype=torch.float32, device=device),
        )

    def reset(self, slots: torch.Tensor | None = None) -> None:
        """A new request enters `slots` (its prefill state already in `state`): empty buffer."""
        if slots is None:
            self.write_pos.zero_()
        else:
            self.write_pos[slots.long()] = 0


@dataclass
class SpecRing(SlotPool):
    """Checkpoint + circular input ring for speculative decoding.

    state     [num_slots, nheads, headdim, dstate]   checkpoint S0 (state_dtype)
    x         [num_slots, nheads, ring_len, headdim] ring of x (act_dtype)
    B         [num_slots, ngroups, ring_len, dstate] ring of B (act_dtype)
    dt        [num_slots, nheads, ring_len]          ring of processed dt (fp32)
    write_pos [num_slots] int32   committed history h since the checkpoint
    origin    [num_slots] int32   ring row of history entry 0
    is_flush  [num_slots] int32   1 if the next verify folds the history into the checkpoint first
    bc        [num_slots, ngroups, ring_len, window] fp32 scratch: B_k . C_s for the window's readouts
    state_scale [num_slots, nheads] fp32               int8 / fp8 checkpoint only (else None): S0 = state * scale
    sr_step   [num_slots] int32                        float16_sr / bfloat16_sr only: checkpoint writes so far
    """

    ACT_FIELD: ClassVar[str] = "x"

    geometry: Mamba2Geometry
    history_len: int
    window: int
    state: torch.Tensor
    x: torch.Tensor
    B: torch.Tensor
    dt: torch.Tensor
    write_pos: torch.Tensor
    origin: torch.Tensor
    is_flush: torch.Tensor
    bc: torch.Tensor
    null_slot: int = NULL_SLOT
    shared_cursor: bool = False       # cursors are a SpecCursor's (replayssm/ring_cursors.py), shared by layers
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry: Mamba2Geometry, num_slots: int, history_len: int, window: int,
                 state_dtype=torch.float32, act_dtype=torch.float32, device="cpu", cursor=None,
                 sr_seed: int = 0) -> SpecRing:
        """`cursor`: a ring_cursors.SpecCursor whose cursors this ring uses (one per decode row for every
        layer); None allocates the ring's own. `state_dtype`: a state format name or a torch dtype (every format
        on the torch / ref backends; the plain ones on triton / cpu); `sr_seed`: the 32-bit seed of a
        stochastic-rounding format."""
        storage = check_pool_alloc(geometry, Mamba2Geometry, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, history_len=history_len, window=window)
        check_ring_lengths(history_len, window)
        g, n = geometry, num_slots
        R = next_pow2(history_len + window)
        state = torch.zeros(n, g.nheads, g.headdim, g.dstate, dtype=storage, device=device)
        return cls(
            geometry=g, history_len=history_len, window=window, shared_cursor=cursor is not None,
            state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
            x=torch.zeros(n, g.nheads, R, g.headdim, dtype=act_dtype, device=device),
            B=torch.zeros(n, g.ngroups, R, g.dstate, dtype=act_dtype, device=device),
            dt=torch.zeros(n, g.nheads, R, dtype=torch.float32, device=device),
            **_cursors(cursor, n, history_len, window, device),
            bc=torch.zeros(n, g.ngroups, R, window, dtype=torch.float32, device=device),
        )

    @property
    def max_len(self) -> int:
        """Logical length L = B + T: the most entries (history + window) a verify step touches."""
        return self.history_len + self.window

    @property
    def ring_len(self) -> int:
        return self.x.shape[2]


def _cursors(cursor, num_slots: int, history_len: int, window: int, device) -> dict[str, torch.Tensor]:
    """A shared SpecCursor's tensors (checked against the ring's shape), or fresh ones."""
    if cursor is not None:
        return cursor.check_ring(num_slots, history_len, window, device)
    return {name: torch.zeros(num_slots, dtype=torch.int32, device=device)
            for name in ("write_pos", "origin", "is_flush")}
