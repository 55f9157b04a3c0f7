"""Tree speculation with a frozen state and a replay of the accepted branch, both families: commit-replay for
trees (the FlashInfer / TensorRT-style commit-time replay of baselines/mamba2_commit_replay.py with a tree
verify) and STree's activation replay (Wu et al., "STree: Speculative Tree Decoding for Hybrid State-Space
Models", NeurIPS 2025, arXiv 2505.14969), written from its paper.

Commit-replay (TreeReplayCache, mamba2_tree_verify / gdn_tree_verify / tree_commit): one state per slot and
a stash of the N tree nodes' inputs. Verify walks the nodes in topological order from the state (each node's
state from its parent's, in working memory, none stored: the tree form of the chain baseline's serial walk in
registers) and emits every node's output; tree_commit replays path[:a] from the stash into the state:
1 state read at verify, 1 read + 1 write at commit.

STree (stree_commit, on a ReplaySSM tree ring): the paper verifies a tree from the state with a tree-masked
form of the accumulated state transitions (outputs from the state plus a masked sum over each node's path,
no per-node state) and, with activation replay, folds the previous step's accepted tokens into the state at
the start of the next tree scan, storing it: one state write every step. On the ring that is a flush on every
step: the accepted branch is the committed history and the next verify folds it into the checkpoint before it
verifies its tree. So stree_commit = tree_commit, then is_flush = 1 for the live rows: the ring's own
kernels (all backends) run STree's algorithm. What differs from ReplaySSM is only when the state is written:
every step (STree) vs once every few steps, when the history is full (the ring's early-flush rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from baselines.native_tree_spec import gdn_prepare, gdn_steps, mamba2_readout, mamba2_steps
from replayssm.checks import NULL_SLOT, check_backend, check_slots
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.tree_ring import check_parents


@dataclass
class TreeReplayCache:
    """state [num_slots, *state_shape] fp32; stash: the last verify's node inputs per slot (name -> tensor
    [num_slots, N, ...])."""

    geometry: Mamba2Geometry | GDNGeometry
    N: int
    state: torch.Tensor
    stash: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, geometry, num_slots: int, N: int, device="cpu") -> TreeReplayCache:
        if N < 1 or num_slots < 1:
            raise ValueError(f"N={N} and num_slots={num_slots} must be >= 1")
        mamba = isinstance(geometry, Mamba2Geometry)
        shape = ((geometry.nheads, geometry.headdim, geometry.dstate) if mamba
                 else (geometry.HV, geometry.V, geometry.K))
        return cls(geometry, N, torch.zeros(num_slots, *shape, device=device))

    @property
    def num_slots(self) -> int:
        return self.state.shape[0]


def _steps(cache: TreeReplayCache, stash: dict, dtype):
    """The per-node step function over node-major stash rows (the family's recurrence)."""
    if isinstance(cache.geometry, Mamba2Geometry):
        p = cache.params
        return mamba2_steps(stash["x"], stash["dt"], p["A"], stash["B"], p["dt_bias"], p["dt_softplus"],
                            cache.geometry.heads_per_group, dtype)
    return gdn_steps(stash["k"].repeat_interleave(cache.geometry.value_heads_per_key_head, 2), stash["v"],
                     stash["g"], stash["beta"], dtype)


def _replay(cache: TreeReplayCache, sl: torch.Tensor, path: torch.Tensor, a: torch.Tensor, dtype) -> None:
    """state[sl] <- the state after the nodes path[:, :a] of the stash (one read, one write per slot)."""
    if sl.numel() == 0 or int(a.max()) == 0:
        return
    idx = path.clamp(min=0)
    gathered = {}
    for name, t in cache.stash.items():
        rows = t[sl]                                                         # [n, N, ...]
        gathered[name] = rows.gather(1, idx.view(*idx.shape, *([1] * (rows.dim() - 2))).expand(
            -1, -1, *rows.shape[2:]))
    step = _steps(cache, gathered, dtype)
    S = cache.state[sl].to(dtype)
    for i in range(path.shape[1]):
        keep = (i < a).view(-1, *([1] * (S.dim() - 1)))
        S = torch.where(keep, step(S, i), S)
    cache.state[sl] = S.to(cache.state.dtype)


def _verify(cache, batch, N, parents, slots, backend, stash_rows: dict, params: dict):
    check_backend(backend, cache.state)
    if backend not in ("torch", "ref"):
        raise ValueError(f"backend={backend!r}: the tree replay baselines run on torch and ref")
    if N != cache.N:
        raise ValueError(f"tree size {N} != the cache's N={cache.N}")
    slots = check_slots(slots, batch, cache.num_slots, cache.state.device, cache.null_slot)
    parents = check_parents(parents, batch, N, cache.state.device, slots != cache.null_slot)
    live = (slots != cache.null_slot).nonzero().squeeze(1)
    sl = slots[live].long()
    dtype = torch.float64 if backend == "ref" else torch.float32
    cache.params = params
    for name, t in stash_rows.items():
        if name not in cache.stash:
            cache.stash[name] = torch.zeros(cache.num_slots, *t.shape[1:], dtype=t.dtype, device=t.device)
        cache.stash[name][sl] = t[live]
    step = _steps(cache, {n: t[live] for n, t in stash_rows.items()}, dtype)
    par = parents[live].long()
    work = torch.empty(sl.numel(), N + 1, *cache.state.shape[1:], dtype=dtype, device=cache.state.device)
    work[:, 0] = cache.state[sl]
    ar = torch.arange(sl.numel(), device=sl.device)
    for s in range(N):
        work[:, s + 1] = step(work[ar, par[:, s] + 1], s)
    return live, work[:, 1:]


def mamba2_tree_verify(cache: TreeReplayCache, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, *,
                       parents, slots=None, out=None, backend="torch") -> torch.Tensor:
    """x, z [batch, N, nheads, headdim]; dt [batch, N, nheads] raw; B, C [batch, N, ngroups, dstate]."""
    if out is None:
        out = torch.empty_like(x)
    live, states = _verify(cache, x.shape[0], x.shape[1], parents, slots, backend, {"x": x, "dt": dt, "B": B},
                           {"A": A, "dt_bias": dt_bias, "dt_softplus": dt_softplus})
    if live.numel():
        hpg = cache.geometry.heads_per_group
        out[live] = mamba2_readout(states, x[live], C[live], D, None if z is None else z[live], hpg).to(out.dtype)
    return out


def gdn_tree_verify(cache: TreeReplayCache, q, k, v, g, beta, scale=None, use_qk_l2norm=False, *, parents,
                    slots=None, out=None, backend="torch") -> torch.Tensor:
    """q, k [batch, N, H, K]; v [batch, N, HV, V]; beta [batch, N, HV]; g [batch, N, HV] (GDN) or [.., HV, K] (KDA)."""
    geo = cache.geometry
    scale = geo.K ** -0.5 if scale is None else scale
    if out is None:
        out = torch.empty(q.shape[0], q.shape[1], geo.HV, geo.V, dtype=v.dtype, device=v.device)
    dtype = torch.float64 if backend == "ref" else torch.float32
    kn, qn = gdn_prepare(q, k, scale, use_qk_l2norm, 1, dtype)               # per key head: stashed as is
    live, states = _verify(cache, q.shape[0], q.shape[1], parents, slots, backend,
                           {"k": kn, "v": v, "g": g, "beta": beta}, {})
    if live.numel():
        qh = qn[live].repeat_interleave(geo.value_heads_per_key_head, 2)
        out[live] = (states @ qh[..., None])[..., 0].to(out.dtype)
    return out


kda_tree_verify = gdn_tree_verify      # KDA: the stash holds g [.., HV, K]; gdn_steps decays per key channel


def tree_commit(cache: TreeReplayCache, path: torch.Tensor, num_accepted: torch.Tensor, slots=None,
                backend="torch") -> None:
    """Replay the stashed nodes path[:, :a] into the state. path int [batch, depth] from node 0,
    num_accepted [batch] in 1..depth."""
    check_backend(backend, path, num_accepted)
    batch, depth = path.shape
    slots = check_slots(slots, batch, cache.num_slots, cache.state.device, cache.null_slot)
    live = (slots != cache.null_slot).nonzero().squeeze(1)
    a = num_accepted.long()[live]
    if a.numel() and (int(a.min()) < 1 or int(a.max()) > depth):
        raise ValueError(f"num_accepted must be in 1..depth={depth}")
    _replay(cache, slots[live].long(), path.long()[live], a, torch.float64 if backend == "ref" else torch.float32)


def committed(cache: TreeReplayCache, slots: torch.Tensor) -> torch.Tensor:
    return cache.state[slots.long()].clone()


def stree_commit(family_module, ring, path: torch.Tensor, num_accepted: torch.Tensor, slots=None,
                 backend: str = "torch") -> None:
    """STree on a tree ring (module docstring): the ring's tree_commit, then every live row flushes on its next
    verify, which folds the accepted branch into the state (activation replay) before scanning its tree.
    family_module: replayssm.mamba2 or replayssm.gdn."""
    family_module.tree_commit(ring, path, num_accepted, slots, backend=backend)
    sl = torch.arange(path.shape[0], device=ring.device) if slots is None else slots[slots != ring.null_slot].long()
    ring.is_flush[sl] = 1
