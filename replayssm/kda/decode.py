"""ReplaySSM Kimi Delta Attention AR decode: public entry points (validation, then a backend).

    replay_step(cache, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None,
                backend="triton") -> o [batch, HV, V]
    materialize(cache, slots=None, backend="triton", out=None) -> state [batch, HV, V, K] fp32

Math, per slot and value head with h = write_pos, L = buffer_len, cached (u_j, k_j, g_j), j < h, where
g_j is a K-vector (KDA's per-key-channel log decay) and products of K-vectors are elementwise:
    G_pre_j = g_0 + .. + g_j,  G_tot = G_pre_{h-1}                  (cumulative per-channel decays)
    S_h = S0 diag(exp(G_tot)) + sum_j u_j (exp(G_tot - G_pre_j) * k_j)^T
    alpha = exp(g) [K], u = beta (v - S_h (alpha * k)), o = S_h (alpha * q~) + u (k . q~), q~ = q * scale
    h < L-1: append (u, k, g) at h, write_pos = h + 1 (checkpoint untouched)
    h = L-1: S0 <- S_h diag(alpha) + u k^T (rounded to the state dtype), write_pos = 0
With g constant across channels this is GDN's replay (replayssm/gdn/decode.py) exactly. The buffer costs K
fp32 per value head and entry for g where GDN's costs one (replayssm/traffic.py).

`backend`: "triton" (GDN's kernels with PER_CHANNEL set, replayssm/gdn/decode_kernels.py), "torch"
(decode_torch.py), "ref" (GDN's float64 loops, replayssm/gdn/decode_ref.py, which take either decay shape).
"cpu" has no C kernel for KDA yet: refused with a ValueError before any work.
"""

from __future__ import annotations

import torch

from replayssm.checks import (
    check_backend,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_slots,
)
from replayssm.gdn import decode_ref
from replayssm.gdn.decode import check_step_inputs
from replayssm.gdn.decode_kernels import MAX_K, launch_materialize, launch_replay_step
from replayssm.kda import decode_torch
from replayssm.kda.cache import ReplayCache
from replayssm.ring_cursors import keep_shared_cursor

NO_CPU = ("backend='cpu' has no KDA kernels (replayssm/cpu implements Mamba-2 and GDN only); "
          "use backend='torch' for the CPU timing backend")


def check_kda_backend(backend: str, *tensors) -> None:
    """check_backend, and refuse backend='cpu' (no C kernels for KDA) before any work."""
    if backend == "cpu":
        raise ValueError(NO_CPU)
    check_backend(backend, *tensors)


def _check_cache(cache) -> None:
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"expected a replayssm.kda.ReplayCache, got {type(cache).__name__}")


def replay_step(cache: ReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton") -> torch.Tensor:
    """One AR decode step per row: o from the checkpoint + cached entries, then the token is cached (or folded).

    Args:
        cache: the layer's kda.ReplayCache; its buffer and write_pos change in place, and so does the
            checkpoint of a row whose buffer is full (the flush step).
        q, k: [batch, H, K] in cache.act_dtype, unit stride on the last dim.
        v: [batch, HV, V] in cache.act_dtype.
        g: [batch, HV, K] float32, the log decay of every key channel (the state's column c decays by
            exp(g[.., c])), unit stride on K. A per-head g [batch, HV] (GDN's) is refused.
        beta: [batch, HV] float32, the delta-rule step size.
        scale: the query scale; None means K ** -0.5.
        use_qk_l2norm: L2-normalise q and k in the kernel (eps 1e-6 under the square root).
        slots: int32 [batch], each row's cache slot (default arange(batch)); a NULL_SLOT (-1) row is skipped.
        out: optional [batch, HV, V] output in cache.act_dtype.
        backend: "triton" (default), "torch" or "ref" ("cpu" raises ValueError: no C kernel yet).

    Returns:
        o [batch, HV, V] in cache.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot or backend, before anything is written.

    Example:
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import ReplayCache, replay_step
        >>> from replayssm.kda.inputs import random_step
        >>> geom = KDAGeometry(H=2, HV=4, K=16, V=16)
        >>> cache = ReplayCache.allocate(geom, num_slots=3, buffer_len=4)
        >>> inp = random_step(geom, batch=2)
        >>> o = replay_step(cache, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], backend="torch")
        >>> tuple(o.shape), cache.write_pos.tolist()
        ((2, 4, 16), [1, 1, 0])
    """
    _check_cache(cache)
    gm = cache.geometry
    check_kda_backend(backend, q, k, v, out, cache.state)
    batch = check_step_inputs(q, k, v, g, beta, out, H=gm.H, HV=gm.HV, K=gm.K, V=gm.V, act_dtype=cache.act_dtype,
                              scale=scale, use_qk_l2norm=use_qk_l2norm, per_channel_g=True)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, out=out, state=cache.state)
    slots_i32 = check_slots(slots, batch, cache.num_slots, device, cache.null_slot)
    scale = gm.K ** -0.5 if scale is None else float(scale)
    if out is None:
        out = (torch.empty if slots is None else torch.zeros)(batch, gm.HV, gm.V, dtype=cache.act_dtype,
                                                               device=device)
    if batch == 0:
        return out
    if backend == "triton":
        launch_replay_step(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out, per_channel=True)
    elif backend == "torch":
        with keep_shared_cursor(cache):
            decode_torch.replay_step_torch(cache, q, k, v, g, beta, scale, use_qk_l2norm,
                                           None if slots is None else slots_i32, out)
    else:
        with keep_shared_cursor(cache):
            decode_ref.replay_step_ref(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out)
    return out


def materialize(cache: ReplayCache, slots: torch.Tensor | None = None, backend: str = "triton",
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The current state S_h of each row's slot (checkpoint + cached entries replayed); nothing is written.

    Args:
        cache: the layer's kda.ReplayCache.
        slots: int32 [batch] slot ids (default every slot, batch = num_slots).
        backend: "triton" (default), "torch" or "ref" ("cpu" raises ValueError).
        out: optional float32 [batch, HV, V, K] output; a NULL_SLOT row of it is left as is.

    Returns:
        state [batch, HV, V, K] float32 (`out` when given; zeros on NULL_SLOT rows when it is not).

    Raises:
        ValueError: a bad slot, shape, dtype, device or backend.

    Example:
        >>> from replayssm.geometry import KDAGeometry
        >>> from replayssm.kda import ReplayCache, materialize
        >>> cache = ReplayCache.allocate(KDAGeometry(H=2, HV=4, K=16, V=16), num_slots=3, buffer_len=4)
        >>> tuple(materialize(cache, backend="torch").shape)
        (3, 4, 16, 16)
    """
    _check_cache(cache)
    gm = cache.geometry
    check_kda_backend(backend, cache.state, out)
    if gm.K > MAX_K:
        raise ValueError(f"K={gm.K} > {MAX_K}: the KDA decode kernels cannot tile K")
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
        launch_materialize(cache, slots_i32, out, per_channel=True)
    elif backend == "torch":
        decode_torch.materialize_torch(cache, slots_i32, out)
    else:
        decode_ref.materialize_ref(cache, slots_i32, out)
    return out
