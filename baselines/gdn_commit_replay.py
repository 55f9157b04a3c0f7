"""Commit-time replay for Gated DeltaNet speculative decoding (FlashInfer style, ReplaySSM blog Algorithms 3 and 7).

The checkpoint is frozen during verify: verify reads it once, runs the T window tokens serially in
registers to emit o_t, stores no state, and stashes the window. After acceptance, `spec_commit` replays the
first num_accepted stashed tokens into the checkpoint: one state read + one state write per step, the only
state write (FlashInfer `gated_delta_rule_mtp(cache_replayssm=True)` + `gated_delta_rule_replayssm_commit`).
No per-draft snapshots and no history ring (contrast: ReplaySSM keeps a ring and writes on flushes only).

Stash choice: the normalised key k (act dtype, per key head), the raw value v (act dtype), g and beta (fp32).
Like FlashInfer we stash v, not the corrected u = beta (v - S k): the commit then re-runs the exact serial
recurrence, so its checkpoint equals what the native baseline would store (no extra rounding of u), at the
price of one S k reduction per replayed token. k is stashed after the in-kernel L2 norm (FlashInfer stashes
it raw and normalises again), so the commit needs no use_qk_l2norm flag.

    cache = CommitReplayCache.allocate(geometry, num_slots, window)   # cache.state <- prefill state
    o = spec_verify(cache, q, k, v, g, beta)                          # o [batch, T, HV, V]
    spec_commit(cache, num_accepted)                                  # replay 1..T accepted tokens
Per step and slot: verify reads 1 state, commit reads + writes 1 state (native: 1 read + T writes).

State formats (replayssm/state_format.py): every format on the torch / ref backends (the checkpoint rounded once per
commit by the format's rule: baselines/spec_formats.py), the plain ones on triton / cpu (the others refused before
any launch). A request's state enters a slot through state_format.set_state(cache, S, slots).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl

from baselines.gdn_recurrent_spec import MAX_K, delta_step_torch_, live_rows, serial_launch_config, window_qk_fp32
from baselines.spec_formats import formatted_pool
from replayssm.checks import (
    NULL_SLOT,
    check_backend,
    check_cache_type,
    check_pool_alloc,
    check_ring_format,
    check_slots,
)
from replayssm.gdn.ref import gdn_step_ref, l2norm
from replayssm.gdn.spec import check_window
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.ring_cursors import check_live_counts
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed


@dataclass
class DeltaRuleCommitReplayCache(SlotPool):
    """Frozen checkpoint + the last window's stash, for both delta-rule families (use the family's subclass,
    GEOMETRY: CommitReplayCache here, baselines.kda_commit_replay.CommitReplayCache, whose g holds K-vectors).

    state [num_slots, HV, V, K]  checkpoint = committed state (state_dtype, K-last)
    k     [num_slots, H, T, K]   the window's keys, L2-normalised if verify asked for it (act_dtype)
    v     [num_slots, HV, T, V]  the window's raw values (act_dtype)
    g     [num_slots, HV, T]     the window's log decays (fp32); KDA: [num_slots, HV, T, K]
    beta  [num_slots, HV, T]     the window's betas (fp32)
    state_scale [num_slots, HV] fp32, sr_step [num_slots] int32: as a ReplaySSM ring's (non-plain formats)
    """

    ACT_FIELD: ClassVar[str] = "k"
    GEOMETRY: ClassVar[type] = GDNGeometry

    geometry: GDNGeometry | KDAGeometry
    state: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry, num_slots: int, window: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu", sr_seed: int = 0):
        """`state_dtype`: a state format name or a torch dtype (every format on torch / ref); `sr_seed`: the 32-bit
        seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, cls.GEOMETRY, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, window=window)
        gm, n, T = geometry, num_slots, window
        state = torch.zeros(n, gm.HV, gm.V, gm.K, dtype=storage, device=device)
        return cls(geometry=gm, state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
                   k=torch.zeros(n, gm.H, T, gm.K, dtype=act_dtype, device=device),
                   v=torch.zeros(n, gm.HV, T, gm.V, dtype=act_dtype, device=device),
                   g=torch.zeros(n, gm.HV, T, *gm.decay_dims, dtype=torch.float32, device=device),
                   beta=torch.zeros(n, gm.HV, T, dtype=torch.float32, device=device))

    @property
    def window(self) -> int:
        return self.k.shape[2]


