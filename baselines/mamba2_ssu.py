"""Mamba-2 state-caching baselines: what serving engines run today (mamba_ssm / vLLM; blog Alg. 3 and 7).

AR decode, `selective_state_update`: every step reads the whole state [nheads, headdim, dstate] of each
sequence, applies the rank-1 update, reads out y and writes the state back (mamba_ssm / vLLM).

Speculative decode, vLLM native (`SpecStates`, `spec_verify`, `spec_commit`, `spec_reset`): each slot owns
T state snapshots. Verify loads snapshot last[slot] (the state after the last accepted token), runs the T
window tokens serially and stores the state after token t into snapshot t: 1 state read + T state writes
per step, T x the state memory. Commit only moves the cursor: last = num_accepted - 1.

Backends: "triton" (baselines/mamba2_ssu_kernels.py), "torch" (vectorised, in-place: the CPU timing
backend), "ref" (float64 oracle via replayssm.mamba2.ref, rounding to the state dtype where it stores).
selective_state_update also takes a FormattedState (replayssm/state_format.py): float16_sr, bfloat16_sr, int8 and
float8_e4m3fn states on torch / ref, written back by the format's rule every step; float16_sr / bfloat16_sr on
Triton too, where the kernel rounds its own store (mamba2_ssu_kernels.ssu_ar_kernel's SR, the same bits) and a
one-program launch advances the live rows' sr_step on the device. int8 / e4m3 stay torch / ref: the per-(slot,
head) scale is an absmax across the head's headdim-tile programs, a reduction the one-pass tile write cannot take.
A row whose slot is the null slot (-1) is padding: skipped, its output left as is, its state untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from baselines import mamba2_ssu_kernels as K
from replayssm.checks import (
    ACT_DTYPES,
    NULL_SLOT,
    STATE_DTYPES,
    check_backend,
    check_dtype,
    check_last_dim_contiguous,
    check_num_accepted,
    check_pool_alloc,
    check_ring_format,
    check_same_device,
    check_shape,
    check_slots,
    next_pow2,
)
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2.ref import SOFTPLUS_THRESHOLD, ssm_step_ref, window_ref
from replayssm.slot_pool import SlotPool
from replayssm.state_format import allocate_extras, check_seed, format_of, formatted_work, read_state, unwrap_state

MAX_WINDOW = 16  # T is unrolled in the spec kernels


# ----------------------------------------------------------------------------------------------------------
# Validation shared with baselines/mamba2_commit_replay.py
# ----------------------------------------------------------------------------------------------------------


def check_step_inputs(nheads: int, headdim: int, dstate: int, x, dt, A, B, C, D, z, dt_bias, out,
                      window: int | None = None, ngroups: int | None = None,
                      act_dtype: torch.dtype | None = None) -> tuple[int, int]:
    """Validate one AR step (window=None) or one spec window; return (batch, ngroups).

    x, z, out [batch, (T,) nheads, headdim]; dt [batch, (T,) nheads]; B, C [batch, (T,) ngroups, dstate];
    A, D, dt_bias [nheads] fp32. x, z, B, C (and out) share one act dtype (`act_dtype` when the cache fixes it).
    """
    if dstate > K.MAX_DSTATE:
        raise ValueError(f"dstate={dstate} > {K.MAX_DSTATE}: the kernels keep a whole dstate row in one tile")
    lead_dims = 1 if window is None else 2
    if x.dim() != lead_dims + 2:
        raise ValueError(f"x must have {lead_dims + 2} dims, got shape {tuple(x.shape)}")
    batch = x.shape[0]
    lead = (batch,) if window is None else (batch, window)
    if B.dim() != lead_dims + 2:
        raise ValueError(f"B must have {lead_dims + 2} dims, got shape {tuple(B.shape)}")
    ngroups = B.shape[-2] if ngroups is None else ngroups
    if ngroups <= 0 or nheads % ngroups:
        raise ValueError(f"nheads={nheads} is not a multiple of ngroups={ngroups}")
    check_shape("x", x, (*lead, nheads, headdim))
    check_shape("z", z, (*lead, nheads, headdim))
    check_shape("out", out, (*lead, nheads, headdim))
    check_shape("dt", dt, (*lead, nheads))
    check_shape("B", B, (*lead, ngroups, dstate))
    check_shape("C", C, (*lead, ngroups, dstate))
    for name, p in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if p is not None:
            check_shape(name, p, (nheads,))
            check_dtype(name, p, (torch.float32,))
    check_dtype("x", x, ACT_DTYPES if act_dtype is None else (act_dtype,))
    for name, t in (("z", z), ("B", B), ("C", C), ("out", out)):
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}; x, z, B, C and out must share one act dtype ({x.dtype})")
    check_dtype("dt", dt, ACT_DTYPES)
    for name, t in (("x", x), ("z", z), ("B", B), ("C", C), ("out", out)):
        check_last_dim_contiguous(name, t)
    check_same_device(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, out=out)
    return batch, ngroups


def process_dt_torch(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """Raw dt [..., nheads] -> processed fp32 dt (bias, softplus with threshold 20)."""
    v = dt.float()
    if dt_bias is not None:
        v = v + dt_bias
    return F.softplus(v, threshold=SOFTPLUS_THRESHOLD) if dt_softplus else v


def gate_torch(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """y [..., nheads, headdim] fp32 -> y + D x, * silu(z) (in place on y)."""
    if D is not None:
        y.addcmul_(D[:, None], x.float())
    if z is not None:
        y.mul_(F.silu(z.float()))
    return y


def live_rows(slots: torch.Tensor | None, batch: int, num_slots: int,
              null_slot: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """torch/ref backends: (rows, slots) of the non-null rows as int64, or (None, None) when slots is None:
    row b then owns slot b, so the rows' states are the view pool[:batch] and no gather is needed."""
    if slots is None:
        return None, None
    rows = torch.nonzero(slots != null_slot).flatten().cpu()
    return rows, slots.long().cpu()[rows]


