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

Validation and dispatch are GDN's (replayssm/gdn/decode.py, run_replay_step / run_materialize, which read the
decay shape from the cache's geometry). `backend`: "triton" (GDN's kernels with PER_CHANNEL set,
replayssm/gdn/decode_kernels.py), "torch" (decode_torch.py), "ref" (GDN's float64 loops,
replayssm/gdn/decode_ref.py, which take either decay shape).
"cpu" (GDN's C kernels gdn_replay / gdn_step in their per-channel mode, replayssm/cpu).
"""

from __future__ import annotations

import torch

from replayssm.checks import check_cache_type
from replayssm.gdn.decode import run_materialize, run_replay_step
from replayssm.kda import decode_torch
from replayssm.kda.cache import ReplayCache


def replay_step(cache: ReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                backend: str = "triton", route: str = "output_only") -> torch.Tensor:
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
        backend: "triton" (default), "torch", "cpu" or "ref"; all compute the same function and cache contents.
        route: the Triton kernel's normal-step form, "output_only" (default), "state_and_output" or
            "output_only_fold", as in replayssm.gdn.replay_step (the same kernels; the decays go onto the vectors
            and keys per channel: on "output_only_fold" in KDA's own prep kernel, once per (row, value head)).

    Returns:
        o [batch, HV, V] in cache.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot, route or backend, before anything is written.

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
    check_cache_type(cache, ReplayCache)
    return run_replay_step(cache, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend, decode_torch,
                           route)


def materialize(cache: ReplayCache, slots: torch.Tensor | None = None, backend: str = "triton",
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The current state S_h of each row's slot (checkpoint + cached entries replayed); nothing is written.

    Args:
        cache: the layer's kda.ReplayCache.
        slots: int32 [batch] slot ids (default every slot, batch = num_slots).
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".
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
    check_cache_type(cache, ReplayCache)
    return run_materialize(cache, slots, backend, out, decode_torch)
