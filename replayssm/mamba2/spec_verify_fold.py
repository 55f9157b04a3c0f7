"""Launch configs and launcher of the Mamba-2 spec verify's "verify_fold" route (spec_verify(route="verify_fold")).

One verify step is three launches, CUDA-graph capturable (no host sync, nothing allocated):
    1. m2_spec_prep_kernel    (batch, ngroups)                       window into the ring, bc = B_k . C_t
    2. m2_spec_verify_kernel  (cdiv(headdim, BLOCK_M), batch, nheads) outputs of the rows that do not flush
    3. m2_spec_fold_kernel    (cdiv(headdim, BLOCK_M), batch, nheads) fold + outputs of the rows that flush
The two row kernels touch disjoint rows (each exits on the other's), so their order does not matter; both
read bc, which the prep wrote. Commit and reset are the shipped cursor moves (replayssm/ring_cursors.py), and
materialize the shipped kernel: the ring's contents are the same whichever route verified.
Each launch's config resolves through replayssm/launch_table.py under its own name (mamba2_spec_prep,
mamba2_spec_verify, mamba2_spec_fold; key headdim, dstate, ring_len, window) with the default rules below.

AOT at Nemotron-3-Super (headdim 64, dstate 128, 128 heads, 8 groups), history 16, fp32 state, bf16 activations,
sm_90, b512 (scripts/kernels/kernel_report.py --fp32-state-only --target 90 --batch 512 --geometry
nemotron3_super_120b --method "mamba2.replay_spec[verify_fold]"), Triton 3.7.1 / 3.6.0, T = 4:
    shipped _verify_kernel   148 / 148 regs, 12 warps per SM, path 2,371, issue 3,139 us; _scatter_bc_kernel 69 us
    m2_spec_verify_kernel    80 / 80 regs, 24 warps per SM, 16 KB smem, 917 / 922 SASS (no loop), issue 304 / 305 us
    m2_spec_fold_kernel      106 / 112 regs, 16 warps per SM, path 1,416-1,504 (loop x4), 0.25 of the rows
    m2_spec_prep_kernel      54 / 55 regs, path 517 / 525, issue 11 us
    step cycle issue floor   501 / 498 us against 698.7 us of bytes (0.72x; shipped 3,936 us, 5.6x)
T = 8: no spill, verify 72 / 80 regs, fold 116 / 118; cycle 742 / 743 us against 861 us of bytes.
Trees (tree_verify(route="verify_fold"), issue 35 item 2): the same three launches. The prep is the chain's (node s
goes to logical position h + s, bc over every live position); the verify and fold kernels take the row's ancestor
bit sets (anc_ptr, spec_kernels.ancestor_bits; IS_TREE set by a heuristic when anc_ptr is given) and build the
window weights with the ancestor mask and tree prefix sums (spec_verify_kernels.window_weights); a flush row's fold
of the committed history is the chain's, that history being a chain. The bit sets are a few device-side torch
ops per call (allocating, as the fused tree's; no host sync). AOT at the same point (tree_recipe, one plain
and one flush row), Triton 3.7.1 / 3.6.0, every build spill-free:
    N = 15 (full 2-ary tree): verify 96 / 96 regs, 20 warps per SM, path 1,236 / 1,233, issue 491 / 490 us;
      fold 107 / 106 regs, 16 warps per SM, path 1,801 / 1,834; prep 55 / 56 regs (8 warps), issue 22 / 23 us;
      step 514 / 514 us against the fused tree's 3,359 / 3,355 (_verify_kernel 150 / 146 regs, 12 warps per SM,
      path 2,484 / 2,481 and 4,692 on a flush row, issue 3,289 / 3,285 us; _scatter_bc_kernel 69 us)
    N = 4 (full 2-ary tree): verify 80 / 80 regs, 24 warps per SM, path 946 / 948 (the chain's 917 / 922 plus the
      mask), issue 313 / 314 us; fold 104 / 112 regs, 16 warps per SM; step 325 / 326 us against 3,363 / 3,356.
The default stays "fused" until a GPU run decides (issue 35 item 1's report has the timing command: both routes
at b512 T4 with every row verifying, every row flushing and staggered cursors, CUDA graphs, cold state).
"""

from __future__ import annotations

import torch
import triton

from replayssm import launch_registry, launch_table
from replayssm.checks import kernel_arch, next_pow2
from replayssm.delta_rule._tl import key_dot
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_fold_kernels import m2_spec_fold_kernel
from replayssm.mamba2.spec_kernels import MAX_NODES, ancestor_bits
from replayssm.mamba2.spec_prep_kernels import m2_spec_prep_kernel
from replayssm.mamba2.spec_tiles import VerifyFoldConfig
from replayssm.mamba2.spec_verify_kernels import m2_spec_verify_kernel

ROUTE = "verify_fold"
KERNELS = ("mamba2_spec_prep", "mamba2_spec_verify", "mamba2_spec_fold")
# tree_verify(route="verify_fold"): the same prep (a tree's window goes into the ring as a chain's), the verify and
# fold kernels built with IS_TREE (the ancestor mask). The two tree builds resolve under their own names, as the
# fused tree kernel does (mamba2_replay_tree): a tuned chain entry never reaches them; the default rule is the chain's.
TREE_KERNELS = ("mamba2_spec_prep", "mamba2_spec_verify_tree", "mamba2_spec_fold_tree")


