"""Float64 oracle of the ReplaySSM GDN AR protocol: loops, written for clarity, not speed.

It walks the cache exactly as the kernels do (same entries, same cursor moves, same flush rule) and
rounds only where the cache stores (u and k in the act dtype, the checkpoint in the state dtype), so
after any sequence of steps its cache equals the other backends' cache up to rounding.

Shared with Kimi Delta Attention (replayssm.kda): a cache whose g holds a decay per key channel
([num_slots, HV, L, K], 4-D) decays the state column-wise, S <- S diag(exp(g_j)) + u_j k_j^T; everything
else is the same loop.

The state after the cached entries is rebuilt by replaying them one by one from the checkpoint,
S <- exp(g_j) S + u_j k_j^T, rather than by the closed form with prefix-sum weights that the fast
backends use: the two agreeing is part of what the tests check.
"""

from __future__ import annotations

import torch

from replayssm.gdn.ref import decay_factor, expand_key_heads, l2norm
from replayssm.state_format import read_state as read_checkpoint
from replayssm.state_format import write_state as write_checkpoint


def rebuild_state_ref(cache, slot: int) -> torch.Tensor:
    """S_h of one slot, [HV, V, K] float64: the checkpoint with the write_pos cached entries replayed."""
    HV = cache.geometry.HV
    S = read_checkpoint(cache, slot, torch.float64)
    for j in range(int(cache.write_pos[slot])):
        k_j = expand_key_heads(cache.k[slot, :, j].double(), HV)             # [HV, K]
        u_j = cache.u[slot, :, j].double()                                   # [HV, V]
        decay = torch.exp(cache.g[slot, :, j].double())                      # [HV] (KDA: [HV, K])
        S = decay_factor(decay, cache.g.dim() == 4) * S + u_j[:, :, None] * k_j[:, None, :]
    return S


def replay_step_ref(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                    out: torch.Tensor) -> None:
    """One step for every live row (inputs validated; slots int32 [batch]); writes out and the cache."""
    HV, L = cache.geometry.HV, cache.buffer_len
    for row, slot in enumerate(slots.tolist()):
        if slot == cache.null_slot:
            continue
        k_norm = l2norm(k[row]) if use_qk_l2norm else k[row].double()        # [H, K], stored in the cache
        q_scaled = (l2norm(q[row]) if use_qk_l2norm else q[row].double()) * scale
        k_hv, q_hv = expand_key_heads(k_norm, HV), expand_key_heads(q_scaled, HV)   # [HV, K]
        S_h = rebuild_state_ref(cache, slot)
        # the decayed state alpha S_h (KDA: S_h diag(alpha) per value head) first, then the delta rule on it
        S_dec = decay_factor(torch.exp(g[row].double()), cache.g.dim() == 4) * S_h
        Sk = torch.einsum("hvk,hk->hv", S_dec, k_hv)
        Sq = torch.einsum("hvk,hk->hv", S_dec, q_hv)
        u = beta[row].double()[:, None] * (v[row].double() - Sk)
        o = Sq + u * (k_hv * q_hv).sum(-1)[:, None]
        out[row] = o.to(out.dtype)
        h = int(cache.write_pos[slot])
        if h == L - 1:
            S_new = S_dec + u[:, :, None] * k_hv[:, None, :]
            write_checkpoint(cache, slot, S_new)   # every format's rule, in float64
            cache.write_pos[slot] = 0
        else:
            cache.u[slot, :, h] = u.to(cache.act_dtype)
            cache.k[slot, :, h] = k_norm.to(cache.act_dtype)
            cache.g[slot, :, h] = g[row]
            cache.write_pos[slot] = h + 1


def materialize_ref(cache, slots: torch.Tensor, out: torch.Tensor) -> None:
    for row, slot in enumerate(slots.tolist()):
        if slot != cache.null_slot:
            out[row] = rebuild_state_ref(cache, slot).to(out.dtype)
