"""ReplaySSM speculative decoding for Mamba-2: verify a window from one checkpoint, commit, reset, materialize.

The SpecRing (replayssm.mamba2.cache) holds one checkpoint per slot and a circular ring of the inputs
(x, B, processed dt) since it. A step is `spec_verify` (scatter the window's inputs after the committed
history, compute all T outputs from the checkpoint with a causal mask; a row whose slot has is_flush set
first folds its committed history into the checkpoint) followed by `spec_commit` (advance the cursors by
the accepted count; rejected drafts are never copied or cleared, the next window overwrites them).
The math is in spec_ref.py's docstring and blog §5.3 (Alg. 4), fork Johnny-Liou/ReplaySSM; the cursor rules of
spec_commit / spec_reset in replayssm/ring_cursors.py (one implementation for the Mamba-2 and GDN rings).

Three backends compute the same function and leave the same cache contents: "triton" (spec_kernels.py),
"torch" (spec_torch.py, vectorised, CPU timing) and "ref" (spec_ref.py, float64 loops, the oracle).
Every entry point validates its inputs before touching the cache and raises ValueError on bad input.
"""

from __future__ import annotations

import torch

from replayssm import ring_cursors
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

PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_A_ATTR = "_replay_A"  # where spec_verify leaves the layer's A on the ring object for spec_materialize


def _check_ring(ring) -> SpecRing:
    if not isinstance(ring, SpecRing):
        raise ValueError(f"expected a replayssm.mamba2.SpecRing, got {type(ring).__name__}")
    return ring


def _check_kernel_geometry(ring: SpecRing, backend: str) -> None:
    # spec_kernels (and so triton) is imported only when the Triton backend is asked for: the torch and
    # ref backends work where triton is absent or TRITON_INTERPRET was set too late.
    if backend == "triton":
        from replayssm.mamba2.spec_kernels import MAX_DSTATE

        if ring.geometry.dstate > MAX_DSTATE:
            raise ValueError(f"dstate={ring.geometry.dstate} > {MAX_DSTATE}: the Triton spec kernels are built and "
                             "tested up to 256; use backend='torch'")