def default_vf_config(kernel: str, headdim: int, dstate: int, arch: int) -> VerifyFoldConfig:
    """The hand rules (GPU; arch 0, the interpreter, takes whole tiles: it costs per program, not per FLOP).

    verify: a [32, 64] fp32 checkpoint chunk over 2 warps (32 values per thread per chunk), every chunk of
      dstate unrolled so their loads are all issued up front: 32 KB per program at dstate 128 in flight.
    fold: the same tile over 4 warps, one chunk live at a time (runtime loop, 2 stages): it also holds the
      chunk's B rows and the folded S1.
    prep: the group's [T, heads x headdim] window tile and [ring, dstate] B tile over 4 warps (8 past 4,096
      window elements)."""
    kernel = kernel.removesuffix("_tree")
    bn = max(16, next_pow2(dstate))
    if kernel == "mamba2_spec_prep":
        return VerifyFoldConfig(0, bn, 4, 1)
    if arch == 0:
        return VerifyFoldConfig(max(16, next_pow2(headdim)), bn, 4, 1)
    bm = min(64, max(16, next_pow2(headdim)))
    if kernel == "mamba2_spec_verify":
        return VerifyFoldConfig(bm, min(64, bn), 4, 1)
    return VerifyFoldConfig(bm, min(32, bn), 4, 2)


def vf_config(kernel: str, ring: SpecRing, arch: int) -> VerifyFoldConfig:
    """This device's tuned entry for `kernel` at the ring's geometry, else the default rule."""
    geo = ring.geometry
    key = launch_registry.key(kernel, headdim=geo.headdim, dstate=geo.dstate, ring_len=ring.ring_len,
                              window=ring.window)
    return launch_table.resolve(kernel, key, ring.state.dtype, arch,
                                default_vf_config(kernel, geo.headdim, geo.dstate, arch))


def launch_verify_fold(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, slots: torch.Tensor,
                       out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """Inputs already validated (replayssm/mamba2/spec.py spec_verify, tree.py tree_verify); slots int32 [batch].
    With `parents` int32 [batch, N] (N = ring.window <= MAX_NODES): a draft tree's verify (the row kernels with
    IS_TREE, reading one int32 ancestor bit set per node, spec_kernels.ancestor_bits)."""
    geo, batch, T = ring.geometry, x.shape[0], ring.window
    is_tree = parents is not None
    if is_tree and T > MAX_NODES:
        raise ValueError(f"N={T} > {MAX_NODES}: the Triton tree kernel keeps one int32 bit set per node")
    anc = ancestor_bits(parents) if is_tree else None
    tree = dict(anc_ptr=anc, sanc_b=anc.stride(0) if is_tree else 0)
    arch = kernel_arch(x.device)
    prep, verify, fold = (vf_config(name, ring, arch) for name in (TREE_KERNELS if is_tree else KERNELS))
    fp32_dot = "ieee" if arch == 0 else "tf32x3"
    dot = key_dot(ring.act_dtype, fp32_dot)
    hpg = geo.heads_per_group
    block_t, block_k = next_pow2(T), max(16, ring.ring_len)
    block_hp = next_pow2(hpg * geo.headdim)
    common = dict(null_slot=ring.null_slot, HEADS_PER_GROUP=hpg, HEADDIM=geo.headdim, DSTATE=geo.dstate, T=T,
                  RING=ring.ring_len, BLOCK_T=block_t, BLOCK_K=block_k)
    rx, rB, rdt, bc = ring.x, ring.B, ring.dt, ring.bc
    m2_spec_prep_kernel[(batch, geo.ngroups)](
        x, dt, dt if dt_bias is None else dt_bias, B, C, slots, rx, rB, rdt, bc, ring.write_pos, ring.origin,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        rx.stride(0), rx.stride(1), rx.stride(2), rB.stride(0), rB.stride(1), rB.stride(2),
        rdt.stride(0), rdt.stride(1), bc.stride(0), bc.stride(1), bc.stride(2),
        **common, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_HP=block_hp, BLOCK_H=next_pow2(hpg), BLOCK_N=prep.block_n,
        BC_DOT="native" if dot in ("bf16x2", "tf32x2") else fp32_dot,
        num_warps=prep.num_warps if block_t * block_hp <= 4096 else 2 * prep.num_warps,
        num_stages=prep.num_stages,
    )
    zz = x if z is None else z
    row_args = (x.stride(0), x.stride(1), x.stride(2), zz.stride(0), zz.stride(1), zz.stride(2),
                C.stride(0), C.stride(1), C.stride(2), out.stride(0), out.stride(1), out.stride(2),
                ring.state.stride(0), ring.state.stride(1), ring.state.stride(2),
                rx.stride(0), rx.stride(1), rx.stride(2))
    flags = dict(HAS_D=D is not None, HAS_Z=z is not None, DOT=dot)
    DD = A if D is None else D
    m2_spec_verify_kernel[(triton.cdiv(geo.headdim, verify.block_m), batch, geo.nheads)](
        x, zz, C, A, DD, out, slots, ring.state, rx, rdt, bc, ring.write_pos, ring.origin, ring.is_flush,
        *row_args, rdt.stride(0), rdt.stride(1), bc.stride(0), bc.stride(1), bc.stride(2), **tree,
        **common, **flags, BLOCK_M=verify.block_m, BLOCK_N=verify.block_n,
        num_warps=verify.num_warps, num_stages=verify.num_stages,
    )
    m2_spec_fold_kernel[(triton.cdiv(geo.headdim, fold.block_m), batch, geo.nheads)](
        x, zz, C, A, DD, out, slots, ring.state, rx, rB, rdt, bc, ring.write_pos, ring.origin, ring.is_flush,
        *row_args, rB.stride(0), rB.stride(1), rB.stride(2), rdt.stride(0), rdt.stride(1),
        bc.stride(0), bc.stride(1), bc.stride(2), **tree,
        **common, **flags, BLOCK_M=fold.block_m, BLOCK_N=fold.block_n, NUM_STAGES=fold.num_stages,
        num_warps=fold.num_warps,
    )
    return out
