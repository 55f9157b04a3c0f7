"""Float64 protocol oracle of the Mamba-2 ReplaySSM AR decode step (backend="ref").

Written for clarity: a Python loop over rows, float64 math, and the cache mutated exactly as the kernels
do it, rounding to the cache dtypes only where a value is stored (checkpoint -> state dtype, appended dt ->
fp32; x and B are stored as given). Inputs are validated by replayssm/mamba2/decode.py before this runs.

Per row (slot s, h = write_pos[s], L = buffer_len), entries j = 0..h with entry h the current token
(ReplaySSM blog §5.1):
    c_j = sum_{i<=j} dt_i,  abar = exp(A c_h),  s_j = dt_j exp(A (c_h - c_j))
    normal (h < L-1): y = abar (S0 C) + sum_j s_j (B_j . C) x_j; append (x, B, dt) at row h; h += 1
    flush  (h = L-1): S = abar S0 + sum_j s_j x_j B_j^T; S0 <- S; y = S C; h = 0
"""

from __future__ import annotations

import torch

from replayssm.mamba2.ref import gate_output, process_dt
from replayssm.state_format import read_state as read_checkpoint
from replayssm.state_format import write_state as write_checkpoint


def _entries(cache, slot: int, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The h cached entries of one slot in float64, B expanded to heads.

    Returns dt [nheads, h], x [nheads, h, headdim], B [nheads, h, dstate].
    """
    hpg = cache.geometry.heads_per_group
    dt = cache.dt[slot, :, :h].double()
    x = cache.x[slot, :, :h].double()
    B = cache.B[slot, :, :h].double().repeat_interleave(hpg, dim=0)
    return dt, x, B


def _weights(A64: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dt [nheads, n] -> s [nheads, n] = dt_j exp(A (c_tot - c_j)) and abar [nheads] = exp(A c_tot)."""
    c = torch.cumsum(dt, dim=1)
    c_tot = c[:, -1] if dt.shape[1] else torch.zeros_like(A64)
    s = dt * torch.exp(A64[:, None] * (c_tot[:, None] - c))
    return s, torch.exp(A64 * c_tot)


def _cursor(cache, slot: int) -> int:
    h = int(cache.write_pos[slot])
    if not 0 <= h < cache.buffer_len:
        raise RuntimeError(f"write_pos[{slot}] = {h} is outside [0, {cache.buffer_len}): corrupted cache")
    return h


def replay_step_ref(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out) -> None:
    """One step for every row; writes out[b] for live rows. Shapes as in decode.replay_step."""
    g, L = cache.geometry, cache.buffer_len
    hpg = g.heads_per_group
    A64 = A.double()
    dt_all = process_dt(dt, dt_bias, dt_softplus)                          # [batch, nheads] float64
    for b in range(x.shape[0]):
        slot = int(slots[b])
        if slot == cache.null_slot:
            continue
        h = _cursor(cache, slot)
        dt_buf, x_buf, B_buf = _entries(cache, slot, h)
        # Entry h is the current token.
        dts = torch.cat([dt_buf, dt_all[b][:, None]], dim=1)                               # [nheads, h+1]
        xs = torch.cat([x_buf, x[b].double()[:, None]], dim=1)                             # [nheads, h+1, headdim]
        Bs = torch.cat([B_buf, B[b].double().repeat_interleave(hpg, dim=0)[:, None]], dim=1)  # [nheads, h+1, dstate]
        Ch = C[b].double().repeat_interleave(hpg, dim=0)                                   # [nheads, dstate]
        s, abar = _weights(A64, dts)
        S0 = read_checkpoint(cache, slot, torch.float64)                                  # [nheads, headdim, dstate]
        if h == L - 1:
            S = abar[:, None, None] * S0 + torch.einsum("hj,hjp,hjn->hpn", s, xs, Bs)
            y = torch.einsum("hpn,hn->hp", S, Ch)
            write_checkpoint(cache, slot, S)       # every format's rule, in float64
            cache.write_pos[slot] = 0
        else:
            bc = torch.einsum("hjn,hn->hj", Bs, Ch)
            y = abar[:, None] * torch.einsum("hpn,hn->hp", S0, Ch) + torch.einsum("hj,hjp->hp", s * bc, xs)
            cache.x[slot, :, h] = x[b]
            cache.B[slot, :, h] = B[b]
            cache.dt[slot, :, h] = dt_all[b].float()
            cache.write_pos[slot] = h + 1
        zb = None if z is None else z[b][None]
        out[b] = gate_output(y[None], x[b][None], D, zb)[0].to(out.dtype)


def materialize_ref(cache, A, slots, out) -> None:
    """out[b] = abar S0 + sum_{j<h} s_j x_j B_j^T (float64, stored fp32) for live rows; nothing written."""
    A64 = A.double()
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        if slot == cache.null_slot:
            continue
        h = _cursor(cache, slot)
        dt_buf, x_buf, B_buf = _entries(cache, slot, h)
        s, abar = _weights(A64, dt_buf)
        S0 = read_checkpoint(cache, slot, torch.float64)
        S = abar[:, None, None] * S0 + torch.einsum("hj,hjp,hjn->hpn", s, x_buf, B_buf)
        out[b] = S.float()
