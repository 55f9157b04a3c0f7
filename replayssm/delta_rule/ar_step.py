"""The AR step's main kernel: grid (cdiv(V, BV), batch, HV), one program per BV value rows of a (row, value head).

Every step, flush rows included, is the output-only readout (prep workspace: ar_prep.py):

    Sk = x_mult (S0 k^) + sum_j ck_j u_j        = alpha S_h k^
    Sq = x_mult (S0 q^) + sum_j cq_j u_j        = alpha S_h q^
    u  = beta (v - Sk),  o = Sq + u (k^ . q^),  u appended at buffer row h

So the kernel holds no flush code and no tensor-core tile: its registers are those of the normal path whatever
the cursor (the flush is ar_fold.py's, launched after this one). It has no family flag either: what differs
between the delta-rule families lives in their prep, which writes x per key head (GDN: X_GROUP = HV / H value
heads read one row) or per value head (KDA, whose decayed vectors differ per value head: X_GROUP = 1).

Reductions: the checkpoint is walked in K chunks of BKC columns, and each chunk is multiplied into two [BV, BKC]
accumulators elementwise (one FMA per state element and vector, x_mult applied once to the sums); their two
cross-lane row sums happen once, at the end (a [32, 32] fp32 chunk over 4 warps puts 8 lanes along the columns:
3 shuffle rounds per sum), instead of a 32-lane sum per chunk. The buffer's u rows are a [BL, BV] tile in their
own layout (V contiguous, as the cache stores them), summed along the buffer axis on their own: adding them into
the state's accumulators instead would convert both [BV, BKC] accumulators to that layout through shared memory
(AOT, Triton 3.7.1: 54 LDS/STS, 13 BAR, 52 SHFL per warp; this way one [BV] vector per readout is converted).
All state chunks are loads in an unrolled static loop, issued before the first FMA needs them; the checkpoint's
address needs only the slot. EVEN_V / EVEN_K (heuristics: the tile divides V / K, as at every production
geometry) drop the masks and their predicate arithmetic. An int8 / e4m3 checkpoint (SCALED: the launcher passes
state_scale) is read as stored and its per-(slot, head) scale applied once, to x_mult: one scalar load.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.heuristics({"HAS_BUFFER": lambda a: a["L"] > 1, "EVEN_V": lambda a: a["V"] % a["BV"] == 0,
                    "EVEN_K": lambda a: a["K"] % a["BKC"] == 0, "SCALED": lambda a: a["scale_ptr"] is not None})
@triton.jit
def ar_step_kernel(
    v_ptr, beta_ptr, o_ptr, slots_ptr, wpos_ptr, state_ptr, ubuf_ptr, x_ptr, c_ptr, s_ptr, scale_ptr,
    stride_v_b, stride_v_h, stride_beta_b, stride_beta_h, stride_o_b, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v, stride_u_slot, stride_u_h, stride_u_l,
    stride_x_slot, stride_x_h, stride_c_slot, stride_c_h, stride_ws_slot, stride_ws_h, stride_sc_slot,
    NULL_ID: tl.constexpr, X_GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BV: tl.constexpr, BKC: tl.constexpr, BC: tl.constexpr, BL: tl.constexpr, HAS_BUFFER: tl.constexpr,
    EVEN_V: tl.constexpr, EVEN_K: tl.constexpr, SCALED: tl.constexpr,
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
    x_ptr += slot * stride_x_slot + (i_hv // X_GROUP) * stride_x_h
    c_ptr += slot * stride_c_slot + i_hv * stride_c_h
    s_ptr += slot * stride_ws_slot + i_hv * stride_ws_h

    acc_k = tl.zeros([BV, BKC], dtype=tl.float32)
    acc_q = tl.zeros([BV, BKC], dtype=tl.float32)
    for kc in tl.static_range(triton.cdiv(K, BKC)):
        offs_k = kc * BKC + tl.arange(0, BKC)
        s_ptrs = state_ptr + offs_v[:, None] * stride_s_v + offs_k[None, :]
        if EVEN_V and EVEN_K:
            S0 = tl.load(s_ptrs).to(tl.float32)                                                 # [BV, BKC]
        else:
            S0 = tl.load(s_ptrs, mask=mask_v[:, None] & (offs_k < K)[None, :], other=0.0).to(tl.float32)
        if EVEN_K:
            xk = tl.load(x_ptr + offs_k)
            xq = tl.load(x_ptr + K + offs_k)
        else:
            xk = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
            xq = tl.load(x_ptr + K + offs_k, mask=offs_k < K, other=0.0)
        acc_k += S0 * xk[None, :]
        acc_q += S0 * xq[None, :]
    x_mult = tl.load(s_ptr)
    if SCALED:                  # int8 / e4m3: the head's scale multiplies the two sums, not every element
        x_mult *= tl.load(scale_ptr + slot * stride_sc_slot + i_hv)
    Sk = tl.sum(acc_k, 1) * x_mult                           # the two cross-lane reductions of the state
    Sq = tl.sum(acc_q, 1) * x_mult
    h = tl.load(wpos_ptr + slot)
    if HAS_BUFFER:
        offs_l = tl.arange(0, BL)
        U = tl.load(ubuf_ptr + offs_l[:, None] * stride_u_l + offs_v[None, :],
                    mask=(offs_l < h)[:, None] & mask_v[None, :], other=0.0).to(tl.float32)          # [BL, BV]
        Sk += tl.sum(U * tl.load(c_ptr + offs_l)[:, None], 0)
        Sq += tl.sum(U * tl.load(c_ptr + BC + offs_l)[:, None], 0)

    kq = tl.load(s_ptr + 1)
    beta = tl.load(beta_ptr + i_b * stride_beta_b + i_hv * stride_beta_h)
    v = tl.load(v_ptr + i_b * stride_v_b + i_hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    u = beta * (v - Sk)
    tl.store(o_ptr + i_b * stride_o_b + i_hv * stride_o_h + offs_v, (Sq + u * kq).to(o_ptr.dtype.element_ty),
             mask=mask_v)
    tl.store(ubuf_ptr + h * stride_u_l + offs_v, u.to(ubuf_ptr.dtype.element_ty), mask=mask_v)
