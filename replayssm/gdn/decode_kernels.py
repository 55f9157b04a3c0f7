"""Triton kernels for ReplaySSM Gated DeltaNet AR decode (both routes) and their launchers.

One decode step is two launches (CUDA-graph capturable, no host sync):
  1. `_gdn_replay_step_kernel`, grid (cdiv(V, BV), batch, HV): each program owns BV value rows of one
     (row, value head). Output-only route (OUTPUT_ONLY, the default), normal steps: the checkpoint tile meets
     the two vectors k and q and the buffered keys the same two (`_vector_readout`); S_h is never formed.
     State-and-output route, and every flush on both: it rebuilds the state after the cached entries, S_h,
     as one [BV, K] tile (padded K >= 16) from the checkpoint and the buffer:
         S_h = exp(G_tot) S0 + (u^T * w) @ k_buf          (one tl.dot over the padded buffer axis)
     reads S_h k and S_h q from it, then for the current token
         alpha = exp(g), u = beta (v - alpha S_h k), o = alpha S_h q + u (k . q)
     Non-flush: append (u, k, g) at write_pos (no state write). Flush: write alpha S_h + u k^T into the
     checkpoint from the tile still in registers (the state is read once per step, flush or not).
  2. `_gdn_advance_cursor_kernel`: write_pos <- (write_pos + 1) mod L for every live row. It runs after
     the main kernel because every program of a row reads the cursor; advancing it in the main kernel
     would race.
`_gdn_materialize_kernel` shares the reconstruction and writes S_h to an fp32 output.

Kimi Delta Attention (replayssm.kda) runs the same kernels with PER_CHANNEL set: g is a K-vector per value head
(g [batch, HV, K]; the buffer's g [slots, HV, L, K]), so the replay weights move from the u rows onto the
key columns, w_j[c] = exp(G_tot[c] - G_pre_j[c]) (cumulated down the buffer axis per channel):
    S_h = S0 diag(exp(G_tot)) + u_buf^T @ (w * k_buf)                 (the same one tl.dot)
    alpha = exp(g) [K], u = beta (v - S_h (alpha * k)), o = S_h (alpha * q) + u (k . q)
    flush: S0 <- S_h diag(alpha) + u k^T
With PER_CHANNEL off (GDN) every added branch is compiled out: GDN's kernels are unchanged.

Buffer writes are split so each element has exactly one writer: u rows by the program owning them,
g by the V-tile-0 program of each value head, the key (per key head, shared by HV/H value heads) by the
V-tile-0 program of the first value head of its group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm import launch_registry, launch_table
from replayssm.checks import NULL_SLOT, check_route, kernel_arch, next_pow2

MAX_K = 256  # q and k are loaded whole (for the L2 norm and k . q): beyond this they do not fit registers


@dataclass(frozen=True)
class ReplayLaunchConfig:
    """Tiles of the replay kernels: BV value rows per program; materialize walks K in tiles of BKT columns
    (the step kernel takes the whole K as one tile)."""

    block_v: int
    block_kt: int
    num_warps: int
    num_stages: int
    dot_precision: str


def replay_launch_config(K: int, V: int, state_dtype: torch.dtype, arch: int, L: int | None = None,
                         kernel: str = "gdn_replay_ar", per_channel: bool = False,
                         route: str | None = None) -> ReplayLaunchConfig:
    """The config of `kernel` (gdn_replay_ar: the step and its flush, keyed also by its route;
    gdn_replay_materialize): this device's tuned entry (replayssm/launch_table.py, keyed by K, V, the buffer
    length L and the route), else the default rule.
    per_channel: the KDA build of the same kernel, resolved under its kda_ name (kda_replay_ar,
    kda_replay_materialize): its register needs differ, so a GDN entry is never applied to it."""
    if per_channel:
        kernel = launch_registry.KDA_BUILD[kernel]       # the KDA build: its own declaration and table entry
    key = launch_registry.key(kernel, K=K, V=V, L=L, route=route)
    return launch_table.resolve(kernel, key, state_dtype, arch,
                                default_replay_config(K, V, state_dtype, arch, route or "state_and_output"))


def default_replay_config(K: int, V: int, state_dtype: torch.dtype, arch: int,
                          route: str = "state_and_output") -> ReplayLaunchConfig:
    """Launch config keyed by geometry, route and GPU architecture (no autotune: it would clobber in-place state).

    A program rebuilds its [BV, K] block of S_h as one tile (block_kt = the padded K) and keeps it in
    registers through the flush, so a flush reads the state once (replayssm/traffic.py counts one read).
    arch 0 (interpreter): one program per (row, value head), the interpreter costs per program and per op,
    not per FLOP. GPU, state-and-output: BV rows so that a tile holds 2048 fp32 values ([16, 128] at K = 128,
    16 per thread over 4 warps; [16, 256] over 8 warps at K = 256). Output-only: twice the rows (4096 values),
    because each program also dots the buffered keys [L, K] with k and q, work that does not shrink with BV;
    its flush step is the same tile code at that BV (no spill at the production geometries,
    scripts/kernels/kernel_report.py). A K walk in [32, 64] tiles needed 103 registers but re-read the state
    and the buffer's keys on every flush. tf32x3 dots keep fp32 parity (plain tf32 drifts ~1e-3).
    A 2-byte state on the state-and-output route: [32, 128] over 8 warps. Its [16, 128] / 4-warp tile spills
    4 bytes at 72 registers on sm_90 under Triton 3.7.1 (Qwen3.5 geometries; 3.6.0 does not); [32, 128] / 8
    warps builds to 80 registers without a spill and issues about 6 % more instructions per state row
    (kernel_report.py --tune-space: 8 x 909 per 32 rows against 4 x 853 per 16).
    """
    check_route(route)
    BK = max(16, next_pow2(K))
    if arch == 0:
        return ReplayLaunchConfig(max(16, next_pow2(V)), BK, 4, 1, "ieee")
    half_state = state_dtype is not None and torch.empty(0, dtype=state_dtype).element_size() == 2
    tile = 4096 if route == "output_only" or (half_state and BK <= 128) else 2048
    warps = 8 if BK > 128 or (half_state and route != "output_only" and BK <= 128) else 4
    return ReplayLaunchConfig(min(max(16, next_pow2(V)), max(16, tile // BK)), BK, warps, 2,
                              "tf32x3" if arch >= 80 else "ieee")


@triton.jit
def _rebuild_tile(S, kbuf_ptrs, kbuf_mask, decay0, weighted_u, HAS_BUFFER: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  key_weights=1.0, PER_CHANNEL: tl.constexpr = False):
    """One [BV, BKT] tile of S_h = exp(G_tot) S0 + (u * w) @ k_buf, in fp32, from the checkpoint tile S0 (loaded
    by the caller, fp32). PER_CHANNEL (KDA): decay0 is the [BKT] row exp(G_tot), weighted_u the plain u rows and
    key_weights the [BC, BKT] weights w of the keys."""
    if HAS_BUFFER:
        kb = tl.load(kbuf_ptrs, mask=kbuf_mask, other=0.0).to(tl.float32)           # [BC, BKT]
        if PER_CHANNEL:
            S = S * decay0[None, :] + tl.dot(weighted_u, kb * key_weights, input_precision=DOT_PRECISION)
        else:
            S = S * decay0 + tl.dot(weighted_u, kb, input_precision=DOT_PRECISION)
    return S


@triton.jit
def _channel_weights(gbuf_ptr, h, offs_c, offs_k, mask_k, stride_gb_l, HAS_BUFFER: tl.constexpr):
    """KDA: exp(G_tot) [BKT] and the key weights w [BC, BKT], w[j, c] = exp(G_tot[c] - G_pre_j[c]) (0 past h)."""
    mask_c = offs_c < h
    if HAS_BUFFER:
        g_hist = tl.load(gbuf_ptr + offs_c[:, None] * stride_gb_l + offs_k[None, :],
                         mask=mask_c[:, None] & mask_k[None, :], other=0.0)           # [BC, BKT]
        G_pre = tl.cumsum(g_hist, 0)
        G_tot = tl.sum(g_hist, 0)
        w = tl.where(mask_c[:, None], tl.exp(tl.minimum(G_tot[None, :] - G_pre, 0.0)), 0.0)
        return tl.exp(G_tot), w
    else:
        return tl.full([offs_k.shape[0]], 1.0, tl.float32), tl.zeros([offs_c.shape[0], offs_k.shape[0]], tl.float32)


@triton.jit
def _buffer_weights(gbuf_ptr, ubuf_ptr, h, offs_c, offs_v, mask_v, stride_u_l, HAS_BUFFER: tl.constexpr,
                    BV: tl.constexpr, BC: tl.constexpr, PER_CHANNEL: tl.constexpr = False):
    """Checkpoint decay exp(G_tot) and the buffer's u rows times their replay weights w_j, [BV, BC] fp32.
    PER_CHANNEL (KDA): the u rows unweighted and a placeholder decay (the weights go on the keys,
    _channel_weights)."""
    mask_c = offs_c < h
    if PER_CHANNEL:
        U = tl.load(ubuf_ptr + offs_c[None, :] * stride_u_l + offs_v[:, None],
                    mask=mask_v[:, None] & mask_c[None, :], other=0.0).to(tl.float32)  # [BV, BC]
        return 1.0, U
    elif HAS_BUFFER:
        g_hist = tl.load(gbuf_ptr + offs_c, mask=mask_c, other=0.0)
        G_pre = tl.cumsum(g_hist, 0)
        G_tot = tl.sum(g_hist, 0)
        w = tl.where(mask_c, tl.exp(G_tot - G_pre), 0.0)
        U = tl.load(ubuf_ptr + offs_c[None, :] * stride_u_l + offs_v[:, None],
                    mask=mask_v[:, None] & mask_c[None, :], other=0.0).to(tl.float32)  # [BV, BC]
        return tl.exp(G_tot), U * w[None, :]
    else:
        return 1.0, tl.zeros([BV, BC], dtype=tl.float32)


@triton.jit
def _vector_readout(S0, kbuf_ptrs, kbuf_mask, decay0, weighted_u, key_weights, xk, xq, alpha,
                    PER_CHANNEL: tl.constexpr):
    """Output-only route: alpha S_h k and alpha S_h q ([BV] each; KDA: S_h (alpha k), S_h (alpha q)) without S_h,
        S_h x = exp(G_tot) (S0 x) + sum_j w_j (k_j . x) u_j        (KDA: S0 (exp(G_tot) x) + sum_j ((w_j k_j) . x) u_j)
    The checkpoint tile meets two vectors (two FMAs per element, no tensor-core tile, no layout conversion) and
    the buffered keys the same two: k_j . x is [BC] per program, recomputed by each V tile of a head (L K FMAs
    against the tile's BV K)."""
    kb = tl.load(kbuf_ptrs, mask=kbuf_mask, other=0.0).to(tl.float32)                  # [BC, BK]
    if PER_CHANNEL:
        xk = xk * alpha
        xq = xq * alpha
        kb = kb * key_weights
        Sk = tl.sum(S0 * (decay0 * xk)[None, :], 1)
        Sq = tl.sum(S0 * (decay0 * xq)[None, :], 1)
    else:
        Sk = decay0 * tl.sum(S0 * xk[None, :], 1)
        Sq = decay0 * tl.sum(S0 * xq[None, :], 1)
    ck = tl.sum(kb * xk[None, :], 1)                                                   # [BC]: k_j . x (0 past h)
    cq = tl.sum(kb * xq[None, :], 1)
    Sk += tl.sum(weighted_u * ck[None, :], 1)
    Sq += tl.sum(weighted_u * cq[None, :], 1)
    if not PER_CHANNEL:
        Sk = alpha * Sk
        Sq = alpha * Sq
    return Sk, Sq


@triton.jit
def _gdn_replay_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, slots_ptr,
    state_ptr, ubuf_ptr, kbuf_ptr, gbuf_ptr, wpos_ptr,
    stride_q_b, stride_q_h, stride_k_b, stride_k_h, stride_v_b, stride_v_h,
    stride_g_b, stride_g_h, stride_beta_b, stride_beta_h, stride_o_b, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v,
    stride_u_slot, stride_u_h, stride_u_l,
    stride_kb_slot, stride_kb_h, stride_kb_l,
    stride_gb_slot, stride_gb_h,
    scale,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, USE_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr,
    stride_gb_l=1, PER_CHANNEL: tl.constexpr = False, OUTPUT_ONLY: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    i_h = i_hv // HV_PER_H
    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    # The checkpoint tile first: its address needs only the slot, so its load is in flight while the cursor, the
    # buffer weights and the q / k norms are computed (issued after them, behind the cursor's dependent load and
    # the branch on it, it would serialise with them).
    s_ptrs = state_ptr + slot * stride_s_slot + i_hv * stride_s_h + offs_v[:, None] * stride_s_v + offs_k[None, :]
    s_mask = mask_v[:, None] & mask_k[None, :]
    S0 = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)                         # [BV, BK]
    h = tl.load(wpos_ptr + slot)
    HAS_BUFFER: tl.constexpr = L > 1

    # q and k whole: the L2 norms and k . q need all of K.
    q_row = q_ptr + i_b * stride_q_b + i_h * stride_q_h
    k_row = k_ptr + i_b * stride_k_b + i_h * stride_k_h
    q_full = tl.load(q_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k_full = tl.load(k_row + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q_mult = scale / tl.sqrt(tl.sum(q_full * q_full, 0) + 1e-6)
        k_mult = 1.0 / tl.sqrt(tl.sum(k_full * k_full, 0) + 1e-6)
    else:
        q_mult = scale
        k_mult = 1.0
    kq = tl.sum(q_full * k_full, 0) * q_mult * k_mult

    offs_c = tl.arange(0, BC)
    decay0, weighted_u = _buffer_weights(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h,
                                         ubuf_ptr + slot * stride_u_slot + i_hv * stride_u_h,
                                         h, offs_c, offs_v, mask_v, stride_u_l, HAS_BUFFER, BV, BC, PER_CHANNEL)
    key_weights = 1.0
    if PER_CHANNEL:
        decay0, key_weights = _channel_weights(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h, h, offs_c,
                                               offs_k, mask_k, stride_gb_l, HAS_BUFFER)
    kbuf_base = kbuf_ptr + slot * stride_kb_slot + i_h * stride_kb_h
    mask_c = offs_c < h
    kbuf_ptrs = kbuf_base + offs_c[:, None] * stride_kb_l + offs_k[None, :]
    kbuf_mask = mask_c[:, None] & mask_k[None, :]
    k_scaled = k_full * k_mult
    q_scaled = q_full * q_mult
    if PER_CHANNEL:
        g_cur = tl.load(g_ptr + i_b * stride_g_b + i_hv * stride_g_h + offs_k, mask=mask_k, other=0.0)   # [BK]
    else:
        g_cur = tl.load(g_ptr + i_b * stride_g_b + i_hv * stride_g_h)
    alpha = tl.exp(g_cur)
    beta = tl.load(beta_ptr + i_b * stride_beta_b + i_hv * stride_beta_h)
    v_cur = tl.load(v_ptr + i_b * stride_v_b + i_hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    o_row = o_ptr + i_b * stride_o_b + i_hv * stride_o_h

    if OUTPUT_ONLY and HAS_BUFFER:
        normal_step = h < L - 1
    else:
        normal_step = False              # compiled out: the state-and-output route, or L = 1 (every step flushes)
    if normal_step:
        # Output-only route, normal step: two vectors meet the checkpoint tile; S_h is never formed.
        Sk, Sq = _vector_readout(S0, kbuf_ptrs, kbuf_mask, decay0, weighted_u, key_weights,
                                 k_scaled, q_scaled, alpha, PER_CHANNEL)
        u = beta * (v_cur - Sk)
        tl.store(o_row + offs_v, (Sq + u * kq).to(o_ptr.dtype.element_ty), mask=mask_v)
        _append_entry(ubuf_ptr, gbuf_ptr, kbuf_base, slot, i_v, i_hv, h, u, g_cur, k_scaled, offs_v, mask_v, offs_k,
                      mask_k, stride_u_slot, stride_u_h, stride_u_l, stride_gb_slot, stride_gb_h, stride_gb_l,
                      stride_kb_l, HV_PER_H, PER_CHANNEL)
    else:
        # State-and-output route (and every flush): the whole [BV, K] block of S_h in one tile, kept in
        # registers until the flush folds it: the state and the buffer's keys are read once per step (a K walk
        # would have to re-read both to fold).
        S = _rebuild_tile(S0, kbuf_ptrs, kbuf_mask, decay0, weighted_u, HAS_BUFFER, DOT_PRECISION, key_weights,
                          PER_CHANNEL)
        if PER_CHANNEL:
            # KDA: decay the state's key columns first, S_h diag(alpha), by decaying the vectors it meets
            Sk = tl.sum(S * (k_scaled * alpha)[None, :], 1)
            Sq = tl.sum(S * (q_scaled * alpha)[None, :], 1)
        else:
            Sk = alpha * tl.sum(S * k_scaled[None, :], 1)
            Sq = alpha * tl.sum(S * q_scaled[None, :], 1)
        u = beta * (v_cur - Sk)
        tl.store(o_row + offs_v, (Sq + u * kq).to(o_ptr.dtype.element_ty), mask=mask_v)
        if h == L - 1:
            # Flush: fold the buffer and the current token into the checkpoint, from the tile still in registers.
            if PER_CHANNEL:
                S_new = S * alpha[None, :] + u[:, None] * k_scaled[None, :]
            else:
                S_new = alpha * S + u[:, None] * k_scaled[None, :]
            tl.store(s_ptrs, S_new.to(state_ptr.dtype.element_ty), mask=s_mask)
        else:
            _append_entry(ubuf_ptr, gbuf_ptr, kbuf_base, slot, i_v, i_hv, h, u, g_cur, k_scaled, offs_v, mask_v,
                          offs_k, mask_k, stride_u_slot, stride_u_h, stride_u_l, stride_gb_slot, stride_gb_h,
                          stride_gb_l, stride_kb_l, HV_PER_H, PER_CHANNEL)


@triton.jit
def _append_entry(ubuf_ptr, gbuf_ptr, kbuf_base, slot, i_v, i_hv, h, u, g_cur, k_scaled, offs_v, mask_v, offs_k,
                  mask_k, stride_u_slot, stride_u_h, stride_u_l, stride_gb_slot, stride_gb_h, stride_gb_l, stride_kb_l,
                  HV_PER_H: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """Append (u, k, g) at buffer row h: u rows of this program; g and the (shared) key by one program each."""
    u_row = ubuf_ptr + slot * stride_u_slot + i_hv * stride_u_h + h * stride_u_l
    tl.store(u_row + offs_v, u.to(ubuf_ptr.dtype.element_ty), mask=mask_v)
    if i_v == 0:
        if PER_CHANNEL:
            tl.store(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h + h * stride_gb_l + offs_k, g_cur,
                     mask=mask_k)
        else:
            tl.store(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h + h, g_cur)
        if i_hv % HV_PER_H == 0:
            tl.store(kbuf_base + h * stride_kb_l + offs_k, k_scaled.to(kbuf_base.dtype.element_ty), mask=mask_k)


@triton.jit
def _gdn_advance_cursor_kernel(slots_ptr, wpos_ptr, batch, NULL_ID: tl.constexpr, L: tl.constexpr,
                               BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_batch = offs < batch
    slot = tl.load(slots_ptr + offs, mask=in_batch, other=NULL_ID)
    live = in_batch & (slot != NULL_ID)
    h = tl.load(wpos_ptr + slot, mask=live, other=0)
    tl.store(wpos_ptr + slot, tl.where(h >= L - 1, 0, h + 1), mask=live)


@triton.jit
def _gdn_materialize_kernel(
    out_ptr, slots_ptr, state_ptr, ubuf_ptr, kbuf_ptr, gbuf_ptr, wpos_ptr,
    stride_out_b, stride_out_h, stride_out_v,
    stride_s_slot, stride_s_h, stride_s_v,
    stride_u_slot, stride_u_h, stride_u_l,
    stride_kb_slot, stride_kb_h, stride_kb_l,
    stride_gb_slot, stride_gb_h,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    BK: tl.constexpr, BKT: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    stride_gb_l=1, PER_CHANNEL: tl.constexpr = False, scale_ptr=None, stride_sc_slot=0,
    SCALED: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    i_h = i_hv // HV_PER_H
    h = tl.load(wpos_ptr + slot)
    HAS_BUFFER: tl.constexpr = L > 1
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    offs_c = tl.arange(0, BC)
    mask_c = offs_c < h
    decay0, weighted_u = _buffer_weights(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h,
                                         ubuf_ptr + slot * stride_u_slot + i_hv * stride_u_h,
                                         h, offs_c, offs_v, mask_v, stride_u_l, HAS_BUFFER, BV, BC, PER_CHANNEL)
    state_base = state_ptr + slot * stride_s_slot + i_hv * stride_s_h
    kbuf_base = kbuf_ptr + slot * stride_kb_slot + i_h * stride_kb_h
    out_base = out_ptr + i_b * stride_out_b + i_hv * stride_out_h
    for kt in tl.static_range(BK // BKT):
        offs_kt = kt * BKT + tl.arange(0, BKT)
        mask_kt = offs_kt < K
        key_weights = 1.0
        if PER_CHANNEL:
            decay0, key_weights = _channel_weights(gbuf_ptr + slot * stride_gb_slot + i_hv * stride_gb_h, h, offs_c,
                                                   offs_kt, mask_kt, stride_gb_l, HAS_BUFFER)
        S0 = tl.load(state_base + offs_v[:, None] * stride_s_v + offs_kt[None, :],
                     mask=mask_v[:, None] & mask_kt[None, :], other=0.0).to(tl.float32)
        if SCALED:                              # int8 / e4m3: dequantised as state_format.dequantize does
            S0 = S0 * tl.load(scale_ptr + slot * stride_sc_slot + i_hv)
        S = _rebuild_tile(S0, kbuf_base + offs_c[:, None] * stride_kb_l + offs_kt[None, :],
                          mask_c[:, None] & mask_kt[None, :], decay0, weighted_u, HAS_BUFFER, DOT_PRECISION,
                          key_weights, PER_CHANNEL)
        tl.store(out_base + offs_v[:, None] * stride_out_v + offs_kt[None, :], S,
                 mask=mask_v[:, None] & mask_kt[None, :])


def _cache_strides(cache) -> tuple[int, ...]:
    return (*cache.state.stride()[:3], *cache.u.stride()[:3], *cache.k.stride()[:3], *cache.g.stride()[:2])


def _per_channel_args(cache, per_channel: bool) -> dict:
    """The KDA switch: the buffer g's stride along L (its K axis has unit stride) and PER_CHANNEL. GDN passes
    nothing, so its launches (and AOT builds) are exactly what they were before KDA shared the kernels."""
    return dict(stride_gb_l=cache.g.stride(2), PER_CHANNEL=True) if per_channel else {}


def launch_replay_step(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                       out: torch.Tensor, per_channel: bool = False, route: str = "output_only") -> None:
    """Inputs already validated; slots int32 [batch] (NULL_SLOT rows skipped). per_channel: a KDA cache
    (replayssm.kda), g [batch, HV, K]. route: the normal step's form (checks.ROUTES)."""
    gm, L = cache.geometry, cache.buffer_len
    batch = q.shape[0]
    cfg = replay_launch_config(gm.K, gm.V, cache.state_dtype, kernel_arch(q.device), L, per_channel=per_channel,
                               route=route)
    grid = (triton.cdiv(gm.V, cfg.block_v), batch, gm.HV)
    _gdn_replay_step_kernel[grid](
        q, k, v, g, beta, out, slots, cache.state, cache.u, cache.k, cache.g, cache.write_pos,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(cache),
        scale,
        NULL_ID=NULL_SLOT, HV_PER_H=gm.HV // gm.H, K=gm.K, V=gm.V, L=L,
        BK=max(16, next_pow2(gm.K)), BV=cfg.block_v, BC=max(16, next_pow2(L)),
        USE_L2NORM=bool(use_qk_l2norm), DOT_PRECISION=cfg.dot_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_per_channel_args(cache, per_channel),
        **({"OUTPUT_ONLY": True} if route == "output_only" else {}),
    )
    if cache.shared_cursor:
        return                        # a DecodeCursor shared by every layer advances once per step
    block = min(1024, max(16, next_pow2(batch)))
    _gdn_advance_cursor_kernel[(triton.cdiv(batch, block),)](
        slots, cache.write_pos, batch, NULL_ID=NULL_SLOT, L=L, BLOCK=block, num_warps=1,
    )


def launch_materialize(cache, slots: torch.Tensor, out: torch.Tensor, per_channel: bool = False) -> None:
    """out [batch, HV, V, K] fp32 (last dim contiguous); NULL_SLOT rows left as they are."""
    gm, L = cache.geometry, cache.buffer_len
    batch = slots.shape[0]
    cfg = replay_launch_config(gm.K, gm.V, cache.state_dtype, kernel_arch(out.device), L, "gdn_replay_materialize",
                               per_channel)
    grid = (triton.cdiv(gm.V, cfg.block_v), batch, gm.HV)
    _gdn_materialize_kernel[grid](
        out, slots, cache.state, cache.u, cache.k, cache.g, cache.write_pos,
        out.stride(0), out.stride(1), out.stride(2),
        *_cache_strides(cache),
        NULL_ID=NULL_SLOT, HV_PER_H=gm.HV // gm.H, K=gm.K, V=gm.V, L=L,
        BK=max(16, next_pow2(gm.K)), BKT=cfg.block_kt, BV=cfg.block_v, BC=max(16, next_pow2(L)),
        DOT_PRECISION=cfg.dot_precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **_per_channel_args(cache, per_channel), **_scaled_read_args(cache),
    )


def _scaled_read_args(cache) -> dict:
    """An int8 / float8_e4m3fn checkpoint's scale for a kernel that reads it (materialize); nothing for the other
    formats, whose builds stay what they were."""
    scale = getattr(cache, "state_scale", None)
    return {} if scale is None else dict(scale_ptr=scale, stride_sc_slot=scale.stride(0), SCALED=True)
