"""The "verify_fold" spec route's verify: grid (cdiv(headdim, BLOCK_M), batch, nheads), the rows that do not flush.

A row whose slot has is_flush set returns after two loads (its outputs and fold are spec_fold_kernels.py's), so
this kernel carries no fold code and no fold registers. For the others (math: spec_ref.py's docstring), with
p = h + t the window position of token t and cum the inclusive prefix sum of the ring's processed dt:

    y_t = exp(A cum_p) (S0 C_t) + sum_{k <= p} dt_k exp(A (cum_p - cum_k)) (B_k . C_t) x_k   (+ D x_t, * silu(z_t))

as two products: S0 [BLOCK_M, DSTATE] @ C^T [DSTATE, BLOCK_T] and X [BLOCK_M, BLOCK_K] @ W [BLOCK_K, BLOCK_T],
with bc = B_k . C_t from the precompute (spec_prep_kernels.py). Against the shipped `_verify_kernel`
(spec_kernels.py; shared-docs gpu-kernels.md 2.2 and R4) it differs in what sets the bytes in flight:
  - BLOCK_T = next_pow2(T) (4 at T = 4), not 16: tl.dot needs only K >= 16, and the window is N;
  - the checkpoint comes in wide chunks (BLOCK_N 64 by default) in an unrolled `static_range`, so every chunk's
    load has its address (it needs only the slot) and can be issued before the first dot;
  - split dots where one side is exact in the MMA's 16-bit type (C, x are stored in the activation dtype):
    `state_dot` / `replay_dot_rhs` (replayssm/delta_rule/_tl.py's splits; state_dot's bf16 split truncates, one
    instruction per element cheaper), two bf16 MMAs where tf32x3 runs three tf32 ones on twice the k-steps
    and splits both sides. (A tf32x2 split of the state, bf16 being exact in tf32, built worse on sm_90: 96
    registers and 1,024 SASS against 72 and 1,003 at the same tile.)
The helpers `window_weights` and `gate_store` are shared with the fold kernel (its rows restart at S1). With IS_TREE
(a draft tree of T nodes: tree_verify(route="verify_fold"); set when anc_ptr is given) `window_weights` replaces the
causal mask by the ancestor mask and the prefix sums of dt by tree prefix sums, as the fused kernel's IS_TREE.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_dot_rhs, state_dot


@triton.jit
def window_weights(ring_dt_ptr, bc_ptr, sbc_r, k, k_rows, h, first, A, t, T: tl.constexpr, anc_ptr, anc_off,
                   IS_TREE: tl.constexpr):
    """(W [BLOCK_K, BLOCK_T], cum_p [BLOCK_T], dt_k, cum [BLOCK_K], hist_total): the ring sum's weights over
    logical positions k, W[k, t] = dt_k exp(A (cum_p - cum_k)) bc[k, t] for first <= k and k visible from
    window token t, 0 elsewhere; ring_dt_ptr and bc_ptr point at the (slot, head) / (slot, group) rows.

    Chain: k visible from t iff k <= p = h + t, cum_k = cum (the inclusive prefix sum of dt). IS_TREE (a draft
    tree of T nodes, replayssm/mamba2/tree.py): node t sees the history and its ancestors-or-self, bit j of
    anc[t] (anc_ptr + anc_off: the row's int32 bit sets, spec_kernels.ancestor_bits) for node j at position h + j;
    cum_p is the tree prefix sum along t's path and a window row's cum_k is its own node's cum_p. The history
    is a chain in both, so `cum` and hist_total (a flush row's fold) are the chain's."""
    live = k < h + T
    dt_k = tl.load(ring_dt_ptr + k_rows, mask=live, other=0.0)
    cum = tl.cumsum(dt_k, 0)                                                               # [BLOCK_K]
    t_mask = t < T
    if IS_TREE:
        anc = tl.load(anc_ptr + anc_off + t, mask=t_mask, other=0)                         # [BLOCK_T]
        win = (k >= h) & live
        node_k = tl.where(win, k - h, 0)                                                   # window node of row k
        on_path = ((anc[None, :] >> node_k[:, None]) & 1) != 0                             # [BLOCK_K, BLOCK_T]
        visible = (k < h)[:, None] | (win[:, None] & on_path)
        cum_p = tl.sum(tl.where(visible, dt_k[:, None], 0.0), 0)                           # tree prefix sums
        cum_win = tl.sum(tl.where(node_k[:, None] == t[None, :], cum_p[None, :], 0.0), 1)  # cum of node k - h
        cum_k = tl.where(k < h, cum, cum_win)
    else:
        visible = k[:, None] <= (h + t)[None, :]                                           # causal
        cum_p = tl.sum(tl.where(visible, dt_k[:, None], 0.0), 0)                           # [BLOCK_T]
        cum_k = cum
    hist_total = tl.sum(tl.where(k < h, dt_k, 0.0), 0)                                     # cum_{h-1}
    bc = tl.load(bc_ptr + k[:, None] * sbc_r + t[None, :], mask=live[:, None] & t_mask[None, :], other=0.0)
    summed = visible & (k >= first)[:, None] & live[:, None]
    W = tl.where(summed, dt_k[:, None] * tl.exp(tl.minimum(A * (cum_p[None, :] - cum_k[:, None]), 0.0)) * bc, 0.0)
    return W, cum_p, dt_k, cum, hist_total


@triton.jit
def gate_store(Y, x_ptr, z_ptr, D_ptr, out_ptr, b, head, m, m_mask, t,
               sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, so_b, so_t, so_h,
               T: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """y + D x_t, times silu(z_t), stored as out[b, t, head, m] ([BLOCK_M, BLOCK_T] tiles)."""
    mt_mask = m_mask[:, None] & (t < T)[None, :]
    if HAS_D:
        x_win = tl.load(x_ptr + b * sx_b + t[None, :] * sx_t + head * sx_h + m[:, None], mask=mt_mask,
                        other=0.0).to(tl.float32)
        Y += tl.load(D_ptr + head).to(tl.float32) * x_win
    if HAS_Z:
        z_win = tl.load(z_ptr + b * sz_b + t[None, :] * sz_t + head * sz_h + m[:, None], mask=mt_mask,
                        other=0.0).to(tl.float32)
        Y *= z_win * tl.sigmoid(z_win)
    tl.store(out_ptr + b * so_b + t[None, :] * so_t + head * so_h + m[:, None], Y.to(out_ptr.dtype.element_ty),
             mask=mt_mask)


@triton.heuristics({"IS_TREE": lambda a: a["anc_ptr"] is not None})
@triton.jit
def m2_spec_verify_kernel(
    x_ptr, z_ptr, C_ptr, A_ptr, D_ptr, out_ptr, slots_ptr,
    state_ptr, ring_x_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr, is_flush_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sC_b, sC_t, sC_g, so_b, so_t, so_h,
    ss_s, ss_h, ss_p, srx_s, srx_h, srx_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot, anc_ptr, sanc_b,
    HEADS_PER_GROUP: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT: tl.constexpr, IS_TREE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    if slot == null_slot:
        return
    s = slot.to(tl.int64)
    if tl.load(is_flush_ptr + s) != 0:
        return                                     # spec_fold_kernels.py's row
    g = head // HEADS_PER_GROUP
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < HEADDIM
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    # S0 C^T over dstate chunks, unrolled: the checkpoint's addresses need only the slot, so every chunk's
    # load can be in flight before the cursors arrive and before the first dot.
    state_rows = state_ptr + s * ss_s + head * ss_h + m[:, None] * ss_p
    C_cols = C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g
    SC = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)
    for c in tl.static_range(triton.cdiv(DSTATE, BLOCK_N)):
        n = c * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        S = tl.load(state_rows + n[None, :], mask=m_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
        C_t = tl.load(C_cols + n[:, None], mask=n_mask[:, None] & t_mask[None, :], other=0.0)   # [BLOCK_N, BLOCK_T]
        SC += state_dot(S, C_t, DOT)

    h = tl.load(write_pos_ptr + s)
    origin = tl.load(origin_ptr + s)
    A = tl.load(A_ptr + head).to(tl.float32)
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    W, cum_p, _, _, _ = window_weights(ring_dt_ptr + s * srdt_s + head * srdt_h, bc_ptr + s * sbc_s + g * sbc_g,
                                       sbc_r, k, k_rows, h, 0, A, t, T, anc_ptr, b * sanc_b, IS_TREE)
    X = tl.load(ring_x_ptr + s * srx_s + head * srx_h + k_rows[None, :] * srx_r + m[:, None],
                mask=m_mask[:, None] & (k < h + T)[None, :], other=0.0)                    # [BLOCK_M, BLOCK_K]
    Y = SC * tl.exp(tl.minimum(A * cum_p, 0.0))[None, :] + replay_dot_rhs(X, W, DOT)
    gate_store(Y, x_ptr, z_ptr, D_ptr, out_ptr, b, head, m, m_mask, t, sx_b, sx_t, sx_h, sz_b, sz_t, sz_h,
               so_b, so_t, so_h, T, HAS_D, HAS_Z)
