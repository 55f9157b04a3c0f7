"""Baseline Kimi Delta Attention AR decode: the fused recurrent step (vLLM / FLA's fused_recurrent_kda style).

    fused_recurrent_step(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None,
                         backend="triton") -> o [batch, HV, V]

state [num_slots, HV, V, K] (K-last) is read and written back in place every step:
    q, k <- L2-normalised (if asked); q <- q * scale
    S <- S diag(exp(g));  u = beta (v - S k);  S <- S + u k^T;  o = S q        (g [batch, HV, K])
Backends: "triton" (GDN's kernel, baselines/gdn_recurrent.py, with PER_CHANNEL), "torch" (vectorised: one read,
one write of the state), "ref" (float64 loops, replayssm.kda.ref). "cpu" raises ValueError (no C kernel).
"""

from __future__ import annotations

import torch

from baselines.gdn_recurrent import _launch
from replayssm.checks import (
    NULL_SLOT,
    STATE_DTYPES,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_slots,
)
from replayssm.gdn.decode import check_step_inputs
from replayssm.gdn.decode_torch import prepare_qk_fp32
from replayssm.kda.decode import check_kda_backend
from replayssm.kda.ref import kda_step_ref


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


def _step_ref(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out) -> None:
    for row, slot in enumerate(slots.tolist()):
        if slot == NULL_SLOT:
            continue
        r = slice(row, row + 1)
        S, o, _ = kda_step_ref(state[slot:slot + 1], q[r], k[r], v[r], g[r], beta[r], scale, use_qk_l2norm)
        state[slot] = S[0].to(state.dtype)
        out[row] = o[0].to(out.dtype)


def fused_recurrent_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                         slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         backend: str = "triton") -> torch.Tensor:
    """One baseline KDA decode step; state [num_slots, HV, V, K] (fp32/fp16/bf16) is updated in place.

    q, k [batch, H, K]; v [batch, HV, V] (same act dtype); g [batch, HV, K] fp32 (unit stride on K);
    beta [batch, HV] fp32; returns o [batch, HV, V]. NULL_SLOT rows are skipped.
    """
    check_kda_backend(backend, q, k, v, out, state)
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError("state must be a tensor [num_slots, HV, V, K]")
    check_dtype("state", state, STATE_DTYPES)
    check_last_dim_contiguous("state", state)
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or not isinstance(v, torch.Tensor) or v.dim() != 3:
        raise ValueError("q must be [batch, H, K] and v [batch, HV, V]")
    num_slots, HV, V, K = state.shape
    H = q.shape[1]
    if H == 0 or HV % H:
        raise ValueError(f"HV={HV} (state) is not a multiple of H={H} (q)")
    batch = check_step_inputs(q, k, v, g, beta, out, H=H, HV=HV, K=K, V=V, act_dtype=q.dtype, scale=scale,
                              use_qk_l2norm=use_qk_l2norm, per_channel_g=True)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, out=out, state=state)
    slots_i32 = check_slots(slots, batch, num_slots, device)
    scale = K ** -0.5 if scale is None else float(scale)
    if out is None:
        out = (torch.empty if slots is None else torch.zeros)(batch, HV, V, dtype=q.dtype, device=device)
    if batch == 0:
        return out
    if backend == "triton":
        _launch(state, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out, per_channel=True)
    elif backend == "torch":
        _step_torch(state, q, k, v, g, beta, scale, use_qk_l2norm, None if slots is None else slots_i32, out)
    else:
        _step_ref(state, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out)
    return out
