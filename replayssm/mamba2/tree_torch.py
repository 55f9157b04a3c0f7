"""Vectorised PyTorch backend of Mamba-2 tree verify (backend="torch"): spec_torch.verify_torch with the
causal mask replaced by the ancestor mask and the window's prefix sums by tree prefix sums.

Node s of the tree sits at logical position h + s; it sees history entry j < h and window node j' iff j' is
an ancestor of s or s itself, weighted dt_j exp(A (cum_s - cum_j)) with cum the tree prefix sum of dt along
the path (history first). For a chain every mask, prefix sum and product equals spec_torch's, bit for bit
(replayssm/tree_ring.py, tree_prefix). Cache writes are the chain's: the N nodes' inputs after the history,
and on flush rows the folded checkpoint. Inputs arrive validated by replayssm.mamba2.tree.
"""

from __future__ import annotations

import torch

from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_torch import _clamped_exp, _fold_into, _Live, _live_rows, _readout, processed_dt
from replayssm.tree_ring import ancestor_tables, tree_prefix


def tree_verify_torch(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, parents: torch.Tensor,
                      slots: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """x, z [batch, N, nheads, headdim]; dt [batch, N, nheads] raw; B, C [batch, N, ngroups, dstate];
    parents int32 [batch, N]."""
    geo, N, R = ring.geometry, ring.window, ring.ring_len
    hpg, H, P = geo.heads_per_group, geo.nheads, geo.headdim
    rows, sl = _live_rows(ring, x.shape[0], slots)
    if sl.numel() == 0:
        return out
    if rows is not None:
        x, dt, B, C, parents = x[rows], dt[rows], B[rows], C[rows], parents[rows]
        z = None if z is None else z[rows]
    n, rows_are_slots = sl.shape[0], slots is None
    h = ring.write_pos[sl].long()
    flush = ring.is_flush[sl] != 0
    A = A.float()
    dev = ring.device

    wrows = (ring.origin[sl].long()[:, None] + h[:, None] + torch.arange(N, device=dev)) & (R - 1)   # [n, N]
    ring.x[sl[:, None], :, wrows] = x
    ring.B[sl[:, None], :, wrows] = B
    ring.dt[sl[:, None], :, wrows] = processed_dt(dt, dt_bias, dt_softplus)

    live = _Live(ring, sl, h, h + N, A, rows_are_slots)
    anc, depth, seq = ancestor_tables(parents)
    # Tree prefix sums of dt: the history in logical order (zeros past h), then the node's ancestors.
    ar = torch.arange(n, device=dev)[:, None]
    node_dt = live.dt[ar, wrows]                                                    # [n, N, H]
    by_pos = ((ring.origin[sl].long()[:, None] + torch.arange(R, device=dev)) & (R - 1))
    hist_seq = live.dt[ar, by_pos] * (torch.arange(R, device=dev)[None, :] < h[:, None]).unsqueeze(-1)
    cum_p = tree_prefix(node_dt, hist_seq, seq, depth)                             # [n, N, H]
    cum_rows = live.cum.clone()
    cum_rows[ar, wrows] = cum_p
    first = torch.where(flush, h, torch.zeros_like(h))
    base = torch.where(flush[:, None], live.total, torch.zeros_like(live.total))

    # Ancestor weights W[r, s] = dt_j exp(A (cum_s - cum_j)) (B_j . C_s), j = pos(row r) visible from node s.
    C32 = C.float()
    bc = torch.einsum("bgrn,btgn->bgrt", live.B, C32)                              # [n, G, R, N]
    j = live.j                                                                      # [n, R]
    win = j - h[:, None]
    in_win = (win >= 0) & (win < N)
    anc_rs = anc.gather(2, win.clamp(0, N - 1)[:, None, :].expand(n, N, R)).transpose(1, 2)   # [n, R, N]
    visible = (j >= first[:, None])[..., None] & ((j < h[:, None])[..., None] | (in_win[..., None] & anc_rs))
    span = cum_p.transpose(1, 2)[:, :, None, :] - cum_rows.transpose(1, 2)[:, :, :, None]   # [n, H, R, N]
    W = _clamped_exp(A[None, :, None, None] * span).mul_(live.dt.transpose(1, 2)[..., None])
    W = W.view(n, -1, hpg, R, N).mul_((bc * visible[:, None]).unsqueeze(2))
    y = torch.einsum("bgjrp,bgjrt->btgjp", live.x.view(n, -1, hpg, R, P), W).reshape(n, N, H, P)

    state = ring.state[:n] if rows_are_slots else ring.state[sl]
    S = state.float()
    readout = _readout(S, C32, hpg)
    if bool(flush.any()):
        fr = flush.nonzero().squeeze(1)
        all_rows = fr.numel() == n
        sel = slice(None) if all_rows else fr
        G = geo.ngroups
        bc_w = bc[sel].view(-1, G, 1, R, N) * live.hist_w[sel].transpose(1, 2).reshape(-1, G, hpg, R, 1)
        hist = torch.einsum("bgjrp,bgjrt->btgjp", live.x[sel].view(-1, G, hpg, R, P), bc_w).reshape(-1, N, H, P)
        readout[sel] = readout[sel] * live.decay[sel][:, None, :, None] + hist
        target = S if all_rows else S[fr]
        _fold_into(target, live, sel, hpg)
        if not (all_rows and rows_are_slots and ring.state_dtype == torch.float32):
            keep = h[fr] > 0
            ring.state[sl[fr[keep]]] = target[keep].to(ring.state_dtype)
    y.add_(_clamped_exp(A * (cum_p - base[:, None, :])).unsqueeze(-1) * readout)
    if D is not None:
        y.add_(D.float()[:, None] * x.float())
    if z is not None:
        zf = z.float()
        y.mul_(zf * torch.sigmoid(zf))
    if rows is None:
        out.copy_(y)
    else:
        out[rows] = y.to(out.dtype)
    return out
