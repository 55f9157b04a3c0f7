"""Native tree speculation, both families: one state snapshot per tree node (what a serving engine would need
to verify a tree with state caching, the tree form of vLLM's per-draft snapshots, baselines/mamba2_ssu.py).

Verify reads the committed snapshot last[slot], walks the N nodes in topological order, each node's state
from its parent's (node 0 from the committed state), writes every node's state into its snapshot and emits
y_s = S_s C_s (Mamba-2) or o_s = S_s q_s (GDN): 1 state read + N state writes per step, N x the state
memory. Commit only moves the cursor: last = path[num_accepted - 1]. Backends "torch" (vectorised over the
batch, serial over nodes) and "ref" (float64 loops, via the tree oracles' recurrence). Same call shapes as
replayssm.{mamba2,gdn}.tree_verify / tree_commit; NULL_SLOT rows are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replayssm.checks import NULL_SLOT, check_backend, check_slots
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.mamba2.ref import SOFTPLUS_THRESHOLD
from replayssm.tree_ring import check_parents

BACKENDS = ("torch", "ref")


@dataclass
class TreeSnapshots:
    """snapshots [num_slots, N, *state_shape] (fp32); last [num_slots] int32: the committed node's snapshot."""

    geometry: Mamba2Geometry | GDNGeometry
    snapshots: torch.Tensor
    last: torch.Tensor
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, geometry, num_slots: int, N: int, device="cpu") -> TreeSnapshots:
        if N < 1 or num_slots < 1:
            raise ValueError(f"N={N} and num_slots={num_slots} must be >= 1")
        shape = ((geometry.nheads, geometry.headdim, geometry.dstate) if isinstance(geometry, Mamba2Geometry)
                 else (geometry.HV, geometry.V, geometry.K))
        return cls(geometry, torch.zeros(num_slots, N, *shape, device=device),
                   torch.zeros(num_slots, dtype=torch.int32, device=device))

    @property
    def N(self) -> int:
        return self.snapshots.shape[1]

    @property
    def num_slots(self) -> int:
        return self.snapshots.shape[0]

    def committed(self, slots: torch.Tensor) -> torch.Tensor:
        """The committed state of each slot in `slots` (a copy)."""
        sl = slots.long()
        return self.snapshots[sl, self.last[sl].long()].clone()


def _prepare(snap: TreeSnapshots, batch: int, N: int, parents, slots, backend):
    check_backend(backend, snap.snapshots)
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: the native tree baseline runs on {BACKENDS}")
    if N != snap.N:
        raise ValueError(f"tree size {N} != the snapshots' N={snap.N}")
    slots = check_slots(slots, batch, snap.num_slots, snap.snapshots.device, snap.null_slot)
    parents = check_parents(parents, batch, N, snap.snapshots.device, slots != snap.null_slot)
    live = (slots != snap.null_slot).nonzero().squeeze(1)
    return slots, parents, live


def _walk(snap: TreeSnapshots, sl: torch.Tensor, par: torch.Tensor, step) -> torch.Tensor:
    """Node states in topological order, each from its parent's; writes the N snapshots. Returns
    work [n, N + 1, ...]: index 0 the committed state, node s at s + 1."""
    n, N = sl.shape[0], snap.N
    work = torch.empty(n, N + 1, *snap.snapshots.shape[2:], dtype=torch.float32, device=sl.device)
    work[:, 0] = snap.snapshots[sl, snap.last[sl].long()]
    ar = torch.arange(n, device=sl.device)
    for s in range(N):
        work[:, s + 1] = step(work[ar, par[:, s].long() + 1], s)
    snap.snapshots[sl] = work[:, 1:]
    return work


def mamba2_steps(x, dt, A, B, dt_bias, dt_softplus: bool, hpg: int, dtype):
    """step(prev, s) = exp(A dt_s) prev + dt_s x_s B_s^T over rows [n] of node-major inputs x [n, N, H, P],
    dt [n, N, H] raw, B [n, N, G, dstate], in `dtype` (fp32: torch, fp64: ref)."""
    dtp = dt.float() + (0 if dt_bias is None else dt_bias.float())
    if dt_softplus:
        dtp = F.softplus(dtp, threshold=SOFTPLUS_THRESHOLD)
    dtp, xs = dtp.to(dtype), x.to(dtype)
    Bh = B.to(dtype).repeat_interleave(hpg, 2)                               # [n, N, H, dstate]
    decay = torch.exp(dtp * A.to(dtype))                                     # [n, N, H]

    def step(prev, s):
        upd = (dtp[:, s, :, None, None] * xs[:, s, :, :, None]) * Bh[:, s, :, None, :]
        return decay[:, s, :, None, None] * prev.to(dtype) + upd
    return step


