"""Vectorised PyTorch backend of the GDN speculative ring (backend="torch"): the CPU timing backend.

Same function and cache contents as the Triton kernels (replayssm/gdn/spec_kernels.py), fp32 math. It
touches the state as few times as the method allows: a non-flush row reads the checkpoint once and never
builds S_h (it reads S_h k and S_h q as exp(G_tot) S0 k + sum_j w_j u_j (k_j . k), the output-only form of
ReplaySSM blog Appendix A.2, Algorithm 8 step 2); only flush rows materialise S_h, and write it once. The T x T system
(I + A) U = R is solved with torch.linalg.solve_triangular (unit lower triangular). With `parents` the
same function verifies a draft tree (replayssm.gdn.tree): the system restricted to ancestors.

Arguments arrive validated from replayssm.gdn.spec. Value head hv = kh * G + i of key head kh is handled
as a [.., H, G, ..] view so grouped keys are never copied HV/H times for the state-sized products.
State formats (replayssm/state_format.py): `checkpoint` reads S0 dequantised, `store_fold` writes the flush fold
by the format's rule (KDA's torch form shares both); a flush row with an empty history writes nothing.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ring import SpecRing
from replayssm.state_format import format_of, read_state, write_state
from replayssm.tree_ring import ancestor_tables, tree_prefix

L2NORM_EPS = 1e-6


def l2norm_fp32(t: torch.Tensor) -> torch.Tensor:
    """t / sqrt(sum t^2 + 1e-6) over the last dim, fp32 (the kernels' formula)."""
    t = t.float()
    return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + L2NORM_EPS)


