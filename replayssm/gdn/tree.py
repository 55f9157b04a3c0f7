"""Tree speculation for Gated DeltaNet on the ReplaySSM ring: verify a draft tree from one committed state.

The ring is a SpecRing (replayssm.gdn.ring) allocated with window = N, the number of tree nodes. A step is
    o = tree_verify(ring, q, k, v, g, beta, parents=parents)    # o [batch, N, HV, V]
    tree_commit(ring, path, num_accepted)                        # the accepted branch, 1..depth nodes
Every node's output is a function of S_h and the inputs on its own root-to-node path: the chunked delta-rule
system of spec_verify restricted to ancestors (A[s, c] nonzero only for c a strict ancestor of s) is solved
by forward substitution in topological order, and on any root-to-leaf path it is exactly the chain system.
The commit moves the accepted nodes' (u, k, g) into chain order and advances the cursors, never a state
(replayssm/tree_ring.py: protocol and the tree early-flush rule write_pos + depth + N > L). A chain tree is
exactly spec_verify / spec_commit.

Backends: each is the chain verify of replayssm.gdn.spec with the tree's parents: "triton" (spec_kernels.py,
the verify kernel with IS_TREE, N <= 32; or with route="verify_fold" replayssm/delta_rule/spec_launch.py's prep /
verify / fold, the prep built with IS_TREE, N <= 8; the commit: replayssm/tree_ring.py), "torch" (spec_torch.py),
"cpu" (the fused C/OpenMP kernel gdn_tree_replay, replayssm/cpu/tree_body.h, N <= 32; its commit is the torch one),
"ref" (spec_ref.py, float64 path recurrence).
"""

from __future__ import annotations

import torch

from replayssm import tree_ring
from replayssm.checks import (
    check_backend,
    check_cache_type,
    check_ring_format,
    check_slots,
    check_spec_route,
    spec_kernel,
)
from replayssm.delta_rule.spec_launch import check_tree_route, launch_verify_fold
from replayssm.gdn import spec_ref, spec_torch
from replayssm.gdn.ring import SpecRing
from replayssm.gdn.spec import check_cache_device, check_window, ring_family

RING_FIELDS = ("u", "k", "g")


def tree_verify(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False, *,
                parents: torch.Tensor, slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of every node of a draft tree from the committed state; the N nodes go into the ring.

    Node s's output depends on the committed state and the inputs on its root-to-node path only: the chunked
    delta-rule system of spec_verify restricted to ancestors. Rows with is_flush fold their history into the
    checkpoint first; the parents are kept on the ring for tree_commit.

    Args:
        ring: the layer's SpecRing allocated with window = N, the number of tree nodes.
        q, k: [batch, N, H, K] in ring.act_dtype, unit stride on the last dim.
        v: [batch, N, HV, V] in ring.act_dtype.
        g: [batch, N, HV] float32, the log decay.
        beta: [batch, N, HV] float32, the delta-rule step size.
        scale: the query scale; None means K ** -0.5.
        use_qk_l2norm: L2-normalise q and k in the kernel.
        parents: int32 [batch, N], or [N] for a tree shared by the batch: parents[0] = -1, parents[s] < s.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        out: optional [batch, N, HV, V] output in ring.act_dtype.
        backend: "triton" (default, N <= 32), "torch", "cpu" (N <= 32) or "ref".
        route: the Triton kernels (replayssm.checks.SPEC_ROUTES), as spec_verify's: "fused" (default;
            spec_kernels.py, the verify kernel with IS_TREE) or "verify_fold" (replayssm/delta_rule/spec_launch.py:
            the prep built with the ancestor mask, then the chain's verify and fold kernels; N <= 8). The other
            backends accept both names and compute the same function.

    Returns:
        o [batch, N, HV, V] in ring.act_dtype (`out` when given).

    Raises:
        ValueError: bad inputs, parents or route (or N > 8 on route "verify_fold"), before anything is written.

    Example:
        >>> import torch
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, tree_verify
        >>> from replayssm.gdn.inputs import random_step
        >>> geom = GDNGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> parents = torch.tensor([-1, 0, 0], dtype=torch.int32)          # a root with two children
        >>> o = tree_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"], parents=parents,
        ...                 backend="torch")
        >>> tuple(o.shape)
        (2, 3, 4, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_tree_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, parents, slots, out, backend, spec_torch,
                           route)


