"""ReplaySSM speculative ring for Gated DeltaNet: checkpoint + circular ring of (u, k, g).

Everything persistent is allocated once here; no kernel allocates per step. Cursors live on the device
and are advanced by tiny kernels, so a speculative step is CUDA-graph capturable.

What the ring holds (blog App. A.2, Alg. 8; the fork): for every token since the checkpoint, the corrected
update u = beta (v - alpha S k) (so replay is the plain linear recurrence S <- exp(g) S + u k^T), the key k
after the optional in-kernel L2 normalisation (per key head, shared by HV/H value heads) and the log decay
g (fp32). The read vector q is never cached.

Spec protocol, history B, window T, logical length L = B + T, physical ring next_pow2(L) rows (the same
protocol as the Mamba-2 ring, replayssm/mamba2/cache.py):
    verify: window token s sits at ring row (origin + write_pos + s) & (ring_len - 1); all T outputs come
            from one committed state S_h (checkpoint + write_pos ring entries) through a T x T triangular
            solve. Rows with is_flush first fold the committed history into the checkpoint (S0 <- S_h).
    commit: if the step flushed: origin += write_pos, write_pos = accepted; else write_pos += accepted;
            is_flush = write_pos + 2T > L (early flush: the next window always fits).
    reset:  write_pos = origin = 0, is_flush = 2T > L (0, since B >= T).
Invariant: write_pos <= B at every verify, so history + window <= L <= ring_len rows never overlap.

State formats (replayssm/state_format.py, as the AR cache's): besides float32 / float16 / bfloat16, the torch and
ref backends store float16_sr / bfloat16_sr (stochastic rounding keyed by (sr_seed, sr_step[slot], slot, element))
and int8 / float8_e4m3fn (a float32 per-(slot, value head) scale `state_scale`). The checkpoint is rounded only
where it is written: the flush fold of a verify (a slot with history) and set_state, which is how a request's state
enters a slot (the SR counter restarts and the scale is recomputed; spec_reset then moves the cursors). Commit and
rollback never write it. Triton and the C kernels store the plain formats and refuse the others before any launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from replayssm.checks import NULL_SLOT, check_pool_alloc, check_ring_lengths, next_pow2
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed


@dataclass
class DeltaRuleSpecRing(SlotPool):
    """Checkpoint + circular input ring of the gated delta rule, for both families (GDN here; KDA,
    replayssm/kda/cache.py, whose g entries are K-vectors). Use the family's subclass (GEOMETRY).

    state     [num_slots, HV, V, K]          checkpoint S0 (state_dtype, K-last)
    u         [num_slots, HV, ring_len, V]   ring of corrected updates u (act_dtype)
    k         [num_slots, H, ring_len, K]    ring of keys, L2-normalised if verify asked for it (act_dtype)
    g         [num_slots, HV, ring_len]      ring of log decays (fp32); KDA: [num_slots, HV, ring_len, K]
    write_pos [num_slots] int32   committed history h since the checkpoint
    origin    [num_slots] int32   ring row of history entry 0
    is_flush  [num_slots] int32   1 if the next verify folds the history into the checkpoint first
    state_scale [num_slots, HV] fp32         int8 / fp8 checkpoint only (else None): S0 = state * scale
    sr_step   [num_slots] int32              float16_sr / bfloat16_sr only (else None): checkpoint writes so far
    """

    ACT_FIELD: ClassVar[str] = "u"
    GEOMETRY: ClassVar[type] = GDNGeometry

    geometry: GDNGeometry | KDAGeometry
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
    shared_cursor: bool = False       # cursors are a SpecCursor's (replayssm/ring_cursors.py), shared by layers
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry, num_slots: int, history_len: int, window: int,
                 state_dtype=torch.float32, act_dtype=torch.float32, device="cpu", cursor=None, sr_seed: int = 0):
        """`cursor`: a ring_cursors.SpecCursor whose cursors this ring uses (one per decode row for every
        layer); None allocates the ring's own. `state_dtype`: a state format name or a torch dtype (every format
        on the torch / ref backends; the plain ones on triton / cpu); `sr_seed`: the 32-bit seed of a
        stochastic-rounding format."""
        storage = check_pool_alloc(geometry, cls.GEOMETRY, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, history_len=history_len, window=window)
        check_ring_lengths(history_len, window)
        gm, n = geometry, num_slots
        R = next_pow2(history_len + window)
        state = torch.zeros(n, gm.HV, gm.V, gm.K, dtype=storage, device=device)
        return cls(
            geometry=gm, history_len=history_len, window=window, shared_cursor=cursor is not None,
            state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
            u=torch.zeros(n, gm.HV, R, gm.V, dtype=act_dtype, device=device),
            k=torch.zeros(n, gm.H, R, gm.K, dtype=act_dtype, device=device),
            g=torch.zeros(n, gm.HV, R, *gm.decay_dims, dtype=torch.float32, device=device),
            **_cursors(cursor, n, history_len, window, device),
        )

    @property
    def max_len(self) -> int:
        """Logical length L = B + T: the most entries (history + window) a verify step touches."""
        return self.history_len + self.window

    @property
    def ring_len(self) -> int:
        return self.u.shape[2]


class SpecRing(DeltaRuleSpecRing):
    """Checkpoint + circular input ring for GDN speculative decoding (fields: DeltaRuleSpecRing; g [num_slots,
    HV, ring_len] fp32). `SpecRing.allocate(GDNGeometry(...), num_slots, history_len, window, ...)`."""

    GEOMETRY: ClassVar[type] = GDNGeometry


def _cursors(cursor, num_slots: int, history_len: int, window: int, device) -> dict[str, torch.Tensor]:
    """A shared SpecCursor's tensors (checked against the ring's shape), or fresh ones."""
    if cursor is not None:
        return cursor.check_ring(num_slots, history_len, window, device)
    return {name: torch.zeros(num_slots, dtype=torch.int32, device=device)
            for name in ("write_pos", "origin", "is_flush")}