class CommitReplayCache(DeltaRuleCommitReplayCache):
    """GDN's frozen checkpoint + stash: `CommitReplayCache.allocate(GDNGeometry(...), num_slots, window, ...)`."""

    GEOMETRY: ClassVar[type] = GDNGeometry


def _stash_args(cache) -> tuple:
    return (cache.k, cache.k.stride(0), cache.k.stride(1), cache.k.stride(2),
            cache.v, cache.v.stride(0), cache.v.stride(1), cache.v.stride(2),
            cache.g, cache.g.stride(0), cache.g.stride(1), cache.beta, cache.beta.stride(0), cache.beta.stride(1))


@triton.jit
def _frozen_verify_kernel(
    state_ptr, s_slot, s_head, s_v, slots_ptr,
    sk_ptr, sk_slot, sk_head, sk_t, sv_ptr, sv_slot, sv_head, sv_t, sg_ptr, sg_slot, sg_head, sb_ptr, sb_slot, sb_head,
    q_ptr, q_b, q_t, q_h, k_ptr, k_b, k_t, k_h, v_ptr, v_b, v_t, v_h,
    g_ptr, g_b, g_t, beta_ptr, beta_b, beta_t, out_ptr, o_b, o_t, o_h, scale,
    T: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    USE_L2NORM: tl.constexpr, NULL: tl.constexpr, g_h=1, sg_t=1, PER_CHANNEL: tl.constexpr = False,
):
    """Outputs of the window from the frozen checkpoint (no state write); stash the window.
    PER_CHANNEL (KDA, baselines/kda_commit_replay.py): g [batch, T, HV, K] and the stash's g [slots, HV, T, K].
    Stash ownership: v of (slot, hv, V tile) by its program; g, beta by pid_v == 0; k by pid_v == 0 of the
    first value head of each key head."""
    pid_v = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    if slot == NULL:
        return
    slot = slot.to(tl.int64)
    kh = hv // GROUP
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mask_v = offs_v < V
    mask_k = offs_k < K
    writes_k = (pid_v == 0) & (hv % GROUP == 0)
    S = tl.load(state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :],
                mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        q = tl.load(q_ptr + row * q_b + t * q_t + kh * q_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * k_b + t * k_t + kh * k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        if USE_L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
        v_raw = tl.load(v_ptr + row * v_b + t * v_t + hv * v_h + offs_v, mask=mask_v, other=0.0)
        if PER_CHANNEL:
            g = tl.load(g_ptr + row * g_b + t * g_t + hv * g_h + offs_k, mask=mask_k, other=0.0)
            beta = tl.load(beta_ptr + row * beta_b + t * beta_t + hv)
            S = S * tl.exp(g)[None, :]
        else:
            g = tl.load(g_ptr + row * g_b + t * g_t + hv)
            beta = tl.load(beta_ptr + row * beta_b + t * beta_t + hv)
            S = S * tl.exp(g)
        u = beta * (v_raw.to(tl.float32) - tl.sum(S * k[None, :], 1))
        S = S + u[:, None] * k[None, :]
        o = tl.sum(S * (q * scale)[None, :], 1)
        tl.store(out_ptr + row * o_b + t * o_t + hv * o_h + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
        if writes_k:  # an `if`, not `mask_k & writes_k`: triton 3.9's interpreter rejects that int32 mask
            tl.store(sk_ptr + slot * sk_slot + kh * sk_head + t * sk_t + offs_k, k.to(sk_ptr.dtype.element_ty),
                     mask=mask_k)
        tl.store(sv_ptr + slot * sv_slot + hv * sv_head + t * sv_t + offs_v, v_raw.to(sv_ptr.dtype.element_ty),
                 mask=mask_v)
        if PER_CHANNEL:
            if pid_v == 0:
                tl.store(sg_ptr + slot * sg_slot + hv * sg_head + t * sg_t + offs_k, g, mask=mask_k)
        else:
            tl.store(sg_ptr + slot * sg_slot + hv * sg_head + t, g, mask=pid_v == 0)
        tl.store(sb_ptr + slot * sb_slot + hv * sb_head + t, beta, mask=pid_v == 0)


@triton.jit
def _replay_commit_kernel(
    state_ptr, s_slot, s_head, s_v, slots_ptr, num_accepted_ptr,
    sk_ptr, sk_slot, sk_head, sk_t, sv_ptr, sv_slot, sv_head, sv_t, sg_ptr, sg_slot, sg_head, sb_ptr, sb_slot, sb_head,
    T: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    NULL: tl.constexpr, sg_t=1, PER_CHANNEL: tl.constexpr = False,
):
    """Replay the first num_accepted stashed tokens into the checkpoint: one state read + one write."""
    pid_v = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    if slot == NULL:
        return
    slot = slot.to(tl.int64)
    kh = hv // GROUP
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mask_v = offs_v < V
    mask_k = offs_k < K
    s_mask = mask_v[:, None] & mask_k[None, :]
    s_ptrs = state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    accepted = tl.load(num_accepted_ptr + row)
    # A constexpr trip count (the window T) with a guard, not range(accepted): triton 3.6's interpreter
    # cannot range over a loaded value (int() of a 1-element array, an error since numpy 2.4).
    for t in range(T):
        if t < accepted:
            k = tl.load(sk_ptr + slot * sk_slot + kh * sk_head + t * sk_t + offs_k, mask=mask_k,
                        other=0.0).to(tl.float32)
            v = tl.load(sv_ptr + slot * sv_slot + hv * sv_head + t * sv_t + offs_v, mask=mask_v,
                        other=0.0).to(tl.float32)
            if PER_CHANNEL:
                S = S * tl.exp(tl.load(sg_ptr + slot * sg_slot + hv * sg_head + t * sg_t + offs_k, mask=mask_k,
                                       other=0.0))[None, :]
            else:
                S = S * tl.exp(tl.load(sg_ptr + slot * sg_slot + hv * sg_head + t))
            u = tl.load(sb_ptr + slot * sb_slot + hv * sb_head + t) * (v - tl.sum(S * k[None, :], 1))
            S = S + u[:, None] * k[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)


def _verify_triton(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, per_channel: bool = False):
    gm, batch = cache.geometry, q.shape[0]
    st = cache.state
    cfg = serial_launch_config(gm, q.device, st.dtype, "gdn_cr_verify", per_channel)
    _frozen_verify_kernel[(triton.cdiv(gm.V, cfg["BV"]), batch, gm.HV)](
        st, st.stride(0), st.stride(1), st.stride(2), slots, *_stash_args(cache),
        q, q.stride(0), q.stride(1), q.stride(2), k, k.stride(0), k.stride(1), k.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2), g, g.stride(0), g.stride(1), beta, beta.stride(0), beta.stride(1),
        out, out.stride(0), out.stride(1), out.stride(2), float(scale),
        T=cache.window, GROUP=gm.value_heads_per_key_head, K=gm.K, V=gm.V, BV=cfg["BV"], BK=cfg["BK"],
        USE_L2NORM=bool(use_qk_l2norm), NULL=NULL_SLOT, num_warps=cfg["num_warps"],
        **(dict(g_h=g.stride(2), sg_t=cache.g.stride(2), PER_CHANNEL=True) if per_channel else {}),
    )


def _commit_triton(cache, num_accepted, slots, per_channel: bool = False):
    gm, batch = cache.geometry, slots.shape[0]
    st = cache.state
    cfg = serial_launch_config(gm, slots.device, st.dtype, "gdn_cr_commit", per_channel)
    _replay_commit_kernel[(triton.cdiv(gm.V, cfg["BV"]), batch, gm.HV)](
        st, st.stride(0), st.stride(1), st.stride(2), slots, num_accepted, *_stash_args(cache),
        T=cache.window, GROUP=gm.value_heads_per_key_head, K=gm.K, V=gm.V, BV=cfg["BV"], BK=cfg["BK"], NULL=NULL_SLOT,
        num_warps=cfg["num_warps"], **(dict(sg_t=cache.g.stride(2), PER_CHANNEL=True) if per_channel else {}),
    )


def _verify_torch(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    gm, T = cache.geometry, cache.window
    G = gm.value_heads_per_key_head
    rows, sl = live_rows(slots, cache.null_slot)
    if sl.numel() == 0:
        return
    if rows is not None:
        q, k, v, g, beta = (t.index_select(0, rows) for t in (q, k, v, g, beta))
    b = sl.numel()
    qf, kf = window_qk_fp32(q, k, scale, use_qk_l2norm)
    S = cache.state[sl].float().view(b, gm.H, G, gm.V, gm.K)       # a copy: the checkpoint stays frozen
    vf = v.float().view(b, T, gm.H, G, gm.V)
    gf, bf = g.view(b, T, gm.H, G, *g.shape[3:]), beta.view(b, T, gm.H, G)      # KDA: g [.., K]
    o = torch.empty(b, T, gm.HV, gm.V, dtype=torch.float32, device=q.device)
    for t in range(T):
        delta_step_torch_(S, kf[:, t], vf[:, t], gf[:, t], bf[:, t])
        o[:, t] = torch.einsum("bhgvk,bhk->bhgv", S, qf[:, t]).reshape(b, gm.HV, gm.V)
    if rows is None:
        out.copy_(o)
    else:
        out.index_copy_(0, rows, o.to(out.dtype))
    cache.k[sl] = kf.transpose(1, 2).to(cache.act_dtype)
    cache.v[sl] = v.transpose(1, 2)
    cache.g[sl] = g.transpose(1, 2)
    cache.beta[sl] = beta.transpose(1, 2)


def _commit_torch(cache, num_accepted, slots):
    gm = cache.geometry
    G = gm.value_heads_per_key_head
    rows, sl = live_rows(slots, cache.null_slot)
    if sl.numel() == 0:
        return
    a = num_accepted if rows is None else num_accepted[rows]
    b = sl.numel()
    S = cache.state[sl].float().view(b, gm.H, G, gm.V, gm.K)
    kf = cache.k[sl].float()                                           # [b, H, T, K]
    vf = cache.v[sl].float().view(b, gm.H, G, cache.window, gm.V)
    gf = cache.g[sl].view(b, gm.H, G, cache.window, *cache.g.shape[3:])           # KDA: g [.., K]
    bf = cache.beta[sl].view(b, gm.H, G, -1)
    for t in range(int(a.max())):
        # Rows that accepted fewer tokens stop early: their step has decay 1 and beta 0 (an exact no-op).
        on = (a > t).view(b, 1, 1)
        g_t = gf[:, :, :, t]
        delta_step_torch_(S, kf[:, :, t], vf[..., t, :], torch.where(on.view(b, *[1] * (g_t.dim() - 1)), g_t, 0.0),
                          torch.where(on, bf[..., t], 0.0))
    cache.state[sl] = S.view(b, gm.HV, gm.V, gm.K).to(cache.state_dtype)


def _verify_ref(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    for row, slot in enumerate(slots.tolist()):
        if slot == cache.null_slot:
            continue
        S = cache.state[slot][None]
        for t in range(cache.window):
            S, o, _ = gdn_step_ref(S, q[row:row + 1, t], k[row:row + 1, t], v[row:row + 1, t], g[row:row + 1, t],
                                   beta[row:row + 1, t], scale, use_qk_l2norm)
            out[row, t] = o[0].to(out.dtype)
        kn = l2norm(k[row]) if use_qk_l2norm else k[row].double()       # [T, H, K]
        cache.k[slot] = kn.transpose(0, 1).to(cache.act_dtype)
        cache.v[slot] = v[row].transpose(0, 1)
        cache.g[slot] = g[row].transpose(0, 1)
        cache.beta[slot] = beta[row].transpose(0, 1)


def _commit_ref(cache, num_accepted, slots):
    for row, slot in enumerate(slots.tolist()):
        if slot == cache.null_slot:
            continue
        S = cache.state[slot][None]                                      # [1, HV, V, K]
        for t in range(int(num_accepted[row])):
            k_t = cache.k[slot, :, t][None]                              # [1, H, K], already normalised
            S, _, _ = gdn_step_ref(S, k_t, k_t, cache.v[slot, :, t][None], cache.g[slot, :, t][None],
                                   cache.beta[slot, :, t][None], 1.0, False)
        cache.state[slot] = S[0].to(cache.state_dtype)


def _verify_cpu(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    from replayssm.cpu import ops
    ops.gdn_cr_verify(cache, q, k, v, g, beta, scale, use_qk_l2norm, out, slots)


def _commit_cpu(cache, num_accepted, slots):
    from replayssm.cpu import ops
    ops.gdn_cr_commit(cache, num_accepted, slots)


def spec_verify(cache: CommitReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from the frozen checkpoint (no state write); stash the window for the commit.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g, beta [batch, T, HV] fp32 -> o [batch, T, HV, V] (act dtype).
    """
    check_cache_type(cache, CommitReplayCache)
    return run_spec_verify(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend)


def run_spec_verify(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend: str) -> torch.Tensor:
    """spec_verify after the family's check, for either decay shape (cache.geometry.PER_CHANNEL_DECAY, KDA:
    g [batch, T, HV, K]): every backend here takes either shape."""
    per_channel = cache.geometry.PER_CHANNEL_DECAY
    check_ring_format(cache, backend, f"{'kda' if per_channel else 'gdn'}.commit_replay")
    batch, scale = check_window(cache.geometry, cache.window, cache.act_dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=per_channel)
    check_backend(backend, cache.state)
    if q.device != cache.device:
        raise ValueError(f"inputs on {q.device}, cache on {cache.device}")
    if backend == "triton" and cache.geometry.K > MAX_K:
        raise ValueError(f"K={cache.geometry.K} > {MAX_K}: the kernel cannot tile a key dim this large")
    slots = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    gm = cache.geometry
    if out is None:
        out = torch.empty(batch, cache.window, gm.HV, gm.V, dtype=cache.act_dtype, device=cache.device)
    if batch:
        args = (cache, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out)
        if backend == "triton":
            _verify_triton(*args, per_channel=per_channel)
        elif backend == "cpu":
            _verify_cpu(*args)
        else:
            with formatted_pool(cache, slots, batch, backend, writes=False) as work:   # reads the checkpoint only
                {"torch": _verify_torch, "ref": _verify_ref}[backend](work, *args[1:])
    return out


def spec_commit(cache: CommitReplayCache, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Replay the accepted prefix (num_accepted [batch] in 1..T, bonus included) into the checkpoint."""
    check_cache_type(cache, CommitReplayCache)
    run_spec_commit(cache, num_accepted, slots, backend)


def run_spec_commit(cache, num_accepted, slots, backend: str) -> None:
    """spec_commit after the family's check, for either decay shape."""
    check_ring_format(cache, backend, f"{'kda' if cache.geometry.PER_CHANNEL_DECAY else 'gdn'}.commit_replay")
    check_backend(backend, cache.state)
    if not isinstance(num_accepted, torch.Tensor) or num_accepted.dim() != 1:
        raise ValueError("num_accepted must be a 1-D integer tensor [batch]")
    if num_accepted.device != cache.device:
        raise ValueError(f"num_accepted on {num_accepted.device}, cache on {cache.device}")
    batch = num_accepted.shape[0]
    slots = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    if batch == 0:
        return
    num_accepted = check_live_counts(num_accepted, slots, cache.null_slot, cache.window)
    if backend == "triton" and cache.geometry.K > MAX_K:
        raise ValueError(f"K={cache.geometry.K} > {MAX_K}: the kernel cannot tile a key dim this large")
    if backend == "triton":
        _commit_triton(cache, num_accepted, slots, per_channel=cache.geometry.PER_CHANNEL_DECAY)
    elif backend == "cpu":
        _commit_cpu(cache, num_accepted, slots)
    else:                                       # the one state write: rounded by the format on the way out
        with formatted_pool(cache, slots, batch, backend, writes=True) as work:
            {"torch": _commit_torch, "ref": _commit_ref}[backend](work, num_accepted, slots)
