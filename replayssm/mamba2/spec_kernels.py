"""Triton kernels for Mamba-2 ReplaySSM speculative decoding, and their launchers (backend="triton").

Three kernels (protocol in spec_ref.py's docstring; logical position k of a slot lives at ring row
(origin + k) & (RING - 1), history k < h = write_pos, window k = h + t). Every kernel loops over dstate in
BLOCK_N chunks, so register use does not grow with dstate. Loop bounds are constexprs (DSTATE,
HEADS_PER_GROUP): triton 3.6's interpreter cannot `range` over a runtime value (it calls int() on a
1-element array, an error since numpy 2.4).

- _scatter_bc_kernel, grid (batch, ngroups): writes the window's x, B and processed dt into the ring after
  the committed history, and bc[slot, g, k, t] = B_k . C_t for every live k (history + window) as
  [BLOCK_K, BLOCK_N] x [BLOCK_N, BLOCK_T] dots. The window's B rows come from the input, not from the
  ring rows just stored (no read-after-write inside a program).
- _verify_kernel, grid (cdiv(headdim, BLOCK_M), batch, nheads): each checkpoint chunk is read once; on a
  flush row it first gets the committed history folded in ([BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] dot)
  and is stored; then S C^T accumulates over the chunks ([BLOCK_M, BLOCK_N] x [BLOCK_N, BLOCK_T]), and the
  causal sum over the ring axis is one [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_T] dot with the masked weights.
  With IS_TREE (replayssm.mamba2.tree, N = T nodes) the causal mask becomes the ancestor mask and the prefix
  sums of dt become tree prefix sums: node s reads anc[row, s], an int32 bit set (bit j: node j is an
  ancestor of s or s itself; N <= MAX_NODES = 32), and
      visible[k, s] = k < h  or  (h <= k < h + N and bit k - h of anc[s])
      cum_s = sum_k visible[k, s] dt_k;   cum_k = cumsum for history k, cum_(k - h) for window k
  after which the weights dt_k exp(A (cum_s - cum_k)) (B_k . C_s) and the dot are the chain's: a tree costs
  the state traffic of a chain. With IS_TREE off the chain compiles without the bit-set load (anc_ptr None).
- _materialize_kernel, same grid: the committed state (checkpoint + history folded), written to a
  separate fp32 output (no cache write).
The cursor kernels of spec_commit / spec_reset are shared with the GDN ring: replayssm/ring_cursors.py.

tl.dot needs every dim >= 16: T and the ring axis are padded with masks. fp32 dots use input_precision
"ieee" under the interpreter and "tf32x3" on GPU (plain tf32 drifts ~1e-3). Exponents are clamped with
min(., 0). Slot offsets are int64 (pools can exceed 2^31 elements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm import launch_registry, launch_table
from replayssm.checks import kernel_arch, next_pow2
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_tiles import (  # noqa: F401 - re-exported: the tuner and tests name them here
    SPEC_TILE_BLOCK_N,
    SPEC_TILE_BLOCK_T,
    SPEC_TILE_DROPPED,
    SPEC_TILE_WARPS,
    SpecLaunchConfig,
    dropped_reason,
    spec_tile_candidates,
)
from replayssm.tree_ring import ancestor_tables

MAX_DSTATE = 256  # the kernels loop over dstate chunks; larger dstate is untested (no model uses it)
MAX_NODES = 32  # tree verify: one int32 ancestor bit set per node


@triton.jit
def _softplus(v):
    """softplus with threshold 20 (as torch.nn.functional.softplus). log(1 + u) loses ~eps/u relative
    accuracy for the small u = exp(v) of typical Mamba-2 dt (v ~ -4): Kahan's log1p keeps it to ~1 ulp."""
    u = tl.exp(tl.minimum(v, 20.0))
    w = 1.0 + u
    log1p_u = tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0)))
    return tl.where(v <= 20.0, log1p_u, v)