def spec_verify(ring: SpecRing, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, dt_softplus: bool = True, slots: torch.Tensor | None = None,
                out: torch.Tensor | None = None, backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of all T window tokens of every row, all from the slot's checkpoint; the window goes into the ring.

    The window's inputs are scattered after the committed history and the T outputs computed with a causal
    mask; a row whose slot has is_flush set first folds its committed history into the checkpoint. Cursors do
    not move: call spec_commit with the accepted counts before the next verify.

    Args:
        ring: the layer's SpecRing (window T).
        x: [batch, T, nheads, headdim] in ring.act_dtype.
        dt: [batch, T, nheads] raw (float32/16/bf16); the ring stores the processed value (bias, softplus).
        A: [nheads] (float32/16/bf16).
        B, C: [batch, T, ngroups, dstate] in ring.act_dtype.
        D: optional [nheads] skip.
        z: optional [batch, T, nheads, headdim] gate in ring.act_dtype.
        dt_bias: optional [nheads].
        dt_softplus: apply softplus (threshold 20) to dt + dt_bias.
        slots: int32 [batch] (default arange(batch)); a NULL_SLOT (-1) row is skipped: its output rows are left
            as they are and no cache entry is touched.
        out: optional [batch, T, nheads, headdim] output in ring.act_dtype.
        backend: "triton" (default), "torch", "cpu" or "ref".
        route: the Triton kernels (replayssm.checks.SPEC_ROUTES): "fused" (default; spec_kernels.py: scatter + bc,
            one verify kernel for every row with the flush fold inside) or "verify_fold" (spec_verify_fold.py:
            prep, a verify kernel for the rows that do not flush, a fold kernel for those that do). The torch,
            cpu and ref backends accept both and compute the same function.

    Returns:
        y [batch, T, nheads, headdim] in ring.act_dtype (`out` when given; without it, NULL_SLOT rows hold
        whatever the fresh allocation held).

    Raises:
        ValueError: a bad shape, dtype, device, slot or backend, or T != ring.window, before anything is written.

    Example:
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, spec_verify
        >>> from replayssm.mamba2.inputs import random_params, random_step
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> p = random_params(geom)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> win = random_step(geom, batch=2, window=4)
        >>> y = spec_verify(ring, win["x"], win["dt"], p.A, win["B"], win["C"], p.D, win["z"], p.dt_bias,
        ...                 backend="torch")
        >>> tuple(y.shape)
        (2, 4, 4, 16)
    """
    ring = _check_ring(ring)
    check_spec_route(route)
    check_ring_format(ring, backend, spec_kernel("mamba2", "replay_spec", route))   # plain only on triton / cpu
    check_backend(backend, x, dt, A, B, C, D, z, dt_bias, out, ring.state)
    _check_kernel_geometry(ring, backend)
    geo, T = ring.geometry, ring.window
    if x.dim() != 4:
        raise ValueError(f"x must be [batch, T, nheads, headdim], got shape {tuple(x.shape)}")
    if x.shape[1] != T:
        raise ValueError(f"window length {x.shape[1]} != ring.window T={T}")
    batch = x.shape[0]
    check_shape("x", x, (batch, T, geo.nheads, geo.headdim))
    check_shape("z", z, (batch, T, geo.nheads, geo.headdim))
    check_shape("dt", dt, (batch, T, geo.nheads))
    check_shape("B", B, (batch, T, geo.ngroups, geo.dstate))
    check_shape("C", C, (batch, T, geo.ngroups, geo.dstate))
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        check_shape(name, t, (geo.nheads,))
    check_shape("out", out, (batch, T, geo.nheads, geo.headdim))
    for name, t in (("x", x), ("z", z), ("B", B), ("C", C), ("out", out)):
        if t is not None and t.dtype != ring.act_dtype:
            raise ValueError(f"{name} has dtype {t.dtype}; the ring caches activations in {ring.act_dtype}")
    for name, t in (("dt", dt), ("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_dtype(name, t, PARAM_DTYPES)
    for name, t in (("x", x), ("z", z), ("dt", dt), ("B", B), ("C", C), ("out", out), ("A", A), ("D", D),
                    ("dt_bias", dt_bias)):
        check_last_dim_contiguous(name, t)
    device = check_same_device(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, out=out, state=ring.state)
    slots_in = slots
    slots = check_slots(slots, batch, ring.num_slots, device, ring.null_slot)
    if out is None:
        out = torch.empty(batch, T, geo.nheads, geo.headdim, dtype=ring.act_dtype, device=device)
    setattr(ring, _A_ATTR, A)  # a reference, for spec_materialize(ring) without A
    if batch == 0:
        return out
    if backend == "ref":
        return spec_ref.verify_ref(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out)
    if backend == "cpu":
        from replayssm.cpu import ops
        ops.mamba2_spec_replay(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slots)
        return out
    if backend == "torch":
        # slots=None lets the torch backend read rows 0..batch-1 as views instead of gathering them
        torch_slots = None if slots_in is None else slots
        return spec_torch.verify_torch(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, torch_slots, out)
    if route == "verify_fold":
        from replayssm.mamba2.spec_verify_fold import launch_verify_fold

        return launch_verify_fold(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out)
    from replayssm.mamba2.spec_kernels import launch_verify

    return launch_verify(ring, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out)


def spec_commit(ring: SpecRing, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Advance each row's slot by its accepted count and decide whether its next verify flushes.

    A slot whose last verify flushed moves its origin past the folded history and keeps only the accepted
    window tokens; then is_flush = write_pos + 2T > history_len + T (replayssm/ring_cursors.py, shared with the
    GDN ring). Runs on the device (no host sync on the Triton backend).

    Args:
        ring: the layer's SpecRing, right after spec_verify.
        num_accepted: int [batch], accepted tokens per row in 1..T (the bonus token included); not checked on
            NULL_SLOT rows.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        backend: "triton" (default), "torch", "cpu" or "ref".

    Returns:
        None; write_pos, origin and is_flush change in place.

    Example:
        >>> import torch
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, spec_commit, spec_verify
        >>> from replayssm.mamba2.inputs import random_params, random_step
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> p = random_params(geom)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> win = random_step(geom, batch=2, window=4)
        >>> _ = spec_verify(ring, win["x"], win["dt"], p.A, win["B"], win["C"], backend="torch")
        >>> spec_commit(ring, torch.tensor([3, 1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [3, 1, 0]
    """
    ring_cursors.commit(_check_ring(ring), num_accepted, slots, backend)


def spec_reset(ring: SpecRing, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Start new requests in `slots`: write_pos = origin = 0, is_flush = 0.

    The caller has already put each request's prefill state into the slot: replayssm.state_format.set_state(ring,
    S, slots) for any state format (it quantises S by the format's rule, restarts the SR counter and recomputes the
    scale: nothing of the slot's previous request survives); a plain format may also be copied into ring.state.
    Only cursors move here.

    Args:
        ring: the layer's SpecRing.
        slots: int32 [n] slot ids (default every slot).
        backend: "triton" (default), "torch", "cpu" or "ref".

    Returns:
        None; the cursors of the slots are reset in place.

    Example:
        >>> import torch
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, spec_reset
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> spec_reset(ring, torch.tensor([1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [0, 0, 0]
    """
    ring_cursors.reset(_check_ring(ring), slots, backend)


def spec_materialize(ring: SpecRing, slots: torch.Tensor | None = None, backend: str = "triton", *,
                     A: torch.Tensor | None = None) -> torch.Tensor:
    """The committed state of each row's slot: checkpoint + committed history folded; nothing is written.

    Args:
        ring: the layer's SpecRing.
        slots: int32 [batch] slot ids (default every slot, batch = num_slots).
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".
        A: [nheads], the layer's A (the decays exp(A dt) need it; the ring does not hold it); default: the A of
            the last spec_verify on this ring object.

    Returns:
        state [batch, nheads, headdim, dstate] float32; NULL_SLOT rows are NaN.

    Raises:
        ValueError: no A known, or a bad slot, shape, dtype, device or backend.

    Example:
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import SpecRing, spec_materialize
        >>> from replayssm.mamba2.inputs import random_params
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> tuple(spec_materialize(ring, backend="torch", A=random_params(geom).A).shape)
        (3, 4, 16, 16)
    """
    ring = _check_ring(ring)
    if A is None:
        A = getattr(ring, _A_ATTR, None)
        if A is None:
            raise ValueError("spec_materialize needs A [nheads]: pass A=..., or run spec_verify on this ring first")
    check_ring_format(ring, backend, "mamba2.spec_materialize")
    check_backend(backend, A, ring.state)
    _check_kernel_geometry(ring, backend)
    check_shape("A", A, (ring.geometry.nheads,))
    check_dtype("A", A, PARAM_DTYPES)
    check_same_device(A=A, state=ring.state)
    if slots is not None and slots.dim() != 1:
        raise ValueError(f"slots must be [batch], got shape {tuple(slots.shape)}")
    n = ring.num_slots if slots is None else slots.shape[0]
    slots = check_slots(slots, n, ring.num_slots, ring.device, ring.null_slot)
    if backend == "ref":
        return spec_ref.materialize_ref(ring, A, slots)
    if backend in ("torch", "cpu"):          # cpu: a debug / gate read, not a timed path: the torch form
        return spec_torch.materialize_torch(ring, A, slots)
    from replayssm.mamba2.spec_kernels import launch_materialize

    return launch_materialize(ring, A, slots)

