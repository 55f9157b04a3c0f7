"""Triton kernels of the Mamba-2 ReplaySSM AR decode step (launched from replayssm/mamba2/decode.py).

The state-and-output route's step is two launches, in this order on one stream:
    _replay_step_kernel    grid (cdiv(headdim, BLOCK_M), batch, nheads)   the state tile rebuilt, y, the x / dt / B
                           appends (the first tile of a group's first head appends B), the checkpoint on a flush
    _advance_cursor_kernel grid (cdiv(batch, BLOCK_B),)          write_pos <- h + 1, or 0 after a flush
The output-only route's is four: _bc_precompute_kernel (below; bc[j] = B_j . C, the B append), the readout and the
fold of replayssm/mamba2/ar_kernels.py, then the same cursor advance.
The cursor moves in its own launch because every program of a row reads write_pos: advancing it inside
the multi-program main kernel would race. Appends go to buffer row h, which no program of the step reads
(they read rows j < h and take entry h from the inputs). _materialize_kernel rebuilds the state without
a current token and writes only its output.

Per (row, head) with slot s, h = write_pos[s], entries j = 0..h (entry h = the current token):
    c_j = sum_{i<=j} dt_i,  abar = exp(A c_h),  s_j = dt_j exp(A (c_h - c_j))
    output_only (any h):   y = abar (S0 C) + sum_j s_j (B_j . C) x_j                          (ar_kernels.py)
    reconstruct:           S = abar S0 + X^T (s * B)  (one tl.dot over the buffer axis), y = S C
All arithmetic is fp32; stores round to the destination dtype. The programs of a null row (slot < 0, i.e.
NULL_SLOT; the validation rejects every other negative slot) return before any load or store, so its
output and the cache stay untouched. Slot offsets are int64 (pools can exceed 2^31 elements).
Scalar conditions (null row, flush step, append owner) gate stores with `if`, never as `block_mask & flag`:
triton 3.9's interpreter turns that `&` into an int32 mask, which tl.load / tl.store reject.
"""

from __future__ import annotations

import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # a constexpr: kernels may only read constexpr globals


@triton.jit
def _process_dt(dt_ptr, dt_bias_ptr, head, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """Raw dt (any float dtype) -> processed fp32 dt: + bias, then softplus (threshold 20)."""
    dt = tl.load(dt_ptr).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + head).to(tl.float32)
    if DT_SOFTPLUS:
        # log1p(exp(dt)) without log1p: log(w) * u / (w - 1) keeps full relative precision for the tiny u
        # that typical dt biases (about -7) give; plain log(1 + u) loses ~1e-4 of dt there.
        u = tl.exp(tl.minimum(dt, SOFTPLUS_THRESHOLD))
        w = 1.0 + u
        log1p_u = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
        dt = tl.where(dt <= SOFTPLUS_THRESHOLD, log1p_u, dt)
    return dt


@triton.jit
def _replay_weights(dtbuf_ptr, h, dt_cur, A, offs_l, INCLUDE_CURRENT: tl.constexpr):
    """Weights over the buffer axis: s [BLOCK_L] (0 outside the entries) and the checkpoint decay abar.

    Entries j < h come from the dt buffer; with INCLUDE_CURRENT entry h is the current token's dt.
    """
    dt_j = tl.load(dtbuf_ptr + offs_l, mask=offs_l < h, other=0.0)
    if INCLUDE_CURRENT:
        dt_j = tl.where(offs_l == h, dt_cur, dt_j)
    c_j = tl.cumsum(dt_j, axis=0)
    c_tot = tl.sum(dt_j, axis=0)
    # Masked entries have dt_j = 0, so their weight is 0 without another mask.
    s = dt_j * tl.exp(A * (c_tot - c_j))
    return s, tl.exp(A * c_tot)


@triton.jit
def _reconstruct(state_tile, xt, bt, s, abar, DOT_PRECISION: tl.constexpr):
    """S = abar S0 + X^T (s * B): state_tile [BLOCK_M, BLOCK_N] fp32, xt [BLOCK_M, BLOCK_L], bt [BLOCK_L, BLOCK_N]."""
    sb = bt * s[:, None]
    return abar * state_tile + tl.dot(xt, sb, input_precision=DOT_PRECISION)


@triton.jit
def _fold_and_read(state_tile_ptr, mask_mn, bbuf, stride_Bbuf_l, offs_l, offs_n, mask_n, h, b_cur, xt, s, abar, C,
                   is_flush, DOT_PRECISION: tl.constexpr):
    """Reconstruct S_t for one tile (cached B rows j < h, the current B at row h), store it on a flush, y = S_t C."""
    bt = tl.load(bbuf + offs_l[:, None] * stride_Bbuf_l + offs_n[None, :],
                 mask=(offs_l[:, None] < h) & mask_n[None, :], other=0.0).to(tl.float32)
    bt = tl.where(offs_l[:, None] == h, b_cur.to(tl.float32)[None, :], bt)
    state = _reconstruct(tl.load(state_tile_ptr, mask=mask_mn, other=0.0).to(tl.float32), xt, bt, s, abar,
                         DOT_PRECISION)
    if is_flush:
        tl.store(state_tile_ptr, state.to(state_tile_ptr.dtype.element_ty), mask=mask_mn)
    return tl.sum(state * C[None, :], axis=1)


