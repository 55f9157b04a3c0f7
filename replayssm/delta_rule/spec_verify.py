"""The ring verify's main kernel ("verify_fold" route): grid (cdiv(V, BV), batch, HV), one program per BV value
rows of a (row, value head); a row that folds this window (is_flush and a non-empty history) exits at once: the
fold specialization (spec_fold.py) computes its outputs while it folds, so its checkpoint is read once.

With the precompute's coefficients (spec_prep.py) every output row i of the window (i < T: the new ring row U_i,
i = T + s: the output o_s) is

    out[:, i] = sum_r (S0 X)[:, r] CzT[r, i] + sum_j u_j CuT[j, i] + sum_c v_c CvT[c, i]

    X [K, TW]     the window rows (k_0..k_{T-1}, q_0..q_{T-1}) as the verify received them (GDN: raw q / k, exact in
                  the activation dtype; KDA: the precompute's decayed vectors, fp32)
    u [BV, BC]    the history's u rows (exact in the ring's dtype), 0 past write_pos

So the kernel is one [BV, K] x [K, TW] product with the checkpoint walked in K chunks as its A operand, one
[BV, BC] x [BC, TW] product with the history, a [BV, TW] x [TW, TW] mix and T outer products. It never forms
S_h, holds no [TW, BV] solve, no gate or norm, and no fold code: its registers are those of one state chunk and
a [BV, TW] accumulator.

Dots: the state product is `state_dot` (_tl.py: _tl.replay_dot with a truncating
bf16 split of the state, 3 instructions per element) where the window rows are exact in bf16 (bf16x2) or tf32
(fp16 inputs, tf32x2); fp32 inputs take FP32_DOT (tf32x3 on sm_80+, ieee in the interpreter). The history product
is `replay_dot_rhs` (_tl.py: the split on the coefficients, the u rows exact). The mix (P @ CzT, both fp32) is
FP32_DOT. DOT / UDOT are chosen by the launcher from the window's and the ring's dtype; KDA's state vectors (fp32,
the precompute's) take "bf16x3" (bf16x3_dot below, both sides split: 3 MMAs) under 16-bit activations, FP32_DOT
under fp32 ones.
The K chunks are a static loop: every chunk's loads are issued before the first MMA needs them.

MIXED (KDA; the launcher's per-family workspace fact): the precompute has already applied Cz to its x rows
(x[i] = decay0 sum_r Cz[i, r] X_r, per value head, spec_prep_kda_kernel), so P = S0 x is the mix itself: no
CzT load, no [BV, TW] x [TW, TW] tf32x3 dot, the history product accumulates onto P in the MMA, and on sm_90 TW
is the launcher's TW2 (the 2T rows the prep writes: no dot needs 16 columns any more). AOT sm_90 Kimi-Linear b512 T4,
Triton 3.7.1: 69 registers, 852 SASS on the path, 141.0 us of issue (the CzT dot and _tl.bf16x3_dot's
round-to-nearest split: 80 registers, 1,123, 185.9 us).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_dot_rhs, split_bf16, split_tf32, state_dot


@triton.jit
def split_bf16_trunc(a):
    """fp32 a -> (hi, lo) in bf16, a = hi + lo + r: hi = a with its 16 low bits cleared (one LOP3, exact in bf16,
    |a - hi| < 2^-7 |a|), lo = bf16(a - hi) (a - hi exact in fp32), |r| <= 2^-7 |a - hi| < 2^-14 |a| under any
    faithful rounding: _tl.split_bf16's bound, for 3 instructions an element where its round-to-nearest hi costs 5
    (a convert, hi back to fp32, the subtraction, a convert, a pack)."""
    hi = (a.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return hi.to(tl.bfloat16), (a - hi).to(tl.bfloat16)


@triton.jit
def _rhs_dot_acc(a, b, acc, DOT: tl.constexpr):
    """acc + _tl.replay_dot_rhs(a, b, DOT), the product accumulated onto acc in the MMA (no second accumulator)."""
    if DOT == "bf16x2":
        hi, lo = split_bf16(b)
        aa = a.to(tl.bfloat16)
        return tl.dot(aa, lo, tl.dot(aa, hi, acc))
    elif DOT == "tf32x2":
        hi, lo = split_tf32(b)
        aa = a.to(tl.float32)
        return tl.dot(aa, lo, tl.dot(aa, hi, acc, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a.to(tl.float32), b, acc, input_precision=DOT)


@triton.jit
def bf16x3_dot(a, b):
    """a [M, C] fp32 @ b [C, N] fp32, neither exact in a 16-bit type: _tl.bf16x3_dot (ah bh + ah bl + al bh, fp32
    accumulation, within (3 * 2^-14 + C 2^-24) (|A| @ |B|)) with split_bf16_trunc's cheaper split on both sides."""
    ah, al = split_bf16_trunc(a)
    bh, bl = split_bf16_trunc(b)
    return tl.dot(al, bh, tl.dot(ah, bl, tl.dot(ah, bh)))


