"""Triton tree verify for Mamba-2 (backend="triton"): the chain verify kernel with the causal mask replaced by
the ancestor mask and the prefix sums of dt by tree prefix sums.

Launches: spec_kernels._scatter_bc_kernel unchanged (the N nodes' x, B, processed dt go to the ring after the
history, exactly where a chain's N window tokens go, and bc[k, s] = B_k . C_s for every live k), then
_tree_verify_kernel, grid (cdiv(headdim, BLOCK_M), batch, nheads). Per node s the kernel reads
anc[row, s], an int32 bit set (bit j: node j is an ancestor of s or s itself; N <= 32), and builds
    visible[k, s] = k < h  or  (h <= k < h + N and bit k - h of anc[s])
    cum_s = sum_k visible[k, s] dt_k            (tree prefix sum: history, then the path)
    cum_k = cumsum for history k, cum_(k - h) for window k
after which the weights dt_k exp(A (cum_s - cum_k)) (B_k . C_s) and the one dot over the ring axis are the
chain kernel's. The checkpoint is read once per chunk and, on flush rows, the folded history stored once
(spec_kernels._fold_chunk): a tree costs the state traffic of a chain. The bit sets come from parents by a
few device-side torch ops (replayssm.tree_ring.ancestor_tables): no host sync, graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.checks import kernel_arch, next_pow2
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_kernels import _blocks, _fold_chunk, _precision, _scatter_bc_kernel, launch_config
from replayssm.tree_ring import ancestor_tables

MAX_NODES = 32  # one int32 bit set per node


def ancestor_bits(parents: torch.Tensor) -> torch.Tensor:
    """parents int32 [b, N] -> int32 [b, N]: bit j of entry s set iff node j is an ancestor-or-self of s."""
    anc, _, _ = ancestor_tables(parents)
    weights = torch.ones(parents.shape[1], dtype=torch.int64, device=parents.device) << torch.arange(
        parents.shape[1], device=parents.device)
    return (anc.long() * weights).sum(-1).to(torch.int32)


@triton.jit
def _tree_verify_kernel(
    x_ptr, z_ptr, C_ptr, A_ptr, D_ptr, out_ptr, slots_ptr, anc_ptr,
    state_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr, is_flush_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sC_b, sC_t, sC_g, so_b, so_t, so_h, sanc_b,
    ss_s, ss_h, ss_p, srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot, headdim,
    HEADS_PER_GROUP: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    if slot == null_slot:
        return
    s = slot.to(tl.int64)
    h = tl.load(write_pos_ptr + s)
    origin = tl.load(origin_ptr + s)
    flush = tl.load(is_flush_ptr + s)
    g = head // HEADS_PER_GROUP
    A = tl.load(A_ptr + head).to(tl.float32)

    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    live = k < h + T
    hist = k < h
    dt_k = tl.load(ring_dt_ptr + s * srdt_s + head * srdt_h + k_rows, mask=live, other=0.0)
    cum = tl.cumsum(dt_k, 0)                                    # right for the history rows only
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    anc = tl.load(anc_ptr + b * sanc_b + t, mask=t_mask, other=0)                          # [BLOCK_T]
    win = (k >= h) & live
    node_k = tl.where(win, k - h, 0)                                                       # window node of row k
    on_path = ((anc[None, :] >> node_k[:, None]) & 1) != 0                                 # [BLOCK_K, BLOCK_T]
    visible = hist[:, None] | (win[:, None] & on_path & t_mask[None, :])
    cum_p = tl.sum(tl.where(visible, dt_k[:, None], 0.0), 0)                               # tree prefix sums
    cum_win = tl.sum(tl.where(node_k[:, None] == t[None, :], cum_p[None, :], 0.0), 1)      # cum of node k - h
    cum_k = tl.where(hist, cum, cum_win)
    hist_total = tl.sum(tl.where(hist, dt_k, 0.0), 0)

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < headdim
    X = tl.load(ring_x_ptr + s * srx_s + head * srx_h + k_rows[None, :] * srx_r + m[:, None],
                mask=m_mask[:, None] & live[None, :], other=0.0).to(tl.float32)            # [BLOCK_M, BLOCK_K]
    first = tl.where(flush != 0, h, 0)
    base = tl.where(flush != 0, hist_total, 0.0)
    w_hist = tl.where(hist, dt_k * tl.exp(tl.minimum(A * (hist_total - cum), 0.0)), 0.0)
    decay_h = tl.exp(tl.minimum(A * hist_total, 0.0))
    B_rows = ring_B_ptr + s * srB_s + g * srB_g + k_rows * srB_r
    SC = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)
    for n0 in range(0, DSTATE, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        sm_mask = m_mask[:, None] & n_mask[None, :]
        state_tile = state_ptr + s * ss_s + head * ss_h + m[:, None] * ss_p + n[None, :]
        S = tl.load(state_tile, mask=sm_mask, other=0.0).to(tl.float32)
        if flush != 0:
            S = _fold_chunk(S, X * w_hist[None, :], hist, decay_h, B_rows, n, n_mask, PRECISION)
            if h > 0:
                tl.store(state_tile, S.to(state_ptr.dtype.element_ty), mask=sm_mask)
        C_t = tl.load(C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g + n[:, None],
                      mask=n_mask[:, None] & t_mask[None, :], other=0.0).to(tl.float32)
        SC += tl.dot(S, C_t, input_precision=PRECISION)
    Y = SC * tl.exp(tl.minimum(A * (cum_p - base), 0.0))[None, :]
    bc = tl.load(bc_ptr + s * sbc_s + g * sbc_g + k[:, None] * sbc_r + t[None, :],
                 mask=live[:, None] & t_mask[None, :], other=0.0)
    ancestor = (k[:, None] >= first) & visible & live[:, None]
    W = tl.where(ancestor, dt_k[:, None] * tl.exp(tl.minimum(A * (cum_p[None, :] - cum_k[:, None]), 0.0)) * bc, 0.0)
    Y += tl.dot(X, W, input_precision=PRECISION)

    mt_mask = m_mask[:, None] & t_mask[None, :]
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


def launch_tree_verify(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, parents: torch.Tensor,
                       slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    geo, batch = ring.geometry, x.shape[0]
    if ring.window > MAX_NODES:
        raise ValueError(f"N={ring.window} > {MAX_NODES}: the Triton tree kernel keeps one int32 bit set per node")
    arch = kernel_arch(x.device)
    cfg = launch_config(geo.headdim, geo.dstate, ring.ring_len, arch)
    blk, prec = dict(_blocks(ring), BLOCK_N=cfg.block_n), _precision(arch)
    common = dict(null_slot=ring.null_slot, headdim=geo.headdim, HEADS_PER_GROUP=geo.heads_per_group,
                  DSTATE=geo.dstate)
    anc = ancestor_bits(parents)
    _scatter_bc_kernel[(batch, geo.ngroups)](
        x, dt, dt if dt_bias is None else dt_bias, B, C, slots,
        ring.x, ring.B, ring.dt, ring.bc, ring.write_pos, ring.origin,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        ring.x.stride(0), ring.x.stride(1), ring.x.stride(2), ring.B.stride(0), ring.B.stride(1), ring.B.stride(2),
        ring.dt.stride(0), ring.dt.stride(1), ring.bc.stride(0), ring.bc.stride(1), ring.bc.stride(2),
        **common, T=ring.window, RING=ring.ring_len, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_P=next_pow2(geo.headdim), PRECISION=prec, num_warps=cfg.scatter_warps, **blk,
    )
    zz = x if z is None else z
    _tree_verify_kernel[(triton.cdiv(geo.headdim, cfg.block_m), batch, geo.nheads)](
        x, zz, C, A, A if D is None else D, out, slots, anc,
        ring.state, ring.x, ring.B, ring.dt, ring.bc, ring.write_pos, ring.origin, ring.is_flush,
        x.stride(0), x.stride(1), x.stride(2), zz.stride(0), zz.stride(1), zz.stride(2),
        C.stride(0), C.stride(1), C.stride(2), out.stride(0), out.stride(1), out.stride(2), anc.stride(0),
        ring.state.stride(0), ring.state.stride(1), ring.state.stride(2),
        ring.x.stride(0), ring.x.stride(1), ring.x.stride(2), ring.B.stride(0), ring.B.stride(1), ring.B.stride(2),
        ring.dt.stride(0), ring.dt.stride(1), ring.bc.stride(0), ring.bc.stride(1), ring.bc.stride(2),
        **common, T=ring.window, RING=ring.ring_len, HAS_D=D is not None, HAS_Z=z is not None,
        BLOCK_M=cfg.block_m, PRECISION=prec, num_warps=cfg.verify_warps, num_stages=cfg.verify_stages, **blk,
    )
    return out
