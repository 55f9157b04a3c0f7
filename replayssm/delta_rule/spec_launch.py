"""Launch configs, workspace and launcher of the ring verify's "verify_fold" route (spec_prep.py, spec_verify.py,
spec_fold.py): replayssm.gdn.spec_verify(..., route="verify_fold").

One verify is three launches, CUDA-graph capturable (no host sync, nothing allocated after a ring's first verify
through this route):
    1. spec_prep_kernel    (batch, H)                per key head: norms, Gram matrix, gates, (I + A)^-1, the
                                                     coefficients; appends the window's k and g rows (KDA:
                                                     spec_prep_kda_kernel, or _tok_kernel at 2T = 16 rows)
    2. spec_verify_kernel  (cdiv(V, BV), batch, HV)  every row's outputs and the window's u rows
    3. spec_fold_kernel    (cdiv(V, BV), batch, HV)  the folding rows (the rest exit; the verify exits on
                                                     these): their outputs and u rows, and S0 <- S_h
Commit and reset stay the cursor moves of replayssm/ring_cursors.py. Each launch's config resolves through
replayssm/launch_table.py under its own name ({gdn,kda}_ring_prep / _ring_verify / _ring_fold; key K, V, history,
window) with the default rules below.
A draft tree (tree_verify(route="verify_fold") of replayssm.gdn and replayssm.kda, parents=...): the same three
launches, the prep built with IS_TREE (gdn_ring_prep_tree / kda_ring_prep_tree, reading the ancestor bit sets of
replayssm.mamba2.spec_kernels.ancestor_bits, a few device-side torch ops: no host sync), N <= MAX_TREE_NODES; the
commit is replayssm/tree_ring.py's (moves of the accepted branch's entries, then the cursors). AOT at Qwen3.5-122B,
b512, history 16, fp32 state, bf16 activations, sm_90, N = 4 (the full binary tree; kernel_report
'gdn.replay_tree[verify_fold]' --spec-T 4 8), Triton 3.7.1 / 3.6.0: prep 143 / 144 registers, no spill, occupancy
0.1875, path 3,913 / 3,967, issue 81.0 / 82.1 us (the chain's 80.6 / 83.8); the verify and the fold are the chain's
kernels (315.8 / 318.7 us, 618.4 / 621.2 us). N = 8: prep 168 / 199 registers, no spill, issue 119.2 / 179.0 us.
sm_100 builds spill-free as well.
KDA (kernel_report 'kda.replay_tree[verify_fold]' at Kimi-Linear b512, history 16, the full binary tree of N = T
nodes; default_config's tree rules), Triton 3.7.1 / 3.6.0, sm_90: N = 4 (spec_prep_kda_kernel, one warp) 156 / 167
registers, no spill, occupancy 0.1875, issue 147.7 / 149.0 us (the chain's capped build 101.3 / 102.4); N = 8
(spec_prep_kda_tok_kernel, four warps) 122 / 128, occupancy 0.25, 473.2 / 465.8 us (the chain's 404.9 / 408.5).
sm_100 and bf16 states build spill-free as well; the chain builds' SASS is the same as without the tree code.
"""

from __future__ import annotations

import torch
import triton

from replayssm import launch_registry, launch_table
from replayssm.checks import NULL_SLOT, kernel_arch, next_pow2
from replayssm.delta_rule._tl import key_dot
from replayssm.delta_rule.spec_fold import spec_fold_kernel
from replayssm.delta_rule.spec_prep import spec_prep_kda_kernel, spec_prep_kda_tok_kernel, spec_prep_kernel
from replayssm.delta_rule.spec_verify import spec_verify_kernel
from replayssm.mamba2.spec_kernels import ancestor_bits

