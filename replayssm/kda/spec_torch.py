"""Vectorised PyTorch backend of the KDA speculative ring (backend="torch"): GDN's (replayssm/gdn/spec_torch.py)
with every decay a K-vector that weights key channels instead of a scalar that weights updates.

Per live row and value head, the committed history j < h (cumulative per-channel decays G_pre_j, G_tot) gives
    S_h = S0 diag(exp(G_tot)) + sum_j u_j (w_j * k_j)^T,   w_j = exp(G_tot - G_pre_j) [K]
and S_h x = S0 (exp(G_tot) * x) + sum_j ((w_j * k_j) . x) u_j: a non-flush row reads the checkpoint once and
never forms S_h. With the window's cumulative decays G_s = g_0 + .. + g_s ([K], a tree: the sum over s's path):
    A[s, c] = beta_s sum_d k_s[d] k_c[d] exp(G_s[d] - G_c[d])      c a strict predecessor (ancestor) of s
    R_s     = beta_s (v_s - S_h (exp(G_s) * k_s))
    (I + A) U = R                                                   unit lower triangular: forward solve
    o_s     = S_h (exp(G_s) * q_s) + sum_{c <= s on the path} (sum_d k_c[d] q_s[d] exp(G_s[d] - G_c[d])) U_c
The decay-weighted key dots are formed pairwise (exp of a difference, clamped at 0), never as exp(G_s) times
exp(-G_c), which would overflow fp32 once a channel's window decay passes e^88.
Arguments arrive validated from replayssm.kda.spec; parents (a draft tree) as in replayssm.gdn.tree.
"""

from __future__ import annotations

import torch

from replayssm.gdn.spec_torch import _live_rows, _whole_pool, checkpoint, l2norm_fp32, store_fold
from replayssm.tree_ring import ancestor_tables, tree_prefix


def _history(ring, sl: torch.Tensor, whole: bool):
    """Committed history in logical order. Returns (u [b, HV, R, V] fp32 masked past write_pos, weighted keys
    kw [b, HV, R, K] = w_j * k_j (0 past write_pos), decay0 [b, HV, K] = exp(G_tot))."""
    gm, R = ring.geometry, ring.ring_len
    h = ring.write_pos.long() if whole else ring.write_pos.long()[sl]
    origin = ring.origin.long() if whole else ring.origin.long()[sl]
    j = torch.arange(R, device=sl.device)
    pos = (origin[:, None] + j) & (R - 1)                                # [b, R]
    valid = (j[None, :] < h[:, None])[:, None, :, None]                  # [b, 1, R, 1]
    b = pos.shape[0]
    take = pos[:, None, :, None]
    g_all = ring.g if whole else ring.g[sl]
    g_hist = torch.gather(g_all, 2, take.expand(b, gm.HV, R, gm.K)) * valid
    G_pre = torch.cumsum(g_hist, 2)
    G_tot = G_pre[:, :, -1:]
    w = torch.exp(torch.clamp(G_tot - G_pre, max=0.0)) * valid
    u_all = ring.u if whole else ring.u[sl]
    u_hist = torch.gather(u_all, 2, take.expand(b, gm.HV, R, gm.V)).float() * valid
    k_all = ring.k if whole else ring.k[sl]
    k_hist = torch.gather(k_all, 2, take.expand(b, gm.H, R, gm.K)).float()
    kw = k_hist.repeat_interleave(gm.value_heads_per_key_head, 1) * w
    return u_hist, kw, torch.exp(G_tot[:, :, 0])


def _state_times(S0, decay0, u_hist, kw, x):
    """S_h x for x [b, HV, m, K] -> [b, HV, m, V] from the checkpoint and the history, without forming S_h."""
    return (x * decay0[:, :, None]) @ S0.transpose(-1, -2) + (x @ kw.transpose(-1, -2)) @ u_hist


