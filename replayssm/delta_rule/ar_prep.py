"""The AR step's precompute, launched first: GDN's ar_prep_kernel, grid (batch, H), one program per (row, key
head); KDA's ar_prep_channel_kernel, grid (batch, HV), one per (row, value head) (its docstring).

Everything the step needs that does not depend on the value tile, computed once per key head instead of once per
program of the main kernel (16 of them per key head at Qwen3.5-122B: 4 value heads x 4 V tiles):

    x [slots, H, 2, K]    k^ and q^ (L2-normalised if asked; q^ also scaled), fp32
    c [slots, HV, 2, BC]  the buffer's readout coefficients, 0 for j >= h:
                          ck_j = alpha w_j (k_j . k^),  cq_j = alpha w_j (k_j . q^)
    s [slots, HV, 2]      x_mult = alpha exp(G_tot) (the checkpoint's factor) and k^ . q^

with alpha = exp(g) of the current token and w_j, G_tot the replay weights of the h buffered entries (_tl.py),
so that the main step's readout is
    alpha S_h x^ = x_mult (S0 x^) + sum_j c_j u_j          (x = k or q; S_h is never formed)
The workspace is indexed by slot (unique within a step), not by batch row: its size is fixed at the pool's.

It also appends the token's key (rounded to the buffer's dtype) and its log decays at buffer row h, on every
step, h = L-1 included: on a flush the current token becomes the buffer's last entry and the fold
(ar_fold.py) replays all L of them. Each key-head program is the one writer of its key and of the g rows of
its value heads; the main step writes only u rows and the output.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import replay_weights


@triton.heuristics({"HAS_BUFFER": lambda a: a["L"] > 1})
@triton.jit
def ar_prep_kernel(
    q_ptr, k_ptr, g_ptr, slots_ptr, wpos_ptr, kbuf_ptr, gbuf_ptr, x_ptr, c_ptr, s_ptr,
    stride_q_b, stride_q_h, stride_k_b, stride_k_h, stride_g_b, stride_g_h,
    stride_kb_slot, stride_kb_h, stride_kb_l, stride_gb_slot, stride_gb_h, stride_gb_l,
    stride_x_slot, stride_x_h, stride_c_slot, stride_c_h, stride_s_slot, stride_s_h,
    scale,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BC: tl.constexpr, BL: tl.constexpr, BG: tl.constexpr, USE_L2NORM: tl.constexpr,
    HAS_BUFFER: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    # base pointers advanced once: the row's q / k / g, the slot's buffers and workspace at this key head
    q_ptr += i_b * stride_q_b + i_h * stride_q_h
    k_ptr += i_b * stride_k_b + i_h * stride_k_h
    g_ptr += i_b * stride_g_b + i_h * HV_PER_H * stride_g_h
    kbuf_ptr += slot * stride_kb_slot + i_h * stride_kb_h
    gbuf_ptr += slot * stride_gb_slot + i_h * HV_PER_H * stride_gb_h
    x_ptr += slot * stride_x_slot + i_h * stride_x_h
    c_ptr += slot * stride_c_slot + i_h * HV_PER_H * stride_c_h
    s_ptr += slot * stride_s_slot + i_h * HV_PER_H * stride_s_h

    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    q = tl.load(q_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q * (scale / tl.sqrt(tl.sum(q * q, 0) + 1e-6))
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))
    else:
        q = q * scale
    kq = tl.sum(k * q, 0)
    tl.store(x_ptr + offs_k, k, mask=mask_k)
    tl.store(x_ptr + K + offs_k, q, mask=mask_k)

    # the value heads of this key head ([BG], padded to a power of two) and the buffer's rows ([BL]; c's columns
    # from BL to BC, the step's chunk padding, keep the zeros they were allocated with)
    offs_r = tl.arange(0, BG)
    mask_r = offs_r < HV_PER_H
    offs_c = tl.arange(0, BL)
    mask_c = offs_c < h
    g_cur = tl.load(g_ptr + offs_r * stride_g_h, mask=mask_r, other=0.0)                     # [BG]
    alpha = tl.exp(g_cur)
    if HAS_BUFFER:
        kb = tl.load(kbuf_ptr + offs_c[:, None] * stride_kb_l + offs_k[None, :],
                     mask=mask_c[:, None] & mask_k[None, :], other=0.0).to(tl.float32)       # [BL, BK]
        ck = tl.sum(kb * k[None, :], 1)                                                     # [BL]: k_j . k^
        cq = tl.sum(kb * q[None, :], 1)
        rc_mask = mask_r[:, None] & mask_c[None, :]
        g_hist = tl.load(gbuf_ptr + offs_r[:, None] * stride_gb_h + offs_c[None, :] * stride_gb_l, mask=rc_mask,
                         other=0.0)                                                          # [BG, BL]
        decay0, w = replay_weights(g_hist, rc_mask, 1)
        coef = alpha[:, None] * w                                                            # [BG, BL]
        c_ptrs = c_ptr + offs_r[:, None] * stride_c_h + offs_c[None, :]
        tl.store(c_ptrs, coef * ck[None, :], mask=mask_r[:, None])
        tl.store(c_ptrs + BC, coef * cq[None, :], mask=mask_r[:, None])
        x_mult = alpha * decay0
    else:
        x_mult = alpha
    s_ptrs = s_ptr + offs_r * stride_s_h
    tl.store(s_ptrs, x_mult, mask=mask_r)
    tl.store(s_ptrs + 1, tl.zeros([BG], tl.float32) + kq, mask=mask_r)

    # append the token's key and log decays at row h (a flush's row L-1 too: the fold's last entry)
    tl.store(kbuf_ptr + h * stride_kb_l + offs_k, k.to(kbuf_ptr.dtype.element_ty), mask=mask_k)
    tl.store(gbuf_ptr + offs_r * stride_gb_h + h * stride_gb_l, g_cur, mask=mask_r)


@triton.heuristics({"HAS_BUFFER": lambda a: a["L"] > 1})
@triton.jit
def ar_prep_channel_kernel(
    q_ptr, k_ptr, g_ptr, slots_ptr, wpos_ptr, kbuf_ptr, gbuf_ptr, x_ptr, c_ptr, s_ptr,
    stride_q_b, stride_q_h, stride_k_b, stride_k_h, stride_g_b, stride_g_h,
    stride_kb_slot, stride_kb_h, stride_kb_l, stride_gb_slot, stride_gb_h, stride_gb_l,
    stride_x_slot, stride_x_h, stride_c_slot, stride_c_h, stride_s_slot, stride_s_h,
    scale,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BC: tl.constexpr, BL: tl.constexpr, USE_L2NORM: tl.constexpr, HAS_BUFFER: tl.constexpr,
):
    """KDA's prep (a log decay per key channel, g [batch, HV, K], buffer g [slots, HV, L, K]): grid (batch, HV),
    one program per (row, value head), since the decays, hence the readout vectors, differ per value head.
    With alpha = exp(g) [K] of the current token and decay0 = exp(G_tot), W[j] = exp(G_tot - G_pre_j) [K]:

        x [slots, HV, 2, K]   alpha decay0 k^ and alpha decay0 q^  (so S0 x = S0 diag(exp(G_tot)) (alpha x^))
        c [slots, HV, 2, BC]  ck_j = (W_j alpha k_j) . k^,  cq_j = (W_j alpha k_j) . q^
        s [slots, HV, 2]      x_mult = 1 and k^ . q^

    so the main step (ar_step.py, X_GROUP = 1) is GDN's unchanged. The [h, K] decay tile is read, scanned and
    exponentiated here once per (row, value head), where the shipped route does it in each of the V tiles'
    programs. Every factor is a decay in (0, 1] (W, alpha, decay0): no overflow for any L or gate. A value head
    group's first program appends the key (one writer per key head); each program appends its own g row."""
    i_b = tl.program_id(0).to(tl.int64)
    i_hv = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    h = tl.load(wpos_ptr + slot)
    i_h = i_hv // HV_PER_H
    q_ptr += i_b * stride_q_b + i_h * stride_q_h
    k_ptr += i_b * stride_k_b + i_h * stride_k_h
    g_ptr += i_b * stride_g_b + i_hv * stride_g_h
    kbuf_ptr += slot * stride_kb_slot + i_h * stride_kb_h
    gbuf_ptr += slot * stride_gb_slot + i_hv * stride_gb_h
    x_ptr += slot * stride_x_slot + i_hv * stride_x_h
    c_ptr += slot * stride_c_slot + i_hv * stride_c_h
    s_ptr += slot * stride_s_slot + i_hv * stride_s_h

    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    q = tl.load(q_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q * (scale / tl.sqrt(tl.sum(q * q, 0) + 1e-6))
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, 0) + 1e-6))
    else:
        q = q * scale
    g_cur = tl.load(g_ptr + offs_k, mask=mask_k, other=0.0)                                   # [BK]
    alpha = tl.exp(g_cur)
    if HAS_BUFFER:
        offs_c = tl.arange(0, BL)             # the buffer's rows only: c's padding past L stays the zeros it started as
        ck_mask = (offs_c < h)[:, None] & mask_k[None, :]
        kb = tl.load(kbuf_ptr + offs_c[:, None] * stride_kb_l + offs_k[None, :], mask=ck_mask,
                     other=0.0).to(tl.float32)                                                 # [BL, BK]
        g_hist = tl.load(gbuf_ptr + offs_c[:, None] * stride_gb_l + offs_k[None, :], mask=ck_mask, other=0.0)
        decay0, W = replay_weights(g_hist, ck_mask, 0)                                          # [BK], [BL, BK]
        kw = kb * W * alpha[None, :]
        tl.store(c_ptr + offs_c, tl.sum(kw * k[None, :], 1))
        tl.store(c_ptr + BC + offs_c, tl.sum(kw * q[None, :], 1))
        a = alpha * decay0
    else:
        a = alpha
    tl.store(x_ptr + offs_k, a * k, mask=mask_k)
    tl.store(x_ptr + K + offs_k, a * q, mask=mask_k)
    tl.store(s_ptr, 1.0)
    tl.store(s_ptr + 1, tl.sum(k * q, 0))

    # append the token's key (the group's first value head) and its decays at row h
    if i_hv % HV_PER_H == 0:
        tl.store(kbuf_ptr + h * stride_kb_l + offs_k, k.to(kbuf_ptr.dtype.element_ty), mask=mask_k)
    tl.store(gbuf_ptr + h * stride_gb_l + offs_k, g_cur, mask=mask_k)
