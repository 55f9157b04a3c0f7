"""The AR step's flush: grid (cdiv(V, BV), batch, HV), launched after the main step (ar_step.py); every program
of a row whose cursor is not at L-1 returns at once.

On a flush step the prep (ar_prep.py) has appended the token's key and log decay at buffer row L-1 and the main
step its u, so the buffer holds all L entries and the fold is one uniform replay of the whole buffer:

    S0 <- S0 diag(exp(G_tot)) + u^T @ (W * k_buf)        ([BV, BC] @ [BC, BKT] per K chunk)
    G_pre[j, c] = g_0[c] + .. + g_j[c] (inclusive),  G_tot = G_pre[L-1],  W[j, c] = exp(G_tot[c] - G_pre[j, c])

One kernel for both delta-rule families, with no family flag: the log decays are read as a [BC, BKT] tile at
`stride_gb_k` along K, which is KDA's 1 (a decay per key channel) and GDN's 0 (one decay per head and entry,
broadcast along the chunk). GDN pays L x BKT exps per chunk where L would do, on 1/L of the steps. Every factor
exp(G_tot - G_pre) is in (0, 1] (g <= 0: a decay), so no weight overflows, whatever L and the gate; nothing is
pre-multiplied by exp(-G_pre) (the pre-decayed-key form, whose exp(-G_pre) grows without bound with L |g|).

Walked over K in chunks of BKT columns (a runtime loop: one [BV, BKT] chunk live at a time), stored per chunk.
Why a separate kernel and not a branch of the step (the shipped route) or a re-walk inside it:
  - the step then never carries the flush's registers (the shipped step: normal path alone 85 registers,
    flush alone 162, both 125 / 163 under Triton 3.7.1 / 3.6.0), and the fold never holds a whole [BV, K]
    tile or waits for u: u is already in the buffer;
  - the fold's own register budget is set by one chunk and its [BC, BKT] weights, so it can stream;
  - the cost: one early-exit grid per step (two loads per program) and, on flush rows, a second read of the
    checkpoint (L2-hot when the fold follows the step closely, HBM otherwise) and of the buffer. A fused
    circular-checkpoint fold (store the history-only rebuild inside the step) would avoid the second read but
    puts a tensor-core dot and its registers back into the step: that is what R1 exists to remove.
The u and k of the current token enter the fold rounded to the buffer's dtype, exactly as every earlier entry
does (the shipped route folds the current token's fp32 u and k): one more rounding of the kind every
replayed entry already has.

Stochastic-rounding state formats (float16_sr / bfloat16_sr, replayssm/state_format.py; SR, a heuristic: the
launcher passes the cache's sr_step counter, None for every other format, whose build is unchanged): each stored
chunk goes through stochastic_rounding.sr_round with key (sr_seed, sr_step[slot]) and the element's flat index in
the slot's [HV, V, K] block (one Philox call per 4 consecutive elements along K: rows aligned when K % 4 == 0, else
the per-element fallback), the bits sr_round_torch draws for the torch / ref backends' write, with
its non-finite guard (NaN -> 0, saturation at the format's max). Every program of the row reads the same counter;
sr_advance_kernel (below, launched after the fold) advances it on the device, so no host state changes per step.
int8 / e4m3 (SCALED, a heuristic: the launcher passes the cache's state_scale, None otherwise): the per-(slot,
head) scale is an absmax over the whole new head, so the launcher gives one program the whole head (BV >= V, grid
dimension 0 of 1) and the program walks it twice, the absmax pass then the quantised store (scaled_rounding.py:
state_format.quantize_scaled's rule bit for bit). The old scale is applied to each loaded element.

The dot is `replay_dot_rhs` (_tl.py): the u rows stay in their stored dtype (exact in a 16-bit MMA) and the fp32
weighted keys W * k are split: bf16x2 for bf16 buffers, tf32x2 for fp16, FP32_DOT (tf32x3; ieee in the
interpreter) for fp32, chosen by a heuristic on the buffer's dtype, with the error bound stated there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.delta_rule._tl import key_dot, replay_dot_rhs, replay_weights
from replayssm.scaled_rounding import finite_absmax_rows, head_scale, quantize
from replayssm.stochastic_rounding import sr_key, sr_round


@triton.jit
def _folded_chunk(state_ptr, kbuf_ptr, gbuf_ptr, U, offs_v, mask_v, offs_c, mask_c, kt, in_scale,
                  stride_s_v, stride_kb_l, stride_gb_l, stride_gb_k, K: tl.constexpr, BKT: tl.constexpr,
                  DOT: tl.constexpr, SCALED: tl.constexpr):
    """The folded state of K chunk `kt` of the V rows offs_v: (S [BV, BKT] fp32, its addresses, its mask).
    SCALED: the stored chunk is dequantised element by element (q * in_scale, state_format.dequantize's
    product), so the value is bit for bit the one a float32 state holding the same numbers folds to."""
    offs_k = kt * BKT + tl.arange(0, BKT)
    mask_k = offs_k < K
    s_ptrs = state_ptr + offs_v[:, None] * stride_s_v + offs_k[None, :]
    s_mask = mask_v[:, None] & mask_k[None, :]
    S0 = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    if SCALED:
        S0 = S0 * in_scale
    ck_mask = mask_c[:, None] & mask_k[None, :]
    kb = tl.load(kbuf_ptr + offs_c[:, None] * stride_kb_l + offs_k[None, :], mask=ck_mask,
                 other=0.0).to(tl.float32)                                                         # [BC, BKT]
    g = tl.load(gbuf_ptr + offs_c[:, None] * stride_gb_l + offs_k[None, :] * stride_gb_k, mask=ck_mask, other=0.0)
    decay0, W = replay_weights(g, ck_mask, 0)                                                      # [BKT], [BC, BKT]
    return decay0[None, :] * S0 + replay_dot_rhs(U, W * kb, DOT), s_ptrs, s_mask


@triton.heuristics({"DOT": lambda a: key_dot(a["ubuf_ptr"].dtype, a["FP32_DOT"]),
                    "SR": lambda a: a["sr_step_ptr"] is not None,
                    "SCALED": lambda a: a["scale_ptr"] is not None})
@triton.jit(do_not_specialize=["sr_seed"])
def ar_fold_kernel(
    slots_ptr, wpos_ptr, state_ptr, ubuf_ptr, kbuf_ptr, gbuf_ptr, sr_step_ptr, sr_seed, scale_ptr,
    stride_s_slot, stride_s_h, stride_s_v, stride_u_slot, stride_u_h, stride_u_l,
    stride_kb_slot, stride_kb_h, stride_kb_l, stride_gb_slot, stride_gb_h, stride_gb_l, stride_gb_k,
    stride_sc_slot,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BV: tl.constexpr, BKT: tl.constexpr, BC: tl.constexpr, FP32_DOT: tl.constexpr, DOT: tl.constexpr,
    SR: tl.constexpr, SCALED: tl.constexpr, QMAX: tl.constexpr = 127.0, IS_INT8: tl.constexpr = True,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    if tl.load(wpos_ptr + slot) != L - 1:
        return                                  # not this row's flush step
    state_ptr += slot * stride_s_slot + i_hv * stride_s_h
    ubuf_ptr += slot * stride_u_slot + i_hv * stride_u_h
    kbuf_ptr += slot * stride_kb_slot + (i_hv // HV_PER_H) * stride_kb_h
    gbuf_ptr += slot * stride_gb_slot + i_hv * stride_gb_h
    offs_v = i_v * BV + tl.arange(0, BV)        # SCALED: BV >= V and one program per head (the launcher's grid)
    mask_v = offs_v < V
    offs_c = tl.arange(0, BC)
    mask_c = offs_c < L
    U = tl.load(ubuf_ptr + offs_c[None, :] * stride_u_l + offs_v[:, None],
                mask=mask_v[:, None] & mask_c[None, :], other=0.0)                                  # [BV, BC]
    in_scale = 1.0
    if SCALED:
        # int8 / e4m3 (scaled_rounding.py): the head's new scale is the absmax of the whole new head, so a first
        # pass folds every chunk for its absmax alone, and the second folds it again and stores it quantised
        # (in place: each chunk's old values are read before its own store, and by the same program only)
        scale_ptr += slot * stride_sc_slot + i_hv
        in_scale = tl.load(scale_ptr)
        absmax = tl.zeros([BV], dtype=tl.float32)
        for kt in tl.range(0, (K + BKT - 1) // BKT):
            S, s_ptrs, s_mask = _folded_chunk(state_ptr, kbuf_ptr, gbuf_ptr, U, offs_v, mask_v, offs_c, mask_c,
                                              kt, in_scale, stride_s_v, stride_kb_l, stride_gb_l, stride_gb_k,
                                              K, BKT, DOT, SCALED)
            absmax = tl.maximum(absmax, finite_absmax_rows(S, s_mask))
        out_scale = head_scale(tl.max(absmax, 0), QMAX)
    if SR:
        key = sr_key(sr_seed, tl.load(sr_step_ptr + slot))                    # this write's draws
    for kt in tl.range(0, (K + BKT - 1) // BKT):        # constexpr bound: a loop, not unrolled
        S, s_ptrs, s_mask = _folded_chunk(state_ptr, kbuf_ptr, gbuf_ptr, U, offs_v, mask_v, offs_c, mask_c, kt,
                                          in_scale, stride_s_v, stride_kb_l, stride_gb_l, stride_gb_k, K, BKT, DOT,
                                          SCALED)
        if SR:                                  # each row's first element index: (hv, v, kt BKT) of [HV, V, K]
            first = i_hv * (V * K) + offs_v * K + kt * BKT
            S = sr_round(S, key, slot, first, state_ptr.dtype.element_ty, ALIGNED=K % 4 == 0)
        if SCALED:
            S = quantize(S, out_scale, QMAX, IS_INT8)
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)
    if SCALED:
        tl.store(scale_ptr, out_scale)


@triton.heuristics({"AT_FLUSH": lambda a: a["wpos_ptr"] is not None})
@triton.jit
def sr_advance_kernel(slots_ptr, wpos_ptr, sr_step_ptr, batch, L: tl.constexpr, BLOCK: tl.constexpr,
                      AT_FLUSH: tl.constexpr):
    """sr_step[slot] += 1 for every live row (slot >= 0; NULL_SLOT rows skipped) of a launch that wrote an SR
    state: AT_FLUSH (a cursor given), only the rows at their flush step (cursor >= L-1, read before the cursor
    advance); without a cursor (a baseline step writes every live row), all of them. Grid (cdiv(batch, BLOCK),).
    Launched after the write, so every program of the write read the counter before it moves; on the device, so a
    captured graph replays with fresh draws. Used by ReplaySSM's folds (GDN / KDA here, Mamba-2's ar_kernels.py)
    and the baselines' AR steps."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < batch
    slot = tl.load(slots_ptr + offs, mask=live, other=-1)
    live = live & (slot >= 0)
    if AT_FLUSH:
        live = live & (tl.load(wpos_ptr + slot, mask=live, other=0) >= L - 1)
    tl.store(sr_step_ptr + slot, tl.load(sr_step_ptr + slot, mask=live, other=0) + 1, mask=live)


def launch_sr_advance(slots, wpos, sr_step, L: int = 1) -> None:
    """sr_advance_kernel over slots int32 [batch] (wpos None: every live row; else its flush rows)."""
    batch = slots.shape[0]
    block = min(1024, max(16, triton.next_power_of_2(batch)))
    sr_advance_kernel[(triton.cdiv(batch, block),)](slots, wpos, sr_step, batch, L=L, BLOCK=block, num_warps=1)