ROUTE = "verify_fold"
PHASES = ("ring_prep", "ring_verify", "ring_fold")
# tree_verify(route="verify_fold"): node s's entries go where a chain's token s goes, so the verify and the fold are
# the chain's builds (every tree fact is in the prep's coefficients) and only the prep is built with IS_TREE. Its
# window tile stacks 2N rows padded to TW = max(16, next_pow2(2N)): up to N = 8 the chain's [16, K] tile, built
# without a spill at N 4 and 8 (Qwen3.5-122B, sm_90 / sm_100, Triton 3.7.1 / 3.6.0; kernel_report
# 'gdn.replay_tree[verify_fold]'). N = 16 doubles it and spills (sm_90, 3.7.1: 255 registers and 368 B on one warp at
# history 16; 96 B on two warps, 300 B on four at history 32); N = 32, what one int32 bit set per node allows (the
# fused tree kernel's limit), more.
MAX_TREE_NODES = 8


def kernel_names(per_channel: bool, tree: bool = False) -> tuple[str, str, str]:
    """The three launches' launch-table names; a tree's prep is its own build (IS_TREE), {gdn,kda}_ring_prep_tree,
    so a chain entry never reaches it (as the fused tree kernel's gdn_replay_tree)."""
    family = "kda" if per_channel else "gdn"
    prep, verify, fold = (f"{family}_{p}" for p in PHASES)
    return (f"{prep}_tree" if tree else prep), verify, fold


def default_config(kernel: str, K: int, V: int, arch: int, window: int = 4) -> dict:
    """The hand rules. Interpreter (arch 0): whole tiles (it costs per program, not per FLOP). GPU (AOT at
    Qwen3.5-122B, b512 T4 hist16, sm_90, Triton 3.7.1, scripts/kernels/kernel_report.py with each config forced):
    prep: one warp (the tiles are [16, K] and [16, 16]; 8 KB-12 KB of layout-conversion smem).
    verify: [64, 32] state chunks over 4 warps, one warpgroup: each warp owns 16 state rows of the MMA's A
      operand (74 registers, 24 warps per SM, 989 SASS per warp: 327 us). [32, 32] over 4 warps puts two warps
      on the same rows, splitting each state element twice (678 us before the truncating split); [32, 32] over
      2 warps 350 us, [64, 64] 96 registers (395 us).
    fold (the verify's work and the fold, on the folding rows): GDN [32, 16] chunks over 2 warps (72 / 78
      registers, 28 warps per SM: 515 / 520 us under Triton 3.7.1 / 3.6.0, sm_100 443 / 436 us) where [64, 16]
      over 4 warps takes 82 / 84 registers and 20 warps per SM (618 / 621 us, sm_100 672 / 652); [64, 32] 106
      registers 782 us, [32, 32] / 2 warps 1,009 us (the tuning space's sweep, kernel_report.py --tune-space). KDA
      keeps [64, 16] over 4 warps (73 registers, 261 us; [32, 16] / 2 warps 85 registers, 381 us)."""
    tree = kernel.endswith("_tree")
    kernel = kernel.removesuffix("_tree")            # a tree's prep: the chain's rule (the same tiles up to N = 8)
    BK = max(16, next_pow2(K))
    BV = max(16, next_pow2(V))
    if kernel.endswith("_ring_prep"):
        # KDA: the whole K in one tile with the rows in-thread, the history in blocks of HB = 8 rows (HB = 16: 218
        # registers). 2T <= 8 (spec_prep_kda_kernel): one warp, capped at 128 registers on sm_90: 16 warps per SM
        # where its 139 leave 12 (the issue rate 0.67 against 0.5; 120 is the same occupancy, 104 and below spill;
        # on sm_100 the cap spills 48 B, uncapped 132-141). 2T = 16 (spec_prep_kda_tok_kernel): two warps, 148-168
        # registers (one: 255 and a 4-12 B spill on sm_100, the same issue time).
        # KDA's tree builds (IS_TREE) differ: data-dependent path masks where the chain's fold per register (rows
        # in-thread), every row of F scaled at every column of the sweep. Token-major on two warps: 181-183
        # registers (8 warps per SM; capped at 168 it spills 4 B on sm_90, 44 B on sm_100), on four 115-128 and 16
        # warps per SM: 0.70x the issue time. Stacked: one warp, uncapped: 141-168 registers, 12 warps per SM (on
        # sm_90 capped at 128 it spills 36 B, at 136 4 B); two warps 1.25x the issue time.
        if kernel.startswith("kda_"):
            if window > 4:
                return {"BV": 0, "BKT": BK, "HB": 8, "num_warps": 4 if tree else 2, "num_stages": 1}
            return {"BV": 0, "BKT": BK, "HB": 8, "num_warps": 1, "num_stages": 1,
                    **({"maxnreg": 128} if arch == 90 and not tree else {})}
        return {"BV": 0, "BKT": BK, "num_warps": 1 if BK <= 128 else 2, "num_stages": 1}
    if arch == 0:
        return {"BV": BV, "BKT": BK, "num_warps": 4, "num_stages": 1}
    # the fold specialization: 16-column state chunks (32 columns: 106 registers and 16 warps per SM, the issue
    # floor 1.4x); GDN's on [32, .] rows over 2 warps (the docstring), KDA's the verify's [64, .] over 4
    if kernel == "gdn_ring_fold":
        return {"BV": min(32, BV), "BKT": min(16, BK), "num_warps": 2, "num_stages": 1}
    return {"BV": min(64, BV), "BKT": min(16 if kernel.endswith("_ring_fold") else 32, BK), "num_warps": 4,
            "num_stages": 1}