def run_tree_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, parents, slots, out, backend: str,
                    torch_forms, route: str = "fused") -> torch.Tensor:
    """tree_verify after the family's ring check, for either decay shape: GDN, and KDA (replayssm/kda/tree.py,
    ring.geometry.PER_CHANNEL_DECAY: g [batch, N, HV, K]). `torch_forms`: the family's torch module (its
    verify_torch with parents). `route` is checked here, before anything is written: "verify_fold" takes N <= 8
    on the Triton backend (either family: the prep is built with IS_TREE); the other backends accept both names."""
    check_spec_route(route)
    per_channel = ring.geometry.PER_CHANNEL_DECAY
    check_ring_format(ring, backend, spec_kernel(ring_family(ring), "replay_tree", route))  # plain only on triton / cpu
    if route == "verify_fold" and backend == "triton":
        check_tree_route(ring.window, per_channel)
    batch, scale = check_window(ring.geometry, ring.window, ring.act_dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=per_channel)
    check_cache_device(ring, q)
    check_backend(backend, ring.state)
    if backend == "cpu":
        from replayssm.cpu.ops import check_tree_sizes
        check_tree_sizes(ring)
    slots = check_slots(slots, batch, ring.num_slots, ring.device, ring.null_slot)
    parents = tree_ring.check_parents(parents, batch, ring.window, ring.device, slots != ring.null_slot)
    if out is None:
        gm = ring.geometry
        out = torch.empty(batch, ring.window, gm.HV, gm.V, dtype=ring.act_dtype, device=ring.device)
    setattr(ring, tree_ring.PARENTS_ATTR, parents)
    if batch == 0:
        return out
    args = (ring, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out, parents)
    if backend == "ref":
        return spec_ref.verify_ref(*args)
    if backend == "torch":
        return torch_forms.verify_torch(*args)
    if backend == "cpu":
        from replayssm.cpu import ops
        ops.gdn_tree_replay(ring, q, k, v, g, beta, scale, bool(use_qk_l2norm), out, slots, parents)
        return out
    if route == "verify_fold":
        return launch_verify_fold(*args[:-1], per_channel=per_channel, parents=parents)
    from replayssm.gdn.spec_kernels import verify_triton

    return verify_triton(*args[:-1], parents=parents, per_channel=per_channel)


def tree_commit(ring: SpecRing, path: torch.Tensor, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton", *, parents: torch.Tensor | None = None) -> None:
    """Keep the accepted branch of each row's tree and advance the cursors; no state is written.

    Moves the ring entries (u, k, g) of node path[i] to logical position h + i, then advances the cursors as
    spec_commit does with the tree flush rule is_flush = write_pos + depth + N > L (replayssm/tree_ring.py).

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
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, tree_commit, tree_verify
        >>> from replayssm.gdn.inputs import random_step
        >>> geom = GDNGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> _ = tree_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"],
        ...                 parents=torch.tensor([-1, 0, 0], dtype=torch.int32), backend="torch")
        >>> path = torch.tensor([[0, 2], [0, 1]], dtype=torch.int32)
        >>> tree_commit(ring, path, torch.tensor([2, 1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [2, 1]
    """
    check_cache_type(ring, SpecRing)
    path, num_accepted, slots = tree_ring.check_tree_commit(ring, path, num_accepted, slots, backend, parents)
    tree_ring.commit(ring, RING_FIELDS, path, num_accepted, slots, backend)
