"""ReplaySSM Gated DeltaNet AR decode: public entry points (validation, then one of three backends).

    replay_step(cache, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None,
                backend="triton") -> o [batch, HV, V]
    materialize(cache, slots=None, backend="triton", out=None) -> state [batch, HV, V, K] fp32

Math (blog App. A.1, Alg. 6), per slot with h = write_pos, L = buffer_len, cached (u_j, k_j, g_j), j < h:
    S_h = exp(G_tot) S0 + sum_j exp(G_tot - G_pre_j) u_j k_j^T      G_pre inclusive prefix sum, G_tot = sum g_j
    alpha = exp(g), u = beta (v - alpha S_h k), o = alpha S_h q~ + u (k . q~), q~ = q * scale
    h < L-1: append (u, k, g) at h, write_pos = h + 1 (checkpoint untouched)
    h = L-1: S0 <- alpha S_h + u k^T (rounded to the state dtype), write_pos = 0
`backend`: "triton" (the kernels, decode_kernels.py), "torch" (vectorised CPU timing backend,
decode_torch.py), "ref" (float64 loops, decode_ref.py). All three compute the same function and leave
the same cache contents (up to rounding).
"""

from __future__ import annotations

import numbers

import torch

from replayssm.checks import (
    ACT_DTYPES,
    check_backend,
    check_cache_type,
    check_dtype,
    check_last_dim_contiguous,
    check_route,
    check_same_device,
    check_shape,
    check_slots,
)
from replayssm.delta_rule.launch import launch_output_only_fold
from replayssm.gdn import decode_ref, decode_torch
from replayssm.gdn.cache import ReplayCache
from replayssm.gdn.decode_kernels import MAX_K, launch_materialize, launch_replay_step
from replayssm.ring_cursors import keep_shared_cursor
from replayssm.state_format import check_backend_format, format_of, plain_state


