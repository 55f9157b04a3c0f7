"""Launch configs, workspace and launcher of the "output_only_fold" AR route (ar_prep.py, ar_step.py, ar_fold.py).

One decode step is four launches, CUDA-graph capturable (no host sync, nothing allocated after a cache's
first step):
    1. ar_prep_kernel  (batch, H)                 per key head: norms, k^.q^, buffered-key dots, gates; appends k, g
    2. ar_step_kernel  (cdiv(V, BV), batch, HV)   the readout of every row; appends u; writes o
    3. ar_fold_kernel  (cdiv(V, BVF), batch, HV)  flush rows only (the rest exit): the K-chunked fold
    4. the cursor advance (replayssm/gdn/decode_kernels.py's), unless the cache shares a DecodeCursor
Each launch's config resolves through replayssm/launch_table.py under its own name (gdn_replay_ar_prep,
gdn_replay_ar_step, gdn_replay_ar_fold; key K, V, L) with the default rules below.

The workspace (x, c, s: ar_prep.py) is kept on the cache object, allocated on its first step through this route
(so the first step should run before a CUDA graph is captured, as the harness's warm-up does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from replayssm import launch_registry, launch_table
from replayssm.checks import NULL_SLOT, kernel_arch, next_pow2
from replayssm.delta_rule.ar_fold import ar_fold_kernel
from replayssm.delta_rule.ar_prep import ar_prep_kernel
from replayssm.delta_rule.ar_step import ar_step_kernel

ROUTE = "output_only_fold"
KERNELS = ("gdn_replay_ar_prep", "gdn_replay_ar_step", "gdn_replay_ar_fold")


@dataclass(frozen=True)
class ArLaunchConfig:
    """block_v: value rows per program (prep: unused); block_k: the K chunk (step: BKC, accumulated elementwise;
    fold: BKT, one chunk live at a time; prep: unused)."""

    block_v: int
    block_k: int
    num_warps: int
    num_stages: int


def default_ar_config(kernel: str, K: int, V: int, arch: int) -> ArLaunchConfig:
    """The hand rules (GPU; arch 0, the interpreter, takes whole tiles: it costs per program, not per FLOP).

    step: [32, 32] chunks over 4 warps, 8 fp32 state values per thread per chunk, all K/32 chunk loads issued
      before the first FMA (K = 128: 32 registers of state per thread). BV 32 keeps 4 V-tile
      programs per value head at V = 128, so the fixed per-program work (the x and c loads) is amortised over
      16 KB of fp32 state.
    fold: a [32, 16-32] weighted-u tile and one [32, 32] state chunk per iteration, 4 warps, 2 stages (the
      runtime loop's next chunk prefetched); it runs on 1/L of the steps.
    prep: the [BC, K] buffered keys over 4 warps (8 warps past K = 128)."""
    BK = max(16, next_pow2(K))
    if kernel == "gdn_replay_ar_prep":
        return ArLaunchConfig(0, BK, 4 if BK <= 128 else 8, 1)
    if arch == 0:
        bv = max(16, next_pow2(V))
        return ArLaunchConfig(bv, 32 if kernel == "gdn_replay_ar_step" else BK, 4, 1)
    if kernel == "gdn_replay_ar_step":
        return ArLaunchConfig(min(32, max(16, next_pow2(V))), 32, 4, 1)
    return ArLaunchConfig(min(32, max(16, next_pow2(V))), 32, 4, 2)


def ar_config(kernel: str, K: int, V: int, L: int, state_dtype, arch: int) -> ArLaunchConfig:
    """This device's tuned entry for `kernel` at (K, V, L), else the default rule."""
    return launch_table.resolve(kernel, launch_registry.key(kernel, K=K, V=V, L=L), state_dtype, arch,
                                default_ar_config(kernel, K, V, arch))


def buffer_width(L: int, block_k: int) -> int:
    """BC: the buffer axis padded to a power of two >= the step's chunk (so the u rows are whole chunks) and
    >= 16 (the fold's tl.dot)."""
    return max(16, block_k, next_pow2(L))


def workspace(cache, BC: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [slots, H, 2, K], c [slots, HV, 2, BC], s [slots, HV, 2]) fp32, zeros, kept on the cache."""
    gm, n = cache.geometry, cache.num_slots
    ws = cache.__dict__.get("_ar_prep_workspace")
    if ws is None or ws[1].shape[-1] != BC or ws[0].device != cache.state.device:
        dev = cache.state.device
        ws = (torch.zeros(n, gm.H, 2, gm.K, device=dev), torch.zeros(n, gm.HV, 2, BC, device=dev),
              torch.zeros(n, gm.HV, 2, device=dev))
        cache.__dict__["_ar_prep_workspace"] = ws
    return ws


def launch_output_only_fold(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                            out: torch.Tensor) -> None:
    """Inputs already validated (replayssm/gdn/decode.py); slots int32 [batch] (NULL_SLOT rows skipped)."""
    from replayssm.gdn.decode_kernels import _gdn_advance_cursor_kernel  # the cursor advance both routes share

    gm, L = cache.geometry, cache.buffer_len
    batch, arch, sd = q.shape[0], kernel_arch(q.device), cache.state_dtype
    prep, step, fold = (ar_config(name, gm.K, gm.V, L, sd, arch) for name in KERNELS)
    BC = buffer_width(L, step.block_k)
    x, c, s = workspace(cache, BC)
    st, u, kb, gb = cache.state, cache.u, cache.k, cache.g
    common = dict(NULL_ID=NULL_SLOT, HV_PER_H=gm.HV // gm.H, K=gm.K, L=L)
    ar_prep_kernel[(batch, gm.H)](
        q, k, g, slots, cache.write_pos, kb, gb, x, c, s,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), g.stride(1),
        kb.stride(0), kb.stride(1), kb.stride(2), gb.stride(0), gb.stride(1), gb.stride(2),
        x.stride(0), x.stride(1), c.stride(0), c.stride(1), s.stride(0), s.stride(1),
        scale, **common, BK=max(16, next_pow2(gm.K)), BC=BC, BG=next_pow2(gm.HV // gm.H),
        USE_L2NORM=bool(use_qk_l2norm), num_warps=prep.num_warps, num_stages=prep.num_stages,
    )
    ar_step_kernel[(triton.cdiv(gm.V, step.block_v), batch, gm.HV)](
        v, beta, out, slots, cache.write_pos, st, u, x, c, s,
        v.stride(0), v.stride(1), beta.stride(0), beta.stride(1), out.stride(0), out.stride(1),
        st.stride(0), st.stride(1), st.stride(2), u.stride(0), u.stride(1), u.stride(2),
        x.stride(0), x.stride(1), c.stride(0), c.stride(1), s.stride(0), s.stride(1),
        **common, V=gm.V, BV=step.block_v, BKC=step.block_k, BC=BC,
        num_warps=step.num_warps, num_stages=step.num_stages,
    )
    ar_fold_kernel[(triton.cdiv(gm.V, fold.block_v), batch, gm.HV)](
        slots, cache.write_pos, st, u, kb, gb,
        st.stride(0), st.stride(1), st.stride(2), u.stride(0), u.stride(1), u.stride(2),
        kb.stride(0), kb.stride(1), kb.stride(2), gb.stride(0), gb.stride(1), gb.stride(2),
        **common, V=gm.V, BV=fold.block_v, BKT=fold.block_k, BC=max(16, next_pow2(L)),
        FP32_DOT="tf32x3" if arch >= 80 else "ieee", num_warps=fold.num_warps, num_stages=fold.num_stages,
    )
    if cache.shared_cursor:
        return                        # a DecodeCursor shared by every layer advances once per step
    block = min(1024, max(16, next_pow2(batch)))
    _gdn_advance_cursor_kernel[(triton.cdiv(batch, block),)](
        slots, cache.write_pos, batch, NULL_ID=NULL_SLOT, L=L, BLOCK=block, num_warps=1,
    )
