"""ReplaySSM speculative decoding for Gated DeltaNet: verify (+ early flush), commit, reset, materialise.

One public function per operation, three backends computing the same function and the same cache contents:
"triton" (replayssm/gdn/spec_kernels.py), "torch" (spec_torch.py, vectorised fp32, the CPU timing backend)
and "ref" (spec_ref.py, float64 loops, the protocol oracle). The ring protocol is documented in
replayssm/gdn/ring.py; the math in ReplaySSM blog Appendix A.2 (Algorithm 8).

A speculative step on a batch of rows, each mapped to a ring slot by `slots` (NULL_SLOT rows are padding:
skipped, output left as is, cache untouched):
    o = spec_verify(ring, q, k, v, g, beta)     # o [batch, T, HV, V]: every window token from one S_h
    spec_commit(ring, num_accepted)             # num_accepted [batch] in 1..T (bonus token included)
spec_reset(ring, slots) starts a request (prefill state already in ring.state); spec_materialize returns the
committed state (checkpoint + history) without writing anything.

Input shapes: q, k [batch, T, H, K] and v [batch, T, HV, V] in the ring's activation dtype; g (log decay)
and beta [batch, T, HV] fp32; scale defaults to K ** -0.5; use_qk_l2norm normalises q and k in the kernel
(eps 1e-6 under the square root). Value head hv reads key head hv // (HV // H). Outer strides are free;
the last dim of every input needs unit stride.
"""

from __future__ import annotations

import torch

from replayssm import ring_cursors
from replayssm.checks import (
    check_backend,
    check_cache_type,
    check_dtype,
    check_last_dim_contiguous,
    check_ring_format,
    check_same_device,
    check_shape,
    check_slots,
    check_spec_route,
    spec_kernel,
)
from replayssm.delta_rule.spec_launch import launch_verify_fold
from replayssm.gdn import spec_kernels, spec_ref, spec_torch
from replayssm.gdn.ring import SpecRing
from replayssm.geometry import GDNGeometry

__all__ = ["SpecRing", "spec_verify", "spec_commit", "spec_reset", "spec_materialize", "check_window",
           "run_spec_verify", "run_spec_materialize", "check_cache_device", "ring_family"]


def check_window(geometry: GDNGeometry, window: int, act_dtype: torch.dtype, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, out: torch.Tensor | None,
                 scale: float | None, backend: str, per_channel_g: bool = False) -> tuple[int, float]:
    """Validate one speculative window against a cache's geometry, window T and activation dtype.

    Shared by ReplaySSM and the baselines (same call shapes), GDN and KDA (per_channel_g: g [batch, T, HV, K]).
    Returns (batch, scale).
    """
    check_backend(backend, q, k, v, g, beta, out)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [batch, T, H, K], got shape {tuple(q.shape)}")
    batch, T = q.shape[0], q.shape[1]
    if T != window:
        raise ValueError(f"window length {T} != the cache's window T={window}")
    gm = geometry
    check_shape("q", q, (batch, T, gm.H, gm.K))
    check_shape("k", k, (batch, T, gm.H, gm.K))
    check_shape("v", v, (batch, T, gm.HV, gm.V))
    check_shape("g", g, (batch, T, gm.HV, gm.K) if per_channel_g else (batch, T, gm.HV))
    check_shape("beta", beta, (batch, T, gm.HV))
    check_shape("out", out, (batch, T, gm.HV, gm.V))
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t, (act_dtype,))
    for name, t in (("g", g), ("beta", beta)):
        check_dtype(name, t, (torch.float32,))
    if out is not None:
        check_dtype("out", out, (act_dtype,))
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("out", out)):
        check_last_dim_contiguous(name, t)
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, out=out)
    if backend == "triton" and gm.K > spec_kernels.MAX_K:
        raise ValueError(f"K={gm.K} > {spec_kernels.MAX_K}: the Triton kernels cannot tile a key dim this large")
    if scale is None:
        scale = gm.K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a float or None, got {scale!r}")
    return batch, float(scale)


def ring_family(ring) -> str:
    """"gdn" or "kda": which family's kernels a delta-rule ring runs (its geometry's decay shape)."""
    return "kda" if ring.geometry.PER_CHANNEL_DECAY else "gdn"


