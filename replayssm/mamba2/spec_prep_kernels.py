"""The "verify_fold" spec route's precompute: grid (batch, ngroups), one program per (row, group), launched first.

It writes the window into the ring after the committed history (x and processed dt of the group's heads, B of the
group) and bc[slot, g, k, t] = B_k . C_t for every live logical position k (history and window), which the
verify and fold kernels (spec_verify_kernels.py, spec_fold_kernels.py) read instead of B and C over the ring.
The math and the ring protocol: spec_ref.py's docstring.

Why not the shipped `_scatter_bc_kernel` (spec_kernels.py): it scatters x and dt head by head in a runtime loop
(16 heads per group at Nemotron-3-Super: 16 trips of a [T, headdim] tile, ~3,300 instructions per warp on its
shortest path) and its bc dot runs tf32x3 in 16-wide dstate chunks. Here:
  - the group's heads are one [BLOCK_T, HEADS_PER_GROUP * HEADDIM] tile: the heads of a group are adjacent in
    x ([batch, T, nheads, headdim]), so one load and one store move the whole window, no loop;
  - the bc dot is one [BLOCK_K, DSTATE] x [DSTATE, BLOCK_T] product in the activations' own dtype: B and C
    are stored in it, so for bf16 / fp16 every product is exact in the fp32 accumulator (8 + 8 or 11 + 11
    significant bits) and one MMA pass equals tf32x3's three; fp32 activations take the fp32 dot
    (FP32_DOT: tf32x3 on GPU, ieee in the interpreter);
  - BLOCK_T = next_pow2(T): the dot's N may be 4 (only K >= 16 is required by Triton 3.6-3.9).
The window's B rows come from the input, not from the ring rows just stored (no read-after-write in a program).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.mamba2.spec_kernels import _softplus


@triton.jit
def m2_spec_prep_kernel(
    x_ptr, dt_ptr, dt_bias_ptr, B_ptr, C_ptr, slots_ptr,
    ring_x_ptr, ring_B_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr,
    sx_b, sx_t, sx_h, sdt_b, sdt_t, sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot,
    HEADS_PER_GROUP: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HP: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BC_DOT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    if slot == null_slot:
        return
    s = slot.to(tl.int64)
    h = tl.load(write_pos_ptr + s)
    origin = tl.load(origin_ptr + s)

    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    win_rows = (origin + h + t) & (RING - 1)
    # x of the group's heads: column j of the tile is (head j // HEADDIM, feature j % HEADDIM).
    j = tl.arange(0, BLOCK_HP)
    jh = j // HEADDIM
    jp = j % HEADDIM
    head_j = g * HEADS_PER_GROUP + jh
    xt_mask = t_mask[:, None] & (jh < HEADS_PER_GROUP)[None, :]
    xw = tl.load(x_ptr + b * sx_b + t[:, None] * sx_t + (head_j * sx_h + jp)[None, :], mask=xt_mask)
    tl.store(ring_x_ptr + s * srx_s + win_rows[:, None] * srx_r + (head_j * srx_h + jp)[None, :], xw, mask=xt_mask)
    # processed dt of the group's heads: a [BLOCK_T, BLOCK_H] tile
    hh = tl.arange(0, BLOCK_H)
    head_h = g * HEADS_PER_GROUP + hh
    th_mask = t_mask[:, None] & (hh < HEADS_PER_GROUP)[None, :]
    dtw = tl.load(dt_ptr + b * sdt_b + t[:, None] * sdt_t + head_h[None, :], mask=th_mask, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        dtw += tl.load(dt_bias_ptr + head_h, mask=hh < HEADS_PER_GROUP, other=0.0).to(tl.float32)[None, :]
    if DT_SOFTPLUS:
        dtw = _softplus(dtw)
    tl.store(ring_dt_ptr + s * srdt_s + head_h[None, :] * srdt_h + win_rows[:, None], dtw, mask=th_mask)

    # B over logical positions (history from the ring, window from the input) and bc = B C^T over all of dstate.
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    hist = k < h
    win = (k >= h) & (k < h + T)
    n = tl.arange(0, BLOCK_N)
    n_mask = n < DSTATE
    ring_B_tile = ring_B_ptr + s * srB_s + g * srB_g + k_rows[:, None] * srB_r + n[None, :]
    B_hist = tl.load(ring_B_tile, mask=hist[:, None] & n_mask[None, :], other=0.0)
    win_mask = win[:, None] & n_mask[None, :]
    B_win = tl.load(B_ptr + b * sB_b + (k - h)[:, None] * sB_t + g * sB_g + n[None, :], mask=win_mask, other=0.0)
    tl.store(ring_B_tile, B_win, mask=win_mask)
    C_t = tl.load(C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g + n[:, None],
                  mask=n_mask[:, None] & t_mask[None, :], other=0.0)                       # [BLOCK_N, BLOCK_T]
    B_all = tl.where(hist[:, None], B_hist, B_win)                                         # [BLOCK_K, BLOCK_N]
    if BC_DOT == "native":
        bc = tl.dot(B_all, C_t)                                  # exact products, fp32 accumulation
    else:
        bc = tl.dot(B_all.to(tl.float32), C_t.to(tl.float32), input_precision=BC_DOT)
    tl.store(bc_ptr + s * sbc_s + g * sbc_g + k[:, None] * sbc_r + t[None, :], bc,
             mask=(k < h + T)[:, None] & t_mask[None, :])
