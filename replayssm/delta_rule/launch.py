"""Launch configs, workspace and launcher of the "output_only_fold" AR route (ar_prep.py, ar_step.py, ar_fold.py).

One decode step is four launches, CUDA-graph capturable (no host sync, nothing allocated after a cache's
first step):
    1. ar_prep_kernel  (batch, H)                 GDN, per key head: norms, k^.q^, buffered-key dots, gates;
                                                  appends k, g
       ar_prep_channel_kernel (batch, HV)         KDA, per value head: the same, with the per-channel decays
                                                  applied to the vectors and the buffered keys
    2. ar_step_kernel  (cdiv(V, BV), batch, HV)   the readout of every row; appends u; writes o
    3. ar_fold_kernel  (cdiv(V, BVF), batch, HV)  flush rows only (the rest exit): the K-chunked fold
                      (1, batch, HV)              int8 / float8_e4m3fn: a program per head, two passes (its scale)
       sr_advance_kernel (cdiv(batch, 1024),)     float16_sr / bfloat16_sr only: the flush rows' sr_step += 1
    4. the cursor advance (replayssm/gdn/decode_kernels.py's), unless the cache shares a DecodeCursor
Each launch's config resolves through replayssm/launch_table.py under its own name (gdn_replay_ar_prep,
gdn_replay_ar_step, gdn_replay_ar_fold, and KDA's kda_replay_ar_*; key K, V, L) with the default rules below.

The workspace (x, c, s: ar_prep.py) is kept on the cache object, allocated on its first step through this route
(so the first step should run before a CUDA graph is captured, as the harness's warm-up does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from replayssm import launch_registry, launch_table
from replayssm.checks import NULL_SLOT, kernel_arch, next_pow2
from replayssm.delta_rule.ar_fold import ar_fold_kernel, launch_sr_advance
from replayssm.delta_rule.ar_prep import ar_prep_channel_kernel, ar_prep_kernel
from replayssm.delta_rule.ar_step import ar_step_kernel
from replayssm.state_format import format_of, scaled_args

ROUTE = "output_only_fold"
KERNELS = ("gdn_replay_ar_prep", "gdn_replay_ar_step", "gdn_replay_ar_fold")
KDA_KERNELS = ("kda_replay_ar_prep", "kda_replay_ar_step", "kda_replay_ar_fold")   # KDA's entries of the same phases


def kernel_names(per_channel: bool) -> tuple[str, str, str]:
    """The launch-table names of the (prep, step, fold) launches: KDA's builds are tuned apart from GDN's."""
    return KDA_KERNELS if per_channel else KERNELS


@dataclass(frozen=True)
class ArLaunchConfig:
    """block_v: value rows per program (prep: unused); block_k: the K chunk (step: BKC, accumulated elementwise;
    fold: BKT, one chunk live at a time; prep: unused)."""

    block_v: int
    block_k: int
    num_warps: int
    num_stages: int


def default_ar_config(kernel: str, K: int, V: int, L: int, arch: int) -> ArLaunchConfig:
    """The hand rules (GPU; arch 0, the interpreter, takes whole tiles: it costs per program, not per FLOP), chosen
    on the AOT report's issue floor (Triton 3.7.1 / 3.6.0, sm_90, Qwen3.5-122B and Kimi-Linear, b256, L = 16).

    step: [32, 32] chunks over 4 warps, 8 fp32 state values per thread per chunk, all K/32 chunk loads issued
      before the first FMA (K = 128: 32 registers of state per thread; 70 registers, 7 blocks per SM). BV 32
      keeps 4 V-tile programs per value head at V = 128, so the fixed per-program work (the x and c loads) is
      amortised over 16 KB of fp32 state.
    fold: a [64, BL] u tile and one [64, 32] state chunk per iteration, 4 warps, 1 stage: it runs on 1/L of the
      steps, and against [32, 32] / 2 stages (the first rule) it halves the programs that recompute the chunk's
      [BL, 32] decay weights, and the software pipeline's extra instructions go (GDN 324 -> 80 us, KDA 221 -> 41
      us of issue on a flush step; 80 / 72 registers).
    prep: GDN's [BL, K] buffered keys over 4 warps (8 past K = 128); KDA's [BL, K] keys and decays over one warp
      per 2,048 elements, so the scan along the buffer runs inside each thread (4 warps: 121 registers and a
      cross-warp scan through shared memory, 61 us of issue at Kimi-Linear b256; 1 warp: 128 registers, 30 us)."""
    BK = max(16, next_pow2(K))
    phase = kernel.rsplit("_", 1)[1]
    if phase == "prep" and kernel.startswith("kda"):
        return ArLaunchConfig(0, BK, max(1, min(8, next_pow2(L) * BK // 2048)), 1)
    if phase == "prep":
        return ArLaunchConfig(0, BK, 4 if BK <= 128 else 8, 1)
    if arch == 0:
        bv = max(16, next_pow2(V))
        return ArLaunchConfig(bv, 32 if phase == "step" else BK, 4, 1)
    if phase == "step":
        return ArLaunchConfig(min(32, max(16, next_pow2(V))), 32, 4, 1)
    return ArLaunchConfig(min(64, max(16, next_pow2(V))), 32, 4, 1)


def ar_config(kernel: str, K: int, V: int, L: int, state_dtype, arch: int) -> ArLaunchConfig:
    """This device's tuned entry for `kernel` at (K, V, L), else the default rule."""
    return launch_table.resolve(kernel, launch_registry.key(kernel, K=K, V=V, L=L), state_dtype, arch,
                                default_ar_config(kernel, K, V, L, arch))


