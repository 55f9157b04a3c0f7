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
[TW2, TW2 + BC) CuT, rows [TW2 + BC, 2 TW2 + BC) CvT; entries past 2T are written as zeros. KDA's prep
(spec_prep_kda_kernel) applies Cz to its own per-value-head x rows instead (the verify's MIXED) and leaves the CzT
rows at their zeros.
The program also appends the window's normalised keys (rounded to the ring's dtype) at ring rows
(origin + h + s) & (ring_len - 1) of its key head and the window's log decays at those rows of its value heads:
one writer per address. It reads only history rows, which no launch of the step writes.

Trees (tree_verify(route="verify_fold") of replayssm.gdn and replayssm.kda, issue 35 item 2): IS_TREE, set when the
launcher passes anc_ptr (int32 [batch, N], bit c of entry s: node c is an ancestor of s or s itself). Node s's
entries go where a chain's token s goes, so only the window's masks and gates change, all here: row r's token sees
key c iff c is on its path (window_path: on_path, and strict for A), G_r is the sum of g over that path and G of key
row c is row c's own G (the chain's cumsum). Restricted to ancestors A is still strictly lower triangular in
topological order and nilpotent: A^m[s, c] is a sum over chains of m strict-ancestor steps from s to c, so A^(d + 1)
= 0 when no path has more than d + 1 nodes (d <= N - 1, the chain's worst case). The chain's ceil(log2 N) factors
sum the series up to A^(2^ceil(log2 N) - 1), at least A^(N - 1): exact for every tree of N nodes (the depth is a
runtime value of each row's tree, so the factor count stays N's). The coefficients carry every tree fact: the verify
and the fold are the chain's builds, and a flush row's fold of the committed history (a chain after the tree
commit's moves, replayssm/tree_ring.py) is the chain's. KDA's preps (spec_prep_kda_kernel, _tok_kernel) take the
same anc_ptr and IS_TREE: their per-channel gates come from a sweep over the path (their docstrings).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_weights
from replayssm.delta_rule.spec_verify import split_bf16_trunc


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


LOG2E = tl.constexpr(1.4426950408889634)       # exp(x) = exp2(x log2 e)


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
def _k_offsets(kc, BK: tl.constexpr):
    """kc * BK + [0, BK), provably contiguous in runs of 4 only: every K tile of the KDA prep, bf16 or fp32, is then
    laid out alike (4 elements a lane, 32 lanes along K, rows in-thread), so no tile changes layout between the
    sweep, the history scan and the stores (8-element bf16 loads put rows across lanes: shuffles)."""
    a = tl.arange(0, BK)
    return kc * BK + (a // 4) * 4 + a % 4


@triton.jit
def _mm(a, b, FP32_DOT: tl.constexpr, MMA: tl.constexpr):
    """a [M, C] @ b [C, N], fp32: tl.dot where C >= 16, else broadcast-and-sum (C <= 8: a few FMAs a lane)."""
    if MMA:
        return tl.dot(a, b, input_precision=FP32_DOT)
    else:
        return tl.sum(a[:, :, None] * b[None, :, :], 1)


@triton.jit
def _window_coefficients(WWd, beta_k, strict, key_block, eye, q_diag, is_k, is_q, on_path,
                         FP32_DOT: tl.constexpr, LOG2T: tl.constexpr, MMA: tl.constexpr):
    """KDA's (Cz, Cv) [TW2, TW2] of one value head (module docstring, eG = 1: its readouts are decayed on the key
    side) from the decayed Gram matrix WWd[r, c] = sum_d w^_r w^_c exp(G_r - G_c) on the path."""
    A = tl.where(strict, beta_k[:, None] * WWd, 0.0)
    # (I + A)^-1 of the nilpotent A (A^T = 0): (I - A)(I + A^2)(I + A^4).. , ceil(log2 T) factors, 2 products each
    N = eye - A
    Ap = A
    for _ in tl.static_range(LOG2T - 1):
        Ap = _mm(Ap, Ap, FP32_DOT, MMA)
        N = N + _mm(N, Ap, FP32_DOT, MMA)
    Bf = tl.where(key_block, N * beta_k[None, :], 0.0)
    M = tl.where(is_q[:, None] & on_path, WWd, 0.0)
    Cv = Bf + _mm(M, Bf, FP32_DOT, MMA)
    Cz = tl.where(is_k[None, :], -Cv, 0.0) + tl.where(q_diag, 1.0, 0.0)
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


@triton.heuristics({"IS_TREE": lambda args: args["anc_ptr"] is not None})      # as spec_prep_kernel's
@triton.jit
def spec_prep_kda_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, slots_ptr, wpos_ptr, origin_ptr, flush_ptr, kring_ptr, gring_ptr, coef_ptr,
    x_ptr, wt_ptr, anc_ptr,
    stride_q_b, stride_q_t, stride_q_h, stride_k_b, stride_k_t, stride_k_h, stride_g_b, stride_g_t, stride_g_h,
    stride_beta_b, stride_beta_t, stride_kr_slot, stride_kr_h, stride_kr_l, stride_gr_slot, stride_gr_h,
    stride_gr_l, stride_c_slot, stride_c_h, stride_x_slot, stride_x_h, stride_w_slot, stride_w_h,
    scale, ring_mask,
    NULL_ID: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, T: tl.constexpr, TW2: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr, FP32_DOT: tl.constexpr, DOT: tl.constexpr,
    LOG2T: tl.constexpr, HB: tl.constexpr, IS_TREE: tl.constexpr,
):
    """KDA (a log decay per key channel): the per-channel decays are applied here, once per (row, value head),
    so that the verify is GDN's with precomputed vectors. For row r (token tok(r)), G_r [K] the window's prefix
    sum, G_tot, w_j [K] the history's replay weights (per channel), X_r = exp(G_r) w^_r:
        WWd[r, c] = sum_d w^_r w^_c exp(G_r - G_c)         for c on r's path (masked elsewhere)
        Z         = Cz X                                   [2T, K], Cz as GDN's with eG = 1 (from WWd and beta)
        x[i]      = exp(G_tot) Z_i                         the verify's state vectors, already mixed (MIXED):
                                                           S0 x[i] is the sum_r decay0 (S0 X_r) Cz[i, r] GDN's
                                                           verify forms with its [TW, TW] CzT dot
        CuT[j, i] = sum_d (k_j w_j) . Z_i                  the history coefficients, (Cz Ch)^T in one product
    exp(G_r - G_c) is the product of alpha_i = exp(g_i) over tokens c < i <= tok(r), built by one sweep of the
    key columns from c = T-1 down to 0 (F *= alpha_c on the rows whose path holds c): every factor in (0, 1]
    (never exp(G_r) exp(-G_c), which overflows fp32 once a channel's window decay passes e^88), and after the
    sweep F = exp(G_r). w_j = exp(G_tot - G_pre_j) is one exp2 of a non-positive sum (G_tot - G_pre_j is the sum
    of the log decays after j).
    Trees (IS_TREE, anc_ptr given; spec_launch.launch_verify_fold(parents=...)): G_r is the sum over the path of
    row r's node, "c on r's path" its ancestor-or-self bit (window_path / path_holds in place of c <= tok), the
    rest unchanged. The sweep still ends at F = exp(G_r) and gives exp(G_r - G_c) at column c: the path nodes of
    index > c are, for c on the path, exactly c's descendants on it (indices grow down a branch), the factors the
    sweep has applied on that row when it reaches c. The solve keeps ceil(log2 T) factors (A nilpotent on
    ancestors: spec_prep.py's module docstring). Nodes sit where a chain's tokens go (ring rows, x and coef rows).

    Layout (why it is fast): one warp, the whole K in one tile, 4 channels a lane and every row of a tile in-thread
    (_k_offsets): the history's prefix sums and the row extractions are register moves, only the K sums (the L2
    norms, WWd's 4T columns) cross lanes. The window tile has 2T rows (8 at T = 4, not tl.dot's 16: the solve is
    a few [8, 8, 8] broadcast-and-sums, the history product an MMA with N = 8). The history goes in blocks of HB
    rows, G_tot first, so that only Z's split stays live through them; CuT is bf16x3 (truncating split) under
    16-bit activations. AOT sm_90 Kimi-Linear b512 T4 (Triton 3.7.1): 128 registers (maxnreg), 3,266 SASS on
    the path, 101.3 us of issue against 237.4 us for the K-chunked [16, 32]-tile version (168 registers, 5,737)."""
    i_b = tl.program_id(0).to(tl.int64)
    i_kh = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    folds = (tl.load(flush_ptr + slot) != 0) & (h > 0)          # the fold reads this row's weights
    offs_r, is_k, is_q, live, tok, win_rows = window_rows(origin, h, ring_mask, T, TW2)
    offs_c = tl.arange(0, BC)
    valid_c = offs_c < h
    hist_rows = (origin + offs_c) & ring_mask
    q_row = q_ptr + i_b * stride_q_b + i_kh * stride_q_h
    k_row = k_ptr + i_b * stride_k_b + i_kh * stride_k_h
    w_ptrs = tl.where(is_q, q_row + tok * stride_q_t, k_row + tok * stride_k_t)
    kr_base = kring_ptr + slot * stride_kr_slot + i_kh * stride_kr_h
    offs_k = _k_offsets(0, BK)
    mask_k = offs_k < K
    hmask = valid_c[:, None] & mask_k[None, :]
    W = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
    mult = tl.where(is_q, scale, 1.0)
    if USE_L2NORM:
        mult = mult * tl.math.rsqrt(tl.sum(W * W, 1) + 1e-6)
    mult = tl.where(live, mult, 0.0)
    W = W * mult[:, None]                                                    # w^_r [TW2, BK]
    tl.store(kr_base + win_rows[:, None] * stride_kr_l + offs_k[None, :], W.to(kring_ptr.dtype.element_ty),
             mask=is_k[:, None] & mask_k[None, :])
    # the chain's masks, or a tree's (bit c of the row's ancestor set): the only chain facts of this kernel
    anc_r, on_path, strict = window_path(anc_ptr, i_b * T, offs_r, is_k, live, tok, IS_TREE)
    key_block = is_k[:, None] & is_k[None, :]
    eye = tl.where(offs_r[:, None] == offs_r[None, :], 1.0, 0.0)
    q_diag = is_q[:, None] & (offs_r[:, None] == offs_r[None, :])
    for j in tl.static_range(GROUP):
        hv = i_kh * GROUP + j
        g_base = g_ptr + i_b * stride_g_b + hv * stride_g_h
        gr_base = gring_ptr + slot * stride_gr_slot + hv * stride_gr_h
        # the decayed Gram matrix by the sweep of the key columns (docstring); after it F = exp(G_r)
        WWd = tl.zeros([TW2, TW2], dtype=tl.float32)
        F = tl.zeros([TW2, BK], dtype=tl.float32) + 1.0
        for cc in tl.static_range(T):
            c = T - 1 - cc
            g_c = tl.load(g_base + c * stride_g_t + offs_k, mask=mask_k, other=0.0)
            tl.store(gr_base + ((origin + h + c) & ring_mask) * stride_gr_l + offs_k, g_c, mask=mask_k)
            k_c = tl.sum(tl.where((offs_r == c)[:, None], W, 0.0), 0)            # row c: in-thread
            col = tl.sum(W * (k_c[None, :] * F), 1)
            WWd += tl.where((offs_r == c)[None, :], col[:, None], 0.0)
            holds = live & path_holds(anc_r, tok, c, IS_TREE)
            F = F * tl.where(holds[:, None], tl.math.exp2(g_c * LOG2E)[None, :], 1.0)
        X = W * F                                                           # exp(G_r) w^_r
        beta_k = tl.load(beta_ptr + i_b * stride_beta_b + offs_r * stride_beta_t + hv, mask=is_k, other=0.0)
        Cz, Cv = _window_coefficients(WWd, beta_k, strict, key_block, eye, q_diag, is_k, is_q, on_path,
                                      FP32_DOT, LOG2T, TW2 >= 16)
        # Z = Cz X: Cz's query columns are the identity, its key columns -Cv's
        Z = tl.where(is_q[:, None], X, 0.0)
        for t in tl.static_range(T):
            cz_t = tl.sum(tl.where((offs_r == t)[None, :], Cz, 0.0), 1)                     # Cz[:, t]
            Z += cz_t[:, None] * tl.sum(tl.where((offs_r == t)[:, None], X, 0.0), 0)[None, :]
        c_base = coef_ptr + slot * stride_c_slot + hv * stride_c_h
        w_base = wt_ptr + slot * stride_w_slot + hv * stride_w_h
        # G_tot first (a sum over the history rows, in-thread): the state vectors are stored before the history
        # blocks, so that only Z's split operand stays live through them
        G_tot = tl.sum(tl.load(gr_base + hist_rows[:, None] * stride_gr_l + offs_k[None, :], mask=hmask, other=0.0), 0)
        decay0 = tl.math.exp2(G_tot * LOG2E)                                   # exp(G_tot)
        if folds:                                       # the fold's weights: row 0 exp(G_tot), rows 1 + j w_j
            tl.store(w_base + offs_k, decay0, mask=mask_k)
        tl.store(x_ptr + slot * stride_x_slot + hv * stride_x_h + offs_r[:, None] * K + offs_k[None, :],
                 Z * decay0[None, :], mask=live[:, None] & mask_k[None, :])
        if DOT == "bf16x3":
            Zh, Zl = split_bf16_trunc(tl.trans(Z))
        # the history in blocks of HB rows: w_j = exp(G_tot - G_pre_j), G_pre carried across the blocks
        G_pre = tl.zeros_like(G_tot)
        for bb in tl.range(0, BC // HB):
            offs_j = bb * HB + tl.arange(0, HB)
            rows_j = (origin + offs_j) & ring_mask
            jmask = (offs_j < h)[:, None] & mask_k[None, :]
            g_hist = tl.load(gr_base + rows_j[:, None] * stride_gr_l + offs_k[None, :], mask=jmask, other=0.0)
            w = tl.math.exp2((G_tot - G_pre)[None, :] * LOG2E - tl.cumsum(g_hist, 0) * LOG2E)
            G_pre += tl.sum(g_hist, 0)
            if folds:
                tl.store(w_base + (1 + offs_j[:, None]) * K + offs_k[None, :], w, mask=jmask)
            Kw = tl.load(kr_base + rows_j[:, None] * stride_kr_l + offs_k[None, :], mask=jmask,
                         other=0.0).to(tl.float32) * w                              # [HB, BK], 0 past h
            if DOT == "bf16x3":
                Kh_, Kl_ = split_bf16_trunc(Kw)
                CuT = tl.dot(Kl_, Zh, tl.dot(Kh_, Zl, tl.dot(Kh_, Zh)))
            else:
                CuT = tl.dot(Kw, tl.trans(Z), input_precision=DOT)                 # [HB, TW2]
            tl.store(c_base + (TW2 + offs_j[:, None]) * TW2 + offs_r[None, :], CuT)
        # after the loop (a loop closing the kernel puts its exit inside the loop body: the report's path count)
        tl.store(c_base + (TW2 + BC + offs_r[None, :]) * TW2 + offs_r[:, None], Cv)


@triton.heuristics({"IS_TREE": lambda args: args["anc_ptr"] is not None})
@triton.jit
def spec_prep_kda_tok_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, slots_ptr, wpos_ptr, origin_ptr, flush_ptr, kring_ptr, gring_ptr, coef_ptr,
    x_ptr, wt_ptr, anc_ptr,
    stride_q_b, stride_q_t, stride_q_h, stride_k_b, stride_k_t, stride_k_h, stride_g_b, stride_g_t, stride_g_h,
    stride_beta_b, stride_beta_t, stride_kr_slot, stride_kr_h, stride_kr_l, stride_gr_slot, stride_gr_h,
    stride_gr_l, stride_c_slot, stride_c_h, stride_x_slot, stride_x_h, stride_w_slot, stride_w_h,
    scale, ring_mask,
    NULL_ID: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, T: tl.constexpr, TW2: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr, FP32_DOT: tl.constexpr, DOT: tl.constexpr,
    LOG2T: tl.constexpr, HB: tl.constexpr, TP: tl.constexpr, IS_TREE: tl.constexpr,
):
    """spec_prep_kda_kernel's algebra token-major, for windows of 2T >= 16 rows (T = 8): the keys and the queries
    in two [TP, K] tiles (TP = next_pow2(T)) that share the sweep's F_t, the solve on [TP, TP] tiles, Z = Cz X as
    [Zk; Zq], one [HB, 2 TP] history product per block. Half the [2T, K] kernel's registers per tile: the
    stacked layout spills 244 B at T = 8. Launched on two warps (spec_launch.default_config). AOT Kimi-Linear
    b512 T8, Triton 3.7.1: sm_90 148 registers, 4,892 SASS a warp on the path, 404.8 us of issue (the K-chunked
    version before it: one warp, 255, 7,863, 488.0 us); sm_100 152, no spill (that version spilled 36 B).
    At T = 4 it needs 140 registers (12 warps per SM; capped at 128 it spills 12 B), the stacked kernel 128.
    Trees (IS_TREE): the stacked kernel's, with window_path on the token axis; the CvT block is stored whole (its
    entries off the ancestors are exact zeros) so that a slot's previous tree leaves no entry of its own there."""
    i_b = tl.program_id(0).to(tl.int64)
    i_kh = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    folds = (tl.load(flush_ptr + slot) != 0) & (h > 0)          # the fold reads this row's weights
    offs_t = tl.arange(0, TP)                                    # window tokens: key rows t, query rows T + t
    live_t = offs_t < T
    ring_t = (origin + h + offs_t) & ring_mask
    kr_base = kring_ptr + slot * stride_kr_slot + i_kh * stride_kr_h
    offs_k = _k_offsets(0, BK)
    mask_k = offs_k < K
    wmask = live_t[:, None] & mask_k[None, :]
    Wk = tl.load(k_ptr + i_b * stride_k_b + i_kh * stride_k_h + offs_t[:, None] * stride_k_t + offs_k[None, :],
                 mask=wmask, other=0.0).to(tl.float32)                               # [TP, BK]
    Wq = tl.load(q_ptr + i_b * stride_q_b + i_kh * stride_q_h + offs_t[:, None] * stride_q_t + offs_k[None, :],
                 mask=wmask, other=0.0).to(tl.float32)
    if USE_L2NORM:
        Wk = Wk * tl.math.rsqrt(tl.sum(Wk * Wk, 1) + 1e-6)[:, None]
        Wq = Wq * (scale * tl.math.rsqrt(tl.sum(Wq * Wq, 1) + 1e-6))[:, None]
    else:
        Wq = Wq * scale                                                     # w^: the keys k^_t, the queries q^_t
    tl.store(kr_base + ring_t[:, None] * stride_kr_l + offs_k[None, :], Wk.to(kring_ptr.dtype.element_ty),
             mask=wmask)
    offs_c = tl.arange(0, TP)
    if IS_TREE:
        # window_path on the token axis (key row t and query row T + t share node t's path): the tile rows are the
        # tokens, the columns the keys
        anc_t, on_path, strict = window_path(anc_ptr, i_b * T, offs_t, live_t, live_t, offs_t, True)
        cv_mask = live_t[:, None] & live_t[None, :]
    else:                   # the chain's masks as they were written before the tree (its build's SASS unchanged)
        anc_t = offs_t
        strict = (offs_t[:, None] > offs_c[None, :]) & live_t[:, None]          # c < t: A's entries
        on_path = (offs_t[:, None] >= offs_c[None, :]) & live_t[:, None]        # c <= s: M's entries
        cv_mask = on_path
    eye = tl.where(offs_t[:, None] == offs_c[None, :], 1.0, 0.0)
    for j in tl.static_range(GROUP):
        hv = i_kh * GROUP + j
        g_base = g_ptr + i_b * stride_g_b + hv * stride_g_h
        gr_base = gring_ptr + slot * stride_gr_slot + hv * stride_gr_h
        # G_tot first (a sum over the history rows, in-thread, before the window's tiles are live): the state
        # vectors are stored before the history blocks, so that only Z's split operand stays live through them
        hmask = (tl.arange(0, BC) < h)[:, None] & mask_k[None, :]
        hist_rows = (origin + tl.arange(0, BC)) & ring_mask
        G_tot = tl.sum(tl.load(gr_base + hist_rows[:, None] * stride_gr_l + offs_k[None, :], mask=hmask,
                               other=0.0), 0)
        # the decayed Gram matrix by the sweep of the key columns (docstring): key row t and query row t share
        # F_t = exp(G_t - G_c) (after the sweep exp(G_t)); WWk[t, c] = k^_t . k^_c F_t, WWq[s, c] = q^_s . k^_c F_s
        WWk = tl.zeros([TP, TP], dtype=tl.float32)
        WWq = tl.zeros([TP, TP], dtype=tl.float32)
        F = tl.zeros([TP, BK], dtype=tl.float32) + 1.0
        for cc in tl.static_range(T):
            c = T - 1 - cc
            g_c = tl.load(g_base + c * stride_g_t + offs_k, mask=mask_k, other=0.0)
            tl.store(gr_base + ((origin + h + c) & ring_mask) * stride_gr_l + offs_k, g_c, mask=mask_k)
            kF = tl.sum(tl.where((offs_t == c)[:, None], Wk, 0.0), 0)[None, :] * F     # row c: in-thread
            WWk += tl.where((offs_c == c)[None, :], tl.sum(Wk * kF, 1)[:, None], 0.0)
            WWq += tl.where((offs_c == c)[None, :], tl.sum(Wq * kF, 1)[:, None], 0.0)
            if IS_TREE:
                holds = path_holds(anc_t, offs_t, c, True)
            else:
                holds = offs_t >= c
            F = F * tl.where(holds[:, None], tl.math.exp2(g_c * LOG2E)[None, :], 1.0)
        Xk = Wk * F                                                         # X_t = exp(G_t) w^_t
        Xq = Wq * F
        beta = tl.load(beta_ptr + i_b * stride_beta_b + offs_t * stride_beta_t + hv, mask=live_t, other=0.0)
        # (I + A)^-1 of the nilpotent A (A^T = 0): (I - A)(I + A^2)(I + A^4).. , ceil(log2 T) factors
        A = tl.where(strict, beta[:, None] * WWk, 0.0)
        N = eye - A
        Ap = A
        for _ in tl.static_range(LOG2T - 1):
            Ap = _mm(Ap, Ap, FP32_DOT, TP >= 16)
            N = N + _mm(N, Ap, FP32_DOT, TP >= 16)
        Bf = N * beta[None, :]                                              # Cv's key rows
        Cq = _mm(tl.where(on_path, WWq, 0.0), Bf, FP32_DOT, TP >= 16)       # Cv's query rows, M Bf
        # Z = Cz X: Cz's key columns are -Cv's, its query columns the identity
        Zk = tl.zeros([TP, BK], dtype=tl.float32)
        Zq = Xq
        for c in tl.static_range(T):
            x_c = tl.sum(tl.where((offs_t == c)[:, None], Xk, 0.0), 0)[None, :]
            Zk -= tl.sum(tl.where((offs_c == c)[None, :], Bf, 0.0), 1)[:, None] * x_c
            Zq -= tl.sum(tl.where((offs_c == c)[None, :], Cq, 0.0), 1)[:, None] * x_c
        c_base = coef_ptr + slot * stride_c_slot + hv * stride_c_h
        w_base = wt_ptr + slot * stride_w_slot + hv * stride_w_h
        decay0 = tl.math.exp2(G_tot * LOG2E)                                   # exp(G_tot)
        if folds:                                       # the fold's weights: row 0 exp(G_tot), rows 1 + j w_j
            tl.store(w_base + offs_k, decay0, mask=mask_k)
        x_ptrs = x_ptr + slot * stride_x_slot + hv * stride_x_h + offs_t[:, None] * K + offs_k[None, :]
        tl.store(x_ptrs, Zk * decay0[None, :], mask=wmask)
        tl.store(x_ptrs + T * K, Zq * decay0[None, :], mask=wmask)
        # one [2 TP, K] operand for the history product: rows (half, t), the key rows then the query rows
        Zj = tl.reshape(tl.permute(tl.join(Zk, Zq), (2, 0, 1)), (2 * TP, BK))
        if DOT == "bf16x3":
            Zh, Zl = split_bf16_trunc(tl.trans(Zj))
        offs_i = tl.arange(0, 2 * TP)
        i_col = offs_i % TP + (offs_i // TP) * T                              # Zj's row -> the workspace's i
        # the history in blocks of HB rows: w_j = exp(G_tot - G_pre_j), G_pre carried across the blocks
        G_pre = tl.zeros_like(G_tot)
        for bb in tl.range(0, BC // HB):
            offs_j = bb * HB + tl.arange(0, HB)
            rows_j = (origin + offs_j) & ring_mask
            jmask = (offs_j < h)[:, None] & mask_k[None, :]
            g_hist = tl.load(gr_base + rows_j[:, None] * stride_gr_l + offs_k[None, :], mask=jmask, other=0.0)
            w = tl.math.exp2((G_tot - G_pre)[None, :] * LOG2E - tl.cumsum(g_hist, 0) * LOG2E)
            G_pre += tl.sum(g_hist, 0)
            if folds:
                tl.store(w_base + (1 + offs_j[:, None]) * K + offs_k[None, :], w, mask=jmask)
            Kw = tl.load(kr_base + rows_j[:, None] * stride_kr_l + offs_k[None, :], mask=jmask,
                         other=0.0).to(tl.float32) * w                              # [HB, BK], 0 past h
            if DOT == "bf16x3":
                Kh_, Kl_ = split_bf16_trunc(Kw)
                Cu = tl.dot(Kl_, Zh, tl.dot(Kh_, Zl, tl.dot(Kh_, Zh)))
            else:
                Cu = tl.dot(Kw, tl.trans(Zj), input_precision=DOT)                 # [HB, 2 TP]
            tl.store(c_base + (TW2 + offs_j[:, None]) * TW2 + i_col[None, :], Cu, mask=(offs_i % TP < T)[None, :])
        # after the loop (a loop closing the kernel puts its exit inside the loop body: the report's path count)
        cv_ptrs = c_base + (TW2 + BC + offs_c[None, :]) * TW2 + offs_t[:, None]   # CvT[c, i]: i = t, T + t
        tl.store(cv_ptrs, Bf, mask=cv_mask)
        tl.store(cv_ptrs + T, Cq, mask=cv_mask)
