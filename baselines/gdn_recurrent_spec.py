"""Native speculative decoding for Gated DeltaNet (vLLM style): one state snapshot per window token.

Each slot owns T state snapshots (ReplaySSM blog Algorithm 7). Verify loads snapshot last[slot]
(the state after the last accepted token of the previous step), runs the T window tokens serially in
registers (S <- exp(g) S; u = beta (v - S k); S <- S + u k^T; o = S q) and stores the state after token t
into snapshot t. Commit only picks which snapshot the next verify reads (last = accepted - 1); rejected
drafts cost nothing more. Per step and slot: 1 state read + T state writes, and T states of memory.

    states = SpecStates.allocate(geometry, num_slots, window)     # states.state[:, 0] <- prefill state
    o = spec_verify(states, q, k, v, g, beta)                     # o [batch, T, HV, V]
    spec_commit(states, num_accepted)                             # num_accepted [batch] in 1..T
Inputs as replayssm.gdn.spec: q, k [batch, T, H, K], v [batch, T, HV, V] in one act dtype, g and beta
[batch, T, HV] fp32, value head hv reads key head hv // (HV // H); NULL_SLOT rows are skipped.
Backends: "triton" (one kernel + tiny cursor kernels), "torch" (vectorised, serial over T), "ref" (float64).
State formats (replayssm/state_format.py): every format on torch / ref (the T snapshots rounded once per verify by
the format's rule, a scale per (slot, snapshot, head): baselines/spec_formats.py), the plain ones on triton / cpu.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import triton
import triton.language as tl

from baselines.spec_formats import formatted_pool
from replayssm import launch_registry, launch_table
from replayssm.checks import (
    ACT_DTYPES,
    NULL_SLOT,
    check_backend,
    check_cache_type,
    check_dtype,
    check_pool_alloc,
    check_ring_format,
    check_slots,
    kernel_arch,
    next_pow2,
)
from replayssm.gdn.ref import gdn_step_ref
from replayssm.gdn.spec import check_window
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.ring_cursors import check_live_counts
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed, format_of, read_state

MAX_K = 256  # a program keeps a whole [BV, K] state row block: the rank-1 update needs all of K


@dataclass
class DeltaRuleSpecStates(SlotPool):
    """T state snapshots per slot, for both delta-rule families (the snapshots do not depend on the decay
    shape); use the family's subclass (GEOMETRY): SpecStates here, baselines.kda_recurrent_spec.SpecStates.

    state [num_slots, T, HV, V, K]  snapshot t = state after window token t of the last verify (state_dtype)
    last  [num_slots] int32         snapshot the next verify starts from (accepted - 1; 0 after reset)
    state_scale [num_slots, T, HV] fp32, sr_step [num_slots] int32: non-plain formats (replayssm/state_format.py)
    """

    GEOMETRY: ClassVar[type] = GDNGeometry

    geometry: GDNGeometry | KDAGeometry
    state: torch.Tensor
    last: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry, num_slots: int, window: int, state_dtype=torch.float32, device="cpu",
                 sr_seed: int = 0):
        """`state_dtype`: a state format name or a torch dtype (every format on torch / ref); `sr_seed`: the 32-bit
        seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, cls.GEOMETRY, state_dtype, all_formats=True, num_slots=num_slots,
                                   window=window)
        gm = geometry
        state = torch.zeros(num_slots, window, gm.HV, gm.V, gm.K, dtype=storage, device=device)
        return cls(geometry=gm, state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, state_dtype),
                   last=torch.zeros(num_slots, dtype=torch.int32, device=device))

    @property
    def window(self) -> int:
        return self.state.shape[1]

    def committed(self) -> torch.Tensor:
        """The committed state of every slot [num_slots, HV, V, K] (a gather: snapshot last[slot]; dequantised to
        float32 for a non-plain format)."""
        key = (torch.arange(self.num_slots, device=self.device), self.last.long())
        return self.state[key] if format_of(self).plain else read_state(self, key)


class SpecStates(DeltaRuleSpecStates):
    """T GDN state snapshots per slot: `SpecStates.allocate(GDNGeometry(...), num_slots, window, ...)`."""

    GEOMETRY: ClassVar[type] = GDNGeometry