def check_cache_device(ring, t: torch.Tensor) -> None:
    if t.device != ring.device:
        raise ValueError(f"inputs on {t.device}, ring on {ring.device}")


def spec_verify(ring: SpecRing, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "fused") -> torch.Tensor:
    """Outputs of all T window tokens from the committed state; the window is appended to the ring.

    Rows whose slot has is_flush set first fold their committed history into the checkpoint. Cursors do not
    move: call spec_commit with the accepted counts before the next verify.

    Args:
        ring: the layer's SpecRing (window T).
        q, k: [batch, T, H, K] in ring.act_dtype, unit stride on the last dim.
        v: [batch, T, HV, V] in ring.act_dtype.
        g: [batch, T, HV] float32, the log decay.
        beta: [batch, T, HV] float32, the delta-rule step size.
        scale: the query scale; None means K ** -0.5.
        use_qk_l2norm: L2-normalise q and k in the kernel (eps 1e-6 under the square root).
        slots: int32 [batch], each row's ring slot (default arange(batch)); NULL_SLOT (-1) rows are skipped.
        out: optional [batch, T, HV, V] output in ring.act_dtype.
        backend: "triton" (default), "torch", "cpu" or "ref".
        route: the Triton form (replayssm/checks.py SPEC_ROUTES): "fused" (default, replayssm/gdn/spec_kernels.py)
            or "verify_fold" (replayssm/delta_rule/spec_launch.py: a per-key-head precompute, the verify, and the
            fold of the flush rows as three launches); the other backends accept both and compute the same function.

    Returns:
        o [batch, T, HV, V] in ring.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot, backend or route, or T != ring.window, before anything is
            written.

    Example:
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, spec_verify
        >>> from replayssm.gdn.inputs import random_step
        >>> geom = GDNGeometry(H=2, HV=4, K=16, V=16)
        >>> ring = SpecRing.allocate(geom, num_slots=3, history_len=8, window=4)
        >>> win = random_step(geom, batch=2, window=4)
        >>> o = spec_verify(ring, win["q"], win["k"], win["v"], win["g"], win["beta"], backend="torch")
        >>> tuple(o.shape)
        (2, 4, 4, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_spec_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend, spec_torch, route)


def run_spec_verify(ring, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend: str,
                    torch_forms, route: str = "fused") -> torch.Tensor:
    """spec_verify after the family's ring check, for either decay shape: GDN, and KDA (replayssm/kda/spec.py,
    ring.geometry.PER_CHANNEL_DECAY: g [batch, T, HV, K]). `torch_forms`: the family's torch module (its
    verify_torch); the Triton kernel, the C kernel and the float64 oracle take either shape. `route` picks the
    Triton form (checked here, before any launch, whatever the backend)."""
    check_spec_route(route)
    per_channel = ring.geometry.PER_CHANNEL_DECAY
    check_ring_format(ring, backend, spec_kernel(ring_family(ring), "replay_spec", route))   # triton / cpu: plain
    batch, scale = check_window(ring.geometry, ring.window, ring.act_dtype, q, k, v, g, beta, out, scale, backend,
                                per_channel_g=per_channel)
    check_cache_device(ring, q)
    check_backend(backend, ring.state)
    slots = check_slots(slots, batch, ring.num_slots, ring.device, ring.null_slot)
    if out is None:
        gm = ring.geometry
        out = torch.empty(batch, ring.window, gm.HV, gm.V, dtype=ring.act_dtype, device=ring.device)
    if batch == 0:
        return out
    args = (ring, q, k, v, g, beta, scale, bool(use_qk_l2norm), slots, out)
    if backend == "triton" and route == "verify_fold":
        return launch_verify_fold(*args, per_channel=per_channel)
    if backend == "triton":
        return spec_kernels.verify_triton(*args, per_channel=per_channel)
    impl = {"torch": torch_forms.verify_torch, "ref": spec_ref.verify_ref, "cpu": _verify_cpu}[backend]
    return impl(*args)


def _verify_cpu(ring, q, k, v, g, beta, scale, use_qk_l2norm, slots, out):
    from replayssm.cpu import ops
    ops.gdn_spec_replay(ring, q, k, v, g, beta, scale, use_qk_l2norm, out, slots)
    return out


def spec_commit(ring: SpecRing, num_accepted: torch.Tensor, slots: torch.Tensor | None = None,
                backend: str = "triton") -> None:
    """Advance each row's cursors by its accepted count and decide whether its next verify flushes.

    If the last verify flushed: origin += write_pos, write_pos = accepted; else write_pos += accepted. Then
    is_flush = write_pos + 2T > L (replayssm/ring_cursors.py, shared with the Mamba-2 ring).

    Args:
        ring: the layer's SpecRing, right after spec_verify.
        num_accepted: int [batch], accepted tokens per row in 1..T (the bonus token included); not checked on
            NULL_SLOT rows.
        slots: int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
        backend: "triton" (default), "torch", "cpu" or "ref".

    Returns:
        None; the ring's write_pos, origin and is_flush change in place.

    Example:
        >>> import torch
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, spec_commit, spec_verify
        >>> from replayssm.gdn.inputs import random_step
        >>> geom = GDNGeometry(H=2, HV=4, K=16, V=16)
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
    """Start new requests: empty history, origin 0, no pending flush (the prefill state is already in the slot:
    replayssm.state_format.set_state(ring, S, slots) for any state format, which restarts the SR counter and
    recomputes the scale; a plain format may also be copied into ring.state). Only cursors move here.

    Args:
        ring: the layer's SpecRing.
        slots: int32 [n] slot ids (default the whole pool).
        backend: "triton" (default), "torch", "cpu" or "ref".

    Returns:
        None; write_pos, origin and is_flush of the slots are reset in place.

    Example:
        >>> import torch
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, spec_reset
        >>> ring = SpecRing.allocate(GDNGeometry(H=2, HV=4, K=16, V=16), num_slots=3, history_len=8, window=4)
        >>> spec_reset(ring, torch.tensor([1], dtype=torch.int32), backend="torch")
        >>> ring.write_pos.tolist()
        [0, 0, 0]
    """
    check_cache_type(ring, SpecRing)
    ring_cursors.reset(ring, slots, backend)