@triton.jit
def spec_verify_kernel(
    x_ptr, v_ptr, out_ptr, slots_ptr, wpos_ptr, origin_ptr, flush_ptr, state_ptr, ubuf_ptr, coef_ptr,
    stride_x_slot, stride_x_h, stride_x_r,
    stride_v_b, stride_v_t, stride_v_h, stride_o_b, stride_o_t, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v, stride_u_slot, stride_u_h, stride_u_l, stride_c_slot, stride_c_h,
    ring_mask,
    NULL_ID: tl.constexpr, X_GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    TW: tl.constexpr, TW2: tl.constexpr, BC: tl.constexpr, BV: tl.constexpr, BKT: tl.constexpr,
    FP32_DOT: tl.constexpr, DOT: tl.constexpr, UDOT: tl.constexpr, MIXED: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    if tl.load(flush_ptr + slot) != 0:
        if h > 0:
            return                               # a folding row: the fold specialization's (spec_fold.py)
    origin = tl.load(origin_ptr + slot)
    state_ptr += slot * stride_s_slot + i_hv * stride_s_h
    ubuf_ptr += slot * stride_u_slot + i_hv * stride_u_h
    coef_ptr += slot * stride_c_slot + i_hv * stride_c_h
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    offs_r = tl.arange(0, TW)
    x_ptrs = x_ptr + slot * stride_x_slot + (i_hv // X_GROUP) * stride_x_h + offs_r * stride_x_r   # [TW, K]: 0 past 2T

    # P = S0 X, the checkpoint as the A operand, K chunk by K chunk
    P = tl.zeros([BV, TW], dtype=tl.float32)
    for kc in tl.static_range((K + BKT - 1) // BKT):
        offs_k = kc * BKT + tl.arange(0, BKT)
        mask_k = offs_k < K
        S0 = tl.load(state_ptr + offs_v[:, None] * stride_s_v + offs_k[None, :],
                     mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)          # [BV, BKT]
        X = tl.load(x_ptrs[None, :] + offs_k[:, None], mask=mask_k[:, None],
                    other=0.0)                                                                   # [BKT, TW]
        if DOT == "bf16x3":
            P += bf16x3_dot(S0, X)                       # fp32 vectors (KDA's decayed ones): neither side exact
        else:
            P += state_dot(S0, X, DOT)

    window_outputs(P, v_ptr, out_ptr, ubuf_ptr, coef_ptr, i_b, i_hv, h, origin, offs_v, mask_v, stride_v_b,
                   stride_v_t, stride_v_h, stride_o_b, stride_o_t, stride_o_h, stride_u_l, ring_mask,
                   T, TW, TW2, BC, FP32_DOT, UDOT, MIXED)


@triton.jit
def window_outputs(P, v_ptr, out_ptr, ubuf_ptr, coef_ptr, i_b, i_hv, h, origin, offs_v, mask_v, stride_v_b,
                   stride_v_t, stride_v_h, stride_o_b, stride_o_t, stride_o_h, stride_u_l, ring_mask,
                   T: tl.constexpr, TW: tl.constexpr, TW2: tl.constexpr, BC: tl.constexpr, FP32_DOT: tl.constexpr,
                   UDOT: tl.constexpr, MIXED: tl.constexpr):
    """From P = S0 X [BV, TW]: out = P CzT + u_hist CuT + sum_c v_c CvT[c]; columns i < T are the window's u rows
    (stored at ring rows origin + h + i), columns T + s the outputs o_s (ubuf_ptr, coef_ptr: this row's and
    value head's). Shared by the verify and the fold specialization (spec_fold.py)."""
    offs_r = tl.arange(0, TW)
    is_k = offs_r < T
    is_q = (offs_r >= T) & (offs_r < 2 * T)
    tok = tl.where(is_q, offs_r - T, offs_r)
    # the history's u rows and the coefficients of this (row, value head)
    offs_c = tl.arange(0, BC)
    hist_rows = (origin + offs_c) & ring_mask
    Uh = tl.load(ubuf_ptr + hist_rows[None, :] * stride_u_l + offs_v[:, None],
                 mask=mask_v[:, None] & (offs_c < h)[None, :], other=0.0)                       # [BV, BC]
    cols = offs_r < TW2
    CuT = tl.load(coef_ptr + (TW2 + offs_c[:, None]) * TW2 + offs_r[None, :], mask=cols[None, :],
                  other=0.0)                                                                     # [BC, TW]
    if MIXED:
        out = _rhs_dot_acc(Uh, CuT, P, UDOT)              # X's rows already mixed by Cz (KDA's prep): P = S0 X Cz^T
    else:
        CzT = tl.load(coef_ptr + offs_r[:, None] * TW2 + offs_r[None, :], mask=cols[:, None] & cols[None, :],
                      other=0.0)                                                                 # [TW, TW]
        out = tl.dot(P, CzT, input_precision=FP32_DOT) + replay_dot_rhs(Uh, CuT, UDOT)
    for c in tl.static_range(T):
        v_c = tl.load(v_ptr + i_b * stride_v_b + c * stride_v_t + i_hv * stride_v_h + offs_v, mask=mask_v,
                      other=0.0).to(tl.float32)
        cv = tl.load(coef_ptr + (TW2 + BC + c) * TW2 + offs_r, mask=cols, other=0.0)
        out += v_c[:, None] * cv[None, :]

    win_rows = (origin + h + tok) & ring_mask
    tl.store(ubuf_ptr + win_rows[None, :] * stride_u_l + offs_v[:, None], out.to(ubuf_ptr.dtype.element_ty),
             mask=mask_v[:, None] & is_k[None, :])
    tl.store(out_ptr + i_b * stride_o_b + tok[None, :] * stride_o_t + i_hv * stride_o_h + offs_v[:, None],
             out.to(out_ptr.dtype.element_ty), mask=mask_v[:, None] & is_q[None, :])
