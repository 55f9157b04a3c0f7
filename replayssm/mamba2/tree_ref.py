"""Float64 oracle of Mamba-2 tree verify (backend="ref"): the plain recurrence walked along each node's path.

Per live row (h = write_pos, o = origin, N = window): the committed state S_c = checkpoint + the h history
entries folded (spec_ref._fold_history); then in topological order
    S_s = exp(A dt_s) S_parent(s) + dt_s x_s B_s^T   (S_parent(0) = S_c),   y_s = S_s C_s (+ D x_s, * silu(z_s))
with x, B, dt read back as the ring stores them (act dtype, fp32 processed dt). No replay formula, no mask:
an independent check of the ancestor-masked kernels. Cache writes mirror the kernels: node s's inputs at
ring row (o + h + s) & (R - 1); a flush row with h > 0 stores S_c as its checkpoint. The bc scratch (the
GPU kernels' hand-off) is not written. Raises ValueError if h + N > L (the early-flush rule was broken).
"""

from __future__ import annotations

import torch

from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.ref import gate_output, process_dt
from replayssm.mamba2.spec_ref import _decay, _fold_history


def tree_verify_ref(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, parents: torch.Tensor,
                    slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    geo, N, mask = ring.geometry, ring.window, ring.ring_len - 1
    hpg = geo.heads_per_group
    for b in range(x.shape[0]):
        slot = int(slots[b])
        if slot == ring.null_slot:
            continue
        h, origin, flush = int(ring.write_pos[slot]), int(ring.origin[slot]), bool(ring.is_flush[slot])
        if h + N > ring.max_len:
            raise ValueError(f"slot {slot}: write_pos {h} + N {N} > L {ring.max_len} (the ring would overflow)")
        par = [int(p) for p in parents[b].tolist()]
        dtp = process_dt(dt[b], dt_bias, dt_softplus)
        rows = [(origin + h + s) & mask for s in range(N)]
        for s in range(N):
            ring.x[slot, :, rows[s]] = x[b, s]
            ring.B[slot, :, rows[s]] = B[b, s]
            ring.dt[slot, :, rows[s]] = dtp[s].float()
        committed = [_fold_history(ring, slot, head, float(A[head])) for head in range(geo.nheads)]
        if flush and h > 0:
            for head in range(geo.nheads):
                ring.state[slot, head] = committed[head].to(ring.state_dtype)
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
    return out
