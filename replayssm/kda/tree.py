"""Tree speculation for Kimi Delta Attention on the ReplaySSM ring (GDN's, replayssm/gdn/tree.py, with
per-key-channel decays).

    o = tree_verify(ring, q, k, v, g, beta, parents=parents)    # o [batch, N, HV, V]
    tree_commit(ring, path, num_accepted)                        # the accepted branch, 1..depth nodes
Node s's output depends on S_h and the inputs on its root-to-node path only: the window system of
replayssm.kda.spec_torch restricted to ancestors, with G_s the per-channel sum of g over s's path. The commit
moves the accepted nodes' (u, k, g) into chain order (replayssm/tree_ring.py), never a state.
Backends: "triton" (the verify kernel with IS_TREE and PER_CHANNEL), "torch", "ref" (float64 path recurrence);
"cpu" (GDN's C tree verify, per-channel mode, N <= 32). The Triton backend takes route="fused" (the default) or
route="verify_fold" (N <= 8): replayssm/delta_rule/spec_launch.py's prep / verify / fold, KDA's prep
(spec_prep_kda_kernel, or spec_prep_kda_tok_kernel at N > 4) built with IS_TREE, the ancestor mask of
window_path / path_holds; the verify and the fold are the chain's builds.
"""

from __future__ import annotations

import torch

from replayssm import tree_ring
from replayssm.checks import check_cache_type
from replayssm.gdn.tree import run_tree_verify
from replayssm.kda import spec_torch
from replayssm.kda.cache import SpecRing

RING_FIELDS = ("u", "k", "g")


def tree_verify(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False, *,
                parents: torch.Tensor, slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of every node of a draft tree from the committed state; the N nodes go into the ring.

    Args: as replayssm.gdn.tree_verify, with g [batch, N, HV, K] float32 (per key channel).
        parents: int32 [batch, N] or [N]: parents[0] = -1, parents[s] < s.
        backend: "triton" (default, N <= 32), "torch", "cpu" (N <= 32) or "ref".
        route: the Triton kernels, as replayssm.gdn.tree_verify's: "fused" (default) or "verify_fold" (the ring
            verify's prep / verify / fold, the prep with the ancestor mask; N <= 8). The other backends accept both
            names and compute the same function.

    Returns:
        o [batch, N, HV, V] in ring.act_dtype.

    Example:
        >>> import torch
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, tree_verify
        >>> from replayssm.kda.inputs import random_step
        >>> geom = KDAGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> o = tree_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"],
        ...                 parents=torch.tensor([-1, 0, 0], dtype=torch.int32), backend="torch")
        >>> tuple(o.shape)
        (2, 3, 4, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_tree_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, parents, slots, out, backend, spec_torch,
                           route)


def tree_commit(ring: SpecRing, path: torch.Tensor, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton", *, parents: torch.Tensor | None = None) -> None:
    """Keep the accepted branch of each row's tree and advance the cursors; no state is written.

    Moves the ring entries (u, k, g) of node path[i] to logical position h + i (g moves its whole K row),
    then advances the cursors with the tree flush rule (replayssm/tree_ring.py).

    Example:
        >>> import torch
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, tree_commit, tree_verify
        >>> from replayssm.kda.inputs import random_step
        >>> geom = KDAGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=2, history_len=8, window=3)
        >>> win = random_step(geom, batch=2, window=3)
        >>> _ = tree_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"],
        ...                 parents=torch.tensor([-1, 0, 0], dtype=torch.int32), backend="torch")
        >>> tree_commit(ring, torch.tensor([[0, 2], [0, 1]], dtype=torch.int32),
        ...             torch.tensor([2, 1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [2, 1]
    """
    check_cache_type(ring, SpecRing)
    path, num_accepted, slots = tree_ring.check_tree_commit(ring, path, num_accepted, slots, backend, parents)
    tree_ring.commit(ring, RING_FIELDS, path, num_accepted, slots, backend)
