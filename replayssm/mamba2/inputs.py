"""Random Mamba-2 decode inputs with realistic ranges, shared by tests, benchmarks and the harness.

Ranges follow Mamba-2's initialisation: A = -exp(A_log) with |A| in [1, 16]; dt_bias the inverse softplus
of a dt drawn log-uniformly in [1e-3, 1e-1]; x, B, C, z standard normal. The decay exp(A dt) then lies in
about [0.2, 1), so long runs stay bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm.geometry import Mamba2Geometry


@dataclass
class Mamba2Params:
    """Per-layer parameters, all [nheads] float32."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor


def random_params(geometry: Mamba2Geometry, device="cpu", generator: torch.Generator | None = None) -> Mamba2Params:
    h = geometry.nheads
    A = -torch.exp(torch.empty(h).uniform_(0.0, 2.77, generator=generator))          # |A| in [1, 16]
    dt0 = torch.exp(torch.empty(h).uniform_(-6.9, -2.3, generator=generator))        # [1e-3, 1e-1]
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))                                   # softplus^-1(dt0)
    D = torch.randn(h, generator=generator)
    return Mamba2Params(A=A.to(device), D=D.to(device), dt_bias=dt_bias.to(device))


def random_step(geometry: Mamba2Geometry, batch: int, act_dtype=torch.float32, device="cpu", window: int | None = None,
                with_z: bool = True, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Inputs of one decode step (window=None) or one speculative window of `window` tokens.

    AR:   x, z [batch, nheads, headdim]; dt [batch, nheads] (raw, fp32); B, C [batch, ngroups, dstate]
    spec: the same with a T axis after batch.
    """
    g = geometry
    lead = (batch,) if window is None else (batch, window)

    def randn(*shape):
        return torch.randn(*lead, *shape, generator=generator).to(device=device, dtype=act_dtype)

    out = {
        "x": randn(g.nheads, g.headdim),
        "dt": (0.5 * torch.randn(*lead, g.nheads, generator=generator)).to(device=device, dtype=torch.float32),
        "B": randn(g.ngroups, g.dstate),
        "C": randn(g.ngroups, g.dstate),
    }
    out["z"] = randn(g.nheads, g.headdim) if with_z else None
    return out


def random_state(geometry: Mamba2Geometry, num_slots: int, dtype=torch.float32, device="cpu",
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """A prefill-like state [num_slots, nheads, headdim, dstate]."""
    g = geometry
    return torch.randn(num_slots, g.nheads, g.headdim, g.dstate, generator=generator).to(device=device, dtype=dtype)
