"""Commit-time replay for Mamba-2 speculative decoding (FlashInfer / TensorRT style, ReplaySSM blog Algorithms 3 and 7).

The checkpoint state is frozen during verify: each verify step reads it once, runs the T window tokens
serially in registers to emit y_t, stores no state, and stashes the window's inputs (x, B in the act dtype,
processed dt in fp32). After acceptance, `spec_commit` replays the first num_accepted stashed tokens into
the checkpoint: one state read + one state write per step, the only state write (TensorRT-Edge-LLM's
`MambaReplayLayerInfo`: "re-runs the SSD recurrence S = dA * S + u (x) B over the first acceptedLengths[b]
tokens of the replay stash"). No per-draft snapshots, no history ring (contrast: ReplaySSM keeps a ring and
writes the checkpoint only on flush steps).

Per step and slot: verify reads 1 state, commit reads + writes 1 state (vs native: 1 read + T writes).

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

from baselines import mamba2_ssu_kernels as K
from baselines.mamba2_ssu import (
    MAX_WINDOW,
    check_step_inputs,
    decayed_fp32,
    fp32_work,
    gate_torch,
    live_rows,
    process_dt_torch,
    write_back,
)
from baselines.spec_formats import formatted_pool
from replayssm.checks import (
    NULL_SLOT,
    check_backend,
    check_dtype,
    check_num_accepted,
    check_pool_alloc,
    check_ring_format,
    check_same_device,
    check_shape,
    check_slots,
)
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2.ref import process_dt, ssm_step_ref, window_ref
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed


@dataclass
class CommitReplayCache(SlotPool):
    """Frozen checkpoint + the last window's stash.

    state [num_slots, nheads, headdim, dstate]  checkpoint = committed state (state_dtype)
    x     [num_slots, nheads, T, headdim]        the window's x (act_dtype)
    B     [num_slots, ngroups, T, dstate]        the window's B (act_dtype)
    dt    [num_slots, nheads, T]                 the window's processed dt (fp32, after bias + softplus)
    state_scale [num_slots, nheads] fp32, sr_step [num_slots] int32: as a ReplaySSM ring's (non-plain formats)
    """

    ACT_FIELD: ClassVar[str] = "x"

    geometry: Mamba2Geometry
    window: int
    state: torch.Tensor
    x: torch.Tensor
    B: torch.Tensor
    dt: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry: Mamba2Geometry, num_slots: int, window: int, state_dtype=torch.float32,
                 act_dtype=torch.float32, device="cpu", sr_seed: int = 0) -> CommitReplayCache:
        """`state_dtype`: a state format name or a torch dtype (every format on torch / ref); `sr_seed`: the 32-bit
        seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, Mamba2Geometry, state_dtype, act_dtype, all_formats=True,
                                   num_slots=num_slots, window=window)
        if window > MAX_WINDOW:
            raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
        if geometry.dstate > K.MAX_DSTATE:
            raise ValueError(f"dstate={geometry.dstate} > {K.MAX_DSTATE}: the kernels keep a whole dstate row in "
                             "one tile")
        g, n, T = geometry, num_slots, window
        state = torch.zeros(n, g.nheads, g.headdim, g.dstate, dtype=storage, device=device)
        return cls(geometry=g, window=T, state=state, sr_seed=check_seed(sr_seed),
                   **allocate_extras(state, state_dtype),
                   x=torch.zeros(n, g.nheads, T, g.headdim, dtype=act_dtype, device=device),
                   B=torch.zeros(n, g.ngroups, T, g.dstate, dtype=act_dtype, device=device),
                   dt=torch.zeros(n, g.nheads, T, dtype=torch.float32, device=device))


