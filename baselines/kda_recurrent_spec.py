"""Native speculative decoding for Kimi Delta Attention (vLLM style): one state snapshot per window token.

GDN's baseline (baselines/gdn_recurrent_spec.py) with the per-key-channel decay: verify loads snapshot
last[slot], runs the T window tokens serially (S <- S diag(exp(g_t)); u = beta (v - S k); S <- S + u k^T;
o = S q) and stores the state after token t into snapshot t; commit picks the snapshot (last = accepted - 1).
Per step and slot: 1 state read + T state writes, T states of memory.

    states = SpecStates.allocate(geometry, num_slots, window)     # states.state[:, 0] <- prefill state
    o = spec_verify(states, q, k, v, g, beta)                     # g [batch, T, HV, K]
    spec_commit(states, num_accepted)
Backends: "triton" (GDN's kernel with PER_CHANNEL), "torch", "ref" (float64); "cpu" raises ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from baselines import gdn_recurrent_spec as gdn
from replayssm.checks import ACT_DTYPES, NULL_SLOT, check_backend, check_dtype, check_pool_alloc, check_slots
from replayssm.gdn.spec import check_window
from replayssm.geometry import KDAGeometry
from replayssm.kda.decode import check_kda_backend
from replayssm.slot_pool import SlotPool


@dataclass
class SpecStates(SlotPool):
    """T state snapshots per slot: state [num_slots, T, HV, V, K]; last [num_slots] int32 (the snapshot the
    next verify starts from)."""

    geometry: KDAGeometry
    state: torch.Tensor
    last: torch.Tensor
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, geometry: KDAGeometry, num_slots: int, window: int, state_dtype=torch.float32,
                 device="cpu") -> SpecStates:
        check_pool_alloc(geometry, KDAGeometry, state_dtype, num_slots=num_slots, window=window)
        gm = geometry
        return cls(geometry=gm,
                   state=torch.zeros(num_slots, window, gm.HV, gm.V, gm.K, dtype=state_dtype, device=device),
                   last=torch.zeros(num_slots, dtype=torch.int32, device=device))

    @property
    def window(self) -> int:
        return self.state.shape[1]

    def committed(self) -> torch.Tensor:
        """The committed state of every slot [num_slots, HV, V, K]."""
        return self.state[torch.arange(self.num_slots, device=self.device), self.last.long()]


def spec_verify(states: SpecStates, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from snapshot last[slot]; the state after token t goes to snapshot t.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K], beta [batch, T, HV] fp32 -> o [batch, T, HV, V].
    """
    gdn._check_states(states, SpecStates)
    check_kda_backend(backend)
    if not isinstance(q, torch.Tensor):
        raise ValueError("q must be a tensor")
    check_dtype("q", q, ACT_DTYPES)
    batch, scale = check_window(states.geometry, states.window, q.dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=True)
    check_backend(backend, states.state)
    if q.device != states.device:
        raise ValueError(f"inputs on {q.device}, states on {states.device}")
    if backend == "triton" and states.geometry.K > gdn.MAX_K:
        raise ValueError(f"K={states.geometry.K} > {gdn.MAX_K}: the kernel cannot tile a key dim this large")
    slots = check_slots(slots, batch, states.num_slots, states.device, states.null_slot)
    gm = states.geometry
    if out is None:
        out = torch.empty(batch, states.window, gm.HV, gm.V, dtype=q.dtype, device=q.device)
    if batch:
        args = (states, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out)
        if backend == "triton":
            gdn._verify_triton(*args, per_channel=True)
        else:
            {"torch": gdn._verify_torch, "ref": gdn._verify_ref}[backend](*args)
    return out


def spec_commit(states: SpecStates, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Keep the snapshot after the last accepted token: last[slot] = num_accepted - 1 (1..T, bonus included)."""
    check_kda_backend(backend)
    slots, num_accepted = gdn._check_cursor_call(states, num_accepted, slots, backend, SpecStates)
    if slots.numel() == 0:
        return
    if backend == "triton":
        gdn._set_last_triton(states, slots, num_accepted)
    else:
        rows, sl = gdn.live_rows(slots, states.null_slot)
        states.last[sl] = (num_accepted if rows is None else num_accepted[rows]) - 1


def spec_reset(states: SpecStates, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Start requests in `slots` (default all): the next verify reads snapshot 0 (the prefill state)."""
    check_kda_backend(backend)
    slots, _ = gdn._check_cursor_call(states, None, slots, backend, SpecStates)
    if slots.numel() == 0:
        return
    if backend == "triton":
        gdn._set_last_triton(states, slots, None)
    else:
        _, sl = gdn.live_rows(slots, states.null_slot)
        states.last[sl] = 0