def check_step_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      out: torch.Tensor | None, *, H: int, HV: int, K: int, V: int, act_dtype: torch.dtype,
                      scale, use_qk_l2norm, per_channel_g: bool = False) -> int:
    """Validate one AR step's inputs against a geometry; return batch. Shared by the baseline and ReplaySSM,
    GDN and KDA (replayssm.kda: per_channel_g, g [batch, HV, K] with unit stride on K).

    q, k [batch, H, K] and v, out [batch, HV, V] in act_dtype with unit stride on the last dim;
    g, beta [batch, HV] fp32 (any strides).
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if K > MAX_K:
        raise ValueError(f"K={K} > {MAX_K}: the GDN decode kernels load q and k whole and cannot tile K")
    if q.dim() != 3:
        raise ValueError(f"q must be [batch, H, K], got shape {tuple(q.shape)}")
    batch = q.shape[0]
    check_shape("q", q, (batch, H, K))
    check_shape("k", k, (batch, H, K))
    check_shape("v", v, (batch, HV, V))
    check_shape("g", g, (batch, HV, K) if per_channel_g else (batch, HV))
    check_shape("beta", beta, (batch, HV))
    check_shape("out", out, (batch, HV, V))
    check_dtype("q", q, ACT_DTYPES)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t is not None and t.dtype != act_dtype:
            raise ValueError(f"{name} has dtype {t.dtype}; expected the activation dtype {act_dtype}")
    check_dtype("g", g, (torch.float32,))
    check_dtype("beta", beta, (torch.float32,))
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)) + ((("g", g),) if per_channel_g else ()):
        check_last_dim_contiguous(name, t)
    if scale is not None and (not isinstance(scale, numbers.Real) or isinstance(scale, bool)):
        raise ValueError(f"scale must be a real number or None, got {scale!r}")
    if not isinstance(use_qk_l2norm, bool):
        raise ValueError(f"use_qk_l2norm must be a bool, got {use_qk_l2norm!r}")
    return batch


def replay_step(cache: ReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "output_only") -> torch.Tensor:
    """One AR decode step per row: o from the checkpoint + cached entries, then the token is cached (or folded).

    Args:
        cache: the layer's ReplayCache; its buffer and write_pos change in place, and so does the checkpoint of
            a row whose buffer is full (the flush step).
        q, k: [batch, H, K] in cache.act_dtype, unit stride on the last dim.
        v: [batch, HV, V] in cache.act_dtype.
        g: [batch, HV] float32, the log decay (the state decays by exp(g)).
        beta: [batch, HV] float32, the delta-rule step size.
        scale: the query scale; None means K ** -0.5.
        use_qk_l2norm: L2-normalise q and k in the kernel (eps 1e-6 under the square root).
        slots: int32 [batch], each row's cache slot (default arange(batch)); a NULL_SLOT (-1) row is skipped:
            its output is left as is and no cache entry is touched.
        out: optional [batch, HV, V] output in cache.act_dtype.
        backend: "triton" (default), "torch", "cpu" or "ref"; all compute the same function and cache contents.
        route: the Triton kernel's normal-step form: "output_only" (default; the checkpoint is read with the two
            vectors k and q and S_h is never formed, the algebra the torch and C forms also use) or
            "state_and_output" (S_h rebuilt as a tile by a tensor-core GEMM over the buffer, then read: the
            paper's GDN kernel). Flush steps rebuild the tile on both routes. "output_only_fold" (GDN and KDA,
            replayssm/delta_rule/): the output-only readout on every step, flush rows included, with the
            per-key-head work in a precompute kernel and the flush as a separate K-chunked fold of the whole
            buffer. The float64, torch and C backends accept every name and compute the same function.

    Returns:
        o [batch, HV, V] in cache.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot, route or backend, before anything is written.

    Example:
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import ReplayCache, replay_step
        >>> from replayssm.gdn.inputs import random_step
        >>> geom = GDNGeometry(H=2, HV=4, K=16, V=16)
        >>> cache = ReplayCache.allocate(geom, num_slots=3, buffer_len=4)
        >>> inp = random_step(geom, batch=2)
        >>> o = replay_step(cache, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], backend="torch")
        >>> tuple(o.shape), cache.write_pos.tolist()
        ((2, 4, 16), [1, 1, 0])
    """
    check_cache_type(cache, ReplayCache)
    return run_replay_step(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend, decode_torch,
                           route)


def run_replay_step(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend: str, torch_forms,
                    route: str = "output_only"):
    """replay_step after the family's cache check, for either decay shape: GDN, and KDA (replayssm/kda/decode.py,
    cache.geometry.PER_CHANNEL_DECAY: g [batch, HV, K]). `torch_forms`: the family's torch module (its
    replay_step_torch); the Triton kernels, the C kernels and the float64 loops take either shape."""
    gm = cache.geometry
    per_channel = gm.PER_CHANNEL_DECAY
    family = "kda" if per_channel else "gdn"
    check_route(route, family)
    # the state's format is check_backend_format's (an e4m3 state is refused by check_backend's dtype rule for
    # every kernel; the format check knows the kernels that store it)
    check_backend(backend, q, k, v, out, plain_state(cache))
    check_backend_format(backend, format_of(cache), f"{family}.replay[{route}]")   # SR / scaled: output_only_fold
    batch = check_step_inputs(q, k, v, g, beta, out, H=gm.H, HV=gm.HV, K=gm.K, V=gm.V, act_dtype=cache.act_dtype,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, per_channel_g=per_channel)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, out=out, state=cache.state)
    slots_i32 = check_slots(slots, batch, cache.num_slots, device, cache.null_slot)
    scale = gm.K ** -0.5 if scale is None else float(scale)
    if out is None:
        out = (torch.empty if slots is None else torch.zeros)(batch, gm.HV, gm.V, dtype=cache.act_dtype,
                                                               device=device)
    if batch == 0:
        return out
    if backend == "triton" and route == "output_only_fold":
        launch_output_only_fold(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out)
    elif backend == "triton":
        launch_replay_step(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out, per_channel=per_channel,
                           route=route)
    elif backend == "torch":
        with keep_shared_cursor(cache):
            torch_forms.replay_step_torch(cache, q, k, v, g, beta, scale, use_qk_l2norm,
                                          None if slots is None else slots_i32, out)
    elif backend == "cpu":
        from replayssm.cpu import ops
        with keep_shared_cursor(cache):
            ops.gdn_replay(cache, q, k, v, g, beta, scale, use_qk_l2norm, out, slots_i32)
    else:
        with keep_shared_cursor(cache):
            decode_ref.replay_step_ref(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out)
    return out


def materialize(cache: ReplayCache, slots: torch.Tensor | None = None, backend: str = "triton",
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The current state S_h of each row's slot (checkpoint + cached entries replayed); nothing is written.

    Args:
        cache: the layer's ReplayCache.
        slots: int32 [batch] slot ids (default every slot, batch = num_slots).
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".
        out: optional float32 [batch, HV, V, K] output; a NULL_SLOT row of it is left as is.

    Returns:
        state [batch, HV, V, K] float32 (`out` when given; zeros on NULL_SLOT rows when it is not).

    Raises:
        ValueError: a bad slot, shape, dtype, device or backend.

    Example:
        >>> from replayssm.geometry import GDNGeometry
        >>> from replayssm.gdn import ReplayCache, materialize
        >>> cache = ReplayCache.allocate(GDNGeometry(H=2, HV=4, K=16, V=16), num_slots=3, buffer_len=4)
        >>> tuple(materialize(cache, backend="torch").shape)
        (3, 4, 16, 16)
    """
    check_cache_type(cache, ReplayCache)
    return run_materialize(cache, slots, backend, out, decode_torch)


def run_materialize(cache, slots, backend: str, out, torch_forms) -> torch.Tensor:
    """materialize after the family's cache check, for either decay shape (as run_replay_step)."""
    gm = cache.geometry
    check_backend(backend, plain_state(cache), out)
    check_backend_format(backend, format_of(cache), f"{'kda' if gm.PER_CHANNEL_DECAY else 'gdn'}.materialize")
    if gm.K > MAX_K:
        raise ValueError(f"K={gm.K} > {MAX_K}: the delta-rule decode kernels cannot tile K")
    batch = cache.num_slots if slots is None else (slots.shape[0] if slots.dim() == 1 else -1)
    if batch < 0:
        raise ValueError(f"slots must be [batch], got shape {tuple(slots.shape)}")
    slots_i32 = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    if out is None:
        out = torch.zeros(batch, gm.HV, gm.V, gm.K, dtype=torch.float32, device=cache.device)
    check_shape("out", out, (batch, gm.HV, gm.V, gm.K))
    check_dtype("out", out, (torch.float32,))
    check_last_dim_contiguous("out", out)
    check_same_device(out=out, state=cache.state)
    if batch == 0:
        return out
    if backend == "triton":
        launch_materialize(cache, slots_i32, out, per_channel=gm.PER_CHANNEL_DECAY)
    elif backend in ("torch", "cpu"):        # cpu: a debug / gate read, not a timed path: the torch form
        torch_forms.materialize_torch(cache, slots_i32, out)
    else:
        decode_ref.materialize_ref(cache, slots_i32, out)
    return out
