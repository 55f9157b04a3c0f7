"""Triton kernels of the GDN speculative ring: verify (+ flush) and materialise.

Verify grid (cdiv(V, BV), batch, HV): one program owns a [BV, K] slice of one value head's state and walks K
in tiles of BKT columns. Per tile it rebuilds S_h = exp(G_tot) S0 + (w u)^T k_hist with one tl.dot over the
history axis (padded to BC >= 16 rows), stores it as the new checkpoint on flush rows (masked store, so
non-flush rows write no state), and accumulates, with one more tl.dot each, the readouts S_h w_r and the
Gram matrix w_r . w_c of the stacked window rows w = [k_0 .. k_{T-1}, q_0 .. q_{T-1}] (padded to TW >= 16).
After the K walk the T x T unit lower triangular system (I + A) U = R is solved by forward substitution
(row s of R - A U, one row per step) and the outputs come from one more tl.dot (blog App. A.2, Alg. 8).
Tree verify (replayssm.gdn.tree) is the same kernel with IS_TREE set: the window differs in three masks, all
from anc[row, s], an int32 bit set per node (bit c: node c is an ancestor of s or s itself; N <= 32):
    G_s   = sum of g over s's path (tree prefix sum) on the rows, the same per key column
    A     = beta_s exp(G_s - G_c) (k_s . k_c) only for c a strict ancestor of s: the system stays unit lower
            triangular in topological order, and the forward substitution (row s reads rows < s) is unchanged
    o_s   = exp(G_s) S_h q_s + sum over c on s's path of exp(G_s - G_c) (k_c . q_s) U_c
Restricted to one root-to-leaf path it is the chain system; node s's (U_s, k_s, g_s) go to ring row
(origin + h + s) & (R - 1), where a chain's window token s goes. With IS_TREE off the chain compiles without
the bit-set load (anc_ptr is None there).
Kimi Delta Attention (replayssm.kda) runs the same kernels with PER_CHANNEL set: g is a K-vector per value head
(window g [batch, T, HV, K], ring g [slots, HV, R, K]), so every decay becomes a row over the key columns:
    S_h   = S0 diag(exp(G_tot)) + u_hist^T @ (w * k_hist)   w[j, c] = exp(G_tot[c] - G_pre_j[c]), per K tile
    G_r   = sum of g over the path of row r's token, a [BKT] row per K tile (a chain: the prefix sum)
    HW[r] = S_h (exp(G_r) * w_r)                               the readouts, decayed on the key side
    WW[r, c] = sum_d w_r[d] k_c[d] exp(G_r[d] - G_c[d])        formed pairwise per K tile (one [TW, BKT]
               product per window token c; exp of a difference clamped at 0, never exp(G_r) exp(-G_c), which
               overflows fp32 once a channel's window decay passes e^88)
    A = beta_s WW on the strict mask, R = beta_s (v_s - HW[s]), o = HW[q rows] + (WW on the path) @ U
With PER_CHANNEL off every added branch is compiled out: GDN's kernels are unchanged.
Cursors are never written by verify: commit and reset are separate tiny launches (replayssm/ring_cursors.py,
shared with the Mamba-2 ring), so verify is race-free and every launch is CUDA-graph capturable.

Ring ownership (no two programs write one address): the u rows of (slot, hv, V tile) belong to that
program; the g rows of (slot, hv) to the program with pid_v == 0; the k rows of (slot, key head) to the
program with pid_v == 0 and hv the first value head of the group. Window rows never overlap the history
rows other programs read (write_pos + T <= L <= ring_len).

Scalar conditions (fold, ring owner) gate stores with `if`, never as `block_mask & flag`: triton 3.9's
interpreter turns that `&` into an int32 mask, which tl.load / tl.store reject.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm import launch_registry, launch_table
from replayssm.checks import NULL_SLOT, kernel_arch, next_pow2
from replayssm.geometry import GDNGeometry
from replayssm.mamba2.spec_kernels import MAX_NODES, ancestor_bits

# The K walk itself takes any K, but the launch configs were built and checked (no spills) for K <= 256 only;
# a larger key dim is rejected rather than run on an unchecked tiling (same limit as the baselines).
MAX_K = 256


KERNELS = ("gdn_replay_spec", "gdn_replay_tree", "gdn_spec_materialize",
           "kda_replay_spec", "kda_replay_tree", "kda_spec_materialize")


def launch_config(geometry: GDNGeometry, history_len: int, window: int, device, state_dtype=None,
                  kernel: str = "gdn_replay_spec", per_channel: bool = False) -> dict:
    """The config of `kernel` (one of KERNELS; the kda_ names are the PER_CHANNEL builds, tuned apart): this
    device's tuned entry (replayssm/launch_table.py, keyed by K, V, history and window), else
    `default_launch_config`. TW and BC follow the window and history: a tuned entry changes only BV, BKT and
    num_warps (the space of experiments/tune.py)."""
    arch = kernel_arch(device)
    key = launch_registry.key(kernel, geometry, history=history_len, window=window)
    return launch_table.resolve(kernel, key, state_dtype, arch,
                                default_launch_config(geometry, history_len, window, arch, per_channel,
                                                      tree=kernel.endswith("_replay_tree")))


def default_launch_config(geometry: GDNGeometry, history_len: int, window: int, arch: int,
                          per_channel: bool = False, tree: bool = False) -> dict:
    """Block sizes for (geometry, GPU arch). Interpreter: biggest legal blocks (it costs per program).
    GPU: [BV, BKT] = [32, 16] tiles, 2 warps, tf32x3 dots: at K = V = 128, fp32 state, T <= 8, B <= 32 the
    AOT build for sm_90 / sm_100 uses 128-161 registers and no local memory ([32, 32] tiles reach 250
    registers; "ieee" dots would run the reconstruction on CUDA cores)."""
    cfg = {"TW": max(16, next_pow2(2 * window)), "BC": max(16, next_pow2(history_len))}
    if arch == 0:
        cfg.update(BV=max(16, next_pow2(geometry.V)), BKT=max(16, next_pow2(geometry.K)), num_warps=4,
                   DOT_PRECISION="ieee")
    else:
        cfg.update(BV=32 if geometry.V > 16 else 16, BKT=16, num_warps=2, DOT_PRECISION="tf32x3")
        if per_channel:
            # KDA: the per-tile window decays and the pairwise decayed dots hold [TW, BKT] tiles beside GDN's;
            # 4 warps spread them (2 warps spill at Kimi-Linear's geometry, scripts/kernels/kernel_report.py)
            cfg.update(num_warps=4)
            if tree:
                # the KDA tree verify adds the ancestor bit sets and per-path decays: [32, 16] tiles at 4 warps
                # need 226-234 registers under Triton 3.7.1 and spill under 3.6.0 (make test-gpu-stack); [16, 16]
                # tiles at 4 warps reach 246-254 under 3.6.0, at 8 warps 222 (3.6.0) / 186 (3.7.1), sm_90 and
                # sm_100 at Kimi-Linear's geometry (kernel_report.py --tune-space)
                cfg.update(BV=16, num_warps=8)
    return cfg


@triton.jit
def _history_weights(ring_g_ptr, g_base, hist_rows, valid):
    """w_j = exp(G_tot - G_j) for history entries j (0 past write_pos) and exp(G_tot)."""
    g_hist = tl.load(ring_g_ptr + g_base + hist_rows, mask=valid, other=0.0)
    G_pre = tl.cumsum(g_hist, 0)
    G_tot = tl.sum(g_hist, 0)
    w = tl.where(valid, tl.exp(tl.minimum(G_tot - G_pre, 0.0)), 0.0)
    return w, tl.exp(G_tot)


@triton.jit
def _spec_verify_kernel(
    state_ptr, s_slot, s_head, s_v,
    ring_u_ptr, ru_slot, ru_head, ru_row,
    ring_k_ptr, rk_slot, rk_head, rk_row,
    ring_g_ptr, rg_slot, rg_head,
    write_pos_ptr, origin_ptr, is_flush_ptr, slots_ptr, anc_ptr, anc_b,
    q_ptr, q_b, q_t, q_h,
    k_ptr, k_b, k_t, k_h,
    v_ptr, v_b, v_t, v_h,
    g_ptr, g_b, g_t,
    beta_ptr, beta_b, beta_t,
    out_ptr, o_b, o_t, o_h,
    scale, ring_mask,
    T: tl.constexpr, TW: tl.constexpr, BC: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, BKT: tl.constexpr, USE_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NULL: tl.constexpr, IS_TREE: tl.constexpr, rg_row=1, g_h=1, PER_CHANNEL: tl.constexpr = False,
):
    pid_v = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    if slot == NULL:
        return
    slot = slot.to(tl.int64)
    kh = hv // GROUP
    h = tl.load(write_pos_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    do_fold = (tl.load(is_flush_ptr + slot) != 0) & (h > 0)
    writes_k = (pid_v == 0) & (hv % GROUP == 0)

    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    offs_c = tl.arange(0, BC)
    valid_c = offs_c < h
    hist_rows = (origin + offs_c) & ring_mask
    # Window rows, stacked: row r < T is key k_r, row T + s is query q_s (padded to TW >= 16 for tl.dot).
    # One [TW, BKT] operand gives both readouts S_h k, S_h q and both Gram matrices k.k, q.k per K tile.
    offs_r = tl.arange(0, TW)
    is_k = offs_r < T
    is_q = (offs_r >= T) & (offs_r < 2 * T)
    tok = tl.where(is_q, offs_r - T, offs_r)
    live_r = is_k | is_q
    w_ptrs = tl.where(is_q, q_ptr + row * q_b + tok * q_t + kh * q_h, k_ptr + row * k_b + tok * k_t + kh * k_h)
    win_rows = (origin + h + tok) & ring_mask

    if PER_CHANNEL:
        # KDA: the history weights go on the keys, per K tile (below); the u rows stay as they are
        u_hist = tl.load(ring_u_ptr + slot * ru_slot + hv * ru_head + hist_rows[:, None] * ru_row + offs_v[None, :],
                         mask=valid_c[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        wu_t = tl.trans(u_hist)                                                   # [BV, BC]
        g_base = ring_g_ptr + slot * rg_slot + hv * rg_head
        g_win_base = g_ptr + row * g_b + hv * g_h
        if IS_TREE:
            anc_r = tl.load(anc_ptr + row * anc_b + tok, mask=live_r, other=0)     # [TW]
    else:
        w, decay0 = _history_weights(ring_g_ptr, slot * rg_slot + hv * rg_head, hist_rows, valid_c)
        u_hist = tl.load(ring_u_ptr + slot * ru_slot + hv * ru_head + hist_rows[:, None] * ru_row + offs_v[None, :],
                         mask=valid_c[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        wu_t = tl.trans(u_hist * w[:, None])                                      # [BV, BC]

    # q rows carry the scale; in-kernel L2 norm needs the whole K axis: a first pass over the window rows.
    mult = tl.where(is_q, scale, 1.0)
    if USE_L2NORM:
        ssq = tl.zeros([TW], dtype=tl.float32)
        for k0 in range(0, K, BKT):
            offs_k = k0 + tl.arange(0, BKT)
            wt = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live_r[:, None] & (offs_k < K)[None, :],
                         other=0.0).to(tl.float32)
            ssq += tl.sum(wt * wt, 1)
        mult = mult / tl.sqrt(ssq + 1e-6)

    HW = tl.zeros([TW, BV], dtype=tl.float32)          # row r: S_h w_r (S_h k_s, then S_h q_s)
    WW = tl.zeros([TW, TW], dtype=tl.float32)          # w_r . w_c (k.k in the top rows, q.k below)
    for k0 in range(0, K, BKT):
        offs_k = k0 + tl.arange(0, BKT)
        mask_k = offs_k < K
        s_ptrs = state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :]
        s_mask = mask_v[:, None] & mask_k[None, :]
        if PER_CHANNEL:
            k_hist = tl.load(ring_k_ptr + slot * rk_slot + kh * rk_head + hist_rows[:, None] * rk_row
                             + offs_k[None, :], mask=valid_c[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            g_hist = tl.load(g_base + hist_rows[:, None] * rg_row + offs_k[None, :],
                             mask=valid_c[:, None] & mask_k[None, :], other=0.0)           # [BC, BKT]
            G_hist = tl.cumsum(g_hist, 0)
            G_tot = tl.sum(g_hist, 0)
            w_k = tl.where(valid_c[:, None], tl.exp(tl.minimum(G_tot[None, :] - G_hist, 0.0)), 0.0)
            S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32) * tl.exp(G_tot)[None, :]
            S += tl.dot(wu_t, k_hist * w_k, input_precision=DOT_PRECISION)           # S_h tile [BV, BKT]
        else:
            S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32) * decay0
            k_hist = tl.load(ring_k_ptr + slot * rk_slot + kh * rk_head + hist_rows[:, None] * rk_row
                             + offs_k[None, :], mask=valid_c[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            S += tl.dot(wu_t, k_hist, input_precision=DOT_PRECISION)                # S_h tile [BV, BKT]
        if do_fold:
            tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)
        Wt = tl.load(w_ptrs[:, None] + offs_k[None, :], mask=live_r[:, None] & mask_k[None, :],
                     other=0.0).to(tl.float32) * mult[:, None]
        if writes_k:
            tl.store(ring_k_ptr + slot * rk_slot + kh * rk_head + win_rows[:, None] * rk_row + offs_k[None, :],
                     Wt.to(ring_k_ptr.dtype.element_ty), mask=is_k[:, None] & mask_k[None, :])
        if PER_CHANNEL:
            # G_r of this K tile: g summed over the path of row r's token (chain: c <= tok; tree: the bit set)
            Grow = tl.zeros([TW, BKT], dtype=tl.float32)
            for c in tl.static_range(T):
                g_c = tl.load(g_win_base + c * g_t + offs_k, mask=mask_k, other=0.0)              # [BKT]
                if IS_TREE:
                    on_c = live_r & (((anc_r >> c) & 1) != 0)
                else:
                    on_c = live_r & (c <= tok)
                Grow += tl.where(on_c[:, None], g_c[None, :], 0.0)
            if pid_v == 0:
                g_tile = tl.load(g_win_base + offs_r[:, None] * g_t + offs_k[None, :],
                                 mask=is_k[:, None] & mask_k[None, :], other=0.0)
                tl.store(g_base + win_rows[:, None] * rg_row + offs_k[None, :], g_tile,
                         mask=is_k[:, None] & mask_k[None, :])
            HW += tl.dot(Wt * tl.exp(Grow), tl.trans(S), input_precision=DOT_PRECISION)
            # decay-weighted dots, one key column c at a time: WW[r, c] += sum_d Wt[r, d] k_c[d] e^(G_r - G_c)[d]
            for c in tl.static_range(T):
                sel = (offs_r == c)[:, None]
                k_c = tl.sum(tl.where(sel, Wt, 0.0), 0)
                G_c = tl.sum(tl.where(sel, Grow, 0.0), 0)
                col = tl.sum(Wt * k_c[None, :] * tl.exp(tl.minimum(Grow - G_c[None, :], 0.0)), 1)    # [TW]
                WW += tl.where((offs_r == c)[None, :], col[:, None], 0.0)
        else:
            HW += tl.dot(Wt, tl.trans(S), input_precision=DOT_PRECISION)
            WW += tl.dot(Wt, tl.trans(Wt), input_precision=DOT_PRECISION)

    if PER_CHANNEL:
        # KDA: HW and WW already carry the per-channel decays (the K loop), so no gate factors remain here
        if IS_TREE:
            col = tl.where(is_k, offs_r, 0)
            on_path = is_k[None, :] & (((anc_r[:, None] >> col[None, :]) & 1) != 0)
            strict = on_path & is_k[:, None] & (offs_r[:, None] != offs_r[None, :])
        else:
            on_path = is_k[None, :] & (offs_r[None, :] <= tok[:, None])
            strict = is_k[None, :] & (offs_r[:, None] > offs_r[None, :])
        beta_k = tl.load(beta_ptr + row * beta_b + offs_r * beta_t + hv, mask=is_k, other=0.0)
        v_win = tl.load(v_ptr + row * v_b + offs_r[:, None] * v_t + hv * v_h + offs_v[None, :],
                        mask=is_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        R = beta_k[:, None] * (v_win - HW)                                        # 0 on the query rows
        A = tl.where(strict, beta_k[:, None] * WW, 0.0)
        U = tl.zeros([TW, BV], dtype=tl.float32)
        for s in tl.static_range(T):
            U = tl.where(offs_r[:, None] == s, R - tl.dot(A, U, input_precision=DOT_PRECISION), U)
        M = tl.where(is_q[:, None] & on_path, WW, 0.0)
        o = HW + tl.dot(M, U, input_precision=DOT_PRECISION)
    else:
        # Gates relative to S_h. on_path[r, c]: key row c is on the path of row r's token (the chain: c <= tok(r);
        # a tree: bit c of anc_r, the ancestor-or-self bit set of r's node). G[r] = the sum of g over that path,
        # Gk[c] = G of key row c, laid along the columns (a chain: the prefix sum).
        g_k = tl.load(g_ptr + row * g_b + offs_r * g_t + hv, mask=is_k, other=0.0)
        if IS_TREE:
            anc_r = tl.load(anc_ptr + row * anc_b + tok, mask=live_r, other=0)                 # [TW]
            col = tl.where(is_k, offs_r, 0)
            on_path = is_k[None, :] & (((anc_r[:, None] >> col[None, :]) & 1) != 0)            # [TW, TW]
            Gk = tl.sum(tl.where(tl.trans(on_path) & is_k[:, None], g_k[:, None], 0.0), 0)
        else:
            on_path = is_k[None, :] & (offs_r[None, :] <= tok[:, None])
            Gk = tl.cumsum(g_k, 0)
        G = tl.sum(tl.where(on_path, g_k[None, :], 0.0), 1)
        beta_k = tl.load(beta_ptr + row * beta_b + offs_r * beta_t + hv, mask=is_k, other=0.0)
        eG = tl.exp(G)
        decay = tl.exp(tl.minimum(G[:, None] - Gk[None, :], 0.0))                      # [TW, TW]

        # Chunked delta rule over the window: (I + A) U = R, A strictly lower triangular on the key rows (a tree
        # keeps only strict ancestors, which come first in topological order: still lower triangular).
        v_win = tl.load(v_ptr + row * v_b + offs_r[:, None] * v_t + hv * v_h + offs_v[None, :],
                        mask=is_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        R = beta_k[:, None] * (v_win - eG[:, None] * HW)                              # 0 on the query rows
        if IS_TREE:
            strict = on_path & is_k[:, None] & (offs_r[:, None] != offs_r[None, :])
        else:
            strict = is_k[None, :] & (offs_r[:, None] > offs_r[None, :])
        A = tl.where(strict, beta_k[:, None] * decay * WW, 0.0)
        # Forward substitution, one row per step: row s of R - A U only reads the finished rows < s of U.
        U = tl.zeros([TW, BV], dtype=tl.float32)
        for s in tl.static_range(T):
            U = tl.where(offs_r[:, None] == s, R - tl.dot(A, U, input_precision=DOT_PRECISION), U)
        # o_s = exp(G_s) S_h q_s + sum over c on s's path of exp(G_s - G_c) (k_c . q_s) U_c, on the query rows.
        M = tl.where(is_q[:, None] & on_path, decay * WW, 0.0)
        o = eG[:, None] * HW + tl.dot(M, U, input_precision=DOT_PRECISION)

    tl.store(out_ptr + row * o_b + tok[:, None] * o_t + hv * o_h + offs_v[None, :],
             o.to(out_ptr.dtype.element_ty), mask=is_q[:, None] & mask_v[None, :])
    tl.store(ring_u_ptr + slot * ru_slot + hv * ru_head + win_rows[:, None] * ru_row + offs_v[None, :],
             U.to(ring_u_ptr.dtype.element_ty), mask=is_k[:, None] & mask_v[None, :])
    if not PER_CHANNEL:
        if pid_v == 0:
            tl.store(ring_g_ptr + slot * rg_slot + hv * rg_head + win_rows, g_k, mask=is_k)


@triton.jit
def _materialize_kernel(
    state_ptr, s_slot, s_head, s_v,
    ring_u_ptr, ru_slot, ru_head, ru_row,
    ring_k_ptr, rk_slot, rk_head, rk_row,
    ring_g_ptr, rg_slot, rg_head,
    write_pos_ptr, origin_ptr, slots_ptr,
    out_ptr, o_b, o_h, o_v,
    ring_mask,
    BC: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    BKT: tl.constexpr, DOT_PRECISION: tl.constexpr, NULL: tl.constexpr, rg_row=1, PER_CHANNEL: tl.constexpr = False,
):
    pid_v = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + row)
    if slot == NULL:
        return
    slot = slot.to(tl.int64)
    kh = hv // GROUP
    h = tl.load(write_pos_ptr + slot)
    origin = tl.load(origin_ptr + slot)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    offs_c = tl.arange(0, BC)
    valid_c = offs_c < h
    hist_rows = (origin + offs_c) & ring_mask
    if PER_CHANNEL:
        u_hist = tl.load(ring_u_ptr + slot * ru_slot + hv * ru_head + hist_rows[:, None] * ru_row + offs_v[None, :],
                         mask=valid_c[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        wu_t = tl.trans(u_hist)
    else:
        w, decay0 = _history_weights(ring_g_ptr, slot * rg_slot + hv * rg_head, hist_rows, valid_c)
        u_hist = tl.load(ring_u_ptr + slot * ru_slot + hv * ru_head + hist_rows[:, None] * ru_row + offs_v[None, :],
                         mask=valid_c[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        wu_t = tl.trans(u_hist * w[:, None])
    for k0 in range(0, K, BKT):
        offs_k = k0 + tl.arange(0, BKT)
        mask_k = offs_k < K
        s_mask = mask_v[:, None] & mask_k[None, :]
        if PER_CHANNEL:
            k_hist = tl.load(ring_k_ptr + slot * rk_slot + kh * rk_head + hist_rows[:, None] * rk_row
                             + offs_k[None, :], mask=valid_c[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            g_hist = tl.load(ring_g_ptr + slot * rg_slot + hv * rg_head + hist_rows[:, None] * rg_row + offs_k[None, :],
                             mask=valid_c[:, None] & mask_k[None, :], other=0.0)
            G_tot = tl.sum(g_hist, 0)
            w_k = tl.where(valid_c[:, None], tl.exp(tl.minimum(G_tot[None, :] - tl.cumsum(g_hist, 0), 0.0)), 0.0)
            S = tl.load(state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :],
                        mask=s_mask, other=0.0).to(tl.float32) * tl.exp(G_tot)[None, :]
            S += tl.dot(wu_t, k_hist * w_k, input_precision=DOT_PRECISION)
        else:
            S = tl.load(state_ptr + slot * s_slot + hv * s_head + offs_v[:, None] * s_v + offs_k[None, :],
                        mask=s_mask, other=0.0).to(tl.float32) * decay0
            k_hist = tl.load(ring_k_ptr + slot * rk_slot + kh * rk_head + hist_rows[:, None] * rk_row
                             + offs_k[None, :], mask=valid_c[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            S += tl.dot(wu_t, k_hist, input_precision=DOT_PRECISION)
        tl.store(out_ptr + row * o_b + hv * o_h + offs_v[:, None] * o_v + offs_k[None, :], S, mask=s_mask)


def _ring_args(ring) -> tuple:
    return (ring.state, ring.state.stride(0), ring.state.stride(1), ring.state.stride(2),
            ring.u, ring.u.stride(0), ring.u.stride(1), ring.u.stride(2),
            ring.k, ring.k.stride(0), ring.k.stride(1), ring.k.stride(2),
            ring.g, ring.g.stride(0), ring.g.stride(1))


def verify_triton(ring, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots, out, parents=None,
                  per_channel: bool = False):
    """Launch the verify kernel: the chain window, or with `parents` int32 [batch, N] a draft tree of
    N = ring.window <= MAX_NODES nodes (IS_TREE; one int32 ancestor bit set per node). per_channel: a KDA ring
    (replayssm.kda), g [batch, T, HV, K]; GDN passes nothing and launches exactly what it did before."""
    gm, batch = ring.geometry, q.shape[0]
    is_tree = parents is not None
    if is_tree and ring.window > MAX_NODES:
        raise ValueError(f"N={ring.window} > {MAX_NODES}: the Triton tree kernel keeps one int32 bit set per node")
    family = "kda" if per_channel else "gdn"
    cfg = launch_config(gm, ring.history_len, ring.window, q.device, ring.state.dtype,
                        f"{family}_replay_tree" if is_tree else f"{family}_replay_spec", per_channel)
    anc = ancestor_bits(parents) if is_tree else None
    grid = (triton.cdiv(gm.V, cfg["BV"]), batch, gm.HV)
    _spec_verify_kernel[grid](
        *_ring_args(ring),
        ring.write_pos, ring.origin, ring.is_flush, slots, anc, anc.stride(0) if is_tree else 0,
        q, q.stride(0), q.stride(1), q.stride(2),
        k, k.stride(0), k.stride(1), k.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2),
        g, g.stride(0), g.stride(1),
        beta, beta.stride(0), beta.stride(1),
        out, out.stride(0), out.stride(1), out.stride(2),
        float(scale), ring.ring_len - 1,
        T=ring.window, TW=cfg["TW"], BC=cfg["BC"], GROUP=gm.value_heads_per_key_head, K=gm.K, V=gm.V,
        BV=cfg["BV"], BKT=cfg["BKT"], USE_L2NORM=bool(use_qk_l2norm), DOT_PRECISION=cfg["DOT_PRECISION"],
        NULL=NULL_SLOT, IS_TREE=is_tree, num_warps=cfg["num_warps"],
        **(dict(rg_row=ring.g.stride(2), g_h=g.stride(2), PER_CHANNEL=True) if per_channel else {}),
    )
    return out


def materialize_triton(ring, slots, out, per_channel: bool = False):
    gm, batch = ring.geometry, slots.shape[0]
    cfg = launch_config(gm, ring.history_len, ring.window, slots.device, ring.state.dtype,
                        f"{'kda' if per_channel else 'gdn'}_spec_materialize", per_channel)
    grid = (triton.cdiv(gm.V, cfg["BV"]), batch, gm.HV)
    _materialize_kernel[grid](
        *_ring_args(ring),
        ring.write_pos, ring.origin, slots,
        out, out.stride(0), out.stride(1), out.stride(2),
        ring.ring_len - 1,
        BC=cfg["BC"], GROUP=gm.value_heads_per_key_head, K=gm.K, V=gm.V, BV=cfg["BV"], BKT=cfg["BKT"],
        DOT_PRECISION=cfg["DOT_PRECISION"], NULL=NULL_SLOT, num_warps=cfg["num_warps"],
        **(dict(rg_row=ring.g.stride(2), PER_CHANNEL=True) if per_channel else {}),
    )
    return out
