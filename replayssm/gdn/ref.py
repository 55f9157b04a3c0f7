"""Float64 ground truth for Gated DeltaNet decode: the plain delta-rule recurrence, one token at a time.

Per sequence, value head hv, key head h = hv // (HV // H) (vLLM's GDN decode / FLA fused_recurrent), state S [V, K]
(K-last, as vLLM and FlashInfer store it):
    q, k <- q / ||q||, k / ||k||      (only if use_qk_l2norm; eps 1e-6 under the square root)
    q    <- q * scale                 (scale defaults to K ** -0.5)
    S    <- exp(g) S
    u     = beta (v - S k)            the corrected update (what ReplaySSM caches instead of v)
    S    <- S + u k^T
    o     = S q
"""

from __future__ import annotations

import torch

L2NORM_EPS = 1e-6


def l2norm(t: torch.Tensor) -> torch.Tensor:
    """Normalise the last dim: t / sqrt(sum t^2 + 1e-6), in float64."""
    t = t.double()
    return t / torch.sqrt((t * t).sum(-1, keepdim=True) + L2NORM_EPS)


def expand_key_heads(t: torch.Tensor, HV: int) -> torch.Tensor:
    """[..., H, K] -> [..., HV, K]: value head hv reads key head hv // (HV // H)."""
    return t.repeat_interleave(HV // t.shape[-2], dim=-2)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, HV: int, scale: float | None,
               use_qk_l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [..., H, K] -> (scaled q, k) [..., HV, K] in float64, normalised if asked."""
    K = q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q64, k64 = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.double(), k.double())
    return expand_key_heads(q64 * scale, HV), expand_key_heads(k64, HV)


def decay_factor(decay: torch.Tensor, per_channel: bool) -> torch.Tensor:
    """A decay per value head [..., HV] (GDN) or per key channel [..., HV, K] (KDA, replayssm.kda) as a factor
    that broadcasts over states [..., HV, V, K]: [..., HV, 1, 1] or [..., HV, 1, K]. The float64 oracles are
    shared by the two families; only the decay's shape differs."""
    return decay[..., None, :] if per_channel else decay[..., None, None]


def gdn_step_ref(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, scale: float | None = None,
                 use_qk_l2norm: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step, pure, float64.

    state [batch, HV, V, K]; q, k [batch, H, K]; v [batch, HV, V]; g, beta [batch, HV]; g may also be
    [batch, HV, K], a decay per key channel (KDA: replayssm.kda.ref).
    Returns (new_state [batch, HV, V, K], o [batch, HV, V], u [batch, HV, V]), all float64.
    """
    HV = v.shape[1]
    qh, kh = prepare_qk(q, k, HV, scale, use_qk_l2norm)             # [batch, HV, K]
    S = decay_factor(torch.exp(g.double()), per_channel=g.dim() == v.dim()) * state.double()
    u = beta.double()[..., None] * (v.double() - torch.einsum("bhvk,bhk->bhv", S, kh))
    S = S + u[..., :, None] * kh[..., None, :]
    o = torch.einsum("bhvk,bhk->bhv", S, qh)
    return S, o, u


def window_ref(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, scale: float | None = None,
               use_qk_l2norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A speculative window run serially from one committed state: the spec oracle.

    state [batch, HV, V, K]; q, k [batch, T, H, K]; v [batch, T, HV, V]; g, beta [batch, T, HV] (or g
    [batch, T, HV, K] per key channel, KDA).
    Returns (states [batch, T, HV, V, K]: state after window token s, o [batch, T, HV, V]), float64.
    """
    states, outs = [], []
    cur = state.double()
    for s in range(q.shape[1]):
        cur, o, _ = gdn_step_ref(cur, q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], scale, use_qk_l2norm)
        states.append(cur)
        outs.append(o)
    return torch.stack(states, 1), torch.stack(outs, 1)
