"""The AR step's main kernel: grid (cdiv(V, BV), batch, HV), one program per BV value rows of a (row, value head).

Every step, flush rows included, is the output-only readout (prep workspace: ar_prep.py):

    Sk = x_mult (S0 k^) + sum_j ck_j u_j        = alpha S_h k^
    Sq = x_mult (S0 q^) + sum_j cq_j u_j        = alpha S_h q^
    u  = beta (v - Sk),  o = Sq + u (k^ . q^),  u appended at buffer row h

So the kernel holds no flush code and no tensor-core tile: its registers are those of the normal path whatever
the cursor (the flush is ar_fold.py's, launched after this one). It has no family flag either: what differs
between the delta-rule families lives in their prep.

Reductions: the checkpoint is walked in K chunks of BKC columns, and each chunk is multiplied into two [BV, BKC]
accumulators elementwise (one FMA per state element and vector); the buffer's u rows are one more such chunk
(coefficients in place of k^ / q^, the buffer axis padded to BC, a multiple of BKC). The two cross-lane row sums
happen once, at the end (a [32, 32] fp32 chunk over 4 warps puts 8 lanes along the columns: 3 shuffle rounds
per sum), instead of a 32-lane sum per chunk and per buffered key. All state chunks are loads in an unrolled
static loop, issued before the first FMA needs them; the checkpoint's address needs only the slot.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.heuristics({"HAS_BUFFER": lambda a: a["L"] > 1})
@triton.jit
def ar_step_kernel(
    v_ptr, beta_ptr, o_ptr, slots_ptr, wpos_ptr, state_ptr, ubuf_ptr, x_ptr, c_ptr, s_ptr,
    stride_v_b, stride_v_h, stride_beta_b, stride_beta_h, stride_o_b, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v, stride_u_slot, stride_u_h, stride_u_l,
    stride_x_slot, stride_x_h, stride_c_slot, stride_c_h, stride_ws_slot, stride_ws_h,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BV: tl.constexpr, BKC: tl.constexpr, BC: tl.constexpr, HAS_BUFFER: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    # base pointers advanced once
    state_ptr += slot * stride_s_slot + i_hv * stride_s_h
    ubuf_ptr += slot * stride_u_slot + i_hv * stride_u_h
    x_ptr += slot * stride_x_slot + (i_hv // HV_PER_H) * stride_x_h
    c_ptr += slot * stride_c_slot + i_hv * stride_c_h
    s_ptr += slot * stride_ws_slot + i_hv * stride_ws_h
    h = tl.load(wpos_ptr + slot)
    x_mult = tl.load(s_ptr)
    kq = tl.load(s_ptr + 1)

    acc_k = tl.zeros([BV, BKC], dtype=tl.float32)
    acc_q = tl.zeros([BV, BKC], dtype=tl.float32)
    for kc in tl.static_range(triton.cdiv(K, BKC)):
        offs_k = kc * BKC + tl.arange(0, BKC)
        mask_k = offs_k < K
        S0 = tl.load(state_ptr + offs_v[:, None] * stride_s_v + offs_k[None, :],
                     mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)      # [BV, BKC]
        xk = tl.load(x_ptr + offs_k, mask=mask_k, other=0.0) * x_mult
        xq = tl.load(x_ptr + K + offs_k, mask=mask_k, other=0.0) * x_mult
        acc_k += S0 * xk[None, :]
        acc_q += S0 * xq[None, :]
    if HAS_BUFFER:
        for cc in tl.static_range(BC // BKC):
            offs_c = cc * BKC + tl.arange(0, BKC)
            U = tl.load(ubuf_ptr + offs_c[None, :] * stride_u_l + offs_v[:, None],
                        mask=mask_v[:, None] & (offs_c < h)[None, :], other=0.0).to(tl.float32)   # [BV, BKC]
            acc_k += U * tl.load(c_ptr + offs_c)[None, :]
            acc_q += U * tl.load(c_ptr + BC + offs_c)[None, :]
    Sk = tl.sum(acc_k, 1)                                    # the two cross-lane reductions of the program
    Sq = tl.sum(acc_q, 1)

    beta = tl.load(beta_ptr + i_b * stride_beta_b + i_hv * stride_beta_h)
    v = tl.load(v_ptr + i_b * stride_v_b + i_hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    u = beta * (v - Sk)
    tl.store(o_ptr + i_b * stride_o_b + i_hv * stride_o_h + offs_v, (Sq + u * kq).to(o_ptr.dtype.element_ty),
             mask=mask_v)
    tl.store(ubuf_ptr + h * stride_u_l + offs_v, u.to(ubuf_ptr.dtype.element_ty), mask=mask_v)