def serial_launch_config(geometry: GDNGeometry, device, state_dtype=None, kernel: str = "gdn_spec_verify",
                         per_channel: bool = False) -> dict:
    """This device's tuned entry for `kernel` (gdn_spec_verify: native spec; gdn_cr_verify / gdn_cr_commit:
    commit replay; per_channel: the KDA build, resolved under its kda_ name, e.g. kda_spec_verify, so a GDN
    entry never reaches it: KDA's verify holds more registers) in replayssm/launch_table.py, else the default."""
    arch = kernel_arch(device)
    if per_channel:
        kernel = launch_registry.KDA_BUILD[kernel]       # the KDA build: its own declaration and table entry
    return launch_table.resolve(kernel, launch_registry.key(kernel, geometry), state_dtype, arch,
                                default_serial_config(geometry, arch))


def default_serial_config(geometry: GDNGeometry, arch: int) -> dict:
    """A program holds a [BV, BK] fp32 state block (BK = whole K). Interpreter: BV = V (fewest programs).
    GPU: [16, 128] over 4 warps, 16 elements per thread (the AR baseline's tile, baselines/gdn_recurrent.py),
    so native spec, commit replay and AR decode are tuned alike; AOT-built for sm_90 at K = V = 128 with no
    local memory."""
    BK = max(16, next_pow2(geometry.K))
    if arch == 0:
        return {"BV": max(16, next_pow2(geometry.V)), "BK": BK, "num_warps": 4}
    return {"BV": min(16, next_pow2(geometry.V)), "BK": BK, "num_warps": 4 if geometry.K >= 128 else 2}


