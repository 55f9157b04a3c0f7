"""@triton.jit helpers shared by the delta-rule AR kernels (ar_prep.py, ar_fold.py).

The fold's dot, (u w)[BV, BC] @ k_buf[BC, BKT], has one operand stored in the activation dtype (the keys) and one
fp32 operand (u times the fp32 replay weights). tf32x3 splits both operands into hi and lo parts and spends two of
its three MMAs on the keys' low part, which is zero whenever the keys are exact in the MMA's input type. So
`replay_dot` splits only the fp32 side:

    bf16x2 (bf16 keys): A = hi + lo + r, hi = bf16(A), lo = bf16(A - hi); out = hi @ B + lo @ B, fp32 accumulation.
        Each bf16 x bf16 product is exact in fp32 (8 + 8 significant bits), so the only errors are r and the fp32
        accumulation: |r| <= 2^-14 |A| elementwise under any faithful rounding (2^-18 under round-to-nearest, the
        GPU's cvt.rn; the Triton interpreter truncates), hence
            |out - A @ B| <= (2^-14 + BC 2^-24) (|A| @ |B|)            (BC: the padded buffer axis)
        i.e. ~6e-5 relative to |A| @ |B| at the production BC = 32, below the bf16 activations' own 2^-9 and
        tested in tests/replayssm/gdn/test_gdn_ar_fold.py (the split against float64, interpreter).
        Underflow: lo is lost when |A - hi| is below bf16's smallest normal (1e-38), i.e. never for these
        magnitudes (|u| ~ 1, w in (0, 1]).
    tf32x2 (fp16 keys: every fp16 value is exact in tf32, 11 significant bits and a wider exponent): hi = A with
        its 13 low mantissa bits cleared (exact in tf32), lo = A - hi (exact in fp32, rounded to tf32 by the MMA:
        error <= 2^-11 |lo| <= 2^-21 |A|); out = hi @ B + lo @ B, both with input_precision "tf32".
    anything else (fp32 keys: neither operand is exact in a 16-bit MMA type): FP32_DOT, "tf32x3" on sm_80+,
        "ieee" before it and in the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_bf16(a):
    """fp32 a -> (hi, lo) in bf16 with a = hi + lo + r, |r| <= 2^-14 |a| (see the module docstring)."""
    hi = a.to(tl.bfloat16)
    lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def split_tf32(a):
    """fp32 a -> (hi, lo) in fp32: hi exact in tf32 (13 low mantissa bits cleared), lo = a - hi exactly."""
    hi = (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, a - hi


@triton.jit
def replay_dot(a, b, DOT: tl.constexpr):
    """a [M, C] fp32 @ b [C, N] (the keys, in their stored dtype) -> [M, N] fp32, by the split DOT names."""
    if DOT == "bf16x2":
        hi, lo = split_bf16(a)
        bb = b.to(tl.bfloat16)
        return tl.dot(lo, bb, tl.dot(hi, bb))
    elif DOT == "tf32x2":
        hi, lo = split_tf32(a)
        bb = b.to(tl.float32)
        return tl.dot(lo, bb, tl.dot(hi, bb, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a, b.to(tl.float32), input_precision=DOT)


@triton.jit
def replay_dot_rhs(a, b, DOT: tl.constexpr):
    """a [M, C] (exact in its stored dtype: u rows, raw window q / k) @ b [C, N] fp32 -> [M, N] fp32: `replay_dot`
    with the split on the right-hand operand (the folds' weighted keys, the verifies' coefficients), the same
    bounds with the roles of A and B exchanged."""
    if DOT == "bf16x2":
        hi, lo = split_bf16(b)
        aa = a.to(tl.bfloat16)
        return tl.dot(aa, lo, tl.dot(aa, hi))
    elif DOT == "tf32x2":
        hi, lo = split_tf32(b)
        aa = a.to(tl.float32)
        return tl.dot(aa, lo, tl.dot(aa, hi, input_precision="tf32"), input_precision="tf32")
    else:
        return tl.dot(a.to(tl.float32), b, input_precision=DOT)


@triton.jit
def replay_weights(g_hist, mask_c, AXIS: tl.constexpr):
    """The buffer's replay weights along AXIS from its log decays g_hist (0 where ~mask_c):
    (exp(G_tot), w) with w_j = exp(G_tot - G_pre_j), G_pre inclusive, so that
        S_n = exp(G_tot) S0 + sum_j w_j u_j k_j^T      after the n entries that mask_c keeps."""
    G_pre = tl.cumsum(g_hist, AXIS)
    G_tot = tl.sum(g_hist, AXIS)
    G_tot_b = tl.expand_dims(G_tot, AXIS)
    w = tl.where(mask_c, tl.exp(G_tot_b - G_pre), 0.0)
    return tl.exp(G_tot), w


def key_dot(key_dtype, fp32_dot: str) -> str:
    """The `replay_dot` split for keys stored in `key_dtype` (a torch dtype; the fold's heuristic)."""
    name = str(key_dtype)
    if name == "torch.bfloat16":
        return "bf16x2"
    if name == "torch.float16":
        return "tf32x2"
    return fp32_dot


@triton.jit
def state_dot(a, b, DOT: tl.constexpr):
    """a [M, C] fp32 (checkpoint, folded state or weighted x) @ b [C, N] (stored in the activation dtype) -> fp32.

    `replay_dot`, except that bf16x2 splits by truncation: hi = a with its 16 low bits cleared (one LOP3, exact
    in bf16), lo = a - hi (exact in fp32, |lo| < 2^-7 |a|), rounded to bf16 (error <= 2^-16 |a|). The
    round-to-nearest split needs hi back in fp32 before the subtraction (a convert, a shift, a subtract and half
    a pack per element: 4 instructions); this one costs 3. Error: |out - a @ b| <= (2^-16 + C 2^-24) (|a| @ |b|),
    against split_bf16's 2^-18 + C 2^-24; both far below the bf16 outputs' 2^-9. The ring verifies' state
    product (replayssm/mamba2/spec_*_kernels.py, replayssm/delta_rule/spec_{verify,fold}.py)."""
    if DOT == "bf16x2":
        hi = (a.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)
        bb = b.to(tl.bfloat16)
        return tl.dot((a - hi).to(tl.bfloat16), bb, tl.dot(hi.to(tl.bfloat16), bb))
    else:
        return replay_dot(a, b, DOT)


@triton.jit
def bf16x3_dot(a, b):
    """a [M, C] fp32 @ b [C, N] fp32 -> [M, N] fp32 where neither side is exact in a 16-bit type: both split as
    split_bf16 (a = ah + al + ra, b = bh + bl + rb), three bf16 MMAs ah bh + ah bl + al bh, fp32 accumulation.
    Dropped: al bl, ah rb, ra bh (and smaller terms), each <= 2^-14 |a||b| elementwise under any faithful rounding
    (the interpreter truncates), al bl <= 2^-16 and the others <= 2^-18 under round-to-nearest (the GPU), so
        |out - a @ b| <= (3 * 2^-14 + C 2^-24) (|a| @ |b|)         (~1.5 * 2^-16 on the GPU)
    For products rounded to a 16-bit activation anyway (2^-9): KDA's decayed window vectors against the state
    (tests/replayssm/kda/test_kda_spec.py test_verify_fold_bf16x3_bound)."""
    ah, al = split_bf16(a)
    bh, bl = split_bf16(b)
    return tl.dot(al, bh, tl.dot(ah, bl, tl.dot(ah, bh)))

