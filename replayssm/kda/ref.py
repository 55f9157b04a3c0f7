"""Float64 ground truth for Kimi Delta Attention decode: the plain recurrence, one token at a time.

FLA's convention (fla.ops.kda.naive.naive_recurrent_kda) keeps the state of a value head as S [K, V]; ours is
K-last, S [V, K] per value head, as GDN. Value head hv reads key head hv // (HV // H). Per token:
    q, k <- q / ||q||, k / ||k||      (only if use_qk_l2norm; eps 1e-6 under the square root)
    q    <- q * scale                 (scale defaults to K ** -0.5)
    S    <- S diag(exp(g))            g [HV, K]: every key channel (state column) decays at its own rate
    u     = beta (v - S k)            the corrected update, against the decayed state (what ReplaySSM caches)
    S    <- S + u k^T
    o     = S q
The loops are GDN's (replayssm/gdn/ref.py), which take a decay of either shape; this module names them for KDA.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ref import gdn_step_ref, l2norm, prepare_qk
from replayssm.gdn.ref import window_ref as _window_ref

__all__ = ["kda_step_ref", "l2norm", "prepare_qk", "window_ref"]


def kda_step_ref(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, scale: float | None = None,
                 use_qk_l2norm: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step, pure, float64.

    state [batch, HV, V, K]; q, k [batch, H, K]; v [batch, HV, V]; g [batch, HV, K]; beta [batch, HV].
    Returns (new_state [batch, HV, V, K], o [batch, HV, V], u [batch, HV, V]), all float64.
    """
    if g.dim() != 3:
        raise ValueError(f"g must be [batch, HV, K] (a decay per key channel), got shape {tuple(g.shape)}")
    return gdn_step_ref(state, q, k, v, g, beta, scale, use_qk_l2norm)


def window_ref(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, scale: float | None = None,
               use_qk_l2norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A speculative window run serially from one committed state: the spec oracle.

    state [batch, HV, V, K]; q, k [batch, T, H, K]; v [batch, T, HV, V]; g [batch, T, HV, K]; beta [batch, T, HV].
    Returns (states [batch, T, HV, V, K]: the state after window token s, o [batch, T, HV, V]), float64.
    """
    if g.dim() != 4:
        raise ValueError(f"g must be [batch, T, HV, K] (a decay per key channel), got shape {tuple(g.shape)}")
    return _window_ref(state, q, k, v, g, beta, scale, use_qk_l2norm)