def _select(t: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or rows is None else t[rows.to(t.device)]


# ----------------------------------------------------------------------------------------------------------
# AR: selective_state_update
# ----------------------------------------------------------------------------------------------------------


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, slots=None,
                           out=None, backend="triton"):
    """One decode token per row, state updated in place. Returns y [batch, nheads, headdim] (x's dtype).

    state [num_slots, nheads, headdim, dstate] (fp32/fp16); x, z [batch, nheads, headdim];
    dt [batch, nheads] raw; A, D, dt_bias [nheads] fp32; B, C [batch, ngroups, dstate];
    slots int32 [batch] (default arange(batch); NULL_SLOT rows are skipped).
    """
    store, state, formatted = unwrap_state(state, backend, "mamba2.ssu")
    check_backend(backend, state, x, dt, B, C, z, out)
    if state.dim() != 4:
        raise ValueError(f"state must be [num_slots, nheads, headdim, dstate], got shape {tuple(state.shape)}")
    if not formatted:
        check_dtype("state", state, STATE_DTYPES)
    check_last_dim_contiguous("state", state)
    num_slots, nheads, headdim, dstate = state.shape
    batch, ngroups = check_step_inputs(nheads, headdim, dstate, x, dt, A, B, C, D, z, dt_bias, out)
    check_same_device(state=state, x=x)
    slots_checked = check_slots(slots, batch, num_slots, state.device)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if formatted:                    # torch / ref: the step on a float working copy, stored back by the format
        with formatted_work(store, None if slots is None else slots_checked, batch, backend) as (work, work_slots):
            if backend == "torch":
                _ssu_torch(work, x, dt, A, B, C, D, z, dt_bias, dt_softplus, work_slots, out, ngroups)
            else:
                _ssu_ref(work, x, dt, A, B, C, D, z, dt_bias, dt_softplus, work_slots, out)
        return out
    if backend == "triton":          # a FormattedState here is float16_sr / bfloat16_sr (unwrap_state refused the rest)
        sr = store if store is not None and store.sr_step is not None else None
        _ssu_triton(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots_checked, out, ngroups, sr)
    elif backend == "torch":
        _ssu_torch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, ngroups)
    elif backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_ssu(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slots_checked, store)  # SR counter
    else:
        _ssu_ref(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out)
    return out


