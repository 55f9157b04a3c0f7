"""Native speculative decoding for Kimi Delta Attention (vLLM style): one state snapshot per window token.

GDN's baseline (baselines/gdn_recurrent_spec.py) with the per-key-channel decay: verify loads snapshot
last[slot], runs the T window tokens serially (S <- S diag(exp(g_t)); u = beta (v - S k); S <- S + u k^T;
o = S q) and stores the state after token t into snapshot t; commit picks the snapshot (last = accepted - 1).
Per step and slot: 1 state read + T state writes, T states of memory.

    states = SpecStates.allocate(geometry, num_slots, window)     # states.state[:, 0] <- prefill state
    o = spec_verify(states, q, k, v, g, beta)                     # g [batch, T, HV, K]
    spec_commit(states, num_accepted)
Validation and dispatch are GDN's (run_spec_verify / run_spec_commit / run_spec_reset read the decay shape from
the geometry). Backends: "triton" (GDN's kernel with PER_CHANNEL), "torch", "cpu" (GDN's C kernel, per-channel
mode), "ref" (float64).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from baselines.gdn_recurrent_spec import DeltaRuleSpecStates, run_spec_commit, run_spec_reset, run_spec_verify
from replayssm.checks import check_cache_type
from replayssm.geometry import KDAGeometry


class SpecStates(DeltaRuleSpecStates):
    """T KDA state snapshots per slot: state [num_slots, T, HV, V, K]; last [num_slots] int32 (the snapshot the
    next verify starts from). `SpecStates.allocate(KDAGeometry(...), num_slots, window, state_dtype, device,
    sr_seed)` (state formats: GDN's)."""

    GEOMETRY: ClassVar[type] = KDAGeometry


def spec_verify(states: SpecStates, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from snapshot last[slot]; the state after token t goes to snapshot t.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K], beta [batch, T, HV] fp32 -> o [batch, T, HV, V].
    """
    check_cache_type(states, SpecStates)
    return run_spec_verify(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend)


def spec_commit(states: SpecStates, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Keep the snapshot after the last accepted token: last[slot] = num_accepted - 1 (1..T, bonus included)."""
    check_cache_type(states, SpecStates)
    run_spec_commit(states, num_accepted, slots, backend)


def spec_reset(states: SpecStates, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Start requests in `slots` (default all): the next verify reads snapshot 0 (the prefill state)."""
    check_cache_type(states, SpecStates)
    run_spec_reset(states, slots, backend)