@triton.jit
def _recurrent_spec_verify_kernel(
    state_ptr, s_slot, s_snap, s_head, s_v, last_ptr, slots_ptr,
    q_ptr, q_b, q_t, q_h, k_ptr, k_b, k_t, k_h, v_ptr, v_b, v_t, v_h,
    g_ptr, g_b, g_t, beta_ptr, beta_b, beta_t, out_ptr, o_b, o_t, o_h, scale,
    T: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    USE_L2NORM: tl.constexpr, NULL: tl.constexpr, g_h=1, PER_CHANNEL: tl.constexpr = False,
):
    """PER_CHANNEL (KDA, baselines/kda_recurrent_spec.py): g [batch, T, HV, K], S <- S diag(exp(g_t))."""
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
    s_base = state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :]
    last = tl.load(last_ptr + slot).to(tl.int64)
    S = tl.load(s_base + last * s_snap, mask=s_mask, other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        q = tl.load(q_ptr + row * q_b + t * q_t + kh * q_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * k_b + t * k_t + kh * k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        if USE_L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
            k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
        v = tl.load(v_ptr + row * v_b + t * v_t + hv * v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        if PER_CHANNEL:
            S = S * tl.exp(tl.load(g_ptr + row * g_b + t * g_t + hv * g_h + offs_k, mask=mask_k, other=0.0))[None, :]
        else:
            S = S * tl.exp(tl.load(g_ptr + row * g_b + t * g_t + hv))
        u = tl.load(beta_ptr + row * beta_b + t * beta_t + hv) * (v - tl.sum(S * k[None, :], 1))
        S = S + u[:, None] * k[None, :]
        o = tl.sum(S * (q * scale)[None, :], 1)
        tl.store(out_ptr + row * o_b + t * o_t + hv * o_h + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
        tl.store(s_base + t * s_snap, S.to(state_ptr.dtype.element_ty), mask=s_mask)


@triton.jit
def _set_last_kernel(last_ptr, slots_ptr, num_accepted_ptr, batch, HAS_COUNTS: tl.constexpr, BLOCK: tl.constexpr,
                     NULL: tl.constexpr):
    """last[slot] = num_accepted - 1 (commit) or 0 (reset), live rows only."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = rows < batch
    slot = tl.load(slots_ptr + rows, mask=in_batch, other=NULL)
    live = in_batch & (slot != NULL)
    value = tl.zeros([BLOCK], dtype=tl.int32)
    if HAS_COUNTS:
        value = tl.load(num_accepted_ptr + rows, mask=live, other=1) - 1
    tl.store(last_ptr + tl.where(live, slot, 0).to(tl.int64), value, mask=live)


def _verify_triton(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, per_channel: bool = False):
    gm, batch = states.geometry, q.shape[0]
    st = states.state
    cfg = serial_launch_config(gm, q.device, st.dtype, "gdn_spec_verify", per_channel)
    _recurrent_spec_verify_kernel[(triton.cdiv(gm.V, cfg["BV"]), batch, gm.HV)](
        st, st.stride(0), st.stride(1), st.stride(2), st.stride(3), states.last, slots,
        q, q.stride(0), q.stride(1), q.stride(2), k, k.stride(0), k.stride(1), k.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2), g, g.stride(0), g.stride(1), beta, beta.stride(0), beta.stride(1),
        out, out.stride(0), out.stride(1), out.stride(2), float(scale),
        T=states.window, GROUP=gm.value_heads_per_key_head, K=gm.K, V=gm.V, BV=cfg["BV"], BK=cfg["BK"],
        USE_L2NORM=bool(use_qk_l2norm), NULL=NULL_SLOT, num_warps=cfg["num_warps"],
        **(dict(g_h=g.stride(2), PER_CHANNEL=True) if per_channel else {}),
    )


def _set_last_triton(states, slots, num_accepted) -> None:
    batch = slots.shape[0]
    block = max(16, min(1024, next_pow2(batch)))
    _set_last_kernel[(triton.cdiv(batch, block),)](
        states.last, slots, slots if num_accepted is None else num_accepted, batch,
        HAS_COUNTS=num_accepted is not None, BLOCK=block, NULL=NULL_SLOT, num_warps=1,
    )


def live_rows(slots: torch.Tensor, null_slot: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(rows, slots) of the live rows; rows is None when every row is live (inputs used without a gather)."""
    live = slots != null_slot
    if bool(live.all()):
        return None, slots.long()
    rows = live.nonzero().squeeze(1)
    return rows, slots.long()[rows]


def window_qk_fp32(q: torch.Tensor, k: torch.Tensor, scale: float, use_qk_l2norm: bool):
    """q, k [b, T, H, K] -> fp32 (q scaled, both normalised if asked: x / sqrt(sum x^2 + 1e-6))."""
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    return q * scale, k


def delta_step_torch_(S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor) -> None:
    """In place, fp32: S [b, H, G, V, K] <- exp(g) S + u k^T, u = beta (v - exp(g) S k).

    k [b, H, K]; v [b, H, G, V]; g, beta [b, H, G]; or g [b, H, G, K], a decay per key channel (KDA):
    S <- S diag(exp(g))."""
    S.mul_(torch.exp(g)[..., None, :] if g.dim() == 4 else torch.exp(g)[..., None, None])
    u = beta[..., None] * (v - torch.einsum("bhgvk,bhk->bhgv", S, k))
    S.add_(u[..., :, None] * k[:, :, None, None, :])


def _verify_torch(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    gm, T = states.geometry, states.window
    G = gm.value_heads_per_key_head
    rows, sl = live_rows(slots, states.null_slot)
    if sl.numel() == 0:
        return
    if rows is not None:
        q, k, v, g, beta = (t.index_select(0, rows) for t in (q, k, v, g, beta))
    b = sl.numel()
    qf, kf = window_qk_fp32(q, k, scale, use_qk_l2norm)
    S = states.state[sl, states.last[sl].long()].float().view(b, gm.H, G, gm.V, gm.K)
    vf = v.float().view(b, T, gm.H, G, gm.V)
    gf, bf = g.view(b, T, gm.H, G, *g.shape[3:]), beta.view(b, T, gm.H, G)      # KDA: g [.., K]
    o = torch.empty(b, T, gm.HV, gm.V, dtype=torch.float32, device=q.device)
    for t in range(T):
        delta_step_torch_(S, kf[:, t], vf[:, t], gf[:, t], bf[:, t])
        o[:, t] = torch.einsum("bhgvk,bhk->bhgv", S, qf[:, t]).reshape(b, gm.HV, gm.V)
        states.state[sl, t] = S.view(b, gm.HV, gm.V, gm.K).to(states.state_dtype)
    if rows is None:
        out.copy_(o)
    else:
        out.index_copy_(0, rows, o.to(out.dtype))


def _verify_ref(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    for row, slot in enumerate(slots.tolist()):
        if slot == states.null_slot:
            continue
        S = states.state[slot, int(states.last[slot])][None]
        for t in range(states.window):
            S, o, _ = gdn_step_ref(S, q[row:row + 1, t], k[row:row + 1, t], v[row:row + 1, t], g[row:row + 1, t],
                                   beta[row:row + 1, t], scale, use_qk_l2norm)
            out[row, t] = o[0].to(out.dtype)
            states.state[slot, t] = S[0].to(states.state_dtype)


def _verify_cpu(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    from replayssm.cpu import ops
    ops.gdn_spec_native(states, q, k, v, g, beta, scale, use_qk_l2norm, out, slots)


def spec_verify(states: SpecStates, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """Serial window from snapshot last[slot]; the state after token t goes to snapshot t.

    q, k [batch, T, H, K]; v [batch, T, HV, V]; g, beta [batch, T, HV] fp32 -> o [batch, T, HV, V] (act dtype).
    """
    check_cache_type(states, SpecStates)
    return run_spec_verify(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend)


def run_spec_verify(states, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend: str) -> torch.Tensor:
    """spec_verify after the family's check, for either decay shape (states.geometry.PER_CHANNEL_DECAY, KDA:
    g [batch, T, HV, K]): every backend here takes either shape."""
    if not isinstance(q, torch.Tensor):
        raise ValueError("q must be a tensor")
    check_dtype("q", q, ACT_DTYPES)
    per_channel = states.geometry.PER_CHANNEL_DECAY
    check_ring_format(states, backend, f"{'kda' if per_channel else 'gdn'}.recurrent_spec")
    batch, scale = check_window(states.geometry, states.window, q.dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=per_channel)
    check_backend(backend, states.state)
    if q.device != states.device:
        raise ValueError(f"inputs on {q.device}, states on {states.device}")
    if backend == "triton" and states.geometry.K > MAX_K:
        raise ValueError(f"K={states.geometry.K} > {MAX_K}: the kernel cannot tile a key dim this large")
    slots = check_slots(slots, batch, states.num_slots, states.device, states.null_slot)
    gm = states.geometry
    if out is None:
        out = torch.empty(batch, states.window, gm.HV, gm.V, dtype=q.dtype, device=q.device)
    if batch:
        args = (states, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out)
        if backend == "triton":
            _verify_triton(*args, per_channel=per_channel)
        elif backend == "cpu":
            _verify_cpu(*args)
        else:                               # the T snapshots: rounded by the format on the way out
            with formatted_pool(states, slots, batch, backend, writes=True, snapshot=states.last) as work:
                {"torch": _verify_torch, "ref": _verify_ref}[backend](work, *args[1:])
    return out


def _check_cursor_call(states, num_accepted, slots, backend):
    check_backend(backend, states.state)
    if num_accepted is not None:
        if not isinstance(num_accepted, torch.Tensor) or num_accepted.dim() != 1:
            raise ValueError("num_accepted must be a 1-D integer tensor [batch]")
        batch = num_accepted.shape[0]
    else:
        if slots is None:
            slots = torch.arange(states.num_slots, dtype=torch.int32, device=states.device)
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
            raise ValueError("slots must be a 1-D integer tensor")
        batch = slots.shape[0]
    slots = check_slots(slots, batch, states.num_slots, states.device, states.null_slot)
    if num_accepted is not None:
        if num_accepted.device != states.device:
            raise ValueError(f"num_accepted on {num_accepted.device}, states on {states.device}")
        num_accepted = check_live_counts(num_accepted, slots, states.null_slot, states.window)
    return slots, num_accepted


def spec_commit(states: SpecStates, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Keep the snapshot after the last accepted token: last[slot] = num_accepted - 1 (1..T, bonus included)."""
    check_cache_type(states, SpecStates)
    run_spec_commit(states, num_accepted, slots, backend)


def run_spec_commit(states, num_accepted, slots, backend: str) -> None:
    """spec_commit after the family's check (the snapshot cursor does not depend on the decay shape)."""
    slots, num_accepted = _check_cursor_call(states, num_accepted, slots, backend)
    if slots.numel() == 0:
        return
    if backend == "triton":
        _set_last_triton(states, slots, num_accepted)
    else:
        rows, sl = live_rows(slots, states.null_slot)
        states.last[sl] = (num_accepted if rows is None else num_accepted[rows]) - 1


def spec_reset(states: SpecStates, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Start requests in `slots` (default all): the next verify reads snapshot 0 (the prefill state)."""
    check_cache_type(states, SpecStates)
    run_spec_reset(states, slots, backend)


def run_spec_reset(states, slots, backend: str) -> None:
    """spec_reset after the family's check."""
    slots, _ = _check_cursor_call(states, None, slots, backend)
    if slots.numel() == 0:
        return
    if backend == "triton":
        _set_last_triton(states, slots, None)
    else:
        _, sl = live_rows(slots, states.null_slot)
        states.last[sl] = 0
