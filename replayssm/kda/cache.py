"""ReplaySSM caches for Kimi Delta Attention: the AR ReplayCache and the speculative SpecRing.

The gated-delta-rule caches of replayssm/gdn/cache.py and replayssm/gdn/ring.py, allocated from a KDAGeometry:
the one change is that the log decay g is a K-vector per value head and token (KDA decays every key channel of
the state at its own rate), so every cached entry holds (u [V], g [K]) per value head and k [K] per key head,
where GDN holds a scalar g. The protocol (cursors, flush rule, ring layout, commit / reset) is GDN's, shared
through replayssm/ring_cursors.py and replayssm/tree_ring.py.

What is cached and why: the corrected update u = beta (v - S' k) against the decayed state S' = S diag(exp(g))
(replay is then the plain linear recurrence S <- S diag(exp(g_j)) + u_j k_j^T), the key k after the optional
L2 normalisation, and g in fp32. The read vector q is never cached.

State formats: GDN's (replayssm/state_format.py; both caches): the checkpoint is rounded where it is written (an AR
flush, a verify's flush fold, set_state), by a cast, a per-(slot, value head) scale or stochastic rounding.
"""

from __future__ import annotations

from typing import ClassVar

from replayssm.gdn.cache import DeltaRuleReplayCache
from replayssm.gdn.ring import DeltaRuleSpecRing
from replayssm.geometry import KDAGeometry


class ReplayCache(DeltaRuleReplayCache):
    """Checkpoint + linear input buffer for KDA AR decode: `ReplayCache.allocate(KDAGeometry(...), num_slots,
    buffer_len, state_dtype, act_dtype, device, cursor, sr_seed)`.

    state     [num_slots, HV, V, K]              checkpoint S0 (state_dtype, K-last like GDN)
    u         [num_slots, HV, buffer_len, V]     cached corrected updates u (act_dtype)
    k         [num_slots, H, buffer_len, K]      cached keys, L2-normalised if the step asked for it (act_dtype)
    g         [num_slots, HV, buffer_len, K]     cached log decays, one per key channel (fp32)
    write_pos [num_slots] int32                  entries cached since the checkpoint
    state_scale [num_slots, HV] fp32             int8 / fp8 checkpoint only (torch / ref backends), else None
    sr_step   [num_slots] int32                  float16_sr / bfloat16_sr only (else None): checkpoint writes so far
    """

    GEOMETRY: ClassVar[type] = KDAGeometry


class SpecRing(DeltaRuleSpecRing):
    """Checkpoint + circular input ring for KDA speculative decoding (GDN's ring protocol, replayssm/gdn/ring.py):
    `SpecRing.allocate(KDAGeometry(...), num_slots, history_len, window, state_dtype, act_dtype, device, cursor,
    sr_seed)`.

    state     [num_slots, HV, V, K]              checkpoint S0 (state_dtype, K-last)
    u         [num_slots, HV, ring_len, V]       ring of corrected updates u (act_dtype)
    k         [num_slots, H, ring_len, K]        ring of keys (act_dtype)
    g         [num_slots, HV, ring_len, K]       ring of per-channel log decays (fp32)
    write_pos, origin, is_flush [num_slots] int32: the cursors (replayssm/ring_cursors.py)
    state_scale [num_slots, HV] fp32, sr_step [num_slots] int32: as the ReplayCache's (every state format of
    replayssm/state_format.py on the torch / ref backends; the plain ones on triton / cpu)
    """

    GEOMETRY: ClassVar[type] = KDAGeometry
