"""Random Gated DeltaNet decode inputs with realistic ranges (tests, benchmarks, harness).

g = log decay in about [-0.7, -1e-3] (decay exp(g) in [0.5, 0.999]); beta = sigmoid(normal) in (0, 1);
q, k unit-norm unless the caller asks the kernel to normalise (use_qk_l2norm=True, then raw normals):
the delta rule is only stable for ||k|| <= 1.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ref import l2norm
from replayssm.geometry import GDNGeometry


def random_step(geometry: GDNGeometry, batch: int, act_dtype=torch.float32, device="cpu", window: int | None = None,
                use_qk_l2norm: bool = False, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Inputs of one decode step (window=None) or one speculative window of `window` tokens.

    AR:   q, k [batch, H, K]; v [batch, HV, V]; g, beta [batch, HV] (fp32)
    spec: the same with a T axis after batch.
    """
    gm = geometry
    lead = (batch,) if window is None else (batch, window)
    q = torch.randn(*lead, gm.H, gm.K, generator=generator)
    k = torch.randn(*lead, gm.H, gm.K, generator=generator)
    if not use_qk_l2norm:
        q, k = l2norm(q).float(), l2norm(k).float()
    v = torch.randn(*lead, gm.HV, gm.V, generator=generator)
    g = -torch.exp(torch.empty(*lead, gm.HV).uniform_(-6.9, -0.36, generator=generator))
    beta = torch.sigmoid(torch.randn(*lead, gm.HV, generator=generator))

    def to_act(t):
        return t.to(device=device, dtype=act_dtype)

    return {"q": to_act(q), "k": to_act(k), "v": to_act(v),
            "g": g.to(device=device, dtype=torch.float32), "beta": beta.to(device=device, dtype=torch.float32)}


def random_state(geometry: GDNGeometry, num_slots: int, dtype=torch.float32, device="cpu",
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """A prefill-like state [num_slots, HV, V, K], scaled so that ||S k|| is O(1)."""
    gm = geometry
    s = torch.randn(num_slots, gm.HV, gm.V, gm.K, generator=generator) * gm.K ** -0.5
    return s.to(device=device, dtype=dtype)