def config(kernel: str, geometry, history_len: int, window: int, state_dtype, arch: int) -> dict:
    """This device's tuned entry for `kernel`, else the default rule."""
    key = launch_registry.key(kernel, geometry, history=history_len, window=window)
    return launch_table.resolve(kernel, key, state_dtype, arch,
                                default_config(kernel, geometry.K, geometry.V, arch, window))


def _state_dot(act_dtype, fp32_dot: str, per_channel: bool) -> str:
    """The verify's state-product split: GDN's raw window rows are exact in the activation dtype (key_dot's
    split); KDA's decayed vectors are not, so 16-bit activations take bf16x3 (its error below their rounding)
    and fp32 ones FP32_DOT."""
    if not per_channel:
        return key_dot(act_dtype, fp32_dot)
    return "bf16x3" if fp32_dot != "ieee" and act_dtype in (torch.bfloat16, torch.float16) else fp32_dot


def widths(window: int, history_len: int) -> tuple[int, int, int]:
    """(TW, TW2, BC): the stacked window rows padded for tl.dot (>= 16), the workspace pitch (2T to a power of
    two) and the history axis padded for tl.dot (>= 16)."""
    TW2 = next_pow2(2 * window)
    return max(16, TW2), TW2, max(16, next_pow2(history_len))