def _ssu_triton(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, ngroups, store=None):
    """store: the FormattedState of a float16_sr / bfloat16_sr state (the kernel rounds its store; sr_step is
    advanced after it), else None."""
    num_slots, nheads, headdim, dstate = state.shape
    batch = x.shape[0]
    block_m, block_n, warps = K.launch_config(headdim, dstate, state.dtype, state.device, "mamba2_ssu_ar")
    zz = x if z is None else z
    grid = (triton.cdiv(headdim, block_m), batch, nheads)
    sr_step = None if store is None else store.sr_step
    K.ssu_ar_kernel[grid](
        state, x, dt, A, B, C, A if D is None else D, zz, A if dt_bias is None else dt_bias, slots, out,
        nheads // ngroups, NULL_SLOT,
        state.stride(0), state.stride(1), state.stride(2),
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), out.stride(0), out.stride(1), sr_step, 0 if store is None else store.sr_seed,
        HEADDIM=headdim, DSTATE=dstate, HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
    )
    if sr_step is not None:           # every live row wrote its state: its counter moves, after every program read it
        from replayssm.delta_rule.ar_fold import launch_sr_advance
        launch_sr_advance(slots, None, sr_step)


def fp32_work(state: torch.Tensor, slot_index: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """The fp32 working view of the rows' states: `state` itself (in place, no copy) when it is fp32 and
    slot_index is None (the caller passes pool[:batch]); else a gathered / upcast fp32 copy.
    Returns (work, needs_writeback)."""
    if slot_index is None and state.dtype == torch.float32:
        return state, False
    src = state if slot_index is None else state[slot_index.to(state.device)]
    return src.float(), True


def write_back(state: torch.Tensor, slot_index: torch.Tensor | None, work: torch.Tensor) -> None:
    """Store an fp32 working copy back into the rows' states (rounding to the state dtype)."""
    if slot_index is None:
        state.copy_(work)
    else:
        state[slot_index.to(state.device)] = work.to(state.dtype)


def decayed_fp32(src: torch.Tensor, decay: torch.Tensor, owned: bool) -> torch.Tensor:
    """src * decay in fp32. In place when src is fp32 and ours to modify; an fp32 src we must not modify is
    multiplied out of place (the multiply is the copy); an fp16 src is upcast, then multiplied in place (on
    CPU that is ~2x faster than a type-promoting multiply)."""
    if src.dtype != torch.float32:
        return src.float().mul_(decay)
    return src.mul_(decay) if owned else torch.mul(src, decay)


def _ssu_torch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, ngroups):
    """Vectorised, three passes over the state: decay multiply (in place on an fp32 pool with default slots,
    row b -> slot b; else on the one gathered / upcast fp32 working copy), dt x B^T accumulate (addcmul_,
    groups broadcast, no outer-product temp), y = S C readout; a working copy is stored back once."""
    num_slots, nheads, headdim, dstate = state.shape
    rows, slot_index = live_rows(slots, x.shape[0], num_slots, NULL_SLOT)
    if rows is not None and rows.numel() == 0:
        return
    if slot_index is None:
        state = state[:x.shape[0]]
    x_r, z_r, B_r, C_r = (_select(t, rows) for t in (x, z, B, C))
    dtp = process_dt_torch(_select(dt, rows), dt_bias, dt_softplus)             # [r, nheads]
    n, hpg = x_r.shape[0], nheads // ngroups
    decay = torch.exp(dtp * A).view(n, ngroups, hpg, 1, 1)
    dtx = (dtp[..., None] * x_r.float()).view(n, ngroups, hpg, headdim, 1)
    src = state if slot_index is None else state[slot_index.to(state.device)]
    S = decayed_fp32(src.unflatten(1, (ngroups, hpg)), decay, owned=True)       # [r, G, hpg, P, N]
    S.addcmul_(dtx, B_r.float()[:, :, None, None, :])
    y = torch.matmul(S, C_r.float()[:, :, None, :, None]).view(n, nheads, headdim)
    if slot_index is not None or S.data_ptr() != state.data_ptr():
        write_back(state, slot_index, S.flatten(1, 2))
    y = gate_torch(y, x_r, D, z_r).to(out.dtype)
    if rows is None:
        out.copy_(y)
    else:
        out[rows.to(out.device)] = y


