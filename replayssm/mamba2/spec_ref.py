"""Float64 protocol oracle for Mamba-2 ReplaySSM speculative decoding (backend="ref").

Written for clarity, with loops: it mirrors what the kernels keep in the SpecRing (rounding to the cache
dtypes only where a value is stored: ring x/B in act dtype, processed dt in fp32, the checkpoint in
state dtype, bc in fp32) so the Triton and torch backends can be compared to it cache entry by cache entry.
Inputs arrive validated by replayssm.mamba2.spec (slots int32 [batch]).

Per slot, h = write_pos, o = origin, T = window, R = ring_len (a power of two), logical length L = B + T:
    logical position k lives at ring row (o + k) & (R - 1); history k < h, window k = h + t, t < T
    cum_k = dt_0 + ... + dt_k (processed dt, logical order)
    non-flush row: y_t = exp(A cum_p) (S0 C_t) + sum_{k<=p} dt_k exp(A (cum_p - cum_k)) (B_k . C_t) x_k, p = h + t
    flush row:     S1 = exp(A cum_{h-1}) S0 + sum_{k<h} dt_k exp(A (cum_{h-1} - cum_k)) x_k B_k^T  (stored if h > 0)
                   y_t = exp(A (cum_p - cum_{h-1})) (S1 C_t) + sum_{h<=k<=p} (same weights) x_k
    then + D x_t and * silu(z_t). Every exponent is clamped with min(., 0), as in the kernels.
    commit: if is_flush: origin = (origin + h) & (R - 1), write_pos = a; else write_pos += a;
            is_flush = write_pos + 2T > L (replayssm/ring_cursors.py, all backends, both families).
A draft tree (parents given, replayssm.mamba2.tree) is scattered the same way and verified by the plain
recurrence along each node's path (_tree_outputs): an independent check of the ancestor-masked backends.
State formats (replayssm/state_format.py): the checkpoint is read with read_state (dequantised, float64) and the
flush fold written with write_state in float64 (a cast, a per-(slot, head) scale from the float64 absmax rounded to
its float32 storage, or stochastic rounding with sr_round_torch's bits for the slot's sr_step): the same rule and
the same random bits as the torch backend, one write per flushing slot with history (h > 0).
"""

from __future__ import annotations

import math

import torch

from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.ref import gate_output, process_dt
from replayssm.state_format import read_state, write_state


def _decay(A: float, span: torch.Tensor | float) -> torch.Tensor:
    """exp(min(A * span, 0)) in float64 (A < 0 and span >= 0 make the clamp a no-op with softplus dt)."""
    return torch.exp(torch.clamp(torch.as_tensor(A * span, dtype=torch.float64), max=0.0))


def _logical_rows(ring: SpecRing, slot: int, count: int) -> list[int]:
    """Ring rows of logical positions 0..count-1 of `slot`."""
    origin, mask = int(ring.origin[slot]), ring.ring_len - 1
    return [(origin + k) & mask for k in range(count)]


def _fold_history(ring: SpecRing, slot: int, head: int, A: float, S0: torch.Tensor) -> torch.Tensor:
    """The committed state of one head: its checkpoint S0 [headdim, dstate] (float64, as read_state dequantises
    it) + the h history entries folded, float64 [headdim, dstate]."""
    h = int(ring.write_pos[slot])
    g = head // ring.geometry.heads_per_group
    state = S0
    if h == 0:
        return state
    rows = _logical_rows(ring, slot, h)
    dt = ring.dt[slot, head, rows].double()                     # [h]
    cum = torch.cumsum(dt, 0)
    total = cum[-1].item()
    state = _decay(A, total) * state
    for k in range(h):
        weight = dt[k] * _decay(A, total - cum[k].item())
        state = state + weight * torch.outer(ring.x[slot, head, rows[k]].double(), ring.B[slot, g, rows[k]].double())
    return state


def _chain_outputs(ring: SpecRing, b: int, slot: int, A, C, D, x, z, out) -> None:
    """Row b's window outputs from the checkpoint by the replay formula (module docstring); writes ring.bc and,
    on a flush row, the folded checkpoint. The window is already in the ring."""
    geo, T, hpg = ring.geometry, ring.window, ring.geometry.heads_per_group
    h, flush = int(ring.write_pos[slot]), bool(ring.is_flush[slot])
    rows = _logical_rows(ring, slot, h + T)
    C64 = C[b].double()                                      # [T, ngroups, dstate]
    B_live = ring.B[slot][:, rows].double()                  # [ngroups, h+T, dstate]
    bc = torch.einsum("gkn,tgn->gkt", B_live, C64)           # B_k . C_t, shared by a group's heads
    ring.bc[slot, :, : h + T] = bc.float()
    S0 = read_state(ring, slot, torch.float64)               # [nheads, headdim, dstate], dequantised
    if flush:
        # S1 of every head first, then one write of the slot by the format's rule (one SR draw per write)
        S0 = torch.stack([_fold_history(ring, slot, head, float(A[head]), S0[head]) for head in range(geo.nheads)])
        if h > 0:
            write_state(ring, slot, S0)
    for head in range(geo.nheads):
        g, a_h = head // hpg, float(A[head])
        dt_live = ring.dt[slot, head, rows].double()         # [h+T], as stored (fp32)
        cum = torch.cumsum(dt_live, 0)
        x_live = ring.x[slot, head, rows].double()           # [h+T, headdim]
        state, first, base = S0[head], 0, 0.0
        if flush:
            # The window restarts from S1 (unrounded, as a kernel holds it): only window tokens in the sum,
            # decays relative to cum_{h-1}.
            first, base = h, (cum[h - 1].item() if h > 0 else 0.0)
        for t in range(T):
            p = h + t
            y = _decay(a_h, cum[p].item() - base) * (state @ C64[t, g])
            for k in range(first, p + 1):
                y = y + dt_live[k] * _decay(a_h, cum[p].item() - cum[k].item()) * bc[g, k, t] * x_live[k]
            y = gate_output(y[None, None], x[b, t, head][None, None],
                            None if D is None else D[head : head + 1],
                            None if z is None else z[b, t, head][None, None])[0, 0]
            out[b, t, head] = y.to(out.dtype)


