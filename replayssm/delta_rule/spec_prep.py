"""The ring verify's precompute ("verify_fold" route): grid (batch, H), one program per (row, key head), first launch.

Everything of a speculative window that does not depend on the value tile, once per (row, key head) instead of
once per program of the verify (8 of them per key head at Qwen3.5-122B: 4 value heads x 2 V tiles). Window rows
r < 2T are stacked as in the fused kernel (replayssm/gdn/spec_kernels.py): r < T the key k_r, r = T + s the
query q_s, padded to TW >= 16 rows for tl.dot. With w^_r = mult_r raw_r (mult: the L2 norm and, on query rows,
the scale; raw_r the window input as stored, exact in the activation dtype) and the committed state

    S_h = decay0 S0 + sum_{j<h} w_j u_j k_j^T              (replay weights of the history, _tl.replay_weights)

the fused kernel's readouts are HW_r = S_h w^_r = decay0 mult_r (S0 raw_r) + sum_j Ch[r, j] u_j with
Ch[r, j] = w_j (w^_r . k_j). Its solve and outputs (replayssm/gdn/spec_ref.py _chain_window) are linear in HW, in
the history's u rows and in the window's v rows, so with G_s the window's gate prefix sums and
    A   = beta_s exp(G_s - G_c) (w^_s . w^_c) on c < s     (I + A)^-1 = (I - A)(I + A^2)(I + A^4)..  (A^T = 0)
    Bf  = (I + A)^-1 diag(beta) on the key block, M = exp(G_s - G_c) (w^_c . w^_{T+s}) on c <= s (query rows)
    Cv  = Bf + M Bf                                        (rows: U_0..U_{T-1}, then o_0..o_{T-1})
    Cz  = -Cv diag(exp(G_c)) on the key columns + diag(exp(G_s)) on the query rows
every output row i (the T new ring u rows, then the T outputs) is
    out_i = sum_r CzT[r, i] (S0 raw_r) + sum_j CuT[j, i] u_j + sum_c CvT[c, i] v_c
    CzT[r, i] = decay0 mult_r Cz[i, r],  CuT = (Cz Ch)^T,  CvT = Cv^T
which is what the verify kernel (spec_verify.py) evaluates: one state product, one history product, T outer
products; no gate, norm, Gram matrix or solve is left there, and the state side of its product is the raw window
input (bf16-exact under bf16 activations: the split-bf16 dot).

Cost (why it looks like this): the per-key-head dots are two MMAs on operands exactly as stored (raw window rows,
ring keys: exact products, fp32 accumulation, no split under 16-bit activations), the norms come from the Gram
matrix's diagonal, and the T x T inverse is ceil(log2 T) pairs of [TW, TW] dots (2 at T = 4) instead of T
forward-substitution dots. One warp per program: the tiles are [16, K] and [16, 16], and a 36 KB, 4-warp first
version of this kernel issued 4x the instructions (kernel_report: 340 us at b512 against 79 us now).

Workspace coef [slots, HV, 2 TW2 + BC, TW2] fp32 (TW2 = next_pow2(2T), indexed by slot): rows [0, TW2) CzT, rows
[TW2, TW2 + BC) CuT, rows [TW2 + BC, 2 TW2 + BC) CvT; entries past 2T are written as zeros.
The program also appends the window's normalised keys (rounded to the ring's dtype) at ring rows
(origin + h + s) & (ring_len - 1) of its key head and the window's log decays at those rows of its value heads:
one writer per address. It reads only history rows, which no launch of the step writes.

Trees (replayssm.gdn.tree_verify(route="verify_fold"), issue 35 item 2): IS_TREE, set when the launcher passes
anc_ptr (int32 [batch, N], bit c of entry s: node c is an ancestor of s or s itself). Node s's entries go where a
chain's token s goes, so only the window's masks and gates change, all here: row r's token sees key c iff c is on
its path (window_path: on_path, and strict for A), G_r is the sum of g over that path and G of key row c is row c's
own G (the chain's cumsum). Restricted to ancestors A is still strictly lower triangular in topological order and
nilpotent: A^m[s, c] is a sum over chains of m strict-ancestor steps from s to c, so A^(d + 1) = 0 when no path has
more than d + 1 nodes (d <= N - 1, the chain's worst case). The chain's ceil(log2 N) factors sum the series up to
A^(2^ceil(log2 N) - 1), at least A^(N - 1): exact for every tree of N nodes (the depth is a runtime value of each
row's tree, so the factor count stays N's). The coefficients carry every tree fact: the verify and
the fold are the chain's builds, and a flush row's fold of the committed history (a chain after the tree commit's
moves, replayssm/tree_ring.py) is the chain's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_weights


@triton.jit
def window_rows(origin, h, ring_mask, T: tl.constexpr, TW: tl.constexpr):
    """The stacked window tile's rows ([TW]: the T keys, then the T queries, then padding) and the ring row of
    each row's token (logical position h + token after the ring's origin): (offs_r, is_k, is_q, live, token,
    ring row)."""
    offs_r = tl.arange(0, TW)
    is_k = offs_r < T
    is_q = (offs_r >= T) & (offs_r < 2 * T)
    tok = tl.where(is_q, offs_r - T, offs_r)
    return offs_r, is_k, is_q, is_k | is_q, tok, (origin + h + tok) & ring_mask


@triton.jit
def window_path(anc_ptr, anc_row, offs_r, is_k, live, tok, IS_TREE: tl.constexpr):
    """The window's path masks [TW, TW] (rows r as window_rows stacks them; columns c < T the key rows):
    on_path[r, c]: window key c is on the path of row r's token (an ancestor of it, or itself); strict[r, c]: the
    same on a key row r, c != r (where the system's A lives). Chain: c <= tok(r), c < r. IS_TREE (a draft tree
    of T nodes, tree_verify(route="verify_fold")): bit c of anc[tok(r)], the row's int32 ancestor-or-self bit sets
    at anc_ptr + anc_row (spec_launch: replayssm/mamba2/spec_kernels.ancestor_bits, [batch, T] contiguous),
    loaded here; strict ancestors come first in topological order, so strict stays strictly lower triangular.
    Also returns anc_r [TW] (0 on padding rows; the chain's: tok) for a sweep of the key columns one at a time:
    path_holds(anc_r, tok, c, IS_TREE) is on_path's column c without the [TW, TW] tile."""
    if IS_TREE:
        anc_r = tl.load(anc_ptr + anc_row + tok, mask=live, other=0)
        col = tl.where(is_k, offs_r, 0)
        on_path = is_k[None, :] & (((anc_r[:, None] >> col[None, :]) & 1) != 0)
        strict = on_path & is_k[:, None] & (offs_r[:, None] != offs_r[None, :])
    else:
        anc_r = tok
        on_path = is_k[None, :] & (offs_r[None, :] <= tok[:, None])
        strict = is_k[:, None] & is_k[None, :] & (offs_r[:, None] > offs_r[None, :])
    return anc_r, on_path, strict


@triton.jit
def path_holds(anc_r, tok, c, IS_TREE: tl.constexpr):
    """[TW] bool: the path of row r's token holds window key c (window_path's anc_r; c a static key index)."""
    if IS_TREE:
        holds = ((anc_r >> c) & 1) != 0
    else:
        holds = c <= tok
    return holds


@triton.jit
def _window_coefficients(WWd, beta_k, eG, strict, key_block, eye, q_diag, is_k, is_q, on_path,
                         FP32_DOT: tl.constexpr, LOG2T: tl.constexpr):
    """(Cz, Cv) [TW, TW] of one value head (module docstring) from the decayed Gram matrix WWd[r, c] =
    exp(G_r - G_c) (w^_r . w^_c) on the path (KDA: the decay per key channel, inside the dot) and eG = exp(G_r)
    (KDA: 1, its readouts are decayed on the key side). The masks come from the caller, built once per program."""
    A = tl.where(strict, beta_k[:, None] * WWd, 0.0)
    # (I + A)^-1 of the nilpotent A (A^T = 0): (I - A)(I + A^2)(I + A^4).. , ceil(log2 T) factors, 2 dots each
    N = eye - A
    Ap = A
    for _ in tl.static_range(LOG2T - 1):
        Ap = tl.dot(Ap, Ap, input_precision=FP32_DOT)
        N = N + tl.dot(N, Ap, input_precision=FP32_DOT)
    Bf = tl.where(key_block, N * beta_k[None, :], 0.0)
    M = tl.where(is_q[:, None] & on_path, WWd, 0.0)
    Cv = Bf + tl.dot(M, Bf, input_precision=FP32_DOT)
    Cz = tl.where(is_k[None, :], -Cv * eG[None, :], 0.0) + tl.where(q_diag, eG[:, None], 0.0)
    return Cz, Cv


# IS_TREE: a draft tree's window (anc_ptr, its ancestor bit sets, given), a fact of the arguments as Mamba-2's
@triton.heuristics({"IS_TREE": lambda args: args["anc_ptr"] is not None})
@triton.jit
def spec_prep_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, slots_ptr, wpos_ptr, origin_ptr, kring_ptr, gring_ptr, coef_ptr, x_ptr, wt_ptr,
    anc_ptr,
    stride_q_b, stride_q_t, stride_q_h, stride_k_b, stride_k_t, stride_k_h, stride_g_b, stride_g_t,
    stride_beta_b, stride_beta_t, stride_kr_slot, stride_kr_h, stride_kr_l, stride_gr_slot, stride_gr_h,
    stride_c_slot, stride_c_h, stride_x_slot, stride_x_h, stride_x_r, stride_w_slot, stride_w_h,
    scale, ring_mask,
    NULL_ID: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, T: tl.constexpr, TW: tl.constexpr,
    TW2: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr, FP32_DOT: tl.constexpr,
    LOG2T: tl.constexpr, IS_TREE: tl.constexpr, XK: tl.constexpr = 32,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_kh = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    origin = tl.load(origin_ptr + slot)

    offs_r, is_k, is_q, live, tok, win_rows = window_rows(origin, h, ring_mask, T, TW)
    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    offs_c = tl.arange(0, BC)
    valid_c = offs_c < h
    hist_rows = (origin + offs_c) & ring_mask
    w_ptrs = tl.where(is_q, q_ptr + i_b * stride_q_b + tok * stride_q_t + i_kh * stride_q_h,
                      k_ptr + i_b * stride_k_b + tok * stride_k_t + i_kh * stride_k_h)
    # the verify's and the fold's state vectors: the raw window rows, per key head (read at X_GROUP = HV / H),
    # copied first in [TW, XK] chunks by loads of their own (stored from Raw, which stays live through the head
    # loop: 168 registers and a 4 B spill at Qwen3.5-122B T 8, Triton 3.7.1)
    for kc in tl.static_range((K + XK - 1) // XK):
        offs_x = kc * XK + tl.arange(0, XK)
        xm = live[:, None] & (offs_x < K)[None, :]
        tl.store(x_ptr + slot * stride_x_slot + i_kh * stride_x_h + offs_r[:, None] * stride_x_r + offs_x[None, :],
                 tl.load(w_ptrs[:, None] + offs_x[None, :], mask=xm, other=0.0).to(x_ptr.dtype.element_ty), mask=xm)
    # The raw window rows and the buffered keys as stored (both exact in the activation dtype): their dots are
    # exact products with fp32 accumulation, one MMA pass each under 16-bit activations; the norms and the scale
    # are applied to the [TW, TW] and [TW, BC] results, never to a [TW, K] operand.
    Raw = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live[:, None] & mask_k[None, :], other=0.0)     # [TW, BK]
    RawT = tl.load(w_ptrs[None, :] + offs_k[:, None], mask=live[None, :] & mask_k[:, None], other=0.0)    # [BK, TW]
    KhT = tl.load(kring_ptr + slot * stride_kr_slot + i_kh * stride_kr_h + hist_rows[None, :] * stride_kr_l
                  + offs_k[:, None], mask=mask_k[:, None] & valid_c[None, :], other=0.0)              # [BK, BC]
    WW = tl.dot(Raw, RawT, input_precision=FP32_DOT)                        # raw_r . raw_c
    D = tl.dot(Raw, KhT.to(Raw.dtype), input_precision=FP32_DOT)            # raw_r . k_j
    diag = offs_r[:, None] == offs_r[None, :]
    mult_r = tl.where(is_q, scale, 1.0)
    mult_c = tl.where(is_q, scale, 1.0)
    if USE_L2NORM:
        mult_r = mult_r / tl.sqrt(tl.sum(tl.where(diag, WW, 0.0), 1) + 1e-6)
        mult_c = mult_c / tl.sqrt(tl.sum(tl.where(diag, WW, 0.0), 0) + 1e-6)
    mult_r = tl.where(live, mult_r, 0.0)
    mult_c = tl.where(live, mult_c, 0.0)
    WW = WW * mult_r[:, None] * mult_c[None, :]                            # w^_r . w^_c
    D = D * mult_r[:, None]                                                # w^_r . k_j
    kn = Raw.to(tl.float32) * tl.where(is_k, mult_r, 0.0)[:, None]
    tl.store(kring_ptr + slot * stride_kr_slot + i_kh * stride_kr_h + win_rows[:, None] * stride_kr_l
             + offs_k[None, :], kn.to(kring_ptr.dtype.element_ty), mask=is_k[:, None] & mask_k[None, :])

    # on_path[r, c]: key c is on the path of row r's token (the chain: c <= tok(r); a tree: its ancestor bit set)
    _, on_path, strict = window_path(anc_ptr, i_b * T, offs_r, is_k, live, tok, IS_TREE)
    key_block = is_k[:, None] & is_k[None, :]
    eye = tl.where(offs_r[:, None] == offs_r[None, :], 1.0, 0.0)
    q_diag = is_q[:, None] & (offs_r[:, None] == offs_r[None, :])
    # coefficient tiles are indexed [i (output row), r / j / c]; stored transposed by their addresses
    out_i = offs_r[:, None] < TW2
    for j in tl.static_range(GROUP):
        hv = i_kh * GROUP + j
        c_base = coef_ptr + slot * stride_c_slot + hv * stride_c_h
        g_k = tl.load(g_ptr + i_b * stride_g_b + offs_r * stride_g_t + hv, mask=is_k, other=0.0)     # [TW]
        beta_k = tl.load(beta_ptr + i_b * stride_beta_b + offs_r * stride_beta_t + hv, mask=is_k, other=0.0)
        g_hist = tl.load(gring_ptr + slot * stride_gr_slot + hv * stride_gr_h + hist_rows, mask=valid_c, other=0.0)
        decay0, w = replay_weights(g_hist, valid_c, 0)
        G = tl.sum(tl.where(on_path, g_k[None, :], 0.0), 1)               # gate of row r's token from S_h
        # ... of key row c along the columns: the chain's prefix sum; a tree's is key row c's own G (its path)
        if IS_TREE:
            Gk = tl.sum(tl.where(diag, G[:, None], 0.0), 0)
        else:
            Gk = tl.cumsum(g_k, 0)
        eG = tl.exp(G)
        decay = tl.exp(tl.minimum(G[:, None] - Gk[None, :], 0.0))
        # _window_coefficients, written out: called here, Triton 3.7.1 builds it as a call (128 registers, a 32 B
        # spill at Qwen3.5-122B); inline, 143 registers and none
        A = tl.where(strict, beta_k[:, None] * decay * WW, 0.0)
        N = eye - A
        Ap = A
        for _ in tl.static_range(LOG2T - 1):
            Ap = tl.dot(Ap, Ap, input_precision=FP32_DOT)
            N = N + tl.dot(N, Ap, input_precision=FP32_DOT)
        Bf = tl.where(key_block, N * beta_k[None, :], 0.0)
        M = tl.where(is_q[:, None] & on_path, decay * WW, 0.0)
        Cv = Bf + tl.dot(M, Bf, input_precision=FP32_DOT)
        Cz = tl.where(is_k[None, :], -Cv * eG[None, :], 0.0) + tl.where(q_diag, eG[:, None], 0.0)
        Cu = tl.dot(Cz, D * w[None, :], input_precision=FP32_DOT)         # [TW, BC]
        blk = out_i & (offs_r[None, :] < TW2)
        tl.store(c_base + offs_r[None, :] * TW2 + offs_r[:, None], Cz * (decay0 * mult_c)[None, :], mask=blk)
        tl.store(c_base + (TW2 + offs_c[None, :]) * TW2 + offs_r[:, None], Cu, mask=out_i)
        tl.store(c_base + (TW2 + BC + offs_r[None, :]) * TW2 + offs_r[:, None], Cv, mask=blk)
        tl.store(gring_ptr + slot * stride_gr_slot + hv * stride_gr_h + win_rows, g_k, mask=is_k)
        # the fold's replay weights (spec_fold.py reads them at K stride 0): exp(G_tot), then w_j
        w_base = wt_ptr + slot * stride_w_slot + hv * stride_w_h
        tl.store(w_base, decay0)
        tl.store(w_base + 1 + offs_c, w)


@triton.jit
def spec_prep_kda_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, slots_ptr, wpos_ptr, origin_ptr, flush_ptr, kring_ptr, gring_ptr, coef_ptr,
    x_ptr, wt_ptr,
    stride_q_b, stride_q_t, stride_q_h, stride_k_b, stride_k_t, stride_k_h, stride_g_b, stride_g_t, stride_g_h,
    stride_beta_b, stride_beta_t, stride_kr_slot, stride_kr_h, stride_kr_l, stride_gr_slot, stride_gr_h,
    stride_gr_l, stride_c_slot, stride_c_h, stride_x_slot, stride_x_h, stride_w_slot, stride_w_h,
    scale, ring_mask,
    NULL_ID: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, T: tl.constexpr, TW: tl.constexpr,
    TW2: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr, FP32_DOT: tl.constexpr,
    LOG2T: tl.constexpr,
):
    """KDA (a log decay per key channel): the per-channel decays are applied here, once per (row, value head),
    so that the verify is GDN's with precomputed vectors. For row r (token tok(r)), G_r [K] the window's prefix
    sum, G_tot, w_j [K] the history's replay weights (per channel):
        X_r       = exp(G_tot + G_r) * w^_r                the verify's state vector (x workspace, fp32)
        Ch[r, j]  = sum_d exp(G_r) w^_r k_j w_j            its history coefficients
        WWd[r, c] = sum_d w^_r w^_c exp(G_r - G_c)         for c on r's path (masked elsewhere)
    and the coefficients as GDN's with eG = 1 and no decay0 / mult factor (both are in X).
    exp(G_r - G_c) is the product of alpha_i = exp(g_i) over tokens c < i <= tok(r), built by one sweep of the
    key columns from c = T-1 down to 0 (F *= alpha_c on the rows whose path holds c): no exp of a [TW, K] tile,
    every factor in (0, 1] (never exp(G_r) exp(-G_c), which overflows fp32 once a channel's window decay passes
    e^88), and after the sweep F = exp(G_r).
    Everything K-wide is per channel, so the program walks K in chunks of BKC columns (one warp: [TW, BKC] tiles
    of 16 registers, a [TW, BC] history dot per chunk) and only the dot sums cross chunks; the L2 norm's sums come
    from a first pass over the chunks."""
    i_b = tl.program_id(0).to(tl.int64)
    i_kh = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    folds = (tl.load(flush_ptr + slot) != 0) & (h > 0)          # the fold reads this row's weights
    offs_r, is_k, is_q, live, tok, win_rows = window_rows(origin, h, ring_mask, T, TW)
    offs_c = tl.arange(0, BC)
    valid_c = offs_c < h
    hist_rows = (origin + offs_c) & ring_mask
    w_ptrs = tl.where(is_q, q_ptr + i_b * stride_q_b + tok * stride_q_t + i_kh * stride_q_h,
                      k_ptr + i_b * stride_k_b + tok * stride_k_t + i_kh * stride_k_h)
    kr_base = kring_ptr + slot * stride_kr_slot + i_kh * stride_kr_h
    mult = tl.where(is_q, scale, 1.0)
    if USE_L2NORM:
        ssq = tl.zeros([TW], dtype=tl.float32)
        for kc in tl.static_range((K + BK - 1) // BK):
            offs_k = kc * BK + tl.arange(0, BK)
            Wc = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live[:, None] & (offs_k < K)[None, :],
                         other=0.0).to(tl.float32)
            ssq += tl.sum(Wc * Wc, 1)
        mult = mult / tl.sqrt(ssq + 1e-6)
    mult = tl.where(live, mult, 0.0)
    on_path = is_k[None, :] & (offs_r[None, :] <= tok[:, None])
    strict = is_k[:, None] & is_k[None, :] & (offs_r[:, None] > offs_r[None, :])
    key_block = is_k[:, None] & is_k[None, :]
    eye = tl.where(offs_r[:, None] == offs_r[None, :], 1.0, 0.0)
    q_diag = is_q[:, None] & (offs_r[:, None] == offs_r[None, :])
    out_i = offs_r[:, None] < TW2
    blk = out_i & (offs_r[None, :] < TW2)
    for j in tl.static_range(GROUP):
        hv = i_kh * GROUP + j
        g_base = g_ptr + i_b * stride_g_b + hv * stride_g_h
        gr_base = gring_ptr + slot * stride_gr_slot + hv * stride_gr_h
        WWd = tl.zeros([TW, TW], dtype=tl.float32)
        Ch = tl.zeros([TW, BC], dtype=tl.float32)
        for kc in tl.range(0, (K + BK - 1) // BK):          # constexpr bound: a loop, one chunk live at a time
            offs_k = kc * BK + tl.arange(0, BK)
            mask_k = offs_k < K
            W = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live[:, None] & mask_k[None, :],
                        other=0.0).to(tl.float32) * mult[:, None]                    # w^_r [TW, BK]
            if j == 0:
                tl.store(kr_base + win_rows[:, None] * stride_kr_l + offs_k[None, :],
                         W.to(kring_ptr.dtype.element_ty), mask=is_k[:, None] & mask_k[None, :])
            # the sweep of the key columns (docstring): the decayed Gram matrix, then F = exp(G_r)
            F = tl.zeros([TW, BK], dtype=tl.float32) + 1.0
            for cc in tl.static_range(T):
                c = T - 1 - cc
                g_c = tl.load(g_base + c * stride_g_t + offs_k, mask=mask_k, other=0.0)
                tl.store(gr_base + ((origin + h + c) & ring_mask) * stride_gr_l + offs_k, g_c, mask=mask_k)
                mult_c = tl.sum(tl.where(offs_r == c, mult, 0.0), 0)
                k_c = tl.load(k_ptr + i_b * stride_k_b + c * stride_k_t + i_kh * stride_k_h + offs_k, mask=mask_k,
                              other=0.0).to(tl.float32) * mult_c
                col = tl.sum(W * (k_c[None, :] * F), 1)
                WWd += tl.where((offs_r == c)[None, :], col[:, None], 0.0)
                F = F * tl.where((live & (c <= tok))[:, None], tl.exp(g_c)[None, :], 1.0)
            hmask = valid_c[:, None] & mask_k[None, :]
            g_hist = tl.load(gr_base + hist_rows[:, None] * stride_gr_l + offs_k[None, :], mask=hmask, other=0.0)
            decay0, w = replay_weights(g_hist, hmask, 0)                       # [BK], [BC, BK]
            if folds:                                   # the fold's weights: row 0 exp(G_tot), rows 1 + j w_j
                w_base = wt_ptr + slot * stride_w_slot + hv * stride_w_h
                tl.store(w_base + offs_k, decay0, mask=mask_k)
                tl.store(w_base + (1 + offs_c[:, None]) * K + offs_k[None, :], w, mask=mask_k[None, :])
            WG = W * F
            tl.store(x_ptr + slot * stride_x_slot + hv * stride_x_h + offs_r[:, None] * K + offs_k[None, :],
                     WG * decay0[None, :], mask=live[:, None] & mask_k[None, :])
            Kh = tl.load(kr_base + hist_rows[:, None] * stride_kr_l + offs_k[None, :], mask=hmask,
                         other=0.0).to(tl.float32)                               # [BC, BK]
            Ch += tl.dot(WG, tl.trans(Kh * w), input_precision=FP32_DOT)        # [TW, BC]
        beta_k = tl.load(beta_ptr + i_b * stride_beta_b + offs_r * stride_beta_t + hv, mask=is_k, other=0.0)
        ones = tl.where(live, 1.0, 0.0)
        Cz, Cv = _window_coefficients(WWd, beta_k, ones, strict, key_block, eye, q_diag, is_k, is_q, on_path,
                                      FP32_DOT, LOG2T)
        Cu = tl.dot(Cz, Ch, input_precision=FP32_DOT)
        c_base = coef_ptr + slot * stride_c_slot + hv * stride_c_h
        tl.store(c_base + offs_r[None, :] * TW2 + offs_r[:, None], Cz, mask=blk)
        tl.store(c_base + (TW2 + offs_c[None, :]) * TW2 + offs_r[:, None], Cu, mask=out_i)
        tl.store(c_base + (TW2 + BC + offs_r[None, :]) * TW2 + offs_r[:, None], Cv, mask=blk)