def verify_torch(ring, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots, out, parents=None):
    """q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K]; beta [batch, T, HV]; out [batch, T, HV, V]."""
    gm, T, R = ring.geometry, ring.window, ring.ring_len
    G = gm.value_heads_per_key_head
    rows, sl = _live_rows(ring, slots, q.shape[0])
    if sl.numel() == 0:
        return out
    whole = _whole_pool(ring, rows, sl)
    if rows is not None:
        q, k, v, g, beta = (t.index_select(0, rows) for t in (q, k, v, g, beta))
        if parents is not None:
            parents = parents.index_select(0, rows)
    b = sl.numel()
    kw_win = (l2norm_fp32(k) if use_qk_l2norm else k.float()).transpose(1, 2)      # [b, H, T, K]
    qw = (l2norm_fp32(q) if use_qk_l2norm else q.float()).transpose(1, 2) * scale
    k_hv, q_hv = kw_win.repeat_interleave(G, 1), qw.repeat_interleave(G, 1)        # [b, HV, T, K]
    g_win = g.float().transpose(1, 2)                                               # [b, HV, T, K]
    b_win = beta.float().transpose(1, 2)                                            # [b, HV, T]
    if parents is None:
        Gc = torch.cumsum(g_win, 2)
        ones = torch.ones(T, T, dtype=torch.bool, device=q.device)
        strict, path = torch.tril(ones, -1), torch.tril(ones)
    else:
        anc, depth, seq = ancestor_tables(parents)
        Gc = tree_prefix(g.float(), torch.zeros(b, gm.HV, gm.K, device=q.device), seq, depth).transpose(1, 2)
        eye = torch.eye(T, dtype=torch.bool, device=q.device)
        strict, path = (anc & ~eye)[:, None], anc[:, None]

    # readouts S_h (exp(G_s) * [k_s | q_s]) in one pass over the checkpoint
    u_hist, kw, decay0 = _history(ring, sl, whole)
    S0 = checkpoint(ring, sl, whole)                                               # fp32, dequantised
    eG = torch.exp(Gc)
    hkq = _state_times(S0, decay0, u_hist, kw, torch.cat([eG * k_hv, eG * q_hv], 2))   # [b, HV, 2T, V]
    hk, hq = hkq[:, :, :T], hkq[:, :, T:]

    wp = ring.write_pos if whole else ring.write_pos[sl]
    fl = ring.is_flush if whole else ring.is_flush[sl]
    fold = ((fl != 0) & (wp > 0)).nonzero().squeeze(1)
    if fold.numel():
        S_h = (S0.index_select(0, fold) * decay0.index_select(0, fold)[:, :, None, :]
               + u_hist.index_select(0, fold).transpose(-1, -2) @ kw.index_select(0, fold))
        store_fold(ring, sl.index_select(0, fold), S_h)             # by the state format's rule

    # decay-weighted dots: D[s, c, d] = exp(G_s[d] - G_c[d]) (clamped at 0: only c on s's path is kept)
    D = torch.exp(torch.clamp(Gc[:, :, :, None, :] - Gc[:, :, None, :, :], max=0.0))       # [b, HV, T, T, K]
    kk = torch.einsum("bhsd,bhcd,bhscd->bhsc", k_hv, k_hv, D)
    qk = torch.einsum("bhsd,bhcd,bhscd->bhsc", q_hv, k_hv, D)
    A = torch.where(strict, b_win[..., :, None] * kk, 0.0)
    Rhs = b_win[..., None] * (v.float().transpose(1, 2) - hk)
    U = torch.linalg.solve_triangular(A, Rhs, upper=False, unitriangular=True)
    o = hq + torch.where(path, qk, 0.0) @ U
    if rows is None:
        out.copy_(o.transpose(1, 2))
    else:
        out.index_copy_(0, rows, o.transpose(1, 2).to(out.dtype))

    origin = ring.origin if whole else ring.origin[sl]
    wrows = (origin.long()[:, None] + wp.long()[:, None] + torch.arange(T, device=q.device)) & (R - 1)
    sidx, widx = sl[:, None, None], wrows[:, None, :]
    hv_idx = torch.arange(gm.HV, device=q.device)[None, :, None]
    ring.u[sidx, hv_idx, widx] = U.to(ring.act_dtype)
    ring.g[sidx, hv_idx, widx] = g_win
    ring.k[sidx, torch.arange(gm.H, device=q.device)[None, :, None], widx] = kw_win.to(ring.act_dtype)
    return out


def materialize_torch(ring, slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [batch, HV, V, K] fp32 <- committed state of each live row (no cache write)."""
    rows, sl = _live_rows(ring, slots, slots.shape[0])
    if sl.numel() == 0:
        return out
    whole = _whole_pool(ring, rows, sl)
    u_hist, kw, decay0 = _history(ring, sl, whole)
    S0 = checkpoint(ring, sl, whole)
    S_h = S0 * decay0[:, :, None, :] + u_hist.transpose(-1, -2) @ kw
    if rows is None:
        out.copy_(S_h)
    else:
        out.index_copy_(0, rows, S_h)
    return out
