"""Random Kimi Delta Attention inputs with realistic ranges (tests, benchmarks, harness).

g = log decay per key channel: per (token, value head) the K channels spread over about [-2.3, -1e-3]
(decays exp(g) from 0.1 to 0.999), so channels of one head differ strongly: a kernel that used one scalar
decay per head, or the wrong channel's, is off by O(1). beta = sigmoid(normal) in (0, 1); q, k unit-norm
unless the kernel is asked to normalise (use_qk_l2norm=True, then raw normals).
"""

from __future__ import annotations

import torch

from replayssm.gdn.inputs import random_state as _gdn_random_state
from replayssm.gdn.ref import l2norm
from replayssm.geometry import KDAGeometry


def random_gate(lead: tuple[int, ...], HV: int, K: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 log decays [*lead, HV, K] in about [-2.3, -1e-3], log-uniform in |g|: fast and slow channels mixed."""
    return -torch.exp(torch.empty(*lead, HV, K).uniform_(-6.9, 0.83, generator=generator))


def random_step(geometry: KDAGeometry, batch: int, act_dtype=torch.float32, device="cpu", window: int | None = None,
                use_qk_l2norm: bool = False, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Inputs of one decode step (window=None) or one speculative window of `window` tokens.

    AR:   q, k [batch, H, K]; v [batch, HV, V]; g [batch, HV, K], beta [batch, HV] (fp32)
    spec: the same with a T axis after batch.
    """
    gm = geometry
    lead = (batch,) if window is None else (batch, window)
    q = torch.randn(*lead, gm.H, gm.K, generator=generator)
    k = torch.randn(*lead, gm.H, gm.K, generator=generator)
    if not use_qk_l2norm:
        q, k = l2norm(q).float(), l2norm(k).float()
    v = torch.randn(*lead, gm.HV, gm.V, generator=generator)
    g = random_gate(lead, gm.HV, gm.K, generator)
    beta = torch.sigmoid(torch.randn(*lead, gm.HV, generator=generator))

    def to_act(t):
        return t.to(device=device, dtype=act_dtype)

    return {"q": to_act(q), "k": to_act(k), "v": to_act(v),
            "g": g.to(device=device, dtype=torch.float32), "beta": beta.to(device=device, dtype=torch.float32)}


def random_state(geometry: KDAGeometry, num_slots: int, dtype=torch.float32, device="cpu",
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """A prefill-like state [num_slots, HV, V, K], scaled so that ||S k|| is O(1) (GDN's rule)."""
    return _gdn_random_state(geometry, num_slots, dtype, device, generator)