def spec_materialize(ring: SpecRing, slots: torch.Tensor | None = None, backend: str = "triton") -> torch.Tensor:
    """The committed state of each row: checkpoint + write_pos ring entries replayed; nothing is written.

    Args:
        ring: the layer's SpecRing.
        slots: int32 [batch] slot ids (default the whole pool, batch = num_slots).
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".

    Returns:
        state [batch, HV, V, K] float32; NULL_SLOT rows are NaN (as replayssm.mamba2.spec_materialize).

    Raises:
        ValueError: a bad slot tensor or backend.

    Example:
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import SpecRing, spec_materialize
        >>> ring = SpecRing.allocate(GDNGeometry(H=2, HV=4, K=16, V=16), num_slots=3, history_len=8, window=4)
        >>> tuple(spec_materialize(ring, backend="torch").shape)
        (3, 4, 16, 16)
    """
    check_cache_type(ring, SpecRing)
    return run_spec_materialize(ring, slots, backend, spec_torch)


def run_spec_materialize(ring, slots, backend: str, torch_forms) -> torch.Tensor:
    """spec_materialize after the family's ring check, for either decay shape (as run_spec_verify)."""
    check_ring_format(ring, backend, f"{ring_family(ring)}.spec_materialize")
    check_backend(backend, ring.state)
    if slots is None:
        slots = torch.arange(ring.num_slots, dtype=torch.int32, device=ring.device)
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        raise ValueError("slots must be a 1-D integer tensor")
    slots = check_slots(slots, slots.shape[0], ring.num_slots, ring.device, ring.null_slot)
    if backend == "triton" and ring.geometry.K > spec_kernels.MAX_K:
        raise ValueError(f"K={ring.geometry.K} > {spec_kernels.MAX_K}: the Triton kernels cannot tile it")
    gm = ring.geometry
    out = torch.full((slots.shape[0], gm.HV, gm.V, gm.K), float("nan"), dtype=torch.float32, device=ring.device)
    if slots.numel() == 0:
        return out
    if backend == "triton":
        return spec_kernels.materialize_triton(ring, slots, out, per_channel=gm.PER_CHANNEL_DECAY)
    impl = {"torch": torch_forms.materialize_torch, "ref": spec_ref.materialize_ref,
            "cpu": torch_forms.materialize_torch}[backend]
    return impl(ring, slots, out)
