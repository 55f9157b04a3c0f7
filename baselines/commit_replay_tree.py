"""Tree speculation with a frozen checkpoint and a replay of the accepted branch, both families: commit-replay
for trees (FlashInfer / TensorRT-style commit-time replay, baselines/mamba2_commit_replay.py, with a tree
verify) and STree's activation replay (Wu et al., "STree: Speculative Tree Decoding for Hybrid State-Space
Models", NeurIPS 2025, arXiv 2505.14969), written from its paper.

Both keep one state per slot and a stash of the N tree nodes' inputs. Verify walks the nodes in topological
order from the state (each node's state from its parent's, in working memory, none stored) and emits every
node's output; the accepted branch's inputs are then replayed into the state:
    mode="commit"  tree_commit replays path[:a] at once: 1 state read + 1 state write in the commit.
    mode="stree"   tree_commit only records the branch; the next verify first replays it into the state and
                   stores it, then verifies the new tree from it (the paper's activation replay folded into
                   the next step's tree scan): the same 1 state read + 1 write per step, in one launch.
Against the ReplaySSM ring (replayssm.{mamba2,gdn}.tree): both write the state every step; the ring writes it
only on flush steps and commits by moving a few input entries. Backends "torch" and "ref" (float64).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from baselines.native_tree_spec import gdn_prepare, gdn_steps, mamba2_readout, mamba2_steps
from replayssm.checks import NULL_SLOT, check_backend, check_slots
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.tree_ring import check_parents

MODES = ("commit", "stree")


@dataclass
class TreeReplayCache:
    """state [num_slots, *state_shape] fp32; stash: the last verify's node inputs per slot (name -> tensor
    [num_slots, N, ...]); pending_path [num_slots, N] / pending_a [num_slots] (mode "stree": the branch the
    next verify replays first)."""

    geometry: Mamba2Geometry | GDNGeometry
    N: int
    mode: str
    state: torch.Tensor
    stash: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    pending_path: torch.Tensor | None = None
    pending_a: torch.Tensor | None = None
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, geometry, num_slots: int, N: int, mode: str = "commit", device="cpu") -> TreeReplayCache:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        if N < 1 or num_slots < 1:
            raise ValueError(f"N={N} and num_slots={num_slots} must be >= 1")
        mamba = isinstance(geometry, Mamba2Geometry)
        shape = ((geometry.nheads, geometry.headdim, geometry.dstate) if mamba
                 else (geometry.HV, geometry.V, geometry.K))
        return cls(geometry, N, mode, torch.zeros(num_slots, *shape, device=device),
                   pending_path=torch.zeros(num_slots, N, dtype=torch.int64, device=device),
                   pending_a=torch.zeros(num_slots, dtype=torch.int64, device=device))

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
    if cache.mode == "stree" and sl.numel():
        # activation replay: the branch accepted last step goes into the state before this tree is scanned
        _replay(cache, sl, cache.pending_path[sl], cache.pending_a[sl], dtype)
        cache.pending_a[sl] = 0
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
    """q, k [batch, N, H, K]; v [batch, N, HV, V]; g, beta [batch, N, HV]."""
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


def tree_commit(cache: TreeReplayCache, path: torch.Tensor, num_accepted: torch.Tensor, slots=None,
                backend="torch") -> None:
    """mode "commit": replay the stashed nodes path[:, :a] into the state now; mode "stree": record them for
    the next verify. path int [batch, depth] from node 0, num_accepted [batch] in 1..depth."""
    check_backend(backend, path, num_accepted)
    batch, depth = path.shape
    slots = check_slots(slots, batch, cache.num_slots, cache.state.device, cache.null_slot)
    live = (slots != cache.null_slot).nonzero().squeeze(1)
    a = num_accepted.long()[live]
    if a.numel() and (int(a.min()) < 1 or int(a.max()) > depth):
        raise ValueError(f"num_accepted must be in 1..depth={depth}")
    sl = slots[live].long()
    p = path.long()[live]
    if cache.mode == "stree":
        cache.pending_path[sl] = torch.nn.functional.pad(p, (0, cache.N - depth), value=-1)
        cache.pending_a[sl] = a
        return
    _replay(cache, sl, p, a, torch.float64 if backend == "ref" else torch.float32)


def committed(cache: TreeReplayCache, slots: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """The committed state of each slot (mode "stree" folds the pending branch in, on a copy)."""
    sl = slots.long()
    if cache.mode == "commit":
        return cache.state[sl].clone()
    saved = cache.state.clone()
    dtype = torch.float64 if backend == "ref" else torch.float32
    _replay(cache, sl, cache.pending_path[sl], cache.pending_a[sl], dtype)
    out = cache.state[sl].clone()
    cache.state.copy_(saved)
    return out
