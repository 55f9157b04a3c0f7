"""Baseline Kimi Delta Attention AR decode: the fused recurrent step (vLLM / FLA's fused_recurrent_kda style).

    fused_recurrent_step(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None,
                         backend="triton") -> o [batch, HV, V]

state [num_slots, HV, V, K] (K-last) is read and written back in place every step:
    q, k <- L2-normalised (if asked); q <- q * scale
    S <- S diag(exp(g));  u = beta (v - S k);  S <- S + u k^T;  o = S q        (g [batch, HV, K])
Validation and dispatch are GDN's (baselines/gdn_recurrent.py, run_recurrent_step). Backends: "triton" (GDN's
kernel with PER_CHANNEL), "torch" (vectorised: one read, one write of the state), "ref" (GDN's float64 loops,
replayssm/gdn/ref.py, which take either decay shape; replayssm.kda.ref names them for KDA), "cpu" (GDN's C
kernel gdn_step in its per-channel mode).
"""

from __future__ import annotations

import torch

from baselines.gdn_recurrent import run_recurrent_step
from replayssm.checks import NULL_SLOT
from replayssm.gdn.decode_torch import prepare_qk_fp32


def _step_torch(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out) -> None:
    """S' = S diag(alpha) formed once (the state read), then u, the rank-1 update and o from it; one write."""
    G = v.shape[1] // q.shape[1]
    rows = None
    if slots is not None:
        rows = torch.nonzero(slots != NULL_SLOT).flatten()
        if rows.numel() == 0:
            return
        q, k, v, g, beta = q[rows], k[rows], v[rows], g[rows], beta[rows]
    target = slice(0, q.shape[0]) if rows is None else slots[rows].long()
    qf, kf = prepare_qk_fp32(q, k, scale, use_qk_l2norm)
    k_hv, q_hv = kf.repeat_interleave(G, 1), qf.repeat_interleave(G, 1)          # [n, HV, K]
    S = state[target].float() * torch.exp(g.float())[:, :, None, :]               # [n, HV, V, K]
    u = beta.float()[..., None] * (v.float() - (S @ k_hv[..., None])[..., 0])
    S += u[..., None] * k_hv[:, :, None, :]
    o = (S @ q_hv[..., None])[..., 0]
    if rows is None:
        out.copy_(o)
    else:
        out[rows] = o.to(out.dtype)
    state[target] = S.to(state.dtype)


def fused_recurrent_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                         slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         backend: str = "triton") -> torch.Tensor:
    """One baseline KDA decode step; state [num_slots, HV, V, K] (fp32/fp16/bf16) is updated in place.

    q, k [batch, H, K]; v [batch, HV, V] (same act dtype); g [batch, HV, K] fp32 (unit stride on K);
    beta [batch, HV] fp32; returns o [batch, HV, V]. NULL_SLOT rows are skipped.
    """
    return run_recurrent_step(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend,
                              per_channel=True, torch_step=_step_torch)