@triton.jit
def _bc_precompute_kernel(
    B_ptr, C_ptr, slots_ptr, write_pos_ptr, Bbuf_ptr, bc_ptr,
    dstate, buffer_len,
    stride_B_b, stride_B_g, stride_C_b, stride_C_g,
    stride_Bbuf_s, stride_Bbuf_g, stride_Bbuf_l, stride_bc_s, stride_bc_g,
    BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Output-only route: bc[slot, g, j] = B_j . C for j <= h (the flush step's readout needs them too), and B
    appended at row h on a normal step."""
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        return
    slot64 = slot.to(tl.int64)
    h = tl.minimum(tl.load(write_pos_ptr + slot64), buffer_len - 1)

    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_n = offs_n < dstate
    C = tl.load(C_ptr + row * stride_C_b + group * stride_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    b_raw = tl.load(B_ptr + row * stride_B_b + group * stride_B_g + offs_n, mask=mask_n, other=0.0)
    bbuf = Bbuf_ptr + slot64 * stride_Bbuf_s + group * stride_Bbuf_g
    bt = tl.load(bbuf + offs_l[:, None] * stride_Bbuf_l + offs_n[None, :],
                 mask=(offs_l[:, None] < h) & mask_n[None, :], other=0.0).to(tl.float32)
    bt = tl.where(offs_l[:, None] == h, b_raw.to(tl.float32)[None, :], bt)
    bc = tl.sum(bt * C[None, :], axis=1)
    tl.store(bc_ptr + slot64 * stride_bc_s + group * stride_bc_g + offs_l, bc, mask=offs_l <= h)
    if h < buffer_len - 1:
        tl.store(bbuf + h * stride_Bbuf_l + offs_n, b_raw, mask=mask_n)   # a flush appends nothing


@triton.jit
def _replay_step_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, out_ptr, slots_ptr,
    state_ptr, xbuf_ptr, Bbuf_ptr, dtbuf_ptr, write_pos_ptr,
    headdim, dstate, buffer_len, heads_per_group,
    stride_x_b, stride_x_h, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g,
    stride_z_b, stride_z_h, stride_out_b, stride_out_h,
    stride_state_s, stride_state_h, stride_state_p,
    stride_xbuf_s, stride_xbuf_h, stride_xbuf_l,
    stride_Bbuf_s, stride_Bbuf_g, stride_Bbuf_l,
    stride_dtbuf_s, stride_dtbuf_h,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """State-and-output route: one [BLOCK_M, dstate] tile of one (row, head) rebuilt every step; output, appends,
    and the checkpoint on a flush."""
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    group = head // heads_per_group
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        return
    slot64 = slot.to(tl.int64)
    # Clamped so a corrupted cursor cannot address past the buffer; h == L-1 is the flush step.
    h = tl.minimum(tl.load(write_pos_ptr + slot64), buffer_len - 1)
    is_flush = h >= buffer_len - 1

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_m = offs_m < headdim
    mask_n = offs_n < dstate

    A = tl.load(A_ptr + head).to(tl.float32)
    dt = _process_dt(dt_ptr + row * stride_dt_b + head * stride_dt_h, dt_bias_ptr, head, HAS_DT_BIAS, DT_SOFTPLUS)
    x_raw = tl.load(x_ptr + row * stride_x_b + head * stride_x_h + offs_m, mask=mask_m, other=0.0)
    x = x_raw.to(tl.float32)
    C = tl.load(C_ptr + row * stride_C_b + group * stride_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)

    dtbuf = dtbuf_ptr + slot64 * stride_dtbuf_s + head * stride_dtbuf_h
    s, abar = _replay_weights(dtbuf, h, dt, A, offs_l, True)
    # X^T [BLOCK_M, BLOCK_L]: cached x_j for j < h (contiguous along headdim), the current x at column h.
    xbuf = xbuf_ptr + slot64 * stride_xbuf_s + head * stride_xbuf_h
    xt = tl.load(xbuf + offs_l[None, :] * stride_xbuf_l + offs_m[:, None],
                 mask=mask_m[:, None] & (offs_l[None, :] < h), other=0.0).to(tl.float32)
    xt = tl.where(offs_l[None, :] == h, x[:, None], xt)

    state_tile_ptr = (state_ptr + slot64 * stride_state_s + head * stride_state_h
                      + offs_m[:, None] * stride_state_p + offs_n[None, :])
    mask_mn = mask_m[:, None] & mask_n[None, :]
    bbuf = Bbuf_ptr + slot64 * stride_Bbuf_s + group * stride_Bbuf_g
    b_cur = tl.load(B_ptr + row * stride_B_b + group * stride_B_g + offs_n, mask=mask_n, other=0.0)
    y = _fold_and_read(state_tile_ptr, mask_mn, bbuf, stride_Bbuf_l, offs_l, offs_n, mask_n, h, b_cur, xt,
                       s, abar, C, is_flush, DOT_PRECISION)

    # Appends (normal steps): this program's x slice; dt by the first tile of the head; the first tile of the
    # group's first head owns the B row (this route has no precompute).
    if h < buffer_len - 1:
        tl.store(xbuf + h * stride_xbuf_l + offs_m, x_raw, mask=mask_m)
        if pid_m == 0:
            tl.store(dtbuf + h, dt)
            if head % heads_per_group == 0:
                tl.store(bbuf + h * stride_Bbuf_l + offs_n, b_cur, mask=mask_n)

    if HAS_D:
        y += tl.load(D_ptr + head).to(tl.float32) * x
    if HAS_Z:
        zv = tl.load(z_ptr + row * stride_z_b + head * stride_z_h + offs_m, mask=mask_m, other=0.0).to(tl.float32)
        y *= zv * tl.sigmoid(zv)
    tl.store(out_ptr + row * stride_out_b + head * stride_out_h + offs_m, y.to(out_ptr.dtype.element_ty),
             mask=mask_m)


@triton.jit
def _advance_cursor_kernel(slots_ptr, write_pos_ptr, batch, buffer_len, BLOCK_B: tl.constexpr):
    """After the main kernel: write_pos <- h + 1 on a normal step, 0 after a flush. Slots are unique."""
    offs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    slot = tl.load(slots_ptr + offs, mask=offs < batch, other=-1)
    live = slot >= 0
    ptr = write_pos_ptr + tl.maximum(slot, 0).to(tl.int64)
    h = tl.load(ptr, mask=live, other=0)
    tl.store(ptr, tl.where(h >= buffer_len - 1, 0, h + 1), mask=live)


@triton.jit
def _materialize_kernel(
    A_ptr, slots_ptr, state_ptr, xbuf_ptr, Bbuf_ptr, dtbuf_ptr, write_pos_ptr, out_ptr,
    headdim, dstate, buffer_len, heads_per_group,
    stride_state_s, stride_state_h, stride_state_p,
    stride_xbuf_s, stride_xbuf_h, stride_xbuf_l,
    stride_Bbuf_s, stride_Bbuf_g, stride_Bbuf_l,
    stride_dtbuf_s, stride_dtbuf_h,
    stride_out_b, stride_out_h, stride_out_p,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, DOT_PRECISION: tl.constexpr,
    scale_ptr=None, stride_sc_slot=0, SCALED: tl.constexpr = False,
):
    """out[row, head] = the state after the h cached entries (checkpoint decayed + buffer folded), fp32. SCALED
    (int8 / e4m3 checkpoint): the stored values times the head's scale (state_format.dequantize)."""
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    group = head // heads_per_group
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        return
    slot64 = slot.to(tl.int64)
    h = tl.minimum(tl.load(write_pos_ptr + slot64), buffer_len - 1)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    mask_m = offs_m < headdim
    mask_n = offs_n < dstate
    A = tl.load(A_ptr + head).to(tl.float32)
    s, abar = _replay_weights(dtbuf_ptr + slot64 * stride_dtbuf_s + head * stride_dtbuf_h, h, 0.0, A, offs_l, False)
    xt = tl.load(xbuf_ptr + slot64 * stride_xbuf_s + head * stride_xbuf_h + offs_l[None, :] * stride_xbuf_l
                 + offs_m[:, None], mask=mask_m[:, None] & (offs_l[None, :] < h), other=0.0).to(tl.float32)
    bt = tl.load(Bbuf_ptr + slot64 * stride_Bbuf_s + group * stride_Bbuf_g + offs_l[:, None] * stride_Bbuf_l
                 + offs_n[None, :], mask=(offs_l[:, None] < h) & mask_n[None, :], other=0.0).to(tl.float32)
    mask_mn = mask_m[:, None] & mask_n[None, :]
    s0 = tl.load(state_ptr + slot64 * stride_state_s + head * stride_state_h + offs_m[:, None] * stride_state_p
                 + offs_n[None, :], mask=mask_mn, other=0.0).to(tl.float32)
    if SCALED:
        s0 = s0 * tl.load(scale_ptr + slot64 * stride_sc_slot + head)
    state = _reconstruct(s0, xt, bt, s, abar, DOT_PRECISION)
    tl.store(out_ptr + row * stride_out_b + head * stride_out_h + offs_m[:, None] * stride_out_p + offs_n[None, :],
             state, mask=mask_mn)
