"""ReplaySSM speculative decoding for Kimi Delta Attention: verify (+ early flush), commit, reset, materialise.

The GDN ring protocol (replayssm/gdn/ring.py, replayssm/ring_cursors.py) on a kda.SpecRing whose g entries are
K-vectors. Backends: "triton" (GDN's verify kernel with PER_CHANNEL set, replayssm/gdn/spec_kernels.py),
"torch" (spec_torch.py, the module docstring has the window math), "ref" (GDN's float64 oracle,
replayssm/gdn/spec_ref.py, which takes either decay shape). Validation and dispatch are GDN's
(replayssm/gdn/spec.py, run_spec_verify / run_spec_materialize: the decay shape comes from the geometry).
"cpu": GDN's C ring verify in its per-channel mode (replayssm/cpu/gdn_spec_body.h).

    o = spec_verify(ring, q, k, v, g, beta)     # o [batch, T, HV, V]: every window token from one S_h
    spec_commit(ring, num_accepted)             # num_accepted [batch] in 1..T (bonus token included)

Input shapes: q, k [batch, T, H, K] and v [batch, T, HV, V] in the ring's activation dtype; g [batch, T, HV, K]
and beta [batch, T, HV] fp32; scale defaults to K ** -0.5. Value head hv reads key head hv // (HV // H).
"""

from __future__ import annotations

import torch

from replayssm import ring_cursors
from replayssm.checks import check_cache_type
from replayssm.gdn.spec import run_spec_materialize, run_spec_verify
from replayssm.kda import spec_torch
from replayssm.kda.cache import SpecRing

__all__ = ["SpecRing", "spec_verify", "spec_commit", "spec_reset", "spec_materialize"]


def spec_verify(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of all T window tokens from the committed state; the window is appended to the ring.

    Rows whose slot has is_flush set first fold their committed history into the checkpoint. Cursors do not
    move: call spec_commit with the accepted counts before the next verify.

    Args:
        ring: the layer's kda.SpecRing (window T).
        q, k: [batch, T, H, K] in ring.act_dtype, unit stride on the last dim.
        v: [batch, T, HV, V] in ring.act_dtype.
        g: [batch, T, HV, K] float32, the per-key-channel log decay (unit stride on K).
        beta: [batch, T, HV] float32.
        scale: the query scale; None means K ** -0.5.
        use_qk_l2norm: L2-normalise q and k in the kernel.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT (-1) rows are skipped.
        out: optional [batch, T, HV, V] output in ring.act_dtype.
        backend: "triton" (default), "torch", "cpu" or "ref".
        route: the Triton form, "fused" (default) or "verify_fold" (replayssm.gdn.spec_verify's; checked before
            any launch); the other backends accept both and compute the same function.

    Returns:
        o [batch, T, HV, V] in ring.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot or backend, or T != ring.window, before anything is written.

    Example:
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, spec_verify
        >>> from replayssm.kda.inputs import random_step
        >>> geom = KDAGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> win = random_step(geom, batch=2, window=4)
        >>> o = spec_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"], backend="torch")
        >>> tuple(o.shape)
        (2, 4, 4, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_spec_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend, spec_torch, route)


def spec_commit(ring: SpecRing, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Advance each row's cursors by its accepted count (GDN's rule, replayssm/ring_cursors.py).

    Args:
        ring: the layer's kda.SpecRing, right after spec_verify.
        num_accepted: int [batch] in 1..T (the bonus token included); not checked on NULL_SLOT rows.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        backend: "triton" (default), "torch", "cpu" or "ref".

    Example:
        >>> import torch
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, spec_commit, spec_verify
        >>> from replayssm.kda.inputs import random_step
        >>> geom = KDAGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> win = random_step(geom, batch=2, window=4)
        >>> _ = spec_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"], backend="torch")
        >>> spec_commit(ring, torch.tensor([3, 1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [3, 1, 0]
    """
    check_cache_type(ring, SpecRing)
    ring_cursors.commit(ring, num_accepted, slots, backend)


def spec_reset(ring: SpecRing, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Start new requests: empty history, origin 0, no pending flush (the prefill state is already in ring.state).

    Example:
        >>> import torch
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, spec_reset
        >>> ring = SpecRing.allocate(KDAGeometry(H=2, HV=4, K=16, V=16), num_slots=3, history_len=8, window=4)
        >>> spec_reset(ring, torch.tensor([1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [0, 0, 0]
    """
    check_cache_type(ring, SpecRing)
    ring_cursors.reset(ring, slots, backend)


def spec_materialize(ring: SpecRing, slots: torch.Tensor | None = None, backend: str = "triton") -> torch.Tensor:
    """The committed state of each row (checkpoint + write_pos ring entries replayed); nothing is written.

    Returns:
        state [batch, HV, V, K] float32; NULL_SLOT rows are NaN (as the GDN and Mamba-2 rings).

    Example:
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import SpecRing, spec_materialize
        >>> ring = SpecRing.allocate(KDAGeometry(H=2, HV=4, K=16, V=16), num_slots=3, history_len=8, window=4)
        >>> tuple(spec_materialize(ring, backend="torch").shape)
        (3, 4, 16, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_spec_materialize(ring, slots, backend, spec_torch)
