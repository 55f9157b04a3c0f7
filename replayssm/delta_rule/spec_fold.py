"""The ring verify's fold specialization ("verify_fold" route): grid (cdiv(V, BV), batch, HV), launched after the
verify (spec_verify.py), the other specialization of the same window; every program of a row that does not fold
this window (is_flush 0, or an empty history) returns after its cursor loads, and the verify returns on the rows
this kernel takes.

A folding row's checkpoint becomes the committed state, S0 <- S_h (the ring protocol, replayssm/gdn/ring.py):

    GDN: S0 <- exp(G_tot) S0 + (u^T * w) @ k_hist              w_j = exp(G_tot - G_pre_j), scalar per entry
    KDA: S0 <- S0 diag(exp(G_tot)) + u^T @ (k_hist * w)        w[j, c] = exp(G_tot[c] - G_pre_j[c]) per channel

over the h committed history rows (origin + j) & (ring_len - 1), walked over K in chunks of BKT columns and
stored per chunk. The same chunks feed the verify's product P = S0 X (spec_verify.py) before they are
overwritten, and the row's outputs and u rows follow from P exactly as in the verify (window_outputs): the
checkpoint is read once and written once, and a row that does not fold never sees this kernel's registers.
The window's rows (written by the prep and by this kernel) are not history rows, which is all the fold reads.

The fold's weights come from the prep (wt, spec_launch.workspace): row 0 exp(G_tot), rows 1 + j w_j, at a K
stride that is 0 when they do not vary along K (GDN). W_ALONG_K is that stride's test, a @triton.heuristics
layout fact of the arguments (the launcher passes no family flag).
Dots: the state product as the verify's (state_dot); the fold's, weights constant along K: on the u rows once,
the keys exact (_tl.replay_dot: bf16x2 / tf32x2 by the ring's key dtype, KDOT; the split hoisted out of the
chunks); weights along K: on the keys per chunk, the u rows exact (_tl.replay_dot_rhs, UDOT).
Cost: the verify's product plus a [BV, BC] x [BC, BKT] fold dot per chunk, 16-column chunks (32 columns: 106
registers, 1.4x the issue time). kernel_report, Qwen3.5-122B b512 T4, sm_90, Triton 3.7.1: 82 registers, 618 us
(the in-kernel replay weights of 3a0e645: 71, 538 us; the weights on the keys in every chunk: 84, 784 us).
Kimi-Linear b512 T4 (KDA: MIXED x rows of TW2 = 8, no CzT dot, spec_verify.py; the truncating bf16x3 split):
73 registers, 1,580 SASS on the shortest path, 261.5 us (was 71, 1,863, 308.3 us).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_dot, replay_dot_rhs, state_dot
from replayssm.delta_rule.spec_verify import bf16x3_dot, window_outputs


# a layout fact of the weights the prep wrote, derived from their K stride (not passed by the launcher)
@triton.heuristics({"W_ALONG_K": lambda args: args["stride_w_k"] != 0})
@triton.jit
def spec_fold_kernel(
    x_ptr, v_ptr, out_ptr, slots_ptr, wpos_ptr, origin_ptr, flush_ptr, state_ptr, ubuf_ptr, coef_ptr,
    kring_ptr, wt_ptr,
    stride_x_slot, stride_x_h, stride_x_r,
    stride_v_b, stride_v_t, stride_v_h, stride_o_b, stride_o_t, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v, stride_u_slot, stride_u_h, stride_u_l, stride_c_slot, stride_c_h,
    stride_kr_slot, stride_kr_h, stride_kr_l, stride_w_slot, stride_w_h, stride_w_l, stride_w_k,
    ring_mask,
    NULL_ID: tl.constexpr, GROUP: tl.constexpr, X_GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    T: tl.constexpr, TW: tl.constexpr, TW2: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr, BKT: tl.constexpr,
    FP32_DOT: tl.constexpr, DOT: tl.constexpr, UDOT: tl.constexpr, KDOT: tl.constexpr, W_ALONG_K: tl.constexpr,
    MIXED: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    if tl.load(flush_ptr + slot) == 0:
        return                                   # not this row's flush: the verify's
    h = tl.load(wpos_ptr + slot)
    if h == 0:
        return                                   # nothing committed since the checkpoint: the verify's
    origin = tl.load(origin_ptr + slot)
    kh = i_hv // GROUP
    state_ptr += slot * stride_s_slot + i_hv * stride_s_h
    ubuf_ptr += slot * stride_u_slot + i_hv * stride_u_h
    coef_ptr += slot * stride_c_slot + i_hv * stride_c_h
    kring_ptr += slot * stride_kr_slot + kh * stride_kr_h
    wt_ptr += slot * stride_w_slot + i_hv * stride_w_h
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    offs_r = tl.arange(0, TW)
    x_ptrs = x_ptr + slot * stride_x_slot + (i_hv // X_GROUP) * stride_x_h + offs_r * stride_x_r   # [TW, K]: 0 past 2T
    offs_c = tl.arange(0, BC)
    mask_c = offs_c < h
    rows = (origin + offs_c) & ring_mask
    U = tl.load(ubuf_ptr + rows[None, :] * stride_u_l + offs_v[:, None],
                mask=mask_v[:, None] & mask_c[None, :], other=0.0)                               # [BV, BC]
    if not W_ALONG_K:
        # one weight per history entry (K stride 0): applied to the u rows once, the keys stay exact
        decay0 = tl.load(wt_ptr)
        Uw = U.to(tl.float32) * tl.load(wt_ptr + (1 + offs_c) * stride_w_l, mask=mask_c, other=0.0)[None, :]

    P = tl.zeros([BV, TW], dtype=tl.float32)
    for kc in tl.static_range((K + BKT - 1) // BKT):
        offs_k = kc * BKT + tl.arange(0, BKT)
        mask_k = offs_k < K
        s_ptrs = state_ptr + offs_v[:, None] * stride_s_v + offs_k[None, :]
        s_mask = mask_v[:, None] & mask_k[None, :]
        S0 = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)                            # [BV, BKT]
        X = tl.load(x_ptrs[None, :] + offs_k[:, None], mask=mask_k[:, None],
                    other=0.0)                                                                   # [BKT, TW]
        if DOT == "bf16x3":
            P += bf16x3_dot(S0, X)
        else:
            P += state_dot(S0, X, DOT)
        cm = mask_c[:, None] & mask_k[None, :]
        kb = tl.load(kring_ptr + rows[:, None] * stride_kr_l + offs_k[None, :], mask=cm, other=0.0)   # [BC, BKT]
        if W_ALONG_K:
            # the prep's replay weights per key channel: row 0 exp(G_tot), rows 1 + j w_j (0 past h)
            decay_k = tl.load(wt_ptr + offs_k * stride_w_k, mask=mask_k, other=0.0)               # [BKT]
            w_k = tl.load(wt_ptr + (1 + offs_c[:, None]) * stride_w_l + offs_k[None, :] * stride_w_k, mask=cm,
                          other=0.0)                                                             # [BC, BKT]
            S = S0 * decay_k[None, :] + replay_dot_rhs(U, kb.to(tl.float32) * w_k, UDOT)
        else:
            S = decay0 * S0 + replay_dot(Uw, kb, KDOT)
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)

    window_outputs(P, v_ptr, out_ptr, ubuf_ptr, coef_ptr, i_b, i_hv, h, origin, offs_v, mask_v, stride_v_b,
                   stride_v_t, stride_v_h, stride_o_b, stride_o_t, stride_o_h, stride_u_l, ring_mask,
                   T, TW, TW2, BC, FP32_DOT, UDOT, MIXED)