def _live_rows(ring: SpecRing, slots: torch.Tensor, batch: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(rows, slots) of the live rows; rows is None when every row is live (no gather of the inputs)."""
    live = slots != ring.null_slot
    if bool(live.all()):
        return None, slots.long()
    rows = live.nonzero().squeeze(1)
    return rows, slots.long()[rows]


def _whole_pool(ring: SpecRing, rows: torch.Tensor | None, sl: torch.Tensor) -> bool:
    """True when the live rows are slots 0..num_slots-1 in order: cache tensors are used as views."""
    return rows is None and sl.numel() == ring.num_slots and bool(
        (sl == torch.arange(ring.num_slots, device=sl.device)).all())


def checkpoint(ring: SpecRing, sl: torch.Tensor, whole: bool) -> torch.Tensor:
    """The rows' checkpoints S0, fp32 [b, HV, V, K]: the cache itself when it is an fp32 whole pool, else a copy
    (a cast, or dequantised with the per-head scale of an int8 / e4m3 format: replayssm/state_format.py)."""
    if format_of(ring).plain:
        return (ring.state if whole else ring.state[sl]).float()
    return read_state(ring, slice(None) if whole else sl)


def store_fold(ring: SpecRing, slots: torch.Tensor, S_h: torch.Tensor) -> None:
    """The flush fold S_h [n, HV, V, K] fp32 into the checkpoints of `slots` (long [n], unique): the one state
    write of a verify, by the format's rule (a cast, a fresh per-head scale, or stochastic rounding keyed by
    each slot's sr_step, which then advances)."""
    if format_of(ring).plain:
        ring.state.index_copy_(0, slots, S_h.to(ring.state_dtype))
    else:
        write_state(ring, slots, S_h)


def _history(ring: SpecRing, sl: torch.Tensor, whole: bool):
    """Committed history of the rows in logical order, masked past write_pos.

    Returns (w_u [b, H, G, R, V] fp32: u_j weighted by exp(G_tot - G_j), k [b, H, R, K] fp32,
    decay0 [b, HV] = exp(G_tot)). Rows past write_pos carry weight 0.
    """
    gm, R = ring.geometry, ring.ring_len
    G = gm.value_heads_per_key_head
    h = ring.write_pos.long() if whole else ring.write_pos.long()[sl]
    origin = ring.origin.long() if whole else ring.origin.long()[sl]
    j = torch.arange(R, device=sl.device)
    pos = (origin[:, None] + j) & (R - 1)                              # [b, R] ring row of history entry j
    valid = j[None, :] < h[:, None]                                     # [b, R]
    b = pos.shape[0]
    g_all = ring.g if whole else ring.g[sl]
    g_hist = torch.gather(g_all, 2, pos[:, None, :].expand(b, gm.HV, R)) * valid[:, None, :]
    G_pre = torch.cumsum(g_hist, -1)
    G_tot = G_pre[..., -1:]
    w = torch.exp(torch.clamp(G_tot - G_pre, max=0.0)) * valid[:, None, :]      # [b, HV, R]
    u_all = ring.u if whole else ring.u[sl]
    u_hist = torch.gather(u_all, 2, pos[:, None, :, None].expand(b, gm.HV, R, gm.V)).float()
    k_all = ring.k if whole else ring.k[sl]
    k_hist = torch.gather(k_all, 2, pos[:, None, :, None].expand(b, gm.H, R, gm.K)).float()
    w_u = (u_hist * w[..., None]).view(b, gm.H, G, R, gm.V)
    return w_u, k_hist, torch.exp(G_tot[..., 0])


def verify_torch(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                 out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """q, k [batch, T, H, K]; v [batch, T, HV, V]; g, beta [batch, T, HV]; out [batch, T, HV, V].

    parents int32 [batch, T] (a draft tree of T nodes, replayssm.gdn.tree) restricts the window's system to
    ancestors: A[s, c] kept only for c a strict ancestor of s, G the tree prefix sum of g along the path, the
    output summed over ancestors-or-self. For a chain every mask and sum equals the parents=None path's, bit
    for bit; the history part (S_h k, S_h q, the flush fold) does not depend on parents."""
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

    kw = (l2norm_fp32(k) if use_qk_l2norm else k.float()).transpose(1, 2)          # [b, H, T, K]
    qw = (l2norm_fp32(q) if use_qk_l2norm else q.float()).transpose(1, 2) * scale
    kqw = torch.cat([kw, qw], 2)                                                    # [b, H, 2T, K]

    # S_h [k | q] = exp(G_tot) S0 [k | q] + sum_j w_j u_j (k_j . [k | q]): one pass over the checkpoint.
    w_u, k_hist, decay0 = _history(ring, sl, whole)
    S0 = checkpoint(ring, sl, whole).view(b, gm.H, G, gm.V, gm.K)
    hkq = torch.einsum("bhgvk,bhtk->bhgtv", S0, kqw)
    hkq.mul_(decay0.view(b, gm.H, G, 1, 1))
    hkq.add_(torch.einsum("bhgrv,bhrt->bhgtv", w_u, k_hist @ kqw.transpose(-1, -2)))
    hkq = hkq.reshape(b, gm.HV, 2 * T, gm.V)
    hk, hq = hkq[:, :, :T], hkq[:, :, T:]

    # Flush rows fold the history into the checkpoint (rows with h == 0 have nothing to fold).
    wp = ring.write_pos if whole else ring.write_pos[sl]
    fl = ring.is_flush if whole else ring.is_flush[sl]
    fold = ((fl != 0) & (wp > 0)).nonzero().squeeze(1)
    if fold.numel():
        S_h = S0.index_select(0, fold) * decay0.index_select(0, fold).view(-1, gm.H, G, 1, 1)
        S_h.add_(torch.einsum("bhgrv,bhrk->bhgvk", w_u.index_select(0, fold), k_hist.index_select(0, fold)))
        store_fold(ring, sl.index_select(0, fold), S_h.view(-1, gm.HV, gm.V, gm.K))

    # Window: chunked delta rule over T tokens from S_h. strict[s, c]: c enters row s of A; path[s, c]: c is
    # summed into o_s (a chain: c < s and c <= s; a tree: c a strict ancestor of s, an ancestor-or-self).
    g_win = g.float().transpose(1, 2)                                               # [b, HV, T]
    b_win = beta.float().transpose(1, 2)
    if parents is None:
        Gc = torch.cumsum(g_win, -1)
        ones = torch.ones(T, T, dtype=torch.bool, device=q.device)
        strict, path = torch.tril(ones, -1), torch.tril(ones)
    else:
        anc, depth, seq = ancestor_tables(parents)                                  # anc [b, T, T]
        Gc = tree_prefix(g.float(), torch.zeros(b, gm.HV, device=q.device), seq, depth).transpose(1, 2)
        eye = torch.eye(T, dtype=torch.bool, device=q.device)
        strict, path = (anc & ~eye)[:, None], anc[:, None]                          # [b, 1, T, T]
    decay = torch.exp(torch.clamp(Gc[..., :, None] - Gc[..., None, :], max=0.0))   # [b, HV, T, T]
    kk = (kw @ kw.transpose(-1, -2)).repeat_interleave(G, 1)                        # [b, HV, T, T]
    qk = (qw @ kw.transpose(-1, -2)).repeat_interleave(G, 1)
    A = torch.where(strict, b_win[..., :, None] * decay * kk, 0.0)
    eG = torch.exp(Gc)[..., None]
    Rhs = b_win[..., None] * (v.float().transpose(1, 2) - eG * hk)                  # [b, HV, T, V]
    # Unit lower triangular in topological order (a tree's parents come first): the diagonal is taken as 1.
    U = torch.linalg.solve_triangular(A, Rhs, upper=False, unitriangular=True)
    o = eG * hq + torch.where(path, decay * qk, 0.0) @ U                            # [b, HV, T, V]
    if rows is None:
        out.copy_(o.transpose(1, 2))
    else:
        out.index_copy_(0, rows, o.transpose(1, 2).to(out.dtype))

    # Append the window to the ring after the committed history.
    origin = ring.origin if whole else ring.origin[sl]
    wrows = (origin.long()[:, None] + wp.long()[:, None] + torch.arange(T, device=q.device)) & (R - 1)   # [b, T]
    sidx, widx = sl[:, None, None], wrows[:, None, :]
    ring.u[sidx, torch.arange(gm.HV, device=q.device)[None, :, None], widx] = U.to(ring.act_dtype)
    ring.g[sidx, torch.arange(gm.HV, device=q.device)[None, :, None], widx] = g_win
    ring.k[sidx, torch.arange(gm.H, device=q.device)[None, :, None], widx] = kw.to(ring.act_dtype)
    return out


def materialize_torch(ring: SpecRing, slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [batch, HV, V, K] fp32 <- committed state of each live row (no cache write)."""
    gm = ring.geometry
    rows, sl = _live_rows(ring, slots, slots.shape[0])
    if sl.numel() == 0:
        return out
    whole = _whole_pool(ring, rows, sl)
    b, G = sl.numel(), gm.value_heads_per_key_head
    w_u, k_hist, decay0 = _history(ring, sl, whole)
    S0 = checkpoint(ring, sl, whole).view(b, gm.H, G, gm.V, gm.K)
    S_h = S0 * decay0.view(b, gm.H, G, 1, 1) + torch.einsum("bhgrv,bhrk->bhgvk", w_u, k_hist)
    S_h = S_h.view(b, gm.HV, gm.V, gm.K)
    if rows is None:
        out.copy_(S_h)
    else:
        out.index_copy_(0, rows, S_h)
    return out
