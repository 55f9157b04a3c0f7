"""Float64 ground truth for Mamba-2 decode: the plain recurrence, one token at a time.

Every method (baselines and ReplaySSM, every backend) is tested against these functions, directly or
through its own float64 protocol oracle. They never cache anything: the state is passed in and returned.

Per sequence b, head h, group g = h // (nheads // ngroups) (mamba_ssm's selective_state_update, as vLLM runs it):
    dt' = softplus(dt + dt_bias)        (threshold 20: identity above it)
    a   = exp(A * dt')
    S   = a * S + dt' * x B^T           S [headdim, dstate]
    y   = S C + D * x ;  y *= z * sigmoid(z)  if z is given
"""

from __future__ import annotations

import torch

SOFTPLUS_THRESHOLD = 20.0


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """dt [..., nheads] raw -> processed dt in float64 (bias added, softplus with threshold 20)."""
    out = dt.double()
    if dt_bias is not None:
        out = out + dt_bias.double()
    if dt_softplus:
        out = torch.where(out <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(out)), out)
    return out


def expand_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """[..., ngroups, dstate] -> [..., nheads, dstate]: head h reads group h // (nheads // ngroups)."""
    ngroups = t.shape[-2]
    return t.repeat_interleave(nheads // ngroups, dim=-2)


def gate_output(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """y [..., nheads, headdim] (float64) -> y + D x, then * silu(z)."""
    if D is not None:
        y = y + D.double()[:, None] * x.double()
    if z is not None:
        z64 = z.double()
        y = y * z64 * torch.sigmoid(z64)
    return y


def ssm_step_ref(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                 dt_bias: torch.Tensor | None = None, dt_softplus: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step, pure, float64.

    state [batch, nheads, headdim, dstate]; x, z [batch, nheads, headdim]; dt [batch, nheads] (raw);
    A, D, dt_bias [nheads]; B, C [batch, ngroups, dstate].
    Returns (new_state [batch, nheads, headdim, dstate], y [batch, nheads, headdim]), both float64.
    """
    nheads = x.shape[1]
    dtp = process_dt(dt, dt_bias, dt_softplus)                      # [batch, nheads]
    decay = torch.exp(A.double()[None, :] * dtp)                    # [batch, nheads]
    Bh = expand_groups(B, nheads).double()                          # [batch, nheads, dstate]
    Ch = expand_groups(C, nheads).double()
    x64 = x.double()
    new_state = decay[..., None, None] * state.double() + (dtp[..., None] * x64)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", new_state, Ch)
    return new_state, gate_output(y, x64, D, z)


def window_ref(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
               dt_bias: torch.Tensor | None = None, dt_softplus: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A speculative window run serially from one committed state: the spec oracle.

    state [batch, nheads, headdim, dstate]; x, z [batch, T, nheads, headdim]; dt [batch, T, nheads];
    B, C [batch, T, ngroups, dstate].
    Returns (states [batch, T, nheads, headdim, dstate]: the state after window token s,
             y [batch, T, nheads, headdim]), float64. Committing `a` tokens means taking states[:, a-1].
    """
    states, ys = [], []
    cur = state.double()
    for s in range(x.shape[1]):
        cur, y = ssm_step_ref(cur, x[:, s], dt[:, s], A, B[:, s], C[:, s], D,
                              None if z is None else z[:, s], dt_bias, dt_softplus)
        states.append(cur)
        ys.append(y)
    return torch.stack(states, 1), torch.stack(ys, 1)
