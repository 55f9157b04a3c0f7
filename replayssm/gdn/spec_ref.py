"""Float64 protocol oracle for the GDN speculative ring (backend="ref"): loops, written for clarity.

It keeps the exact cache protocol of the Triton kernels (same ring rows, same values stored, rounded to
the cache dtypes only where they are stored) and computes everything else in float64. The cursor moves of
commit and reset are replayssm/ring_cursors.py (commit_ref / reset_ref there).
The arguments arrive validated from replayssm.gdn.spec (slots is an int32 tensor, shapes and dtypes match).

Per live row (slot != NULL_SLOT), value head hv, key head kh = hv // (HV // H), h = write_pos, o = origin:
    S_h = replay of the committed history from the checkpoint: S <- exp(g_j) S + u_j k_j^T, j < h
          (= exp(G_tot) S0 + sum_j exp(G_tot - G_j) u_j k_j^T, ReplaySSM blog Appendix A.1, Algorithm 6)
    is_flush and h > 0: checkpoint <- S_h
    window (§2.6): G_s = g_0 + .. + g_s; A[s, s'] = beta_s exp(G_s - G_s') (k_s . k_s') for s' < s;
          R_s = beta_s (v_s - exp(G_s) S_h k_s); U = (I + A)^-1 R (forward substitution);
          o_s = exp(G_s) S_h q_s + sum_{s' <= s} exp(G_s - G_s') (k_s' . q_s) U_s'
    append (U_s, k_s, g_s) at ring rows (o + h + s) & (ring_len - 1)
Shared with Kimi Delta Attention (replayssm.kda): a ring whose g holds a decay per key channel
([num_slots, HV, ring_len, K]) runs the same loops with G_s a [K] row: exp(G_s) S_h k_s becomes
S_h (exp(G_s) * k_s), exp(G_s - G_s') (k_s . k_s') becomes sum_c exp(G_s[c] - G_s'[c]) k_s[c] k_s'[c].
A draft tree (parents given, replayssm.gdn.tree) walks the delta rule along each node's path instead, with
S_parent(0) = S_h: u_s = beta_s (v_s - exp(g_s) S_parent(s) k_s), S_s = exp(g_s) S_parent(s) + u_s k_s^T,
o_s = S_s q_s; u_s is stored where U_s goes. No triangular system, no mask: an independent check of the
ancestor-restricted solve of the other backends.
State formats (replayssm/state_format.py): the checkpoint is read with read_state (dequantised, float64) and the
flush fold stored with write_state in float64, once per flushing slot with history (h > 0): a cast, a
per-(slot, head) scale from the float64 absmax (rounded to its float32 storage), or stochastic rounding with
sr_round_torch's bits for the slot's sr_step: the torch backend's rule and random bits. The window continues from
the unrounded S_h, as the kernels do.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ref import l2norm
from replayssm.gdn.ring import SpecRing
from replayssm.state_format import read_state, write_state


def _history_state(ring: SpecRing, slot: int, hv: int, S0: torch.Tensor) -> torch.Tensor:
    """S_h [V, K] float64: the checkpoint S0 [V, K] (float64, dequantised by read_state) with the committed ring
    entries replayed into it."""
    mask = ring.ring_len - 1
    kh = hv // ring.geometry.value_heads_per_key_head
    h, origin = int(ring.write_pos[slot]), int(ring.origin[slot])
    S = S0
    for j in range(h):
        row = (origin + j) & mask
        u_j = ring.u[slot, hv, row].double()
        k_j = ring.k[slot, kh, row].double()
        # exp(g_j): a scalar (GDN) or a [K] row that decays the state's key columns (KDA): both broadcast
        S = torch.exp(ring.g[slot, hv, row].double()) * S + torch.outer(u_j, k_j)
    return S


def _prepare(t: torch.Tensor, use_qk_l2norm: bool) -> torch.Tensor:
    return l2norm(t) if use_qk_l2norm else t.double()


def _chain_window(S_h: torch.Tensor, ks: torch.Tensor, qs: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One head's window from S_h [V, K] by the chunked delta rule: ks, qs [T, K] float64 (q scaled), v [T, V],
    beta [T], g [T] (GDN) or [T, K] (KDA: a decay per key channel; every exp(G) below is then a [K] row that
    weights the key channels of the dot it sits in). Returns (o_s, U_s) per token, float64 [V] each."""
    T = ks.shape[0]
    G = torch.cumsum(g.double(), 0)                         # [T] or [T, K]: decay from S_h to token s
    b = beta.double()
    R = [b[s] * (v[s].double() - S_h @ (torch.exp(G[s]) * ks[s])) for s in range(T)]
    # U = (I + A)^-1 R by forward substitution: U_s = R_s - sum_{s' < s} A[s, s'] U_s'.
    U = []
    for s in range(T):
        u_s = R[s].clone()
        for sp in range(s):
            a = b[s] * torch.dot(torch.exp(torch.clamp(G[s] - G[sp], max=0.0)) * ks[s], ks[sp])
            u_s = u_s - a * U[sp]
        U.append(u_s)
    o = []
    for s in range(T):
        o_s = S_h @ (torch.exp(G[s]) * qs[s])
        for sp in range(s + 1):
            o_s = o_s + torch.dot(torch.exp(torch.clamp(G[s] - G[sp], max=0.0)) * ks[sp], qs[s]) * U[sp]
        o.append(o_s)
    return o, U


