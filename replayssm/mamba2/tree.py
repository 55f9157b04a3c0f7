"""Tree speculation for Mamba-2 on the ReplaySSM ring: verify a draft tree from one checkpoint, commit a branch.

The ring is a SpecRing allocated with window = N (the number of tree nodes). A step is
    y = tree_verify(ring, x, dt, A, B, C, ..., parents=parents)    # y [batch, N, nheads, headdim]
    tree_commit(ring, path, num_accepted)                           # the accepted branch, 1..depth nodes
Node s's output depends on the checkpoint and the inputs on its own root-to-node path only, so the whole
tree verifies from one checkpoint: the chain kernel with the causal mask replaced by the ancestor mask and
the prefix sums of dt by tree prefix sums (cum_s = cum_parent(s) + dt_s). The commit moves the accepted
nodes' ring entries (x, B, dt) into chain order and advances the cursors; it never writes a state. Tree
protocol and the early-flush rule restated for trees (write_pos + depth + N > L): replayssm/tree_ring.py.
A chain (parents = [-1, 0, 1, ...], path = [0, 1, ...]) is exactly spec_verify / spec_commit.

Backends: each is the chain verify of replayssm.mamba2.spec with the tree's parents: "triton" (spec_kernels.py,
the verify kernel with IS_TREE, or with route="verify_fold" spec_verify_fold.py's prep / verify / fold with
IS_TREE; the commit: replayssm/tree_ring.py), "torch" (spec_torch.py, vectorised), "cpu"
(the fused C/OpenMP kernel m2_tree_replay, replayssm/cpu/tree_body.h, N <= 32; its commit is the torch one),
"ref" (spec_ref.py, float64 path recurrence: the oracle). Every entry point validates its inputs before
touching the ring.
"""

from __future__ import annotations

import torch

from replayssm import tree_ring
from replayssm.checks import (
    check_backend,
    check_dtype,
    check_last_dim_contiguous,
    check_ring_format,
    check_same_device,
    check_shape,
    check_slots,
    check_spec_route,
    spec_kernel,
)
from replayssm.mamba2 import spec_ref, spec_torch
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec import _A_ATTR, PARAM_DTYPES, _check_kernel_geometry

RING_FIELDS = ("x", "B", "dt")  # what a tree commit moves: the cached inputs of the accepted nodes


def _check_ring(ring) -> SpecRing:
    if not isinstance(ring, SpecRing):
        raise ValueError(f"expected a replayssm.mamba2.SpecRing, got {type(ring).__name__}")
    return ring


