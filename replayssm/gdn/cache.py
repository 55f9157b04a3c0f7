"""ReplaySSM cache for Gated DeltaNet AR decode: checkpoint + linear buffer of (u, k, g).

Everything persistent is allocated once here; no kernel allocates per step. The cursor lives on the device
and is advanced by a kernel, so a decode step is CUDA-graph capturable.

What is cached (blog App. A.1, Alg. 6; the fork): the *corrected* update u = beta (v - alpha S k), not raw v
(caching v would make every replayed step depend on the state before it), the key k after the optional
L2 normalisation (per key head, shared by HV/H value heads), and the log decay g (fp32). The read vector q
is never cached.

AR protocol, per slot with h = write_pos[slot], L = buffer_len:
    h <  L-1: output from checkpoint + h cached entries + current token; append (u, k, g) at h; h += 1
    h == L-1: flush: fold the L-1 entries and the current token into the checkpoint; h = 0
L = 1 flushes every step, which is exactly the baseline fused recurrent step.

State formats (replayssm/state_format.py): state_dtype is a format name or a torch dtype. Besides the plain
float32 / float16 / bfloat16, the torch and ref backends store float16_sr / bfloat16_sr (stochastic rounding
keyed by (sr_seed, sr_step[slot], slot, element); sr_step counts the slot's checkpoint writes) and int8 /
float8_e4m3fn (a float32 per-(slot, value head) scale `state_scale`). The checkpoint is rounded only where it is
written: at a flush and by set_state. The spec ring (replayssm/gdn/ring.py) takes the same formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm.checks import NULL_SLOT, check_pool_alloc
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed


@dataclass
class DeltaRuleReplayCache(SlotPool):
    """Checkpoint + linear input buffer of the gated delta rule, for both families (GDN: a scalar log decay per
    value head and token; KDA, replayssm/kda/cache.py: a K-vector). Use the family's subclass: GEOMETRY names
    its geometry class, and the family's entry points accept only their own.

    state     [num_slots, HV, V, K]          checkpoint S0 (state_dtype, K-last like vLLM / FlashInfer)
    u         [num_slots, HV, buffer_len, V] cached corrected updates u (act_dtype)
    k         [num_slots, H, buffer_len, K]  cached keys, L2-normalised if the step asked for it (act_dtype)
    g         [num_slots, HV, buffer_len]    cached log decays (fp32); KDA: [num_slots, HV, buffer_len, K]
    write_pos [num_slots] int32              entries cached since the checkpoint
    state_scale [num_slots, HV] fp32         int8 / fp8 checkpoint only (else None): S0 = state * scale
    sr_step   [num_slots] int32              float16_sr / bfloat16_sr only (else None): checkpoint writes so far
    """

    ACT_FIELD: ClassVar[str] = "u"
    GEOMETRY: ClassVar[type] = GDNGeometry

    geometry: GDNGeometry | KDAGeometry
    buffer_len: int
    state: torch.Tensor
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    write_pos: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    shared_cursor: bool = False      # write_pos is a DecodeCursor's (replayssm/ring_cursors.py), shared by layers
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry, num_slots: int, buffer_len: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu", cursor=None, sr_seed: int = 0):
        """`cursor`: a ring_cursors.DecodeCursor whose write_pos this cache uses (one per decode row for every
        layer; replay_step then leaves it to cursor.advance); None allocates the cache's own. `state_dtype`: a
        state format name or a torch dtype; `sr_seed`: the 32-bit seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, cls.GEOMETRY, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, buffer_len=buffer_len)
        gm, n, L = geometry, num_slots, buffer_len
        state = torch.zeros(n, gm.HV, gm.V, gm.K, dtype=storage, device=device)
        return cls(
            geometry=gm, buffer_len=L, state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
            u=torch.zeros(n, gm.HV, L, gm.V, dtype=act_dtype, device=device),
            k=torch.zeros(n, gm.H, L, gm.K, dtype=act_dtype, device=device),
            g=torch.zeros(n, gm.HV, L, *gm.decay_dims, dtype=torch.float32, device=device),
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


class ReplayCache(DeltaRuleReplayCache):
    """Checkpoint + linear input buffer for GDN AR decode (fields: DeltaRuleReplayCache; g [num_slots, HV,
    buffer_len] fp32). `ReplayCache.allocate(GDNGeometry(...), num_slots, buffer_len, ...)`."""

    GEOMETRY: ClassVar[type] = GDNGeometry