def _tree_window(S_h: torch.Tensor, ks: torch.Tensor, qs: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, par: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One head's draft tree from S_h by the delta rule walked along each node's path (par[s] < s, -1 for the
    root): u_s = beta_s (v_s - exp(g_s) S_par k_s), S_s = exp(g_s) S_par + u_s k_s^T, o_s = S_s q_s. No
    triangular system and no mask: an independent check of the kernels' ancestor-restricted solve."""
    node_state: list[torch.Tensor] = []
    o, U = [], []
    for s in range(ks.shape[0]):
        prev = S_h if par[s] < 0 else node_state[par[s]]
        decayed = torch.exp(g[s].double()) * prev          # a scalar (GDN) or a [K] row over the key columns (KDA)
        u = float(beta[s]) * (v[s].double() - decayed @ ks[s])
        S = decayed + torch.outer(u, ks[s])
        node_state.append(S)
        o.append(S @ qs[s])
        U.append(u)
    return o, U


def verify_ref(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
               out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """q, k [batch, T, H, K]; v [batch, T, HV, V]; g, beta [batch, T, HV]; out [batch, T, HV, V].

    parents int32 [batch, T]: a draft tree of T nodes (replayssm.gdn.tree), verified by the path recurrence
    (_tree_window); a row with h + T > L raises ValueError (the tree early-flush rule was broken)."""
    gm, T, mask = ring.geometry, ring.window, ring.ring_len - 1
    group = gm.value_heads_per_key_head
    for row, slot in enumerate(slots.tolist()):
        if slot == ring.null_slot:
            continue
        h, origin, flush = int(ring.write_pos[slot]), int(ring.origin[slot]), bool(ring.is_flush[slot])
        if parents is not None and h + T > ring.max_len:
            raise ValueError(f"slot {slot}: write_pos {h} + N {T} > L {ring.max_len} (the ring would overflow)")
        par = None if parents is None else [int(p) for p in parents[row].tolist()]
        window_rows = [(origin + h + s) & mask for s in range(T)]
        # All heads first compute S_h from the ring as it was on entry; the flush store comes after, so a
        # head never replays the history on top of a checkpoint that already holds it.
        S0 = read_state(ring, slot, torch.float64)
        history = [_history_state(ring, slot, hv, S0[hv]) for hv in range(gm.HV)]
        if flush and h > 0:
            write_state(ring, slot, torch.stack(history))     # the slot's one write, by the format's rule
        kn = _prepare(k[row], use_qk_l2norm)                   # [T, H, K]
        qn = _prepare(q[row], use_qk_l2norm) * scale
        for hv in range(gm.HV):
            kh = hv // group
            args = (history[hv], kn[:, kh], qn[:, kh], v[row, :, hv], g[row, :, hv], beta[row, :, hv])
            o, U = _chain_window(*args) if par is None else _tree_window(*args, par)
            for s in range(T):
                out[row, s, hv] = o[s].to(out.dtype)
                ring.u[slot, hv, window_rows[s]] = U[s].to(ring.act_dtype)
                ring.g[slot, hv, window_rows[s]] = g[row, s, hv]
        for s in range(T):
            ring.k[slot, :, window_rows[s]] = kn[s].to(ring.act_dtype)
    return out


def materialize_ref(ring: SpecRing, slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [batch, HV, V, K] fp32 <- committed state S_h of each live row (no cache write)."""
    for row, slot in enumerate(slots.tolist()):
        if slot == ring.null_slot:
            continue
        S0 = read_state(ring, slot, torch.float64)
        for hv in range(ring.geometry.HV):
            out[row, hv] = _history_state(ring, slot, hv, S0[hv]).to(out.dtype)
    return out