def workspace(ring, TW: int, TW2: int, BC: int, per_channel: bool, x_dtype) -> tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor]:
    """The preps' outputs, kept on the ring (zeros at allocation), one layout for both families:
        coef [slots, HV, 2 TW2 + BC, TW2] fp32   the window's coefficient tiles (spec_prep.py; KDA leaves the
                                                 CzT rows at zero)
        x    [slots, HX, TW, K]                  the state vectors: GDN the raw window rows in the activation
                                                 dtype per key head (HX = H), KDA the decayed ones already mixed
                                                 by Cz, fp32 per value head (HX = HV, the verify's MIXED); read
                                                 at head i_hv // (HV / HX). Rows
                                                 [2T, TW) stay the allocation's zeros (no prep writes them, and a
                                                 workspace serves one window length, part of its key): the
                                                 verify and the fold load whole [BKT, TW] tiles unmasked along
                                                 the rows (a row mask: 88 registers against 72, Triton 3.7.1)
        wt   [slots, HV, 1 + BC, KW] fp32        the fold's replay weights, row 0 exp(G_tot), rows 1 + j w_j; per
                                                 key channel for KDA (KW = K), one per head for GDN (KW = 1, read
                                                 at K stride 0)
    Bytes per slot at Kimi-Linear T 4 (HV 32, K 128, BC 16): coef 32 KB, x 256 KB, wt 272 KB (written on folding
    rows only); at Qwen3.5-122B (H 16, HV 64): coef 64 KB, x 64 KB (bf16), wt 4.3 KB. Kept per ring and window."""
    gm, n, dev = ring.geometry, ring.num_slots, ring.state.device
    HX, KW = (gm.HV, gm.K) if per_channel else (gm.H, 1)
    shapes = ((n, gm.HV, 2 * TW2 + BC, TW2), (n, HX, TW, gm.K), (n, gm.HV, 1 + BC, KW))
    key = (shapes, dev, x_dtype, ring.window)
    cached = ring.__dict__.get("_verify_fold_workspace")
    if cached is None or cached[0] != key:
        cached = (key, (torch.zeros(shapes[0], device=dev), torch.zeros(shapes[1], device=dev, dtype=x_dtype),
                        torch.zeros(shapes[2], device=dev)))
        ring.__dict__["_verify_fold_workspace"] = cached
    return cached[1]


def check_tree_route(N: int, per_channel: bool) -> None:
    """A draft tree of N nodes on this route (GDN or KDA, `per_channel`: both preps build with IS_TREE):
    N <= MAX_TREE_NODES. Raises ValueError (called before anything is written or launched)."""
    if N > MAX_TREE_NODES:
        raise ValueError(f"N={N} > {MAX_TREE_NODES}: route='verify_fold' verifies trees of up to {MAX_TREE_NODES} "
                         f"nodes (its prep stacks 2N window rows in one tile, spec_launch.MAX_TREE_NODES); "
                         f"route='fused' verifies trees of up to 32")


