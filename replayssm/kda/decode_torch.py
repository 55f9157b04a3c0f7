"""Vectorised PyTorch ReplaySSM KDA AR decode: the CPU timing backend (GDN's, replayssm/gdn/decode_torch.py,
with the decay moved from the cached updates onto the key channels).

Per value head, with the buffer's cumulative log decays G_pre_j = g_0 + .. + g_j and G_tot = G_pre_{h-1}
(K-vectors), the state after the h cached entries is
    S_h = S0 diag(exp(G_tot)) + sum_j u_j (w_j * k_j)^T,        w_j = exp(G_tot - G_pre_j)  [K]
so S_h x = S0 (exp(G_tot) * x) + sum_j ((w_j * k_j) . x) u_j for any x. A normal step reads the checkpoint
once (one batched product with the two vectors alpha exp(G_tot) * [k, q], alpha = exp(g)) and never forms
S_h; the buffer terms come from the cached keys. Then
    u = beta (v - S_h (alpha * k)),    o = S_h (alpha * q) + (k . q) u
A flush writes S0 <- S_h diag(alpha) + u k^T (one pass over S0: a column scale and a rank-(L) update).
Math in fp32; the cache stores u, k in the act dtype and the checkpoint in its state format (replayssm/state_format.py).
"""

from __future__ import annotations

import torch

from replayssm.gdn.decode_torch import _rows, prepare_qk_fp32, state_times
from replayssm.state_format import read_state as read_checkpoint
from replayssm.state_format import write_state as write_checkpoint


def buffer_weights(g_buf: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g_buf [n, HV, L, K] fp32, h [n] -> (exp(G_tot) [n, HV, K], w [n, HV, L, K]), w = 0 past each row's h."""
    L = g_buf.shape[2]
    live = (torch.arange(L, device=g_buf.device)[None, :] < h[:, None])[:, None, :, None]      # [n, 1, L, 1]
    g_live = torch.where(live, g_buf, 0.0)
    G_pre = torch.cumsum(g_live, 2)
    G_tot = G_pre[:, :, -1:]
    w = torch.where(live, torch.exp(torch.clamp(G_tot - G_pre, max=0.0)), 0.0)
    return torch.exp(G_tot[:, :, 0]), w


def replay_step_torch(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor | None,
                      out: torch.Tensor) -> None:
    """slots None means row i uses slot i; else int32 [batch] (NULL_SLOT rows skipped)."""
    gm, L = cache.geometry, cache.buffer_len
    HV, G = gm.HV, gm.value_heads_per_key_head
    rows, sl = _rows(slots, q.shape[0], cache.null_slot, q.device)
    if rows is not None:
        if rows.numel() == 0:
            return
        q, k, v, g, beta = q[rows], k[rows], v[rows], g[rows], beta[rows]
    qf, kf = prepare_qk_fp32(q, k, scale, use_qk_l2norm)                       # [n, H, K]
    k_hv, q_hv = kf.repeat_interleave(G, 1), qf.repeat_interleave(G, 1)       # [n, HV, K]
    h = cache.write_pos[sl].long()
    S0 = read_checkpoint(cache, sl)                                             # [n, HV, V, K] fp32
    u_buf, k_buf, g_buf = cache.u[sl].float(), cache.k[sl].float(), cache.g[sl]
    alpha = torch.exp(g.float())                                                # [n, HV, K]
    decay0, w = buffer_weights(g_buf, h)

    # S_h (alpha * [k, q]) = S0 (exp(G_tot) alpha * [k, q]) + sum_j ((w_j * k_j) . (alpha * [k, q])) u_j
    x = torch.stack((k_hv, q_hv), 2) * alpha[:, :, None]                        # [n, HV, 2, K]
    S_x = state_times(S0, x * decay0[:, :, None], HV)                           # [n, HV, V, 2]
    if L > 1:
        kw = k_buf.repeat_interleave(G, 1) * w                                  # [n, HV, L, K]
        S_x = S_x + (x @ kw.transpose(-1, -2) @ u_buf).transpose(-1, -2)        # [n, HV, V, 2]
    u = beta.float()[..., None] * (v.float() - S_x[..., 0])                     # [n, HV, V]
    o = S_x[..., 1] + u * (k_hv * q_hv).sum(-1, keepdim=True)
    if rows is None:
        out.copy_(o)
    else:
        out[rows] = o.to(out.dtype)

    flush = h == L - 1
    keep = ~flush
    if bool(keep.any()):
        s_k, h_k = sl[keep], h[keep]
        cache.u[s_k, :, h_k] = u[keep].to(cache.act_dtype)
        cache.k[s_k, :, h_k] = kf[keep].to(cache.act_dtype)
        cache.g[s_k, :, h_k] = g[keep].float()
    if bool(flush.any()):
        # S_h diag(alpha) + u k^T = S0 diag(alpha exp(G_tot)) + sum_j u_j (alpha w_j k_j)^T + u k^T
        S = S0[flush] * (alpha[flush] * decay0[flush])[:, :, None, :]
        if L > 1:
            S = S + u_buf[flush].transpose(-1, -2) @ (kw[flush] * alpha[flush][:, :, None])
        S = S + u[flush][..., None] * k_hv[flush][:, :, None, :]
        write_checkpoint(cache, sl[flush], S)
    cache.write_pos[sl] = torch.where(flush, 0, h + 1).to(torch.int32)


def materialize_torch(cache, slots: torch.Tensor, out: torch.Tensor) -> None:
    """out [batch, HV, V, K] fp32 <- S_h of each live row (NULL_SLOT rows left as they are); no cache write."""
    gm = cache.geometry
    rows, sl = _rows(slots, slots.shape[0], cache.null_slot, slots.device)
    if rows.numel() == 0:
        return
    decay0, w = buffer_weights(cache.g[sl], cache.write_pos[sl].long())
    kw = cache.k[sl].float().repeat_interleave(gm.value_heads_per_key_head, 1) * w      # [n, HV, L, K]
    S = read_checkpoint(cache, sl) * decay0[:, :, None, :] + cache.u[sl].float().transpose(-1, -2) @ kw
    out[rows] = S
