"""Float64 oracle of GDN tree verify (backend="ref"): the delta rule walked along each node's path.

Per live row (h = write_pos, o = origin, N = window): S_h = the checkpoint with the h committed ring entries
replayed (spec_ref._history_state); then in topological order, with S_parent(0) = S_h,
    u_s = beta_s (v_s - exp(g_s) S_parent(s) k_s),   S_s = exp(g_s) S_parent(s) + u_s k_s^T,   o_s = S_s q_s
(q, k L2-normalised when asked, q scaled). No triangular system, no mask: an independent check of the
ancestor-restricted solve. Cache writes mirror the kernels: (u_s, k_s, g_s) at ring row (o + h + s) & (R - 1);
a flush row with h > 0 stores S_h as its checkpoint. Raises ValueError if h + N > L.
"""

from __future__ import annotations

import math

import torch

from replayssm.gdn.ring import SpecRing
from replayssm.gdn.spec_ref import _history_state, _prepare


def tree_verify_ref(ring: SpecRing, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, parents: torch.Tensor,
                    slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    gm, N, mask = ring.geometry, ring.window, ring.ring_len - 1
    group = gm.value_heads_per_key_head
    for row, slot in enumerate(slots.tolist()):
        if slot == ring.null_slot:
            continue
        h, origin, flush = int(ring.write_pos[slot]), int(ring.origin[slot]), bool(ring.is_flush[slot])
        if h + N > ring.max_len:
            raise ValueError(f"slot {slot}: write_pos {h} + N {N} > L {ring.max_len} (the ring would overflow)")
        par = [int(p) for p in parents[row].tolist()]
        rows = [(origin + h + s) & mask for s in range(N)]
        history = [_history_state(ring, slot, hv) for hv in range(gm.HV)]
        if flush and h > 0:
            for hv in range(gm.HV):
                ring.state[slot, hv] = history[hv].to(ring.state_dtype)
        kn = _prepare(k[row], use_qk_l2norm)
        qn = _prepare(q[row], use_qk_l2norm) * scale
        for hv in range(gm.HV):
            kh = hv // group
            node_state: list[torch.Tensor] = []
            for s in range(N):
                prev = history[hv] if par[s] < 0 else node_state[par[s]]
                decay = math.exp(float(g[row, s, hv]))
                u = float(beta[row, s, hv]) * (v[row, s, hv].double() - decay * (prev @ kn[s, kh]))
                S = decay * prev + torch.outer(u, kn[s, kh])
                node_state.append(S)
                out[row, s, hv] = (S @ qn[s, kh]).to(out.dtype)
                ring.u[slot, hv, rows[s]] = u.to(ring.act_dtype)
                ring.g[slot, hv, rows[s]] = g[row, s, hv]
        for s in range(N):
            ring.k[slot, :, rows[s]] = kn[s].to(ring.act_dtype)
    return out