# ----------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def commit_replay_verify_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, slots_ptr, out_ptr,
    xs_ptr, Bs_ptr, dts_ptr,
    heads_per_group, null_slot,
    s_slot, s_head, s_dim,
    x_batch, x_tok, x_head, dt_batch, dt_tok, dt_head, B_batch, B_tok, B_group, C_batch, C_tok, C_group,
    z_batch, z_tok, z_head, o_batch, o_tok, o_head,
    xs_slot, xs_head, xs_tok, Bs_slot, Bs_group, Bs_tok, dts_slot, dts_head,
    T: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Outputs of the T window tokens from the frozen checkpoint (recurrence in registers, no state store),
    and the stash: x by every program (its headdim block), dt by the first headdim block of each head,
    B by the first block of the first head of each group (written once, not once per head)."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    if slot == null_slot:
        return
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < HEADDIM
    mask_n = offs_n < DSTATE
    mask = mask_m[:, None] & mask_n[None, :]
    writes_dt = pid_m == 0
    writes_B = (pid_m == 0) & (h % heads_per_group == 0)

    S = tl.load(state_ptr + slot * s_slot + h * s_head + offs_m[:, None] * s_dim + offs_n[None, :], mask=mask,
                other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    for t in tl.static_range(T):
        x_raw = tl.load(x_ptr + b * x_batch + t * x_tok + h * x_head + offs_m, mask=mask_m, other=0.0)
        B_raw = tl.load(B_ptr + b * B_batch + t * B_tok + g * B_group + offs_n, mask=mask_n, other=0.0)
        Cv = tl.load(C_ptr + b * C_batch + t * C_tok + g * C_group + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        dt = K.process_dt(tl.load(dt_ptr + b * dt_batch + t * dt_tok + h * dt_head), dt_bias_ptr, h,
                          HAS_DT_BIAS, DT_SOFTPLUS)
        tl.store(xs_ptr + slot * xs_slot + h * xs_head + t * xs_tok + offs_m, x_raw, mask=mask_m)
        if writes_B:  # an `if`, not `mask_n & writes_B`: triton 3.9's interpreter rejects that int32 mask
            tl.store(Bs_ptr + slot * Bs_slot + g * Bs_group + t * Bs_tok + offs_n, B_raw, mask=mask_n)
        tl.store(dts_ptr + slot * dts_slot + h * dts_head + t, dt, mask=writes_dt)
        x = x_raw.to(tl.float32)
        S = S * tl.exp(A * dt) + (dt * x)[:, None] * B_raw.to(tl.float32)[None, :]
        y = tl.sum(S * Cv[None, :], axis=1)
        y = K.gate_output(y, x, D_ptr, z_ptr + b * z_batch + t * z_tok + h * z_head + offs_m, h, mask_m, HAS_D,
                          HAS_Z)
        tl.store(out_ptr + b * o_batch + t * o_tok + h * o_head + offs_m, y.to(out_ptr.dtype.element_ty),
                 mask=mask_m)


@triton.jit
def commit_replay_commit_kernel(
    state_ptr, xs_ptr, Bs_ptr, dts_ptr, A_ptr, slots_ptr, acc_ptr,
    heads_per_group, null_slot,
    s_slot, s_head, s_dim, xs_slot, xs_head, xs_tok, Bs_slot, Bs_group, Bs_tok, dts_slot, dts_head,
    T: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Replay the first num_accepted stashed tokens into the checkpoint tile: one read, one write."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    if slot == null_slot:
        return
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < HEADDIM
    mask_n = offs_n < DSTATE
    mask = mask_m[:, None] & mask_n[None, :]
    n_acc = tl.minimum(tl.load(acc_ptr + b), T)

    s_ptrs = state_ptr + slot * s_slot + h * s_head + offs_m[:, None] * s_dim + offs_n[None, :]
    S = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    xs = xs_ptr + slot * xs_slot + h * xs_head + offs_m
    Bs = Bs_ptr + slot * Bs_slot + g * Bs_group + offs_n
    dts = dts_ptr + slot * dts_slot + h * dts_head
    # A constexpr trip count with a guard, not range(n_acc): triton 3.6's interpreter cannot range over a
    # loaded value (int() of a 1-element array, an error since numpy 2.4).
    for t in range(T):
        if t < n_acc:
            dt = tl.load(dts + t)
            x = tl.load(xs + t * xs_tok, mask=mask_m, other=0.0).to(tl.float32)
            Bv = tl.load(Bs + t * Bs_tok, mask=mask_n, other=0.0).to(tl.float32)
            S = S * tl.exp(A * dt) + (dt * x)[:, None] * Bv[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------


def _check_cache(cache) -> None:
    if not isinstance(cache, CommitReplayCache):
        raise ValueError(f"expected CommitReplayCache, got {type(cache).__name__}")


def spec_verify(cache, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, slots=None, out=None,
                backend="triton"):
    """Verify a window of T tokens per row from the frozen checkpoint. Returns y [batch, T, nheads, headdim].

    x, z [batch, T, nheads, headdim]; dt [batch, T, nheads] raw; B, C [batch, T, ngroups, dstate] (act dtype
    = cache.act_dtype). No state is written; the window's x, B and processed dt are stashed for the commit.
    """
    _check_cache(cache)
    check_ring_format(cache, backend, "mamba2.commit_replay")
    check_backend(backend, cache.state, x, dt, B, C, z, out)
    g, T = cache.geometry, cache.window
    batch, _ = check_step_inputs(g.nheads, g.headdim, g.dstate, x, dt, A, B, C, D, z, dt_bias, out, window=T,
                                 ngroups=g.ngroups, act_dtype=cache.act_dtype)
    check_same_device(state=cache.state, x=x)
    slots_checked = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if backend == "triton":
        _verify_triton(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots_checked, out)
    elif backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_cr_verify(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slots_checked)
    else:
        with formatted_pool(cache, slots, batch, backend, writes=False) as work:      # reads the checkpoint only
            verify = _verify_torch if backend == "torch" else _verify_ref
            verify(work, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out)
    return out


def spec_commit(cache, num_accepted, A, slots=None, backend="triton"):
    """Replay the first num_accepted [batch] (1..T, bonus included) stashed tokens into the checkpoint."""
    _check_cache(cache)
    check_ring_format(cache, backend, "mamba2.commit_replay")
    check_backend(backend, cache.state, num_accepted, A)
    batch = num_accepted.shape[0] if num_accepted.dim() == 1 else -1
    num_accepted = check_num_accepted(num_accepted, batch, cache.window)
    check_shape("A", A, (cache.geometry.nheads,))
    check_dtype("A", A, (torch.float32,))
    check_same_device(state=cache.state, num_accepted=num_accepted, A=A)
    slots_checked = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    if batch == 0:
        return
    if backend == "triton":
        _commit_triton(cache, num_accepted, A, slots_checked)
    elif backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_cr_commit(cache, num_accepted, A, slots_checked)
    else:                                       # the one state write: rounded by the format on the way out
        with formatted_pool(cache, slots, batch, backend, writes=True) as work:
            (_commit_torch if backend == "torch" else _commit_ref)(work, num_accepted, A, slots)


def spec_reset(cache, slots=None, backend="triton"):
    """A new request enters `slots`: nothing to do (there are no cursors: every verify overwrites the whole
    stash and every commit names its own accepted count). Kept so a harness can treat all methods alike;
    the caller writes the prefill state into the slot (state_format.set_state for any format)."""
    _check_cache(cache)
    check_backend(backend, cache.state)
    if slots is not None:
        check_slots(slots, slots.shape[0] if slots.dim() == 1 else -1, cache.num_slots, cache.device,
                    cache.null_slot)


def _verify_triton(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    g, st = cache.geometry, cache.state
    block_m, block_n, warps = K.launch_config(g.headdim, g.dstate, st.dtype, st.device, "mamba2_cr_verify")
    zz = x if z is None else z
    grid = (triton.cdiv(g.headdim, block_m), x.shape[0], g.nheads)
    commit_replay_verify_kernel[grid](
        st, x, dt, A, B, C, A if D is None else D, zz, A if dt_bias is None else dt_bias, slots, out,
        cache.x, cache.B, cache.dt,
        g.heads_per_group, cache.null_slot,
        st.stride(0), st.stride(1), st.stride(2),
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1), dt.stride(2),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), out.stride(0), out.stride(1), out.stride(2),
        cache.x.stride(0), cache.x.stride(1), cache.x.stride(2), cache.B.stride(0), cache.B.stride(1),
        cache.B.stride(2), cache.dt.stride(0), cache.dt.stride(1),
        T=cache.window, HEADDIM=g.headdim, DSTATE=g.dstate, HAS_D=D is not None, HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus), BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=warps,
    )


def _commit_triton(cache, num_accepted, A, slots):
    g, st = cache.geometry, cache.state
    block_m, block_n, warps = K.launch_config(g.headdim, g.dstate, st.dtype, st.device, "mamba2_cr_commit")
    grid = (triton.cdiv(g.headdim, block_m), slots.shape[0], g.nheads)
    commit_replay_commit_kernel[grid](
        st, cache.x, cache.B, cache.dt, A, slots, num_accepted,
        g.heads_per_group, cache.null_slot,
        st.stride(0), st.stride(1), st.stride(2), cache.x.stride(0), cache.x.stride(1), cache.x.stride(2),
        cache.B.stride(0), cache.B.stride(1), cache.B.stride(2), cache.dt.stride(0), cache.dt.stride(1),
        T=cache.window, HEADDIM=g.headdim, DSTATE=g.dstate, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
    )


def _verify_torch(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    """The checkpoint is read once, by token 0's decay multiply, which creates the fp32 working copy (the
    checkpoint itself stays frozen); then in-place token updates with y_t = S C_t, and the stash."""
    g, st, T = cache.geometry, cache.state, cache.window
    rows, slot_index = live_rows(slots, x.shape[0], cache.num_slots, cache.null_slot)
    if rows is not None and rows.numel() == 0:
        return
    stash_x, stash_B, stash_dt = cache.x, cache.B, cache.dt
    if slot_index is None:                  # row b owns slot b: work on views of the first rows
        st, stash_x, stash_B, stash_dt = (t[:x.shape[0]] for t in (st, stash_x, stash_B, stash_dt))
    sel = (lambda t: t) if rows is None else (lambda t: None if t is None else t[rows.to(t.device)])
    x_r, z_r, B_r, C_r = sel(x), sel(z), sel(B), sel(C)
    n, hpg = x_r.shape[0], g.heads_per_group
    dtp = process_dt_torch(sel(dt), dt_bias, dt_softplus)                       # [r, T, nheads]
    decay = torch.exp(dtp * A).view(n, T, g.ngroups, hpg, 1, 1)
    dtx = (dtp[..., None] * x_r.float()).view(n, T, g.ngroups, hpg, g.headdim, 1)
    S = st if slot_index is None else st[slot_index.to(st.device)]
    S = S.unflatten(1, (g.ngroups, hpg))
    Bf, Cf = B_r.float(), C_r.float()
    y = torch.empty(n, T, g.nheads, g.headdim, dtype=torch.float32, device=st.device)
    for t in range(T):
        # Token 0's multiply creates the fp32 working copy unless S is already a gathered fp32 copy.
        S = decayed_fp32(S, decay[:, t], owned=t > 0 or (slot_index is not None and st.dtype == torch.float32))
        S.addcmul_(dtx[:, t], Bf[:, t, :, None, None, :])
        y[:, t] = torch.matmul(S, Cf[:, t, :, None, :, None]).view(n, g.nheads, g.headdim)
    if slot_index is None:
        stash_x.copy_(x_r.transpose(1, 2))
        stash_B.copy_(B_r.transpose(1, 2))
        stash_dt.copy_(dtp.transpose(1, 2))
    else:
        idx = slot_index.to(st.device)
        stash_x[idx] = x_r.transpose(1, 2)
        stash_B[idx] = B_r.transpose(1, 2)
        stash_dt[idx] = dtp.transpose(1, 2)
    y = gate_torch(y, x_r, D, z_r).to(out.dtype)
    if rows is None:
        out.copy_(y)
    else:
        out[rows.to(out.device)] = y


def _commit_torch(cache, num_accepted, A, slots):
    """The accepted prefix folded in closed form: S <- exp(A sum dt) S + X^T (s * B) with
    s_t = dt_t exp(A sum_{k>t} dt_k) over accepted tokens (0 for rejected ones). Two in-place passes over
    the state (mul_, then one batched GEMM accumulate per group), whatever num_accepted is."""
    g, st, T = cache.geometry, cache.state, cache.window
    rows, slot_index = live_rows(slots, num_accepted.shape[0], cache.num_slots, cache.null_slot)
    if rows is not None and rows.numel() == 0:
        return
    idx = None if slot_index is None else slot_index.to(st.device)
    acc = num_accepted if rows is None else num_accepted[rows.to(num_accepted.device)]
    n, hpg = acc.shape[0], g.heads_per_group
    if idx is None:                         # row b owns slot b: views of the first n slots
        st = st[:n]
    pick = (lambda t: t[:n]) if idx is None else (lambda t: t[idx])
    accepted = torch.arange(T, device=st.device)[None, :] < acc.to(st.device)[:, None]      # [r, T]
    dtm = pick(cache.dt) * accepted[:, None, :]                                           # [r, nheads, T]
    after = dtm.flip(-1).cumsum(-1).flip(-1) - dtm                                        # sum_{k>t} dt_k
    weight = dtm * torch.exp(A[:, None] * after)                                          # [r, nheads, T]
    total_decay = torch.exp(A * dtm.sum(-1))                                              # [r, nheads]
    # [r, G, hpg, P, T] -> [r*G, hpg*P, T]: rows of all heads of a group share that group's B [T, N].
    xw = (pick(cache.x).float() * weight[..., None]).transpose(2, 3).reshape(n * g.ngroups, hpg * g.headdim, T)
    Bg = pick(cache.B).float().reshape(n * g.ngroups, T, g.dstate)
    work, writeback = fp32_work(st, slot_index)
    if not work.is_contiguous():
        work, writeback = work.contiguous(), True
    work.view(n, g.nheads, -1).mul_(total_decay[..., None])
    work.view(n * g.ngroups, hpg * g.headdim, g.dstate).baddbmm_(xw, Bg)
    if writeback:
        write_back(st, slot_index, work)


def _verify_ref(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    rows, slot_index = live_rows(slots, x.shape[0], cache.num_slots, cache.null_slot)
    if rows is None:
        rows = slot_index = torch.arange(x.shape[0])
    for b, s in zip(rows.tolist(), slot_index.tolist()):
        _, y = window_ref(cache.state[s][None], x[b:b + 1], dt[b:b + 1], A, B[b:b + 1], C[b:b + 1], D,
                          None if z is None else z[b:b + 1], dt_bias, dt_softplus)
        out[b] = y[0].to(out.dtype)
        cache.x[s] = x[b].transpose(0, 1)
        cache.B[s] = B[b].transpose(0, 1)
        cache.dt[s] = process_dt(dt[b], dt_bias, dt_softplus).transpose(0, 1).float()


def _commit_ref(cache, num_accepted, A, slots):
    """float64 serial replay of the stashed tokens (their processed dt as stored, fp32)."""
    rows, slot_index = live_rows(slots, num_accepted.shape[0], cache.num_slots, cache.null_slot)
    if rows is None:
        rows = slot_index = torch.arange(num_accepted.shape[0])
    no_C = torch.zeros(1, cache.geometry.ngroups, cache.geometry.dstate, dtype=torch.float64, device=cache.device)
    for b, s in zip(rows.tolist(), slot_index.tolist()):
        S = cache.state[s][None].double()
        for t in range(int(num_accepted[b])):
            S, _ = ssm_step_ref(S, cache.x[s, :, t][None], cache.dt[s, :, t][None], A, cache.B[s, :, t][None],
                                no_C, dt_softplus=False)
        cache.state[s] = S[0].to(cache.state.dtype)