def check_tree_window(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, out, backend: str) -> tuple[int, torch.device]:
    """Shapes, dtypes and devices of one tree window (as spec_verify's, N = ring.window nodes).
    Returns (batch, device)."""
    check_backend(backend, x, dt, A, B, C, D, z, dt_bias, out, ring.state)
    _check_kernel_geometry(ring, backend)
    if backend == "cpu":
        from replayssm.cpu.ops import check_tree_sizes
        check_tree_sizes(ring)
    geo, N = ring.geometry, ring.window
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be [batch, N, nheads, headdim], got {getattr(x, 'shape', type(x).__name__)}")
    if x.shape[1] != N:
        raise ValueError(f"tree size {x.shape[1]} != ring.window N={N} (allocate the ring with window = N)")
    batch = x.shape[0]
    check_shape("x", x, (batch, N, geo.nheads, geo.headdim))
    check_shape("z", z, (batch, N, geo.nheads, geo.headdim))
    check_shape("dt", dt, (batch, N, geo.nheads))
    check_shape("B", B, (batch, N, geo.ngroups, geo.dstate))
    check_shape("C", C, (batch, N, geo.ngroups, geo.dstate))
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_shape(name, t, (geo.nheads,))
    check_shape("out", out, (batch, N, geo.nheads, geo.headdim))
    for name, t in (("x", x), ("z", z), ("B", B), ("C", C), ("out", out)):
        if t is not None and t.dtype != ring.act_dtype:
            raise ValueError(f"{name} has dtype {t.dtype}; the ring caches activations in {ring.act_dtype}")
    for name, t in (("dt", dt), ("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_dtype(name, t, PARAM_DTYPES)
    for name, t in (("x", x), ("z", z), ("dt", dt), ("B", B), ("C", C), ("out", out)):
        check_last_dim_contiguous(name, t)
    device = check_same_device(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, out=out, state=ring.state)
    return batch, device


def tree_verify(ring: SpecRing, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, dt_softplus: bool = True, *, parents: torch.Tensor,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of every node of a draft tree, all from the slot's checkpoint; the N nodes go into the ring.

    Node s's output depends on the checkpoint and the inputs on its own root-to-node path only: the chain
    verify with the causal mask replaced by the ancestor mask and the prefix sums of dt by tree prefix sums.
    On is_flush rows the committed history is folded into the checkpoint first; the parents are kept on the
    ring for tree_commit.

    Args:
        ring: the layer's SpecRing allocated with window = N, the number of tree nodes.
        x: [batch, N, nheads, headdim] in ring.act_dtype.
        dt: [batch, N, nheads] raw (float32/16/bf16).
        A: [nheads].
        B, C: [batch, N, ngroups, dstate] in ring.act_dtype.
        D: optional [nheads] skip.
        z: optional [batch, N, nheads, headdim] gate in ring.act_dtype.
        dt_bias: optional [nheads].
        dt_softplus: apply softplus (threshold 20) to dt + dt_bias.
        parents: int32 [batch, N], or [N] for a tree shared by the batch: parents[0] = -1, parents[s] < s.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        out: optional [batch, N, nheads, headdim] output in ring.act_dtype.
        backend: "triton" (default, N <= 32), "torch", "cpu" (N <= 32) or "ref".
        route: the Triton kernels (replayssm.checks.SPEC_ROUTES), as spec_verify's: "fused" (default;
            spec_kernels.py, the verify kernel with IS_TREE) or "verify_fold" (spec_verify_fold.py: the prep, then
            the verify and fold kernels built with the ancestor mask; a flush row's fold is the chain's, the
            history being a chain). The other backends accept both names and compute the same function.

    Returns:
        y [batch, N, nheads, headdim] in ring.act_dtype (`out` when given).

    Raises:
        ValueError: bad inputs or parents, before anything is written.

    Example:
        >>> import torch
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, tree_verify
        >>> from replayssm.mamba2.inputs import random_params, random_step
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> p = random_params(geom)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> parents = torch.tensor([-1, 0, 0], dtype=torch.int32)          # a root with two children
        >>> y = tree_verify(ring, win["x"], win["dt"], p.A, win["B"], win["C"], p.D, win["z"], p.dt_bias,
        ...                 parents=parents, backend="torch")
        >>> tuple(y.shape)
        (2, 3, 4, 16)
    """
    ring = _check_ring(ring)
    check_spec_route(route)
    check_ring_format(ring, backend, spec_kernel("mamba2", "replay_tree", route))   # plain only on triton / cpu
    batch, device = check_tree_window(ring, x, dt, A, B, C, D, z, dt_bias, out, backend)
    slots_in = slots
    slots = check_slots(slots, batch, ring.num_slots, device, ring.null_slot)
    parents = tree_ring.check_parents(parents, batch, ring.window, device, slots != ring.null_slot)
    geo = ring.geometry
    if out is None:
        out = torch.empty(batch, ring.window, geo.nheads, geo.headdim, dtype=ring.act_dtype, device=device)
    setattr(ring, _A_ATTR, A)
    setattr(ring, tree_ring.PARENTS_ATTR, parents)
    if batch == 0:
        return out
    if backend == "ref":
        return spec_ref.verify_ref(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, parents)
    if backend == "torch":
        torch_slots = None if slots_in is None else slots
        return spec_torch.verify_torch(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, torch_slots, out, parents)
    if backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_tree_replay(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slots, parents)
        return out
    if route == "verify_fold":
        from replayssm.mamba2.spec_verify_fold import launch_verify_fold

        return launch_verify_fold(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, parents=parents)
    from replayssm.mamba2.spec_kernels import launch_verify

    return launch_verify(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out, parents=parents)


def tree_commit(ring: SpecRing, path: torch.Tensor, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton", *, parents: torch.Tensor | None = None) -> None:
    """Keep the accepted branch of each row's tree and advance the cursors; no state is written.

    Moves the ring entries (x, B, dt) of node path[i] to logical position h + i, then advances the cursors;
    is_flush = write_pos + depth + N > L (replayssm/tree_ring.py).

    Args:
        ring: the layer's SpecRing, right after tree_verify.
        path: int32 [batch, depth], node indices from node 0 down the branch.
        num_accepted: int [batch] in 1..depth (the bonus token included).
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".
        parents: the tree the path must be a branch of (default the parents of the ring's last tree_verify).

    Returns:
        None; ring entries and cursors change in place.

    Example:
        >>> import torch
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, tree_commit, tree_verify
        >>> from replayssm.mamba2.inputs import random_params, random_step
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> p = random_params(geom)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> _ = tree_verify(ring, win["x"], win["dt"], p.A, win["B"], win["C"],
        ...                 parents=torch.tensor([-1, 0, 0], dtype=torch.int32), backend="torch")
        >>> path = torch.tensor([[0, 2], [0, 1]], dtype=torch.int32)
        >>> tree_commit(ring, path, torch.tensor([2, 1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [2, 1]
    """
    ring = _check_ring(ring)
    path, num_accepted, slots = tree_ring.check_tree_commit(ring, path, num_accepted, slots, backend, parents)
    tree_ring.commit(ring, RING_FIELDS, path, num_accepted, slots, backend)