@triton.jit
def _scatter_bc_kernel(
    x_ptr, dt_ptr, dt_bias_ptr, B_ptr, C_ptr, slots_ptr,
    ring_x_ptr, ring_B_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr,
    sx_b, sx_t, sx_h, sdt_b, sdt_t, sB_b, sB_t, sB_g, sC_b, sC_t, sC_g,
    srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot, headdim,
    HEADS_PER_GROUP: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    if slot == null_slot:
        return
    s = slot.to(tl.int64)
    h = tl.load(write_pos_ptr + s)
    origin = tl.load(origin_ptr + s)

    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    win_rows = (origin + h + t) & (RING - 1)
    p = tl.arange(0, BLOCK_P)
    p_mask = p < headdim
    xt_mask = t_mask[:, None] & p_mask[None, :]
    # x and processed dt of this group's heads (a [T, headdim] tile per head).
    for j in range(HEADS_PER_GROUP):
        head = g * HEADS_PER_GROUP + j
        xw = tl.load(x_ptr + b * sx_b + t[:, None] * sx_t + head * sx_h + p[None, :], mask=xt_mask)
        tl.store(ring_x_ptr + s * srx_s + head * srx_h + win_rows[:, None] * srx_r + p[None, :], xw, mask=xt_mask)
        dtw = tl.load(dt_ptr + b * sdt_b + t * sdt_t + head, mask=t_mask, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dtw += tl.load(dt_bias_ptr + head).to(tl.float32)
        if DT_SOFTPLUS:
            dtw = _softplus(dtw)
        tl.store(ring_dt_ptr + s * srdt_s + head * srdt_h + win_rows, dtw, mask=t_mask)

    # B over logical positions: history rows from the ring, window rows from the input; bc accumulates
    # B_k . C_t over dstate chunks.
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    hist = k < h
    win = (k >= h) & (k < h + T)
    bc = tl.zeros([BLOCK_K, BLOCK_T], dtype=tl.float32)
    for n0 in range(0, DSTATE, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        ring_B_tile = ring_B_ptr + s * srB_s + g * srB_g + k_rows[:, None] * srB_r + n[None, :]
        B_hist = tl.load(ring_B_tile, mask=hist[:, None] & n_mask[None, :], other=0.0)
        win_mask = win[:, None] & n_mask[None, :]
        B_win = tl.load(B_ptr + b * sB_b + (k - h)[:, None] * sB_t + g * sB_g + n[None, :], mask=win_mask, other=0.0)
        tl.store(ring_B_tile, B_win, mask=win_mask)
        B_all = B_hist.to(tl.float32) + B_win.to(tl.float32)                               # [BLOCK_K, BLOCK_N]
        C_t = tl.load(C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g + n[:, None],
                      mask=n_mask[:, None] & t_mask[None, :], other=0.0).to(tl.float32)    # [BLOCK_N, BLOCK_T]
        bc += tl.dot(B_all, C_t, input_precision=PRECISION)                                # [BLOCK_K, BLOCK_T]
    tl.store(bc_ptr + s * sbc_s + g * sbc_g + k[:, None] * sbc_r + t[None, :], bc,
             mask=(k < h + T)[:, None] & t_mask[None, :])


@triton.jit
def _fold_chunk(S, Xw, hist, decay, B_rows_ptr, n, n_mask, PRECISION: tl.constexpr):
    """One dstate chunk of S1 = exp(A cum_{h-1}) S + sum_{k<h} w_k x_k B_k^T (one dot over the ring axis).

    S [BLOCK_M, BLOCK_N]; Xw [BLOCK_M, BLOCK_K] = x_k w_k with w_k = dt_k exp(A (cum_{h-1} - cum_k)), 0 for
    k >= h; B_rows_ptr [BLOCK_K] pointers to the ring's B rows in logical order.
    """
    B_hist = tl.load(B_rows_ptr[:, None] + n[None, :], mask=hist[:, None] & n_mask[None, :],
                     other=0.0).to(tl.float32)                                             # [BLOCK_K, BLOCK_N]
    return decay * S + tl.dot(Xw, B_hist, input_precision=PRECISION)


@triton.jit
def _verify_kernel(
    x_ptr, z_ptr, C_ptr, A_ptr, D_ptr, out_ptr, slots_ptr,
    state_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, bc_ptr, write_pos_ptr, origin_ptr, is_flush_ptr,
    sx_b, sx_t, sx_h, sz_b, sz_t, sz_h, sC_b, sC_t, sC_g, so_b, so_t, so_h,
    ss_s, ss_h, ss_p, srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h, sbc_s, sbc_g, sbc_r,
    null_slot, headdim, anc_ptr, sanc_b,
    HEADS_PER_GROUP: tl.constexpr, DSTATE: tl.constexpr,
    T: tl.constexpr, RING: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, IS_TREE: tl.constexpr,
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

    # Processed dt over logical positions (history then window) and its inclusive prefix sum.
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    live = k < h + T
    dt_k = tl.load(ring_dt_ptr + s * srdt_s + head * srdt_h + k_rows, mask=live, other=0.0)
    cum = tl.cumsum(dt_k, 0)                                                               # [BLOCK_K]
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    # visible[k, t]: position k is summed into window token t's output (before the flush restart below);
    # cum_p[t] = the prefix sum of dt up to t, cum_k[k] = the prefix sum up to position k.
    if IS_TREE:
        # Tree: node t sees the history and its ancestors-or-self (bit j of anc[t]: node j, position h + j);
        # prefix sums run along the node's path, so a window row's cum_k is its own node's cum_p.
        anc = tl.load(anc_ptr + b * sanc_b + t, mask=t_mask, other=0)                      # [BLOCK_T]
        win = (k >= h) & live
        node_k = tl.where(win, k - h, 0)                                                   # window node of row k
        on_path = ((anc[None, :] >> node_k[:, None]) & 1) != 0                             # [BLOCK_K, BLOCK_T]
        visible = (k < h)[:, None] | (win[:, None] & on_path & t_mask[None, :])
        cum_p = tl.sum(tl.where(visible, dt_k[:, None], 0.0), 0)                           # tree prefix sums
        cum_win = tl.sum(tl.where(node_k[:, None] == t[None, :], cum_p[None, :], 0.0), 1)  # cum of node k - h
        cum_k = tl.where(k < h, cum, cum_win)
    else:
        pos = h + t                                                                        # window positions
        visible = k[:, None] <= pos[None, :]                                               # causal
        cum_p = tl.sum(tl.where(visible, dt_k[:, None], 0.0), 0)                           # [BLOCK_T]
        cum_k = cum
    hist_total = tl.sum(tl.where(k < h, dt_k, 0.0), 0)                                     # cum_{h-1}

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < headdim
    X = tl.load(ring_x_ptr + s * srx_s + head * srx_h + k_rows[None, :] * srx_r + m[:, None],
                mask=m_mask[:, None] & live[None, :], other=0.0).to(tl.float32)            # [BLOCK_M, BLOCK_K]
    # Flush rows restart at S1: sums start at k = h and decays are relative to cum_{h-1}.
    first = tl.where(flush != 0, h, 0)
    base = tl.where(flush != 0, hist_total, 0.0)
    hist = k < h
    w_hist = tl.where(hist, dt_k * tl.exp(tl.minimum(A * (hist_total - cum), 0.0)), 0.0)   # fold weights
    decay_h = tl.exp(tl.minimum(A * hist_total, 0.0))
    B_rows = ring_B_ptr + s * srB_s + g * srB_g + k_rows * srB_r
    # S C^T over dstate chunks; the checkpoint is read once (and, on flush rows, written once).
    SC = tl.zeros([BLOCK_M, BLOCK_T], dtype=tl.float32)
    for n0 in range(0, DSTATE, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        sm_mask = m_mask[:, None] & n_mask[None, :]
        state_tile = state_ptr + s * ss_s + head * ss_h + m[:, None] * ss_p + n[None, :]
        S = tl.load(state_tile, mask=sm_mask, other=0.0).to(tl.float32)                    # [BLOCK_M, BLOCK_N]
        if flush != 0:
            # Early flush: fold only the committed history into the checkpoint.
            S = _fold_chunk(S, X * w_hist[None, :], hist, decay_h, B_rows, n, n_mask, PRECISION)
            if h > 0:
                tl.store(state_tile, S.to(state_ptr.dtype.element_ty), mask=sm_mask)
        C_t = tl.load(C_ptr + b * sC_b + t[None, :] * sC_t + g * sC_g + n[:, None],
                      mask=n_mask[:, None] & t_mask[None, :], other=0.0).to(tl.float32)    # [BLOCK_N, BLOCK_T]
        SC += tl.dot(S, C_t, input_precision=PRECISION)
    Y = SC * tl.exp(tl.minimum(A * (cum_p - base), 0.0))[None, :]
    bc = tl.load(bc_ptr + s * sbc_s + g * sbc_g + k[:, None] * sbc_r + t[None, :],
                 mask=live[:, None] & t_mask[None, :], other=0.0)                          # [BLOCK_K, BLOCK_T]
    summed = (k[:, None] >= first) & visible & live[:, None]
    W = tl.where(summed, dt_k[:, None] * tl.exp(tl.minimum(A * (cum_p[None, :] - cum_k[:, None]), 0.0)) * bc, 0.0)
    Y += tl.dot(X, W, input_precision=PRECISION)                                           # [BLOCK_M, BLOCK_T]

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


@triton.jit
def _materialize_kernel(
    A_ptr, out_ptr, slots_ptr, state_ptr, ring_x_ptr, ring_B_ptr, ring_dt_ptr, write_pos_ptr, origin_ptr,
    so_b, so_h, so_p, ss_s, ss_h, ss_p, srx_s, srx_h, srx_r, srB_s, srB_g, srB_r, srdt_s, srdt_h,
    null_slot, headdim,
    HEADS_PER_GROUP: tl.constexpr, DSTATE: tl.constexpr,
    RING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
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
    g = head // HEADS_PER_GROUP
    A = tl.load(A_ptr + head).to(tl.float32)
    k = tl.arange(0, BLOCK_K)
    k_rows = (origin + k) & (RING - 1)
    hist = k < h
    dt_k = tl.load(ring_dt_ptr + s * srdt_s + head * srdt_h + k_rows, mask=hist, other=0.0)
    cum = tl.cumsum(dt_k, 0)
    hist_total = tl.sum(dt_k, 0)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < headdim
    X = tl.load(ring_x_ptr + s * srx_s + head * srx_h + k_rows[None, :] * srx_r + m[:, None],
                mask=m_mask[:, None] & hist[None, :], other=0.0).to(tl.float32)
    w_hist = tl.where(hist, dt_k * tl.exp(tl.minimum(A * (hist_total - cum), 0.0)), 0.0)
    Xw = X * w_hist[None, :]
    decay_h = tl.exp(tl.minimum(A * hist_total, 0.0))
    B_rows = ring_B_ptr + s * srB_s + g * srB_g + k_rows * srB_r
    for n0 in range(0, DSTATE, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < DSTATE
        sm_mask = m_mask[:, None] & n_mask[None, :]
        S = tl.load(state_ptr + s * ss_s + head * ss_h + m[:, None] * ss_p + n[None, :], mask=sm_mask,
                    other=0.0).to(tl.float32)
        S = _fold_chunk(S, Xw, hist, decay_h, B_rows, n, n_mask, PRECISION)
        tl.store(out_ptr + b * so_b + head * so_h + m[:, None] * so_p + n[None, :], S, mask=sm_mask)


# ---------------------------------------------------------------------------------------------- launchers

# The launch config type and the tile space (SpecLaunchConfig, SPEC_TILE_*, spec_tile_candidates): spec_tiles.py.

# Tuned configs live in the per-device launch tables (replayssm/launch_table.py) under kernel
# "mamba2_replay_spec", keyed by (headdim, dstate, ring_len, window) and the state dtype; a geometry and GPU with
# no entry runs the default rule of `launch_config`. The tree verify ("mamba2_replay_tree") and materialize
# ("mamba2_spec_materialize") resolve under their own names: a chain entry never reaches them (the tree is
# tuned apart, on a chain tree without the window padding: experiments/tune.py; materialize is not tuned).
KERNELS = ("mamba2_replay_spec", "mamba2_replay_tree", "mamba2_spec_materialize")


def launch_config(headdim: int, dstate: int, ring_len: int, arch: int, window: int | None = None,
                  state_dtype=None, kernel: str = "mamba2_replay_spec") -> SpecLaunchConfig:
    """The launch config of `kernel` (one of KERNELS) for a geometry on an architecture (checks.kernel_arch:
    0 = interpreter): a `launch_table.override`, else this device's tuned entry, else `default_launch_config`."""
    key = launch_registry.key(kernel, headdim=headdim, dstate=dstate, ring_len=ring_len, window=window)
    return launch_table.resolve(kernel, key, state_dtype, arch, default_launch_config(headdim, dstate, ring_len, arch))


def default_launch_config(headdim: int, dstate: int, ring_len: int, arch: int) -> SpecLaunchConfig:
    """The default rule.

    Interpreter: one program per (row, head) and one dstate chunk: it costs per program and per op, not
    per FLOP. GPU (sm_90 / sm_100): a 32-row headdim tile, 16-wide dstate chunks, 4 warps and 2 stages:
    scripts/kernels/kernel_report.py at history 16 / window 4 (Nemotron-3 Nano, Super, Ultra; triton 3.6, 3.7, 3.9)
    gives the verify kernel 125-150 registers and no spill. 32-wide chunks use 168-185 registers since the
    dstate loop has a constexpr trip count, and triton 3.6's build for sm_90 spills 4 B there; 64-wide
    chunks spill (255 registers + local memory), and so does a whole 128-wide dstate. A 64-row ring
    (history > 28) gets 8 warps, untested. Not yet timed on hardware.
    """
    if arch == 0:
        return SpecLaunchConfig(max(16, next_pow2(headdim)), max(16, next_pow2(dstate)), 4, 4, 1)
    block_m = 16 if headdim <= 16 else 32
    block_n = 16  # the tl.dot minimum; dstate is padded to a power of 2 >= 16, so the chunks tile it
    warps = 4 if ring_len <= 32 else 8
    return SpecLaunchConfig(block_m, block_n, warps, warps, 2)


def _precision(arch: int) -> str:
    return "ieee" if arch == 0 else "tf32x3"


def _blocks(ring: SpecRing, cfg: SpecLaunchConfig | None = None) -> dict:
    block_t = max(16, next_pow2(ring.window))
    if cfg is not None and cfg.block_t is not None:
        block_t = max(block_t, cfg.block_t)
    return dict(BLOCK_T=block_t, BLOCK_K=max(16, ring.ring_len))


def ancestor_bits(parents: torch.Tensor) -> torch.Tensor:
    """parents int32 [b, N] -> int32 [b, N]: bit j of entry s set iff node j is an ancestor-or-self of s.

    A few device-side torch ops (replayssm.tree_ring.ancestor_tables): no host sync, graph capturable. Both
    families' tree verifies read it (N <= MAX_NODES)."""
    anc, _, _ = ancestor_tables(parents)
    weights = torch.ones(parents.shape[1], dtype=torch.int64, device=parents.device) << torch.arange(
        parents.shape[1], device=parents.device)
    return (anc.long() * weights).sum(-1).to(torch.int32)


def launch_verify(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, slots: torch.Tensor,
                  out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """Scatter + verify launches of a chain window, or with `parents` int32 [batch, N] of a draft tree of
    N = ring.window <= MAX_NODES nodes (the verify kernel with IS_TREE)."""
    geo, batch = ring.geometry, x.shape[0]
    is_tree = parents is not None
    if is_tree and ring.window > MAX_NODES:
        raise ValueError(f"N={ring.window} > {MAX_NODES}: the Triton tree kernel keeps one int32 bit set per node")
    arch = kernel_arch(x.device)
    # Tuned tiles and their window padding were searched on the chain kernel only: a tree resolves under its
    # own kernel name (the default rule unless its own entry or override), without the window padding.
    cfg = launch_config(geo.headdim, geo.dstate, ring.ring_len, arch, ring.window, ring.state.dtype,
                        "mamba2_replay_tree" if is_tree else "mamba2_replay_spec")
    blk, prec = dict(_blocks(ring, None if is_tree else cfg), BLOCK_N=cfg.block_n), _precision(arch)
    common = dict(null_slot=ring.null_slot, headdim=geo.headdim, HEADS_PER_GROUP=geo.heads_per_group,
                  DSTATE=geo.dstate)
    anc = ancestor_bits(parents) if is_tree else None
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
    _verify_kernel[(triton.cdiv(geo.headdim, cfg.block_m), batch, geo.nheads)](
        x, zz, C, A, A if D is None else D, out, slots,
        ring.state, ring.x, ring.B, ring.dt, ring.bc, ring.write_pos, ring.origin, ring.is_flush,
        x.stride(0), x.stride(1), x.stride(2), zz.stride(0), zz.stride(1), zz.stride(2),
        C.stride(0), C.stride(1), C.stride(2), out.stride(0), out.stride(1), out.stride(2),
        ring.state.stride(0), ring.state.stride(1), ring.state.stride(2),
        ring.x.stride(0), ring.x.stride(1), ring.x.stride(2), ring.B.stride(0), ring.B.stride(1), ring.B.stride(2),
        ring.dt.stride(0), ring.dt.stride(1), ring.bc.stride(0), ring.bc.stride(1), ring.bc.stride(2),
        anc_ptr=anc, sanc_b=anc.stride(0) if is_tree else 0,
        **common, T=ring.window, RING=ring.ring_len, HAS_D=D is not None, HAS_Z=z is not None,
        BLOCK_M=cfg.block_m, PRECISION=prec, IS_TREE=is_tree, num_warps=cfg.verify_warps,
        num_stages=cfg.verify_stages, **blk,
    )
    return out


def launch_materialize(ring: SpecRing, A: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    geo, batch = ring.geometry, slots.shape[0]
    out = torch.full((batch, geo.nheads, geo.headdim, geo.dstate), float("nan"), device=ring.device)
    if batch == 0:
        return out
    arch = kernel_arch(ring.device)
    cfg = launch_config(geo.headdim, geo.dstate, ring.ring_len, arch, ring.window, ring.state.dtype,
                        "mamba2_spec_materialize")
    _materialize_kernel[(triton.cdiv(geo.headdim, cfg.block_m), batch, geo.nheads)](
        A, out, slots, ring.state, ring.x, ring.B, ring.dt, ring.write_pos, ring.origin,
        out.stride(0), out.stride(1), out.stride(2), ring.state.stride(0), ring.state.stride(1), ring.state.stride(2),
        ring.x.stride(0), ring.x.stride(1), ring.x.stride(2), ring.B.stride(0), ring.B.stride(1), ring.B.stride(2),
        ring.dt.stride(0), ring.dt.stride(1),
        null_slot=ring.null_slot, headdim=geo.headdim, HEADS_PER_GROUP=geo.heads_per_group, DSTATE=geo.dstate,
        RING=ring.ring_len, BLOCK_M=cfg.block_m, BLOCK_K=_blocks(ring)["BLOCK_K"], BLOCK_N=cfg.block_n,
        PRECISION=_precision(arch), num_warps=cfg.verify_warps,
    )
    return out
