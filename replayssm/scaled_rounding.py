"""The scaled 8-bit state formats (int8, float8_e4m3fn) inside a Triton kernel: the write rule of
state_format.quantize_scaled, bit for bit, for a kernel that holds a whole (slot, head) block.

    scale = absmax / qmax      over the head's finite elements (1 for an all-zero head), fp32, division rounded
                               to nearest (tl.div_rn: torch's fp32 division)
    q     = round(clamp(S / scale, -qmax, qmax))   NaN -> 0, +-inf -> +-qmax, round to nearest even

Why a kernel must see the whole head: the scale is a reduction over every element of the [a, b] block, so a
kernel that writes the head in tiles from several programs cannot know it before its first store. The writers
here (ReplaySSM's AR folds) give one program the whole head and walk it twice: a first pass that only computes
the absmax, a second that recomputes each chunk and stores it quantised. The recomputation costs a second fold
of the chunk on a flush step (1 in L steps); keeping the new state instead would need an fp32 copy of the head,
the memory an 8-bit state exists to save.

Rounding without libdevice (the interpreter has none) and without a float-to-8-bit conversion that rounds (the
interpreter's float8 conversion truncates; a value already on the e4m3 grid converts exactly everywhere): both
formats round in fp32 by the magic-number trick. Adding M = 1.5 * 2^(e + 23), whose ulp is 2^e, to |x| < 2^(e+22)
leaves the sum rounded to a multiple of 2^e (to nearest even, the fp32 adder's mode); subtracting M gives it
back exactly. int8 takes e = 0 (|x| <= 127). e4m3 (3 mantissa bits, exponents -6..8, subnormal step 2^-9) takes
the quantum of x's binade: e = max(floor(log2 |x|), -6) - 3, read from the exponent bits. The sum and the
difference are separate fp32 operations that no compiler may fold without fast-math reassociation, which Triton
does not enable.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP32_MAX = tl.constexpr(3.4028234663852886e38)
INT8_MAGIC = tl.constexpr(12582912.0)          # 1.5 * 2^23: ulp 1


@triton.jit
def finite_absmax_rows(S, mask):
    """max |S| along each row of a [rows, cols] tile over its finite, unmasked elements (0.0 where none): the
    scale's reduction, whose non-finite guard keeps one NaN / inf from rescaling the whole head. A writer keeps
    the row maxima across its chunks (elementwise) and reduces them to the head's scalar once, after its loop:
    reducing a tensor-core result straight to a scalar in the loop trips Triton's sm_100 tensor-memory layout
    pass (TritonNvidiaGPUOptimizeTMemLayoutsPass: "parent layout must have at least rank >= 2", 3.6.0 and 3.7.1)."""
    finite = mask & (S == S) & (tl.abs(S) <= FP32_MAX)
    return tl.max(tl.where(finite, tl.abs(S), 0.0), 1)


@triton.jit
def head_scale(absmax, QMAX: tl.constexpr):
    """The stored fp32 scale of a head whose finite absmax is `absmax` (1 for an all-zero head: 0 / 0 would
    poison it)."""
    return tl.where(absmax > 0.0, tl.div_rn(absmax, QMAX), 1.0)


@triton.jit
def quantize(S, scale, QMAX: tl.constexpr, IS_INT8: tl.constexpr):
    """S / scale on the format's grid, as fp32 values (an exact conversion to the storage dtype follows)."""
    x = tl.div_rn(S, scale)
    x = tl.where(x != x, 0.0, tl.minimum(tl.maximum(x, -QMAX), QMAX))     # NaN -> 0, saturate +-inf / overflow
    if IS_INT8:
        return (x + INT8_MAGIC) - INT8_MAGIC
    ax = tl.abs(x)
    expo = ((ax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127          # floor(log2 |x|) for a normal |x|
    # M = 1.5 * 2^(e + 23) with e = max(expo, -6) - 3 the e4m3 quantum's exponent; biased: e + 23 + 127
    magic = ((tl.maximum(expo, -6) + 147) << 23 | (1 << 22)).to(tl.float32, bitcast=True)
    r = (ax + magic) - magic
    # x's sign bit onto r (a negative that rounds to zero stays -0, as torch's conversion keeps it)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