def _ssu_ref(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    """float64, one row at a time through ssm_step_ref; the state is rounded to its dtype when stored."""
    rows, slot_index = live_rows(slots, x.shape[0], state.shape[0], NULL_SLOT)
    if rows is None:
        rows = slot_index = torch.arange(x.shape[0])
    for b, s in zip(rows.tolist(), slot_index.tolist()):
        new_state, y = ssm_step_ref(state[s:s + 1], x[b:b + 1], dt[b:b + 1], A, B[b:b + 1], C[b:b + 1], D,
                                    None if z is None else z[b:b + 1], dt_bias, dt_softplus)
        state[s] = new_state[0].to(state.dtype)
        out[b] = y[0].to(out.dtype)


# ----------------------------------------------------------------------------------------------------------
# Speculative decoding, vLLM native: one state snapshot per window token
# ----------------------------------------------------------------------------------------------------------


@dataclass
class SpecStates(SlotPool):
    """T state snapshots per slot.

    state [num_slots, T, nheads, headdim, dstate]  snapshot t = state after window token t of the last verify
    last  [num_slots] int32                         which snapshot holds the committed state
    state_scale [num_slots, T, nheads] fp32, sr_step [num_slots] int32: non-plain formats (torch / ref backends:
    the T snapshots rounded once per verify by the format's rule, baselines/spec_formats.py)
    """

    geometry: Mamba2Geometry
    window: int
    state: torch.Tensor
    last: torch.Tensor
    null_slot: int = NULL_SLOT
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None  # replayssm/state_format.py name (None: the state dtype's plain format)

    @classmethod
    def allocate(cls, geometry: Mamba2Geometry, num_slots: int, window: int, state_dtype=torch.float32,
                 device="cpu", sr_seed: int = 0) -> SpecStates:
        """`state_dtype`: a state format name or a torch dtype (every format on torch / ref); `sr_seed`: the 32-bit
        seed of a stochastic-rounding format."""
        storage = check_pool_alloc(geometry, Mamba2Geometry, state_dtype, all_formats=True, num_slots=num_slots,
                                   window=window)
        if window > MAX_WINDOW:
            raise ValueError(f"window must be an int in 1..{MAX_WINDOW}, got {window!r}")
        if geometry.dstate > K.MAX_DSTATE:
            raise ValueError(f"dstate={geometry.dstate} > {K.MAX_DSTATE}: the kernels keep a whole dstate row in "
                             "one tile")
        g = geometry
        state = torch.zeros(num_slots, window, g.nheads, g.headdim, g.dstate, dtype=storage, device=device)
        return cls(geometry=g, window=window, state=state, sr_seed=check_seed(sr_seed),
                   **allocate_extras(state, state_dtype), last=torch.zeros(num_slots, dtype=torch.int32, device=device))

    def committed(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The committed state of `slots` (default all): [batch, nheads, headdim, dstate] (a gathered copy)."""
        idx = torch.arange(self.num_slots, device=self.device) if slots is None else slots.long()
        key = (idx, self.last[idx].long())
        return self.state[key] if format_of(self).plain else read_state(self, key)    # dequantised


def _check_spec_states(states) -> None:
    if not isinstance(states, SpecStates):
        raise ValueError(f"expected SpecStates, got {type(states).__name__}")


def spec_verify(states, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, slots=None, out=None,
                backend="triton"):
    """Verify a window of T tokens per row. Returns y [batch, T, nheads, headdim].

    x, z [batch, T, nheads, headdim]; dt [batch, T, nheads] raw; B, C [batch, T, ngroups, dstate].
    Loads snapshot last[slot], runs the T tokens serially, stores the state after token t into snapshot t.
    """
    _check_spec_states(states)
    check_ring_format(states, backend, "mamba2.ssu_spec")
    check_backend(backend, states.state, x, dt, B, C, z, out)
    g, T = states.geometry, states.window
    batch, _ = check_step_inputs(g.nheads, g.headdim, g.dstate, x, dt, A, B, C, D, z, dt_bias, out, window=T,
                                 ngroups=g.ngroups)
    check_same_device(state=states.state, x=x)
    slots_checked = check_slots(slots, batch, states.num_slots, states.device, states.null_slot)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if backend == "triton":
        _spec_triton(states, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots_checked, out)
    elif backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_spec_native(states, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slots_checked)
    else:                                   # the T snapshots: rounded by the format on the way out
        from baselines.spec_formats import formatted_pool
        with formatted_pool(states, slots, batch, backend, writes=True, snapshot=states.last) as work:
            (_spec_torch if backend == "torch" else _spec_ref)(work, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                                                slots, out)
    return out


def _spec_triton(states, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    g, st = states.geometry, states.state
    block_m, block_n, warps = K.launch_config(g.headdim, g.dstate, st.dtype, st.device, "mamba2_ssu_spec")
    zz = x if z is None else z
    grid = (triton.cdiv(g.headdim, block_m), x.shape[0], g.nheads)
    K.ssu_spec_kernel[grid](
        st, states.last, x, dt, A, B, C, A if D is None else D, zz, A if dt_bias is None else dt_bias, slots, out,
        g.heads_per_group, states.null_slot,
        st.stride(0), st.stride(1), st.stride(2), st.stride(3),
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1), dt.stride(2),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), out.stride(0), out.stride(1), out.stride(2),
        T=states.window, HEADDIM=g.headdim, DSTATE=g.dstate, HAS_D=D is not None, HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus), BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=warps,
    )


def _spec_torch(states, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    """Gather snapshot last[slot] (the step's one state read), then per token: decay multiply, rank-1
    accumulate, y_t = S C_t, and the snapshot store. With an fp32 pool and default slots (row b -> slot b)
    the multiply writes straight into snapshot t and the rest runs there (3 passes per token); otherwise on
    one fp32 working copy that is then stored into snapshot t (4 passes)."""
    g, st, T = states.geometry, states.state, states.window
    rows, slot_index = live_rows(slots, x.shape[0], states.num_slots, states.null_slot)
    if rows is not None and rows.numel() == 0:
        return
    if slot_index is None:
        st = st[:x.shape[0]]
    x_r, z_r, B_r, C_r = (_select(t, rows) for t in (x, z, B, C))
    n, G, hpg = x_r.shape[0], g.ngroups, g.heads_per_group
    dtp = process_dt_torch(_select(dt, rows), dt_bias, dt_softplus)             # [r, T, nheads]
    decay = torch.exp(dtp * A).view(n, T, G, hpg, 1, 1)
    dtx = (dtp[..., None] * x_r.float()).view(n, T, G, hpg, g.headdim, 1)
    idx = torch.arange(n, device=st.device) if slot_index is None else slot_index.to(st.device)
    S = st[idx, states.last[idx].long()].unflatten(1, (G, hpg))                # gathered copy
    into_snapshots = slot_index is None and st.dtype == torch.float32
    Bf, Cf = B_r.float(), C_r.float()
    y = torch.empty(n, T, g.nheads, g.headdim, dtype=torch.float32, device=st.device)
    for t in range(T):
        if into_snapshots:
            snap = st[:, t].unflatten(1, (G, hpg))
            S = torch.mul(S, decay[:, t], out=snap)
        else:
            S = decayed_fp32(S, decay[:, t], owned=t > 0 or st.dtype == torch.float32)
        S.addcmul_(dtx[:, t], Bf[:, t, :, None, None, :])
        C_t = Cf[:, t, :, None, :, None]                                          # [r, G, 1, N, 1]
        if into_snapshots:
            # A snapshot's rows are T states apart: a batched matmul would first copy it contiguous, so
            # read out row by row (each row's [nheads, P, N] block is contiguous).
            for r in range(n):
                y[r, t] = torch.matmul(S[r], C_t[r]).view(g.nheads, g.headdim)
        else:
            y[:, t] = torch.matmul(S, C_t).view(n, g.nheads, g.headdim)
            st[idx, t] = S.flatten(1, 2).to(st.dtype)
    y = gate_torch(y, x_r, D, z_r).to(out.dtype)
    if rows is None:
        out.copy_(y)
    else:
        out[rows.to(out.device)] = y


def _spec_ref(states, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out):
    st = states.state
    rows, slot_index = live_rows(slots, x.shape[0], states.num_slots, states.null_slot)
    if rows is None:
        rows = slot_index = torch.arange(x.shape[0])
    for b, s in zip(rows.tolist(), slot_index.tolist()):
        last = int(states.last[s])
        snaps, y = window_ref(st[s, last][None], x[b:b + 1], dt[b:b + 1], A, B[b:b + 1], C[b:b + 1], D,
                              None if z is None else z[b:b + 1], dt_bias, dt_softplus)
        st[s] = snaps[0].to(st.dtype)
        out[b] = y[0].to(out.dtype)


def _set_cursor(cursor: torch.Tensor, slots: torch.Tensor, values: torch.Tensor | None, offset: int,
                null_slot: int, backend: str) -> None:
    """cursor[slot] = values + offset (0 without values) for the non-null rows."""
    batch = slots.shape[0]
    if batch == 0:
        return
    if backend == "triton":
        K.set_cursor_kernel[(1,)](cursor, slots, slots if values is None else values, batch, null_slot, offset,
                                  HAS_VALUES=values is not None, BLOCK=max(16, next_pow2(batch)))
        return
    live = slots != null_slot
    target = slots[live].long()
    if values is None:
        cursor[target] = 0
    else:
        cursor[target] = (values[live] + offset).to(cursor.dtype)


def spec_commit(states, num_accepted, slots=None, backend="triton"):
    """After verify: num_accepted [batch] in 1..T (bonus token included) -> last[slot] = num_accepted - 1."""
    _check_spec_states(states)
    check_backend(backend, states.state, num_accepted)
    batch = num_accepted.shape[0] if num_accepted.dim() == 1 else -1
    num_accepted = check_num_accepted(num_accepted, batch, states.window)
    slots = check_slots(slots, batch, states.num_slots, states.device, states.null_slot)
    check_same_device(state=states.state, num_accepted=num_accepted)
    _set_cursor(states.last, slots, num_accepted, -1, states.null_slot, backend)


def spec_reset(states, slots=None, backend="triton"):
    """A new request enters `slots` (default all): last = 0; the caller writes its prefill state to snapshot 0."""
    _check_spec_states(states)
    check_backend(backend, states.state)
    if slots is None:
        slots = torch.arange(states.num_slots, dtype=torch.int32, device=states.device)
    slots = check_slots(slots, slots.shape[0] if slots.dim() == 1 else -1, states.num_slots, states.device,
                        states.null_slot)
    _set_cursor(states.last, slots, None, 0, states.null_slot, backend)
