"""Counter-based stochastic rounding (SR) of float32 values to fp16 / bf16, for low-precision SSM state.

Why: a recurrent state written back in fp16 / bf16 every step loses the part of each update below half an ulp
under round-to-nearest (RN): a slowly decaying or slowly growing state stalls, and the error is a bias, not
noise. SR rounds x up to its upper neighbour with probability (x - lo) / (hi - lo), so E[SR(x)] = x exactly and
the per-step errors are zero-mean and independent, growing like sqrt(steps) instead of steps.

Random bits: one uint32 per element from Triton's Philox4x32-10 (`tl.randint4x`, 10 rounds), a pure function of
    key     = (seed, step)          64 bits: low word the 32-bit seed, high word the step (mod 2^32)
    counter = (e >> 2, slot)        64 bits: low word the element's group of four (e: its flat index inside the
                                    slot's [nheads, ...] block, < 2^31), high word the cache slot id
and element e takes output word e mod 4 of its group's call (element 4i + j: word j of counter i). One call thus
feeds four consecutive elements, where tl.randint spends a whole call on one element and drops three words.
Using all four words is how Philox is meant to be consumed (a 4 x 32-bit block per counter, as tl.randint4x,
curand and Random123 hand them out; the BigCrush results of Salmon et al. are for that whole-block stream), so
the draws stay uniform and independent-looking. Two slots, two steps or two elements never share a (key,
counter, word) triple, the draws are reproducible from the seed, and they do not depend on which row of a batch
carries the slot. The step lives in the key, not the counter: a 64-bit counter cannot hold a 32-bit slot, a
32-bit element index and a step without wrapping. There is no host state per step: the step is read from a
device tensor ([] or per slot [slots], e.g. derived from the cache's cursor) inside the kernel, so a captured
CUDA graph replays with fresh draws. (A Python int step is accepted for convenience and copied to a tensor per
call: not capturable.) The torch reference (philox_words / sr_round_torch) and the C backend
(replayssm/cpu/kernels.c) draw the same bits.

What a kernel needs for one call per four elements (sr_round / sr_draws with ALIGNED): the tile's last dim runs
along the slot's unit-stride axis (the state's K / dstate) and is a multiple of 4 wide, and every tile row starts
on a flat index that is a multiple of 4 (a row length and a tile offset that are multiples of 4: every call site
and production geometry). Draws are then made on a tile a quarter as wide and interleaved back. A caller that
cannot promise the alignment (a row length not a multiple of 4) passes ALIGNED=False: each element then runs its
own group's call and keeps its word, the same bits at one call per element.

Rounding, with r the element's uint32 draw and x first made finite (the guard below):
  bf16  integer add on the fp32 bit pattern: bits' = (|x|bits + (r & 0xFFFF)) & ~0xFFFF. The low 16 bits are
        the distance to the lower neighbour in units of 2^-16 ulp, so the add carries (rounds up) with
        probability exactly low16 / 2^16; a carry out of the mantissa bumps the exponent, which is the right
        upper neighbour. bf16 shares fp32's exponent range, so fp32 subnormals round the same way.
  fp16  distance to the two neighbours: ulp = 2^(max(e, -14) - 10) (e = the exponent of |x|; fp16's subnormal
        grid 2^-24 below 2^-14), t = |x| * (1 / ulp), lo = floor(t), frac = t - lo, round up iff
        r < frac * 2^32. Every step is exact in fp32 (power-of-two scalings, Sterbenz subtraction), so the
        torch reference reproduces it bit for bit. frac * 2^32 is an integer (the rounding exactly unbiased)
        for |x| >= 2^-33; below, truncating it biases by < 2^-32 of fp16's smallest subnormal.

Non-finite guard (a non-finite value must never reach the state; TensorRT-LLM #14509 found the same for SR'd
state): NaN -> 0, and |x| is clamped to the target's largest finite value before rounding, so +-inf and values
beyond it saturate to +-max and no carry can overflow to inf. Saturation is the only biased case.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SR_DTYPES = (torch.float16, torch.bfloat16)
FP16_MAX_BITS = 0x477FE000      # 65504.0 as fp32 bits
BF16_MAX_BITS = 0x7F7F0000      # bf16's largest finite (3.3895e38) as fp32 bits
FP32_INF_BITS = 0x7F800000
FP16_MIN_NORMAL_EXP = 113       # biased fp32 exponent of 2^-14; below it fp16's grid is 2^-24
U32 = 0xFFFFFFFF
BLOCK = 1024

# Philox4x32-10 constants (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3").
_MUL_A, _MUL_B = 0xD2511F53, 0xCD9E8D57      # multipliers of counter words 0 and 2
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85      # Weyl increments of key words 0 and 1


# ------------------------------------------------------------------------------------------------ Triton

@triton.jit
def sr_key(seed, step):
    """The Philox key of one (seed, step): int64, seed in the low word, step (mod 2^32) in the high word."""
    return (step.to(tl.int64) << 32) | (seed.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def sr_counter(slot, group):
    """The Philox counter (tl.randint4x's int64 offset) of element group `group` (flat index >> 2) of cache slot
    `slot`: its four output words are the draws of elements 4 group .. 4 group + 3."""
    return (slot.to(tl.int64) << 32) | (group.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _sr_words(key, counters):
    """The four uint32 Philox words at each counter (a separate function so a test can swap it for a mutant)."""
    return tl.randint4x(key, counters)


@triton.jit
def sr_draws(key, slot, first, COLS: tl.constexpr, ALIGNED: tl.constexpr):
    """The uint32 draws of a [R, COLS] tile whose row r holds the slot's elements first[r] .. first[r] + COLS - 1
    (first: [R] int). ALIGNED (the caller's promise: every first[r] is a multiple of 4) and COLS a multiple of 4:
    one Philox call per 4 elements on a [R, COLS / 4] tile, its words interleaved back, so out[r, 4i + j] is
    word j of group first[r] / 4 + i. Where the tile being rounded is in a blocked layout with 4 consecutive
    columns per thread (the baselines' steps) the interleave only regroups registers; where it comes out of an
    MMA (the folds: 2 columns per thread) the compiler moves the draws into its layout through shared memory, a
    few STS / LDS per tile, far less than the three Philox calls per 4 elements it saves. Otherwise (not
    ALIGNED) the same bits with one call per element, each keeping word (e mod 4)."""
    if ALIGNED and COLS % 4 == 0:
        group = (first >> 2)[:, None] + tl.arange(0, COLS // 4)[None, :]
        r0, r1, r2, r3 = _sr_words(key, sr_counter(slot, group))
        # interleave(a, b)[2i] = a[i], [2i + 1] = b[i]: twice gives out[4i + j] = r_j[i]
        r = tl.interleave(tl.interleave(r0, r2), tl.interleave(r1, r3))
    else:
        elem = first[:, None] + tl.arange(0, COLS)[None, :]
        r0, r1, r2, r3 = _sr_words(key, sr_counter(slot, elem >> 2))
        w = elem & 3
        r = tl.where(w == 0, r0, tl.where(w == 1, r1, tl.where(w == 2, r2, r3)))
    return r.to(tl.uint32, bitcast=True)


@triton.jit
def sr_round(x, key, slot, first, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """Stochastically round fp32 `x` [R, C] to DTYPE (tl.float16 / tl.bfloat16): row r holds the slot's elements
    first[r] .. first[r] + C - 1 (first [R] int: the flat index of the row's first element in the slot's block),
    drawn with key `key` and slot `slot`; ALIGNED: every first[r] is a multiple of 4 (sr_draws).

    Returns fp32 values exactly representable in DTYPE (store them into a DTYPE pointer: the conversion is
    exact), finite whatever `x` holds. Method and guard: see the module docstring. The draws and the rounding
    stay in 32-bit integers: r, the bf16 sum (< 2^31) and the fp16 threshold (< 2^32) all fit."""
    r = sr_draws(key, slot, first, x.shape[1], ALIGNED)
    bits = x.to(tl.int32, bitcast=True)
    sign = bits & -0x80000000
    mag = bits & 0x7FFFFFFF
    nan = mag > 0x7F800000
    sign = tl.where(nan, 0, sign)                                            # NaN -> +0
    mag = tl.where(nan, 0, mag)
    if DTYPE == tl.bfloat16:
        mag = tl.minimum(mag, 0x7F7F0000)                                    # inf / beyond max -> max
        mag = (mag + (r & 0xFFFF).to(tl.int32, bitcast=True)) & 0x7FFF0000  # <= 0x7F7FFFFF: no overflow
        y = sign | mag
    else:
        tl.static_assert(DTYPE == tl.float16, "sr_round: DTYPE must be tl.float16 or tl.bfloat16")
        mag = tl.minimum(mag, 0x477FE000)
        a = mag.to(tl.float32, bitcast=True)
        e_ulp = tl.maximum(mag >> 23, 113) - 10                              # biased exponent of the ulp
        ulp = (e_ulp << 23).to(tl.float32, bitcast=True)
        inv_ulp = ((254 - e_ulp) << 23).to(tl.float32, bitcast=True)
        t = a * inv_ulp                                                      # < 2^11, exact
        lo = t.to(tl.int32).to(tl.float32)                                   # floor (t >= 0)
        threshold = ((t - lo) * 4294967296.0).to(tl.uint32)                  # frac * 2^32 < 2^32
        q = lo + tl.where(r < threshold, 1.0, 0.0)
        y = sign | (q * ulp).to(tl.int32, bitcast=True)
    return y.to(tl.float32, bitcast=True)


@triton.jit
def _stochastic_round_kernel(x_ptr, out_ptr, slot_ptr, step_ptr, step_stride, seed, N,
                             DTYPE: tl.constexpr, AS_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (rows, cdiv(N, BLOCK)): row `row` of x [rows, N] fp32 -> out [rows, N] (DTYPE, or its int16 bit
    pattern when AS_BITS: the interpreter has no bf16 arithmetic, and a bit store is exact on GPU too)."""
    row = tl.program_id(0)
    first = tl.program_id(1) * BLOCK + tl.zeros([1], dtype=tl.int32)       # one [1, BLOCK] row: aligned
    elem = first[:, None] + tl.arange(0, BLOCK)[None, :]
    mask = elem < N
    slot = tl.load(slot_ptr + row)
    step = tl.load(step_ptr + row * step_stride)
    base = row.to(tl.int64) * N
    x = tl.load(x_ptr + base + elem, mask=mask, other=0.0)
    y = sr_round(x, sr_key(seed, step), slot, first, DTYPE, ALIGNED=True)
    if AS_BITS:
        y = (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
    tl.store(out_ptr + base + elem, y, mask=mask)


def _step_tensor(step, rows: int, device) -> torch.Tensor:
    if isinstance(step, torch.Tensor):
        if step.numel() not in (1, rows):
            raise ValueError(f"step must be a scalar or hold one entry per slot ({rows}), got {tuple(step.shape)}")
        return step.reshape(-1).to(device=device, dtype=torch.int64)
    return torch.tensor([int(step)], dtype=torch.int64, device=device)


def _check(x: torch.Tensor, seed: int, dtype: torch.dtype) -> None:
    if dtype not in SR_DTYPES:
        raise ValueError(f"stochastic rounding targets float16 or bfloat16, not {dtype}")
    if not 0 <= int(seed) <= U32:
        raise ValueError(f"seed must be a 32-bit unsigned integer, got {seed}")
    if x.dim() < 1:
        raise ValueError("x must be [slots, ...]")


def stochastic_round_(out: torch.Tensor, x: torch.Tensor, seed: int, slot_ids: torch.Tensor, step) -> torch.Tensor:
    """Write SR(x) into `out` (float16 / bfloat16, x's shape): x [slots, ...] float32, row i drawn with cache
    slot slot_ids[i] ([slots] int, >= 0) at `step` (int, or a device tensor [] / [slots]: graph-safe)."""
    _check(x, seed, out.dtype)
    if x.dtype != torch.float32 or out.shape != x.shape or not out.is_contiguous():
        raise ValueError("stochastic_round_: x must be float32 and out a contiguous tensor of x's shape")
    rows = x.shape[0]
    if slot_ids.shape != (rows,):
        raise ValueError(f"slot_ids must be [{rows}], got {tuple(slot_ids.shape)}")
    steps = _step_tensor(step, rows, x.device)
    n = x[0].numel() if rows else 0
    if n >= 2**31:
        raise ValueError("a slot holds fewer than 2^31 elements (int32 element indices in the kernel)")
    if rows == 0 or n == 0:
        return out
    as_bits = out.dtype == torch.bfloat16
    dst = out.view(torch.int16) if as_bits else out
    _stochastic_round_kernel[(rows, triton.cdiv(n, BLOCK))](
        x.contiguous(), dst, slot_ids.to(torch.int32), steps, 0 if steps.numel() == 1 else 1, int(seed), n,
        DTYPE=tl.bfloat16 if as_bits else tl.float16, AS_BITS=as_bits, BLOCK=BLOCK)
    return out


def quantize_sr(x: torch.Tensor, seed: int, slot_ids: torch.Tensor, step, dtype: torch.dtype) -> torch.Tensor:
    """SR of x [slots, ...] float32 to `dtype` (new tensor): see stochastic_round_."""
    _check(x, seed, dtype)
    return stochastic_round_(torch.empty(x.shape, dtype=dtype, device=x.device), x, seed, slot_ids, step)


# ------------------------------------------------------------------------------------------------ torch

def _mul32(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m, for a int64 in [0, 2^32) and a 32-bit constant m, in int64 without
    overflow: a is split into 16-bit halves so every partial product stays below 2^49."""
    p_lo = (a & 0xFFFF) * m
    mid = (a >> 16) * m + (p_lo >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (p_lo & 0xFFFF)


def philox_words(seed: int, slot, step, group: torch.Tensor) -> torch.Tensor:
    """The four uint32 Philox4x32-10 output words (as int64, stacked on a new last dim) at key (seed, step mod
    2^32) and counter (group, slot, 0, 0), as tl.randint4x defines them. slot, step: ints or int tensors
    broadcastable against group."""
    as_t = lambda v: torch.as_tensor(v, dtype=torch.int64, device=group.device) & U32
    c0, c1 = group.to(torch.int64) & U32, as_t(slot)
    c0, c1 = torch.broadcast_tensors(c0, c1)
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = as_t(seed), as_t(step)
    for _ in range(10):
        hi_a, lo_a = _mul32(c0, _MUL_A)
        hi_b, lo_b = _mul32(c2, _MUL_B)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & U32, (k1 + _KEY_B) & U32
    return torch.stack((c0, c1, c2, c3), dim=-1)


def philox_bits(seed: int, slot, step, elem: torch.Tensor) -> torch.Tensor:
    """The uint32 draws (as int64) that sr_round uses at (seed, slot, step, elem): word elem mod 4 of
    philox_words at group elem >> 2 (elem taken mod 2^32). slot, step: ints or int tensors broadcastable
    against elem."""
    e = elem.to(torch.int64) & U32
    words = philox_words(seed, slot, step, e >> 2)
    return words.gather(-1, (e & 3).expand(words.shape[:-1]).unsqueeze(-1)).squeeze(-1)


def sr_round_torch(x: torch.Tensor, seed: int, slot, step, dtype: torch.dtype) -> torch.Tensor:
    """The torch reference of sr_round, bit for bit: x [slots, ...] with slot a [slots] int tensor (step an int
    or a [] / [slots] tensor), or x one slot's block [...] with slot an int. x is rounded to float32 first (what
    a kernel holds), so a float64 oracle gets the kernel's quantisation and draws. Returns `dtype`."""
    _check(x.reshape(-1) if isinstance(slot, int) else x, seed, dtype)
    x32 = x.to(torch.float32).contiguous()
    if isinstance(slot, int):
        flat, slot_col, step_col = x32.reshape(1, -1), torch.tensor([slot]), torch.as_tensor(step).reshape(-1)
    else:
        flat, slot_col, step_col = x32.reshape(x32.shape[0], -1), slot, torch.as_tensor(step).reshape(-1)
    dev = x.device
    n = flat.shape[1]
    group = torch.arange((n + 3) // 4, dtype=torch.int64, device=dev)[None, :]
    words = philox_words(seed, slot_col.to(dev, torch.int64)[:, None], step_col.to(dev, torch.int64)[:, None],
                         group)                                          # [slots, groups, 4]: element 4 g + j
    r = words.reshape(words.shape[0], -1)[:, :n]
    bits = flat.view(torch.int32).to(torch.int64)
    sign, mag = bits & ~0x7FFFFFFF, bits & 0x7FFFFFFF
    nan = mag > FP32_INF_BITS
    sign, mag = torch.where(nan, 0, sign), torch.where(nan, 0, mag)
    if dtype == torch.bfloat16:
        mag = (mag.clamp_max(BF16_MAX_BITS) + (r & 0xFFFF)) & 0x7FFF0000
    else:
        mag = mag.clamp_max(FP16_MAX_BITS)
        a = mag.to(torch.int32).view(torch.float32).double()
        e_ulp = mag.div(2**23, rounding_mode="floor").clamp_min(FP16_MIN_NORMAL_EXP) - 10
        ulp = torch.pow(2.0, (e_ulp - 127).double())
        t = a / ulp                                                  # exact: power of two
        lo = t.floor()
        q = lo + (r < ((t - lo) * 2.0**32).floor().to(torch.int64)).double()
        mag = (q * ulp).float().view(torch.int32).to(torch.int64)
    y = (sign | mag).to(torch.int32).view(torch.float32).to(dtype)
    return y.reshape(x.shape)