def buffer_width(L: int, block_k: int) -> int:
    """BC: the buffer axis padded to a power of two >= the step's chunk (so the u rows are whole chunks) and
    >= 16 (the fold's tl.dot)."""
    return max(16, block_k, next_pow2(L))


def workspace(cache, BC: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [slots, H or HV, 2, K], c [slots, HV, 2, BC], s [slots, HV, 2]) fp32, zeros, kept on the cache; x has a
    row per key head (GDN) or per value head (KDA: its decayed vectors differ per value head)."""
    gm, n = cache.geometry, cache.num_slots
    ws = cache.__dict__.get("_ar_prep_workspace")
    if ws is None or ws[1].shape[-1] != BC or ws[0].device != cache.state.device:
        dev = cache.state.device
        x_heads = gm.HV if gm.PER_CHANNEL_DECAY else gm.H
        ws = (torch.zeros(n, x_heads, 2, gm.K, device=dev), torch.zeros(n, gm.HV, 2, BC, device=dev),
              torch.zeros(n, gm.HV, 2, device=dev))
        cache.__dict__["_ar_prep_workspace"] = ws
    return ws


def launch_output_only_fold(cache, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                            out: torch.Tensor) -> None:
    """Inputs already validated (replayssm/gdn/decode.py, GDN or KDA); slots int32 [batch] (NULL_SLOT rows
    skipped). The families differ in the prep kernel only (and in the decays' stride along K in the fold)."""
    from replayssm.gdn.decode_kernels import _gdn_advance_cursor_kernel  # the cursor advance both routes share

    gm, L = cache.geometry, cache.buffer_len
    per_channel = gm.PER_CHANNEL_DECAY
    batch, arch, sd = q.shape[0], kernel_arch(q.device), cache.state_dtype
    prep, step, fold = (ar_config(name, gm.K, gm.V, L, sd, arch) for name in kernel_names(per_channel))
    BC = buffer_width(L, step.block_k)
    x, c, s = workspace(cache, BC)
    st, u, kb, gb = cache.state, cache.u, cache.k, cache.g
    common = dict(NULL_ID=NULL_SLOT, K=gm.K, L=L)
    hv_per_h = gm.HV // gm.H
    prep_args = (q, k, g, slots, cache.write_pos, kb, gb, x, c, s,
                 q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), g.stride(1),
                 kb.stride(0), kb.stride(1), kb.stride(2), gb.stride(0), gb.stride(1), gb.stride(2),
                 x.stride(0), x.stride(1), c.stride(0), c.stride(1), s.stride(0), s.stride(1), scale)
    prep_kw = dict(**common, HV_PER_H=hv_per_h, BK=max(16, next_pow2(gm.K)), BC=BC, BL=next_pow2(L),
                   USE_L2NORM=bool(use_qk_l2norm),
                   num_warps=prep.num_warps, num_stages=prep.num_stages)
    if per_channel:
        ar_prep_channel_kernel[(batch, gm.HV)](*prep_args, **prep_kw)
    else:
        ar_prep_kernel[(batch, gm.H)](*prep_args, **prep_kw, BG=next_pow2(hv_per_h))
    fmt = format_of(cache)
    state_scale = cache.state_scale if fmt.scaled else None               # int8 / float8_e4m3fn
    scale_stride = state_scale.stride(0) if state_scale is not None else 0
    ar_step_kernel[(triton.cdiv(gm.V, step.block_v), batch, gm.HV)](
        v, beta, out, slots, cache.write_pos, st, u, x, c, s, state_scale,
        v.stride(0), v.stride(1), beta.stride(0), beta.stride(1), out.stride(0), out.stride(1),
        st.stride(0), st.stride(1), st.stride(2), u.stride(0), u.stride(1), u.stride(2),
        x.stride(0), x.stride(1), c.stride(0), c.stride(1), s.stride(0), s.stride(1), scale_stride,
        **common, X_GROUP=1 if per_channel else hv_per_h, V=gm.V, BV=step.block_v, BKC=step.block_k, BC=BC,
        BL=next_pow2(L),
        num_warps=step.num_warps, num_stages=step.num_stages,
    )
    sr_step = cache.sr_step if fmt.stochastic else None                  # float16_sr / bfloat16_sr
    # a scaled format's fold: one program per head (its scale is the whole head's absmax: ar_fold.py)
    # in K chunks of 16 (a [V, 16] chunk per iteration, 4 warps): with the default 32, 118-134 registers and an 8 B
    # spill at sm_100 (Kimi-Linear int8, Triton 3.7.1); 8 warps spill too. AOT sm_90 b256 per flush step, int8:
    # Qwen3.5-122B 94.6 us, Kimi-Linear 47.6 (fp32 fold: 79.4 / 40.6): the absmax pass costs ~20 %
    fold_bv = max(16, next_pow2(gm.V)) if state_scale is not None else fold.block_v
    fold_bkt = min(fold.block_k, 16) if state_scale is not None and arch else fold.block_k
    ar_fold_kernel[(triton.cdiv(gm.V, fold_bv), batch, gm.HV)](
        slots, cache.write_pos, st, u, kb, gb, sr_step, cache.sr_seed if sr_step is not None else 0, state_scale,
        st.stride(0), st.stride(1), st.stride(2), u.stride(0), u.stride(1), u.stride(2),
        kb.stride(0), kb.stride(1), kb.stride(2), gb.stride(0), gb.stride(1), gb.stride(2),
        gb.stride(3) if per_channel else 0,              # GDN: one decay per entry, broadcast along K
        scale_stride, **common, HV_PER_H=hv_per_h, V=gm.V, BV=fold_bv, BKT=fold_bkt, BC=max(16, next_pow2(L)),
        FP32_DOT="tf32x3" if arch >= 80 else "ieee", num_warps=fold.num_warps, num_stages=fold.num_stages,
        **scaled_args(fmt),
    )
    if sr_step is not None:           # after the fold (its programs read the counter), before the cursor moves
        launch_sr_advance(slots, cache.write_pos, sr_step, L)
    if cache.shared_cursor:
        return                        # a DecodeCursor shared by every layer advances once per step
    block = min(1024, max(16, next_pow2(batch)))
    _gdn_advance_cursor_kernel[(triton.cdiv(batch, block),)](
        slots, cache.write_pos, batch, NULL_ID=NULL_SLOT, L=L, BLOCK=block, num_warps=1,
    )
