"""The output-only route's readout and fold kernels (launched from replayssm/mamba2/decode.py).

One output-only decode step is four launches, in this order on one stream:
    _bc_precompute_kernel  (batch, ngroups)                        decode_kernels.py: bc[j] = B_j . C for j <= h
                                                                   (the flush step included), B appended at h < L-1
    mamba2_ar_step_kernel  (cdiv(headdim, BLOCK_M), batch, nheads) y of every live row, flush rows included; the x
                                                                   and dt appends on normal steps
    mamba2_ar_fold_kernel  (cdiv(headdim, BMF), batch, nheads)     flush rows only (the rest exit): the checkpoint
    _advance_cursor_kernel (cdiv(batch, BLOCK_B),)                 decode_kernels.py

Every step's y is the output-only readout, the flush step's too (its h = L-1 entries come from the buffer and the
current token from the inputs, exactly as on a normal step):

    y = abar (S0 C) + sum_{j<h} w_j x_j + w_h x,   w_j = s_j bc_j,  s_j = dt_j exp(A (c_h - c_j))

so the step holds no flush code and no tensor-core tile: its registers are the normal path's whatever the cursor.
Why this layout of the step (gpu-kernels.md R6, §3): the step is issue-bound (programs x warps x instructions per
warp), so the work per state element is cut to the bone:
  - the checkpoint tile's address needs only the slot: its loads are issued before the cursor load, and nothing
    between them waits on the cursor (no branch on it at all);
  - S0 C is accumulated elementwise into one [BLOCK_M, BLOCK_K] tile over the dstate chunks (one FMA per state
    element), with one cross-lane row sum at the end instead of one per chunk;
  - the buffer rows and the dt / bc vectors are loaded masked by the cursor (the h live rows: the bytes the model
    counts), after the state loads are in flight; a stale row never reaches y (masked to an exact 0, and the
    weights selected, not multiplied by a zero: 0 * inf is NaN);
  - EVEN_M / EVEN_N (heuristics) drop the tile masks where the tiles divide the geometry.

The fold rebuilds the state after the current token, S = abar S0 + (X * s) @ B over all L entries (rows j < L-1
from the buffer, row L-1 = the current x, B, dt from the inputs: the cache's row L-1 is never written, so the cache
contents stay those of the other backends), walked over dstate in chunks of BKT columns and stored per chunk. Its
dot is delta_rule/_tl.py's replay_dot: X and B are exact in the activation dtype, so for bf16 activations the fp32
side (X * s) is split into bf16 hi + lo (two bf16 MMAs, error <= (2^-14 + BLOCK_L 2^-24) (|X s| @ |B|)), tf32x2 for
fp16 activations, tf32x3 for fp32 ones (ieee in the interpreter). The fold does not depend on the step (the step
writes neither the checkpoint nor a buffer row the fold reads); it runs after it so the checkpoint it re-reads is
L2-hot, and before the cursor advance, which both read.

Stochastic-rounding state formats (float16_sr / bfloat16_sr; SR, a heuristic on sr_step_ptr, None for every other
format, whose build is unchanged): each stored chunk goes through stochastic_rounding.sr_round with key (sr_seed,
sr_step[slot]) and the element's flat index in the slot's [nheads, headdim, dstate] block (one Philox call per 4
consecutive elements along dstate: rows aligned when dstate % 4 == 0, else the per-element fallback): the bits the
torch / ref backends' write draws (sr_round_torch), with its non-finite guard. The counter is advanced on the
device after the fold (delta_rule/ar_fold.py's sr_advance_kernel, flush rows only).

int8 / e4m3 checkpoints (SCALED, a heuristic on scale_ptr, the cache's state_scale): the readout applies the
head's scale once, to abar; the fold, given the whole head by its launcher, walks it twice (the absmax pass, then
the quantised store: scaled_rounding.py, state_format.quantize_scaled's rule bit for bit).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import key_dot, replay_dot
from replayssm.mamba2.decode_kernels import _process_dt
from replayssm.scaled_rounding import finite_absmax_rows, head_scale, quantize
from replayssm.stochastic_rounding import sr_key, sr_round


@triton.heuristics({"EVEN_M": lambda a: a["headdim"] % a["BLOCK_M"] == 0,
                    "EVEN_N": lambda a: a["dstate"] == a["BLOCK_N"], "SCALED": lambda a: a["scale_ptr"] is not None})
@triton.jit
def mamba2_ar_step_kernel(
    x_ptr, dt_ptr, A_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, out_ptr, slots_ptr,
    state_ptr, xbuf_ptr, dtbuf_ptr, bc_ptr, write_pos_ptr, scale_ptr,
    stride_x_b, stride_x_h, stride_dt_b, stride_dt_h, stride_C_b, stride_C_g,
    stride_z_b, stride_z_h, stride_out_b, stride_out_h,
    stride_state_s, stride_state_h, stride_state_p,
    stride_xbuf_s, stride_xbuf_h, stride_xbuf_l,
    stride_dtbuf_s, stride_dtbuf_h, stride_bc_s, stride_bc_g, stride_sc_slot,
    headdim: tl.constexpr, dstate: tl.constexpr, L: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, SCALED: tl.constexpr,
):
    """y of one [BLOCK_M] slice of one (row, head), every step; the x / dt appends on normal steps."""
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    group = head // HEADS_PER_GROUP
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        return
    slot64 = slot.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < headdim
    C_row = C_ptr + row * stride_C_b + group * stride_C_g

    # S0 C: every chunk's loads depend on the slot alone, so they all go out before the cursor load below.
    state_ptr += slot64 * stride_state_s + head * stride_state_h
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for kc in tl.static_range(BLOCK_N // BLOCK_K):
        offs_k = kc * BLOCK_K + tl.arange(0, BLOCK_K)
        s_ptrs = state_ptr + offs_m[:, None] * stride_state_p + offs_k[None, :]
        if EVEN_M and EVEN_N:
            S0 = tl.load(s_ptrs)
            Ck = tl.load(C_row + offs_k)
        else:
            S0 = tl.load(s_ptrs, mask=mask_m[:, None] & (offs_k < dstate)[None, :], other=0.0)
            Ck = tl.load(C_row + offs_k, mask=offs_k < dstate, other=0.0)
        acc += S0.to(tl.float32) * Ck.to(tl.float32)[None, :]

    # The cursor, then the h live buffer rows, dt and bc: masked by it, so a step reads exactly the entries it
    # replays (the byte model's count; loading all L rows unmasked read up to L-1 rows more on early steps). The
    # state chunks above are already in flight: they never wait on the cursor. Clamped so a corrupted cursor
    # cannot address past the buffer; h == L-1 is the flush step.
    h = tl.minimum(tl.load(write_pos_ptr + slot64), L - 1)
    offs_l = tl.arange(0, BLOCK_L)
    hist = offs_l < h
    dtbuf = dtbuf_ptr + slot64 * stride_dtbuf_s + head * stride_dtbuf_h
    bcrow = bc_ptr + slot64 * stride_bc_s + group * stride_bc_g
    xbuf = xbuf_ptr + slot64 * stride_xbuf_s + head * stride_xbuf_h
    dt_hist = tl.load(dtbuf + offs_l, mask=hist, other=0.0)
    bc = tl.load(bcrow + offs_l, mask=hist, other=0.0)
    if EVEN_M:
        xt = tl.load(xbuf + offs_l[None, :] * stride_xbuf_l + offs_m[:, None], mask=hist[None, :], other=0.0)
    else:
        xt = tl.load(xbuf + offs_l[None, :] * stride_xbuf_l + offs_m[:, None],
                     mask=mask_m[:, None] & hist[None, :], other=0.0)
    A = tl.load(A_ptr + head).to(tl.float32)
    dt = _process_dt(dt_ptr + row * stride_dt_b + head * stride_dt_h, dt_bias_ptr, head, HAS_DT_BIAS, DT_SOFTPLUS)
    x_raw = tl.load(x_ptr + row * stride_x_b + head * stride_x_h + offs_m, mask=mask_m, other=0.0)
    x = x_raw.to(tl.float32)
    dt_j = tl.where(hist, dt_hist, tl.where(offs_l == h, dt, 0.0))
    c_j = tl.cumsum(dt_j, axis=0)
    c_tot = tl.sum(dt_j, axis=0)
    w = dt_j * tl.exp(A * (c_tot - c_j)) * tl.where(hist, bc, 0.0)     # dt_j is 0 past h: w_j = 0 for j >= h
    bc_h = tl.load(bcrow + h)
    abar = tl.exp(A * c_tot)
    if SCALED:                  # int8 / e4m3: the head's scale multiplies the sum, not every element
        abar *= tl.load(scale_ptr + slot64 * stride_sc_slot + head)
    y = abar * tl.sum(acc, axis=1) + tl.sum(tl.where(hist[None, :], xt.to(tl.float32), 0.0)
                                                         * w[None, :], axis=1) + (dt * bc_h) * x

    if h < L - 1:
        tl.store(xbuf + h * stride_xbuf_l + offs_m, x_raw, mask=mask_m)
        if pid_m == 0:
            tl.store(dtbuf + h, dt)
    if HAS_D:
        y += tl.load(D_ptr + head).to(tl.float32) * x
    if HAS_Z:
        zv = tl.load(z_ptr + row * stride_z_b + head * stride_z_h + offs_m, mask=mask_m, other=0.0).to(tl.float32)
        y *= zv * tl.sigmoid(zv)
    tl.store(out_ptr + row * stride_out_b + head * stride_out_h + offs_m, y.to(out_ptr.dtype.element_ty),
             mask=mask_m)


@triton.jit
def _folded_chunk(state_ptr, bbuf, b_row, xs, abar, in_scale, offs_m, mask_m, offs_l, hist, cur, kt,
                  stride_state_p, stride_Bbuf_l, dstate: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                  SCALED: tl.constexpr):
    """The folded state of dstate chunk `kt` of the headdim rows offs_m: (S [BLOCK_M, BLOCK_K] fp32, addresses,
    mask). SCALED: the stored chunk dequantised element by element (q * in_scale, state_format.dequantize)."""
    offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_k = offs_k < dstate
    b_cur = tl.load(b_row + offs_k, mask=mask_k, other=0.0)
    bt = tl.load(bbuf + offs_l[:, None] * stride_Bbuf_l + offs_k[None, :], mask=hist[:, None] & mask_k[None, :],
                 other=0.0)                                                                       # [BLOCK_L, BLOCK_K]
    bt = tl.where(cur[:, None], b_cur[None, :], bt)
    s_ptrs = state_ptr + offs_m[:, None] * stride_state_p + offs_k[None, :]
    s_mask = mask_m[:, None] & mask_k[None, :]
    S0 = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    if SCALED:
        S0 = S0 * in_scale
    return abar * S0 + replay_dot(xs, bt, DOT), s_ptrs, s_mask


@triton.heuristics({"DOT": lambda a: key_dot(a["Bbuf_ptr"].dtype, a["FP32_DOT"]),
                    "SR": lambda a: a["sr_step_ptr"] is not None,
                    "SCALED": lambda a: a["scale_ptr"] is not None})
@triton.jit(do_not_specialize=["sr_seed"])
def mamba2_ar_fold_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, dt_bias_ptr, slots_ptr, state_ptr, xbuf_ptr, Bbuf_ptr, dtbuf_ptr, write_pos_ptr,
    sr_step_ptr, sr_seed, scale_ptr,
    stride_x_b, stride_x_h, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g,
    stride_state_s, stride_state_h, stride_state_p,
    stride_xbuf_s, stride_xbuf_h, stride_xbuf_l,
    stride_Bbuf_s, stride_Bbuf_g, stride_Bbuf_l, stride_dtbuf_s, stride_dtbuf_h, stride_sc_slot,
    headdim: tl.constexpr, dstate: tl.constexpr, L: tl.constexpr, HEADS_PER_GROUP: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, FP32_DOT: tl.constexpr, DOT: tl.constexpr,
    SR: tl.constexpr, SCALED: tl.constexpr, QMAX: tl.constexpr = 127.0, IS_INT8: tl.constexpr = True,
):
    """Flush rows only: the checkpoint of one [BLOCK_M] slice of one (row, head) <- the state after this token."""
    pid_m = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    group = head // HEADS_PER_GROUP
    slot = tl.load(slots_ptr + row)
    if slot < 0:
        return
    slot64 = slot.to(tl.int64)
    if tl.load(write_pos_ptr + slot64) < L - 1:
        return                                  # not this row's flush step (a cursor past L-1 clamps to a flush)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < headdim
    offs_l = tl.arange(0, BLOCK_L)
    hist = offs_l < L - 1
    cur = offs_l == L - 1

    # The replay weights of all L entries (the current token's processed dt at L-1) and the checkpoint decay.
    A = tl.load(A_ptr + head).to(tl.float32)
    dt = _process_dt(dt_ptr + row * stride_dt_b + head * stride_dt_h, dt_bias_ptr, head, HAS_DT_BIAS, DT_SOFTPLUS)
    dt_j = tl.load(dtbuf_ptr + slot64 * stride_dtbuf_s + head * stride_dtbuf_h + offs_l, mask=hist, other=0.0)
    dt_j = tl.where(cur, dt, dt_j)
    c_tot = tl.sum(dt_j, axis=0)
    s = dt_j * tl.exp(A * (c_tot - tl.cumsum(dt_j, axis=0)))
    abar = tl.exp(A * c_tot)
    # (X * s) [BLOCK_M, BLOCK_L], the fp32 side of the dot: cached x_j, the current x in column L-1, zero past L.
    x_cur = tl.load(x_ptr + row * stride_x_b + head * stride_x_h + offs_m, mask=mask_m, other=0.0)
    xt = tl.load(xbuf_ptr + slot64 * stride_xbuf_s + head * stride_xbuf_h + offs_l[None, :] * stride_xbuf_l
                 + offs_m[:, None], mask=mask_m[:, None] & hist[None, :], other=0.0)
    xs = tl.where(cur[None, :], x_cur[:, None], xt).to(tl.float32) * s[None, :]

    bbuf = Bbuf_ptr + slot64 * stride_Bbuf_s + group * stride_Bbuf_g
    b_row = B_ptr + row * stride_B_b + group * stride_B_g
    state_ptr += slot64 * stride_state_s + head * stride_state_h
    in_scale = 1.0
    if SCALED:
        # int8 / e4m3 (scaled_rounding.py; the launcher gives the program the whole head, BLOCK_M >= headdim): the
        # new scale is the absmax of the whole new head, so a first pass folds every chunk for it alone and the
        # second folds it again and stores it quantised (each chunk's old values read before its own store)
        scale_ptr += slot64 * stride_sc_slot + head
        in_scale = tl.load(scale_ptr)
        absmax = tl.zeros([BLOCK_M], dtype=tl.float32)
        for kt in tl.range(0, (dstate + BLOCK_K - 1) // BLOCK_K):
            S, s_ptrs, s_mask = _folded_chunk(state_ptr, bbuf, b_row, xs, abar, in_scale, offs_m, mask_m, offs_l,
                                              hist, cur, kt, stride_state_p, stride_Bbuf_l, dstate, BLOCK_K, DOT,
                                              SCALED)
            absmax = tl.maximum(absmax, finite_absmax_rows(S, s_mask))
        out_scale = head_scale(tl.max(absmax, 0), QMAX)
    if SR:
        key = sr_key(sr_seed, tl.load(sr_step_ptr + slot64))                  # this write's draws
    for kt in tl.range(0, (dstate + BLOCK_K - 1) // BLOCK_K):     # constexpr bound: a loop, one chunk live
        S, s_ptrs, s_mask = _folded_chunk(state_ptr, bbuf, b_row, xs, abar, in_scale, offs_m, mask_m, offs_l, hist,
                                          cur, kt, stride_state_p, stride_Bbuf_l, dstate, BLOCK_K, DOT, SCALED)
        if SR:                                  # each row's first element index: (head, m, kt BLOCK_K) of the block
            first = head * (headdim * dstate) + offs_m * dstate + kt * BLOCK_K
            S = sr_round(S, key, slot64, first, state_ptr.dtype.element_ty, ALIGNED=dstate % 4 == 0)
        if SCALED:
            S = quantize(S, out_scale, QMAX, IS_INT8)
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)
    if SCALED:
        tl.store(scale_ptr, out_scale)
