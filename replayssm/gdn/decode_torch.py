"""Vectorised PyTorch ReplaySSM GDN AR decode: the CPU timing backend.

It touches the checkpoint as few times as the method allows. A normal step reads it once (one batched
matmul S0 @ [k, q]) and writes no state: the buffer terms of S_h k and S_h q are folded in through the
cached keys, as in the output-only algebra,
    S_h x = exp(G_tot) (S0 x) + sum_j w_j (k_j . x) u_j,
so S_h is never built. A flush step additionally rewrites the checkpoint in place with one scale and one
rank-(L) update, alpha S_h + u k^T = alpha exp(G_tot) S0 + [alpha w_j u_j | u] @ [k_j | k]^T.
Math in fp32; the cache stores u, k in the act dtype and the checkpoint in its state format (a flush writes it
through replayssm/state_format.py: a cast, stochastic rounding, or int8 / e4m3 with a per-head scale).
"""

from __future__ import annotations

import torch

from replayssm.gdn.ref import L2NORM_EPS
from replayssm.state_format import format_of
from replayssm.state_format import read_state as read_checkpoint
from replayssm.state_format import write_state as write_checkpoint


def prepare_qk_fp32(q: torch.Tensor, k: torch.Tensor, scale: float,
                    use_qk_l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [n, H, K] -> (q * scale, k), normalised if asked, fp32, per key head."""
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2NORM_EPS)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2NORM_EPS)
    return qf * scale, kf


def state_times(S: torch.Tensor, x: torch.Tensor, HV: int) -> torch.Tensor:
    """S [n, HV, V, K] times per-key-head row vectors x [n, H, m, K] -> [n, HV, V, m] fp32, one read of S.

    x goes in as a transposed view of a contiguous [.., m, K] tensor: on CPU that sends the batched
    matrix-times-few-vectors product down the GEMV-like path (K contiguous in both operands), not the
    general GEMM a contiguous [K, m] right operand would take.
    """
    n, H, m, K = x.shape
    V = S.shape[2]
    if S.dtype != torch.float32:
        S = S.float()
    x_hv = x.repeat_interleave(HV // H, dim=1).reshape(n * HV, m, K)
    return torch.bmm(S.reshape(n * HV, V, K), x_hv.transpose(1, 2)).view(n, HV, V, m)


CHUNK_BYTES = 1 << 20  # about one core's L2: the second in-place pass over a chunk hits cache, not DRAM


def fold_into_state_(S: torch.Tensor, decay: torch.Tensor, u: torch.Tensor, k: torch.Tensor,
                     u_buf: torch.Tensor | None = None, coef: torch.Tensor | None = None,
                     k_buf: torch.Tensor | None = None) -> None:
    """In place, per (row, value head) i with key head i // G (G = value heads per key head):
        S_i <- decay_i S_i + sum_j coef_ij u_buf_ij k_buf_(i//G)j^T + u_i k_(i//G)^T
    S [N, V, K] fp32 contiguous; decay [N]; u [N, V]; k [N/G, K]; optional buffer u_buf [N, L, V],
    coef [N, L], k_buf [N/G, L, K] (any float dtype).

    Walks S in chunks of about one L2 so the scale and the updates cost one read and one write of S, and
    so the key-head expansion and the weighted buffer stay small cache-resident temporaries.
    """
    N, V, K = S.shape
    G = N // k.shape[0]
    chunk = max(G, CHUNK_BYTES // (V * K * S.element_size()) // G * G)
    d = decay.reshape(N, 1, 1)
    for i in range(0, N, chunk):
        j = min(N, i + chunk)
        Sc = S[i:j]
        Sc.mul_(d[i:j])
        if u_buf is not None:
            ub = (u_buf[i:j].float() * coef[i:j, :, None]).transpose(1, 2)     # [c, V, L]
            Sc.baddbmm_(ub, k_buf[i // G:j // G].float().repeat_interleave(G, 0))
        Sc.addcmul_(u[i:j, :, None], k[i // G:j // G, None, :].repeat_interleave(G, 0))


def buffer_weights(g_buf: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g_buf [n, HV, L] fp32, h [n] -> (exp(G_tot) [n, HV], w [n, HV, L]) with w = 0 past each row's h."""
    L = g_buf.shape[-1]
    live = torch.arange(L, device=g_buf.device)[None, :] < h[:, None]          # [n, L]
    g_live = torch.where(live[:, None, :], g_buf, 0.0)
    G_pre = torch.cumsum(g_live, -1)
    G_tot = G_pre[..., -1]
    w = torch.where(live[:, None, :], torch.exp(G_tot[..., None] - G_pre), 0.0)
    return torch.exp(G_tot), w


def _rows(slots: torch.Tensor | None, batch: int, null_slot: int, device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(rows of the batch to process or None for all, their slots as int64)."""
    if slots is None:
        return None, torch.arange(batch, device=device)
    rows = torch.nonzero(slots != null_slot).flatten()
    return rows, slots[rows].long()


def replay_step_torch(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor | None,
                      out: torch.Tensor) -> None:
    """slots None means row i uses slot i (no gathers of the checkpoint); else int32 [batch]."""
    gm, L = cache.geometry, cache.buffer_len
    HV, H = gm.HV, gm.H
    rows, sl = _rows(slots, q.shape[0], cache.null_slot, q.device)
    if rows is not None:
        if rows.numel() == 0:
            return
        q, k, v, g, beta = q[rows], k[rows], v[rows], g[rows], beta[rows]
    whole_pool = rows is None and q.shape[0] == cache.num_slots
    qf, kf = prepare_qk_fp32(q, k, scale, use_qk_l2norm)                       # [n, H, K]
    h = cache.write_pos[sl].long()                                              # [n]
    S0 = cache.state if whole_pool else cache.state[sl]
    if format_of(cache).scaled:                                                 # int8 / e4m3 + per-head scale
        S0 = read_checkpoint(cache, sl)
    u_buf, k_buf, g_buf = (cache.u, cache.k, cache.g) if whole_pool else (cache.u[sl], cache.k[sl], cache.g[sl])

    # S_h [k, q] = exp(G_tot) S0 [k, q] + sum_j w_j u_j (k_j . [k, q])
    kq_rows = torch.stack((kf, qf), 2)                                          # [n, H, 2, K]
    S_kq = state_times(S0, kq_rows, HV)                                         # [n, HV, V, 2]
    decay0, w = buffer_weights(g_buf, h)
    if L > 1:
        dots = torch.matmul(kq_rows, k_buf.float().transpose(-1, -2))           # [n, H, 2, L]
        dots = dots.repeat_interleave(HV // H, dim=1) * w[:, :, None, :]        # [n, HV, 2, L]
        buf_kq = torch.matmul(dots, u_buf.float())                              # [n, HV, 2, V]
        S_kq = S_kq.mul_(decay0[..., None, None]).add_(buf_kq.transpose(-1, -2))
    alpha = torch.exp(g)
    u = beta[..., None] * (v.float() - alpha[..., None] * S_kq[..., 0])         # [n, HV, V]
    kq = (kf * qf).sum(-1).repeat_interleave(HV // H, dim=1)                    # [n, HV]
    o = alpha[..., None] * S_kq[..., 1] + u * kq[..., None]
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
        cache.g[s_k, :, h_k] = g[keep]
    if bool(flush.any()):
        all_flush = bool(flush.all())
        pick = slice(None) if all_flush else flush
        s_f = sl[pick]
        # alpha S_h + u k^T = alpha exp(G_tot) S0 + sum_j alpha w_j u_j k_j^T + u k^T, in one pass over S0.
        f = int(s_f.shape[0])
        in_place = (whole_pool and all_flush and cache.state_dtype == torch.float32
                    and cache.state.is_contiguous())
        S = cache.state if in_place else read_checkpoint(cache, s_f)
        buf = {}
        if L > 1:
            buf = dict(u_buf=u_buf[pick].reshape(f * HV, L, gm.V),
                       coef=(alpha[pick][..., None] * w[pick]).reshape(f * HV, L),
                       k_buf=k_buf[pick].reshape(f * H, L, gm.K))
        fold_into_state_(S.view(f * HV, gm.V, gm.K), (alpha[pick] * decay0[pick]).reshape(-1),
                         u[pick].reshape(f * HV, gm.V), kf[pick].reshape(f * H, gm.K), **buf)
        if not in_place:
            write_checkpoint(cache, s_f, S)
    cache.write_pos[sl] = torch.where(flush, 0, h + 1).to(torch.int32)


def materialize_torch(cache, slots: torch.Tensor, out: torch.Tensor) -> None:
    gm = cache.geometry
    rows, sl = _rows(slots, slots.shape[0], cache.null_slot, slots.device)
    if rows.numel() == 0:
        return
    h = cache.write_pos[sl].long()
    decay0, w = buffer_weights(cache.g[sl], h)
    k_hv = cache.k[sl].float().repeat_interleave(gm.HV // gm.H, dim=1)          # [n, HV, L, K]
    uw = cache.u[sl].float() * w[..., None]                                     # [n, HV, L, V]
    S = decay0[..., None, None] * read_checkpoint(cache, sl) + torch.matmul(uw.transpose(-1, -2), k_hv)
    out[rows] = S
