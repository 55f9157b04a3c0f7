"""ReplaySSM caches for Kimi Delta Attention: the AR ReplayCache and the speculative SpecRing.

The GDN caches (replayssm/gdn/cache.py, replayssm/gdn/ring.py) with one change: the log decay g is a
K-vector per value head and token (KDA decays every key channel of the state at its own rate), so every
cached entry holds (u [V], g [K]) per value head and k [K] per key head, where GDN holds a scalar g. The
protocol (cursors, flush rule, ring layout, commit / reset) is GDN's, shared through replayssm/ring_cursors.py
and replayssm/tree_ring.py.

What is cached and why: the corrected update u = beta (v - S' k) against the decayed state S' = S diag(exp(g))
(replay is then the plain linear recurrence S <- S diag(exp(g_j)) + u_j k_j^T), the key k after the optional
L2 normalisation, and g in fp32. The read vector q is never cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm.checks import NULL_SLOT, check_pool_alloc, check_ring_lengths, next_pow2
from replayssm.fp8_checkpoint import allocate_scale
from replayssm.gdn.ring import _cursors
from replayssm.geometry import KDAGeometry
from replayssm.slot_pool import SlotPool


@dataclass
class ReplayCache(SlotPool):
    """Checkpoint + linear input buffer for KDA AR decode.

    state     [num_slots, HV, V, K]              checkpoint S0 (state_dtype, K-last like GDN)
    u         [num_slots, HV, buffer_len, V]     cached corrected updates u (act_dtype)
    k         [num_slots, H, buffer_len, K]      cached keys, L2-normalised if the step asked for it (act_dtype)
    g         [num_slots, HV, buffer_len, K]     cached log decays, one per key channel (fp32)
    write_pos [num_slots] int32                  entries cached since the checkpoint
    state_scale [num_slots, HV] fp32             fp8 checkpoint only (torch / ref backends), else None
    """

    ACT_FIELD: ClassVar[str] = "u"

    geometry: KDAGeometry
    buffer_len: int
    state: torch.Tensor
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    write_pos: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    shared_cursor: bool = False      # write_pos is a DecodeCursor's (replayssm/ring_cursors.py), shared by layers

    @classmethod
    def allocate(cls, geometry: KDAGeometry, num_slots: int, buffer_len: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu", cursor=None) -> ReplayCache:
        """`cursor`: a ring_cursors.DecodeCursor shared by every layer (replay_step leaves it to
        cursor.advance); None allocates the cache's own."""
        check_pool_alloc(geometry, KDAGeometry, state_dtype, act_dtype, allow_fp8=True, num_slots=num_slots,
                         buffer_len=buffer_len)
        gm, n, L = geometry, num_slots, buffer_len
        state = torch.zeros(n, gm.HV, gm.V, gm.K, dtype=state_dtype, device=device)
        return cls(
            geometry=gm, buffer_len=L, state=state, state_scale=allocate_scale(state),
            u=torch.zeros(n, gm.HV, L, gm.V, dtype=act_dtype, device=device),
            k=torch.zeros(n, gm.H, L, gm.K, dtype=act_dtype, device=device),
            g=torch.zeros(n, gm.HV, L, gm.K, dtype=torch.float32, device=device),
            write_pos=(torch.zeros(n, dtype=torch.int32, device=device) if cursor is None
                       else cursor.check_cache(n, L, device)),
            shared_cursor=cursor is not None,
        )

    def reset(self, slots: torch.Tensor | None = None) -> None:
        """A new request enters `slots` (its prefill state already in `state`): empty buffer."""
        if slots is None:
            self.write_pos.zero_()
        else:
            self.write_pos[slots.long()] = 0


@dataclass
class SpecRing(SlotPool):
    """Checkpoint + circular input ring for KDA speculative decoding (GDN's ring protocol, replayssm/gdn/ring.py).

    state     [num_slots, HV, V, K]              checkpoint S0 (state_dtype, K-last)
    u         [num_slots, HV, ring_len, V]       ring of corrected updates u (act_dtype)
    k         [num_slots, H, ring_len, K]        ring of keys (act_dtype)
    g         [num_slots, HV, ring_len, K]       ring of per-channel log decays (fp32)
    write_pos, origin, is_flush [num_slots] int32: the cursors (replayssm/ring_cursors.py)
    """

    ACT_FIELD: ClassVar[str] = "u"

    geometry: KDAGeometry
    history_len: int
    window: int
    state: torch.Tensor
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    write_pos: torch.Tensor
    origin: torch.Tensor
    is_flush: torch.Tensor
    null_slot: int = NULL_SLOT
    shared_cursor: bool = False

    @classmethod
    def allocate(cls, geometry: KDAGeometry, num_slots: int, history_len: int, window: int,
                 state_dtype=torch.float32, act_dtype=torch.float32, device="cpu", cursor=None) -> SpecRing:
        """`cursor`: a ring_cursors.SpecCursor shared by every layer; None allocates the ring's own."""
        check_pool_alloc(geometry, KDAGeometry, state_dtype, act_dtype, num_slots=num_slots,
                         history_len=history_len, window=window)
        check_ring_lengths(history_len, window)
        gm, n = geometry, num_slots
        R = next_pow2(history_len + window)
        return cls(
            geometry=gm, history_len=history_len, window=window, shared_cursor=cursor is not None,
            state=torch.zeros(n, gm.HV, gm.V, gm.K, dtype=state_dtype, device=device),
            u=torch.zeros(n, gm.HV, R, gm.V, dtype=act_dtype, device=device),
            k=torch.zeros(n, gm.H, R, gm.K, dtype=act_dtype, device=device),
            g=torch.zeros(n, gm.HV, R, gm.K, dtype=torch.float32, device=device),
            **_cursors(cursor, n, history_len, window, device),
        )

    @property
    def max_len(self) -> int:
        """Logical length L = B + T: the most entries (history + window) a verify step touches."""
        return self.history_len + self.window

    @property
    def ring_len(self) -> int:
        return self.u.shape[2]