def launch_verify_fold(ring, q, k, v, g, beta, scale: float, use_qk_l2norm: bool, slots: torch.Tensor,
                       out: torch.Tensor, per_channel: bool = False, parents: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Inputs already validated (replayssm/gdn/spec.py run_spec_verify, replayssm/gdn/tree.py run_tree_verify);
    slots int32 [batch]. With `parents` int32 [batch, N] (N = ring.window <= MAX_TREE_NODES): a draft tree's
    verify, the prep (GDN's, or KDA's stacked / token-major one) built with IS_TREE reading one int32 ancestor bit
    set per node [batch, N]."""
    gm, T, batch = ring.geometry, ring.window, q.shape[0]
    is_tree = parents is not None
    if is_tree:
        check_tree_route(T, per_channel)
    anc = ancestor_bits(parents).contiguous() if is_tree else None      # the prep reads row i_b at i_b * T
    arch, sd = kernel_arch(q.device), ring.state.dtype
    prep, verify, fold = (config(name, gm, ring.history_len, T, sd, arch)
                          for name in kernel_names(per_channel, is_tree))
    TW, TW2, BC = widths(T, ring.history_len)
    x_dtype = torch.float32 if per_channel else q.dtype
    coef, x, wt = workspace(ring, TW, TW2, BC, per_channel, x_dtype)
    fp32_dot = "tf32x3" if arch >= 80 else "ieee"
    st, u, kr, gr = ring.state, ring.u, ring.k, ring.g
    group, ring_mask = gm.value_heads_per_key_head, ring.ring_len - 1
    common = dict(NULL_ID=NULL_SLOT, K=gm.K, BC=BC, FP32_DOT=fp32_dot)
    prep_args = dict(**common, GROUP=group, T=T, TW2=TW2, BK=prep["BKT"], USE_L2NORM=bool(use_qk_l2norm),
                     LOG2T=max(1, (T - 1).bit_length()), num_warps=prep["num_warps"], num_stages=prep["num_stages"])
    dots = dict(DOT=_state_dot(q.dtype, fp32_dot, per_channel), UDOT=key_dot(u.dtype, fp32_dot))
    if per_channel:
        prep_args["BK"] = max(16, next_pow2(gm.K))           # KDA's prep holds the whole K in one tile
        # 2T <= 8 window rows: one stacked [2T, K] tile; 16: keys and queries token-major (registers)
        kda_prep, wide = (spec_prep_kda_kernel, {}) if TW2 <= 8 else (spec_prep_kda_tok_kernel, {"TP": next_pow2(T)})
        kda_prep[(batch, gm.H)](
            q, k, g, beta, slots, ring.write_pos, ring.origin, ring.is_flush, kr, gr, coef, x, wt, anc,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), g.stride(0), g.stride(1),
            g.stride(2), beta.stride(0), beta.stride(1), kr.stride(0), kr.stride(1), kr.stride(2), gr.stride(0),
            gr.stride(1), gr.stride(2), coef.stride(0), coef.stride(1), x.stride(0), x.stride(1), wt.stride(0),
            wt.stride(1),
            float(scale), ring_mask, **prep_args, DOT=dots["DOT"], HB=prep.get("HB", 8), **wide,
            **({"maxnreg": prep["maxnreg"]} if prep.get("maxnreg") else {}),
        )
    else:
        spec_prep_kernel[(batch, gm.H)](
            q, k, g, beta, slots, ring.write_pos, ring.origin, kr, gr, coef, x, wt, anc,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), g.stride(0), g.stride(1),
            beta.stride(0), beta.stride(1), kr.stride(0), kr.stride(1), kr.stride(2), gr.stride(0), gr.stride(1),
            coef.stride(0), coef.stride(1), x.stride(0), x.stride(1), x.stride(2), wt.stride(0), wt.stride(1),
            float(scale), ring_mask, **prep_args, TW=TW,
        )
    # one verify and one fold for both families: what differs is in the workspace (x's head group, wt's K stride)
    x_group = gm.HV // x.shape[1]
    # the state product's width: GDN's P feeds a [TW, TW] tl.dot (>= 16 columns); KDA's x rows are mixed (MIXED):
    # no dot follows, so on sm_90 it reads only the TW2 rows the prep writes (on sm_100 the N = 8 product takes
    # 78-92 registers and spills 4 B under Triton 3.6.0 with a bf16 state; TW: 56)
    tw = TW2 if per_channel and arch == 90 else TW
    rows = (x, v, out, slots, ring.write_pos, ring.origin, ring.is_flush, st, u, coef)
    row_strides = (x.stride(0), x.stride(1), x.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0),
                   out.stride(1), out.stride(2), st.stride(0), st.stride(1), st.stride(2), u.stride(0), u.stride(1),
                   u.stride(2), coef.stride(0), coef.stride(1))
    spec_verify_kernel[(triton.cdiv(gm.V, verify["BV"]), batch, gm.HV)](
        *rows, *row_strides, ring_mask,
        **common, X_GROUP=x_group, V=gm.V, T=T, TW=tw, TW2=TW2, BV=verify["BV"], BKT=verify["BKT"], **dots,
        MIXED=per_channel,
        num_warps=verify["num_warps"], num_stages=verify["num_stages"],
    )
    spec_fold_kernel[(triton.cdiv(gm.V, fold["BV"]), batch, gm.HV)](
        *rows, kr, wt, *row_strides,
        kr.stride(0), kr.stride(1), kr.stride(2), wt.stride(0), wt.stride(1), wt.stride(2),
        wt.stride(3) if wt.shape[3] > 1 else 0,
        ring_mask,
        **common, GROUP=group, X_GROUP=x_group, V=gm.V, T=T, TW=tw, TW2=TW2, BV=fold["BV"], BKT=fold["BKT"],
        **dots, KDOT=key_dot(kr.dtype, fp32_dot), MIXED=per_channel, num_warps=fold["num_warps"],
        num_stages=fold["num_stages"],
    )
    return out
