"""The "verify_fold" spec route's fold: grid (cdiv(headdim, BLOCK_M), batch, nheads), the rows that flush.

A row whose slot has is_flush clear returns after two loads (spec_verify_kernels.py verifies it). A flush row
folds its committed history into the checkpoint and verifies its window from the folded state, in one pass over
the checkpoint (read once, written once; spec_ref.py's docstring):

    S1  = exp(A cum_{h-1}) S0 + sum_{k<h} dt_k exp(A (cum_{h-1} - cum_k)) x_k B_k^T        (stored if h > 0)
    y_t = exp(A (cum_p - cum_{h-1})) (S1 C_t) + sum_{h <= k <= p} dt_k exp(A (cum_p - cum_k)) (B_k . C_t) x_k

per dstate chunk: S1 = decay S0 + Xw [BLOCK_M, BLOCK_K] @ B_hist [BLOCK_K, BLOCK_N] (B is stored in the
activation dtype: `state_dot`'s split of Xw), stored, then S1 C^T accumulated. Why a kernel of its own and not
a branch of the verify (the shipped `_verify_kernel`): the fold's second dot, its B loads and its store set
the register count of every row there (148 registers, 3 blocks per SM on sm_90), while only the flushing
rows, T / history of them in the ring's steady state, need them. Here they cost registers only in this
kernel, whose other programs exit at once: the price is one early-exit grid per step.

With IS_TREE (tree_verify(route="verify_fold"); anc_ptr given) the window's weights take the ancestor mask
(spec_verify_kernels.window_weights); the fold of the history is the same, the committed history being a chain.

The chunk loop is a runtime loop (tl.range, a constexpr trip count, software-pipelined by num_stages): one
chunk's S, S1 and B tile live at a time. Default [64, 32] chunks over 4 warps: 106 / 112 registers (Triton 3.7.1
/ 3.6.0), 4 blocks per SM; 64-wide chunks take 150 (3 blocks) and 2 warps 130-198, for more issue per row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_dot_rhs, state_dot
from replayssm.mamba2.spec_verify_kernels import gate_store, window_weights


@triton.heuristics({"IS_TREE": lambda a: a["anc_ptr"] is not None})
@triton.jit
def m2_spec_fold_kernel(
    x_ptr, z_ptr, C_ptr, A_ptr, D_ptr, out_ptr, slots_ptr,
    state_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr, is_flush_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sC_b, sC_t, sC_g, so_b, so_t, so_h,
    ss_s, ss_h, ss_p, srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot, anc_ptr, sanc_b,
    HEADS_PER_GROUP: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT: tl.constexpr, NUM_STAGES: tl.constexpr, IS_TREE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    if slot == null_slot:
        return
    s = slot.to(tl.int64)
    if tl.load(is_flush_ptr + s) == 0:
        return                                     # spec_verify_kernels.py's row
    h = tl.load(write_pos_ptr + s)
    origin = tl.load(origin_ptr + s)
    g = head // HEADS_PER_GROUP
    A = tl.load(A_ptr + head).to(tl.float32)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < HEADDIM
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    hist = k < h
    # The window restarts at S1: its sum starts at k = h and its decays are relative to cum_{h-1}.
    W, cum_p, dt_k, cum, hist_total = window_weights(ring_dt_ptr + s * srdt_s + head * srdt_h,
                                                     bc_ptr + s * sbc_s + g * sbc_g, sbc_r, k, k_rows, h, h, A, t, T,
                                                     anc_ptr, b * sanc_b, IS_TREE)
    X = tl.load(ring_x_ptr + s * srx_s + head * srx_h + k_rows[None, :] * srx_r + m[:, None],
                mask=m_mask[:, None] & (k < h + T)[None, :], other=0.0)                    # [BLOCK_M, BLOCK_K]
    w_hist = tl.where(hist, dt_k * tl.exp(tl.minimum(A * (hist_total - cum), 0.0)), 0.0)   # fold weights
    Xw = X.to(tl.float32) * w_hist[None, :]
    decay_h = tl.exp(tl.minimum(A * hist_total, 0.0))
    B_rows = ring_B_ptr + s * srB_s + g * srB_g + k_rows[:, None] * srB_r
    state_rows = state_ptr + s * ss_s + head * ss_h + m[:, None] * ss_p
    C_cols = C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g
    SC = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)
    for c in tl.range(0, (DSTATE + BLOCK_N - 1) // BLOCK_N, num_stages=NUM_STAGES):     # constexpr trip count
        n = c * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        sm_mask = m_mask[:, None] & n_mask[None, :]
        S = tl.load(state_rows + n[None, :], mask=sm_mask, other=0.0).to(tl.float32)      # [BLOCK_M, BLOCK_N]
        B_hist = tl.load(B_rows + n[None, :], mask=hist[:, None] & n_mask[None, :], other=0.0)
        S = decay_h * S + state_dot(Xw, B_hist, DOT)
        if h > 0:
            tl.store(state_rows + n[None, :], S.to(state_ptr.dtype.element_ty), mask=sm_mask)
        C_t = tl.load(C_cols + n[:, None], mask=n_mask[:, None] & t_mask[None, :], other=0.0)   # [BLOCK_N, BLOCK_T]
        SC += state_dot(S, C_t, DOT)
    Y = SC * tl.exp(tl.minimum(A * (cum_p - hist_total), 0.0))[None, :] + replay_dot_rhs(X, W, DOT)
    gate_store(Y, x_ptr, z_ptr, D_ptr, out_ptr, b, head, m, m_mask, t, sx_b, sx_t, sx_h, sz_b, sz_t, sz_h,
               so_b, so_t, so_h, T, HAS_D, HAS_Z)