def mamba2_readout(states, x, C, D, z, hpg: int) -> torch.Tensor:
    """y [n, N, H, P] = S_s C_s (+ D x_s, * silu(z_s)) from node states [n, N, H, P, dstate]."""
    Ch = C.to(states.dtype).repeat_interleave(hpg, 2)
    y = torch.einsum("bshpn,bshn->bshp", states, Ch)
    if D is not None:
        y = y + D.to(y.dtype)[:, None] * x.to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def mamba2_tree_verify(snap: TreeSnapshots, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, *,
                       parents, slots=None, out=None, backend="torch") -> torch.Tensor:
    """x, z [batch, N, nheads, headdim]; dt [batch, N, nheads]; B, C [batch, N, ngroups, dstate]."""
    batch, N = x.shape[:2]
    slots, parents, live = _prepare(snap, batch, N, parents, slots, backend)
    hpg = snap.geometry.heads_per_group
    if out is None:
        out = torch.empty_like(x)
    if live.numel() == 0:
        return out
    dtype = torch.float64 if backend == "ref" else torch.float32
    step = mamba2_steps(x[live], dt[live], A, B[live], dt_bias, dt_softplus, hpg, dtype)
    work = _walk(snap, slots[live].long(), parents[live], step)
    out[live] = mamba2_readout(work[:, 1:], x[live], C[live], D, None if z is None else z[live], hpg).to(out.dtype)
    return out


def gdn_prepare(q, k, scale: float, use_qk_l2norm: bool, grp: int, dtype):
    """(k, q) [n, N, HV, K] in `dtype`: L2-normalised when asked, q scaled, key heads repeated per value head."""
    kk, qq = k.to(dtype), q.to(dtype)
    if use_qk_l2norm:
        kk = kk * torch.rsqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
        qq = qq * torch.rsqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
    return kk.repeat_interleave(grp, 2), qq.repeat_interleave(grp, 2) * scale


def gdn_steps(kk, v, g, beta, dtype):
    """step(prev, s): the delta rule u = beta (v - exp(g) prev k), S = exp(g) prev + u k^T on node s of
    node-major rows (kk [n, N, HV, K] prepared, v [n, N, HV, V], beta [n, N, HV]; g [n, N, HV] (GDN: one decay
    per head) or [n, N, HV, K] (KDA: one per key channel, the state's K-last columns))."""
    vv, gg, bb = v.to(dtype), g.to(dtype), beta.to(dtype)
    per_channel = gg.dim() == 4

    def step(prev, s):
        prev = prev.to(dtype)
        e = torch.exp(gg[:, s])
        e = e[..., None, :] if per_channel else e[..., None, None]           # [n, HV, 1, K] or [n, HV, 1, 1]
        u = bb[:, s, :, None] * (vv[:, s] - (e * prev @ kk[:, s, :, :, None])[..., 0])
        return e * prev + u[..., :, None] * kk[:, s, :, None, :]
    return step


def gdn_tree_verify(snap: TreeSnapshots, q, k, v, g, beta, scale=None, use_qk_l2norm=False, *, parents,
                    slots=None, out=None, backend="torch") -> torch.Tensor:
    """q, k [batch, N, H, K]; v [batch, N, HV, V]; beta [batch, N, HV]; g [batch, N, HV] (GDN) or [.., HV, K] (KDA)."""
    batch, N = q.shape[:2]
    slots, parents, live = _prepare(snap, batch, N, parents, slots, backend)
    geo = snap.geometry
    scale = geo.K ** -0.5 if scale is None else scale
    if out is None:
        out = torch.empty(batch, N, geo.HV, geo.V, dtype=v.dtype, device=v.device)
    if live.numel() == 0:
        return out
    dtype = torch.float64 if backend == "ref" else torch.float32
    kk, qq = gdn_prepare(q[live], k[live], scale, use_qk_l2norm, geo.value_heads_per_key_head, dtype)
    work = _walk(snap, slots[live].long(), parents[live], gdn_steps(kk, v[live], g[live], beta[live], dtype))
    out[live] = (work[:, 1:].to(dtype) @ qq[..., None])[..., 0].to(out.dtype)
    return out


kda_tree_verify = gdn_tree_verify      # KDA: the same walk with g [batch, N, HV, K] (gdn_steps decays per channel)


def tree_commit(snap: TreeSnapshots, path: torch.Tensor, num_accepted: torch.Tensor, slots=None,
                backend="torch") -> None:
    """last = path[num_accepted - 1]: the accepted branch's deepest committed node (a cursor move)."""
    check_backend(backend, path, num_accepted)
    batch = path.shape[0]
    slots = check_slots(slots, batch, snap.num_slots, snap.snapshots.device, snap.null_slot)
    live = slots != snap.null_slot
    a = num_accepted.long()
    if bool(((a < 1) | (a > path.shape[1]))[live].any()):
        raise ValueError(f"num_accepted must be in 1..depth={path.shape[1]}")
    node = path.long().gather(1, (a - 1).clamp(min=0)[:, None])[:, 0]
    snap.last[slots[live].long()] = node[live].to(torch.int32)