def _tree_outputs(ring: SpecRing, b: int, slot: int, A, C, D, x, z, par: list[int], out) -> None:
    """Row b's draft-tree outputs by the plain recurrence walked along each node's path, from the committed
    state S_c (checkpoint + history folded): S_s = exp(A dt_s) S_parent(s) + dt_s x_s B_s^T (S_parent(0) =
    S_c), y_s = S_s C_s (+ D x_s, * silu(z_s)), with x, B, dt read back as the ring stores them. No replay
    formula, no mask: an independent check of the ancestor-masked kernels. A flush row with h > 0 stores S_c
    as its checkpoint; the bc scratch (the GPU kernels' hand-off) is not written."""
    geo, N, hpg = ring.geometry, ring.window, ring.geometry.heads_per_group
    h, flush = int(ring.write_pos[slot]), bool(ring.is_flush[slot])
    rows = [(int(ring.origin[slot]) + h + s) & (ring.ring_len - 1) for s in range(N)]
    S0 = read_state(ring, slot, torch.float64)
    committed = [_fold_history(ring, slot, head, float(A[head]), S0[head]) for head in range(geo.nheads)]
    if flush and h > 0:
        write_state(ring, slot, torch.stack(committed))
    for head in range(geo.nheads):
        g, a_h = head // hpg, float(A[head])
        node_state: list[torch.Tensor] = []
        for s in range(N):
            prev = committed[head] if par[s] < 0 else node_state[par[s]]
            d = ring.dt[slot, head, rows[s]].double()
            S = _decay(a_h, d.item()) * prev + d * torch.outer(ring.x[slot, head, rows[s]].double(),
                                                               ring.B[slot, g, rows[s]].double())
            node_state.append(S)
            y = S @ C[b, s, g].double()
            y = gate_output(y[None, None], x[b, s, head][None, None], None if D is None else D[head: head + 1],
                            None if z is None else z[b, s, head][None, None])[0, 0]
            out[b, s, head] = y.to(out.dtype)


def verify_ref(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, slots: torch.Tensor,
               out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """x, z [batch, T, nheads, headdim]; dt [batch, T, nheads] raw; B, C [batch, T, ngroups, dstate].

    parents int32 [batch, T]: a draft tree of T nodes (replayssm.mamba2.tree), verified by the path recurrence
    (_tree_outputs); a row with h + T > L raises ValueError (the tree early-flush rule was broken)."""
    T, mask = ring.window, ring.ring_len - 1
    for b in range(x.shape[0]):
        slot = int(slots[b])
        if slot == ring.null_slot:
            continue
        h, origin = int(ring.write_pos[slot]), int(ring.origin[slot])
        if parents is not None and h + T > ring.max_len:
            raise ValueError(f"slot {slot}: write_pos {h} + N {T} > L {ring.max_len} (the ring would overflow)")
        dtp = process_dt(dt[b], dt_bias, dt_softplus)            # [T, nheads] float64
        # Scatter the window after the committed history (rejected drafts of the last step get overwritten).
        for t in range(T):
            row = (origin + h + t) & mask
            ring.x[slot, :, row] = x[b, t]
            ring.B[slot, :, row] = B[b, t]
            ring.dt[slot, :, row] = dtp[t].float()
        if parents is None:
            _chain_outputs(ring, b, slot, A, C, D, x, z, out)
        else:
            _tree_outputs(ring, b, slot, A, C, D, x, z, [int(p) for p in parents[b].tolist()], out)
    return out


def materialize_ref(ring: SpecRing, A: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The committed state per row, float32 [batch, nheads, headdim, dstate]; NULL rows are NaN."""
    geo = ring.geometry
    out = torch.full((slots.shape[0], geo.nheads, geo.headdim, geo.dstate), math.nan, dtype=torch.float32,
                     device=ring.device)
    for b in range(slots.shape[0]):
        slot = int(slots[b])
        if slot == ring.null_slot:
            continue
        S0 = read_state(ring, slot, torch.float64)
        for head in range(geo.nheads):
            out[b, head] = _fold_history(ring, slot, head, float(A[head]), S0[head]).float()
    return out
