"""Vectorised PyTorch backend of GDN tree verify (backend="torch"): spec_torch.verify_torch with the window's
chunked delta-rule system restricted to ancestors.

For nodes in topological order, A[s, c] = beta_s exp(G_s - G_c) (k_s . k_c) is kept only for c a strict
ancestor of s (a lower-triangular system, still solved by one unit-triangular solve), G is the tree prefix
sum of the log decays g along the path, and the output sums over ancestors-or-self. Restricted to any
root-to-leaf path this is exactly the chain system; for a chain every mask and sum equals spec_torch's,
bit for bit. The history part (S_h k, S_h q, the flush fold) is spec_torch's unchanged. Node s's (U_s, k_s,
g_s) go to logical position h + s. Inputs arrive validated by replayssm.gdn.tree.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ring import SpecRing
from replayssm.gdn.spec_torch import _history, _live_rows, _whole_pool, l2norm_fp32
from replayssm.tree_ring import ancestor_tables, tree_prefix


def tree_verify_torch(ring: SpecRing, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, parents: torch.Tensor,
                      slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """q, k [batch, N, H, K]; v [batch, N, HV, V]; g, beta [batch, N, HV]; parents int32 [batch, N]."""
    gm, N, R = ring.geometry, ring.window, ring.ring_len
    G = gm.value_heads_per_key_head
    rows, sl = _live_rows(ring, slots, q.shape[0])
    if sl.numel() == 0:
        return out
    whole = _whole_pool(ring, rows, sl)
    if rows is not None:
        q, k, v, g, beta, parents = (t.index_select(0, rows) for t in (q, k, v, g, beta, parents))
    b = sl.numel()

    kw = (l2norm_fp32(k) if use_qk_l2norm else k.float()).transpose(1, 2)          # [b, H, N, K]
    qw = (l2norm_fp32(q) if use_qk_l2norm else q.float()).transpose(1, 2) * scale
    kqw = torch.cat([kw, qw], 2)

    w_u, k_hist, decay0 = _history(ring, sl, whole)
    S0 = (ring.state if whole else ring.state[sl]).view(b, gm.H, G, gm.V, gm.K)
    hkq = torch.einsum("bhgvk,bhtk->bhgtv", S0.float(), kqw)
    hkq.mul_(decay0.view(b, gm.H, G, 1, 1))
    hkq.add_(torch.einsum("bhgrv,bhrt->bhgtv", w_u, k_hist @ kqw.transpose(-1, -2)))
    hkq = hkq.reshape(b, gm.HV, 2 * N, gm.V)
    hk, hq = hkq[:, :, :N], hkq[:, :, N:]

    wp = ring.write_pos if whole else ring.write_pos[sl]
    fl = ring.is_flush if whole else ring.is_flush[sl]
    fold = ((fl != 0) & (wp > 0)).nonzero().squeeze(1)
    if fold.numel():
        S_h = S0.index_select(0, fold).float() * decay0.index_select(0, fold).view(-1, gm.H, G, 1, 1)
        S_h.add_(torch.einsum("bhgrv,bhrk->bhgvk", w_u.index_select(0, fold), k_hist.index_select(0, fold)))
        ring.state.index_copy_(0, sl.index_select(0, fold), S_h.view(-1, gm.HV, gm.V, gm.K).to(ring.state_dtype))

    # Tree: the delta-rule system over each node's ancestors, from S_h.
    anc, depth, seq = ancestor_tables(parents)                                      # anc [b, N, N]
    g_win = g.float().transpose(1, 2)                                               # [b, HV, N]
    b_win = beta.float().transpose(1, 2)
    Gc = tree_prefix(g.float(), torch.zeros(b, gm.HV, device=q.device), seq, depth).transpose(1, 2)
    decay = torch.exp(torch.clamp(Gc[..., :, None] - Gc[..., None, :], max=0.0))   # [b, HV, N, N]
    kk = (kw @ kw.transpose(-1, -2)).repeat_interleave(G, 1)
    qk = (qw @ kw.transpose(-1, -2)).repeat_interleave(G, 1)
    eye = torch.eye(N, dtype=torch.bool, device=q.device)
    strict = (anc & ~eye)[:, None]                                                  # [b, 1, N, N]
    A = torch.where(strict, b_win[..., :, None] * decay * kk, 0.0)
    eG = torch.exp(Gc)[..., None]
    Rhs = b_win[..., None] * (v.float().transpose(1, 2) - eG * hk)
    U = torch.linalg.solve_triangular(A, Rhs, upper=False, unitriangular=True)
    o = eG * hq + torch.where(anc[:, None], decay * qk, 0.0) @ U
    if rows is None:
        out.copy_(o.transpose(1, 2))
    else:
        out.index_copy_(0, rows, o.transpose(1, 2).to(out.dtype))

    origin = ring.origin if whole else ring.origin[sl]
    wrows = (origin.long()[:, None] + wp.long()[:, None] + torch.arange(N, device=q.device)) & (R - 1)
    sidx, widx = sl[:, None, None], wrows[:, None, :]
    ring.u[sidx, torch.arange(gm.HV, device=q.device)[None, :, None], widx] = U.to(ring.act_dtype)
    ring.g[sidx, torch.arange(gm.HV, device=q.device)[None, :, None], widx] = g_win
    ring.k[sidx, torch.arange(gm.H, device=q.device)[None, :, None], widx] = kw.to(ring.act_dtype)
    return out
