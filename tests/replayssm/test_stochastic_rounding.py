"""Counter-based stochastic rounding (replayssm/stochastic_rounding.py): the torch Philox (against tl.randint4x
and Philox4x32-10's known answer) and rounding reference against the Triton kernel bit for bit (fp16 and bf16:
bf16 is rounded on int32 bit patterns and stored as int16 bits, which the interpreter runs exactly), the mapping
of draws to elements (element 4i + j: word j of counter i, on the one-call-per-four path and its fallback), the
statistics (unbiased, Bernoulli variance, tracks an fp64 sum where round-to-nearest stalls; a deterministic-bits
mutant is caught), the keying of the draws (fresh per slot, step and seed, repeatable, independent of the row
that carries the slot) and the non-finite guard."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

import replayssm.stochastic_rounding as sr
from replayssm.checks import interpreter_active
from replayssm.stochastic_rounding import (
    philox_bits,
    philox_words,
    quantize_sr,
    sr_counter,
    sr_draws,
    sr_key,
    sr_round_torch,
)

DTYPES = [torch.float16, torch.bfloat16]
MBITS = {torch.float16: 10, torch.bfloat16: 7}             # stored mantissa bits
MIN_EXP = {torch.float16: -14, torch.bfloat16: -126}      # exponent of the smallest normal
Z = 5.0                                                    # standard errors a statistical check may stray


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def rand_slots(gen, rows: int) -> torch.Tensor:
    return torch.randperm(1 << 12, generator=gen)[:rows].to(torch.int32)


def rand_int(gen, hi: int) -> int:
    return int(torch.randint(0, hi, (1,), generator=gen))


def between(gen, dtype, subnormal: bool, p_range=(0.05, 0.95)) -> tuple[float, float, float]:
    """(x, gap, p): x = lo + p * gap exactly in fp32, lo a random `dtype` value, gap its neighbour distance."""
    m = MBITS[dtype]
    if subnormal:                                           # lo = k * 2^(MIN_EXP - m), k in [1, 2^m)
        k, e = 1 + rand_int(gen, (1 << m) - 1), MIN_EXP[dtype]
    else:                                                   # lo = k * 2^(e - m), k in [2^m, 2^(m+1) - 1)
        k, e = (1 << m) + rand_int(gen, (1 << m) - 1), rand_int(gen, 12) - 6
    gap = 2.0 ** (e - m)
    j = round(4096 * (p_range[0] + (p_range[1] - p_range[0]) * float(torch.rand((), generator=gen))))
    sign = 1.0 if rand_int(gen, 2) else -1.0
    return sign * (k + j / 4096) * gap, gap, j / 4096


def assert_unbiased(draws: torch.Tensor, x: float, gap: float, p: float) -> None:
    """The mean of the draws is x within Z standard errors, SE = gap * sqrt(p (1 - p) / N)."""
    n = draws.numel()
    se = gap * math.sqrt(p * (1 - p) / n)
    mean = draws.double().mean().item()
    assert abs(mean - x) <= Z * se, f"mean {mean!r} vs x {x!r}: off by {abs(mean - x) / se:.1f} SE (SE {se:.3e})"


def sr_of_constant(x: float, dtype, gen, n: int = 1 << 15, device: str = "cpu") -> torch.Tensor:
    X = torch.full((4, n // 4), x, dtype=torch.float32, device=device)
    return quantize_sr(X, rand_int(gen, 2**32), rand_slots(gen, 4).to(device), rand_int(gen, 2**31), dtype)


# ------------------------------------------------------------------------------------ bit-exact agreement

@triton.jit
def _words_kernel(out_ptr, seed, slot, step_ptr, N, BLOCK: tl.constexpr):
    group = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    step = tl.load(step_ptr)
    r0, r1, r2, r3 = tl.randint4x(sr_key(seed, step), sr_counter(slot, group))
    tl.store(out_ptr + group * 4, r0.to(tl.int64), mask=group < N)
    tl.store(out_ptr + group * 4 + 1, r1.to(tl.int64), mask=group < N)
    tl.store(out_ptr + group * 4 + 2, r2.to(tl.int64), mask=group < N)
    tl.store(out_ptr + group * 4 + 3, r3.to(tl.int64), mask=group < N)


@triton.jit
def _draws_kernel(out_ptr, seed, slot, step, first_ptr, COLS: tl.constexpr, ROWS: tl.constexpr,
                  ALIGNED: tl.constexpr):
    rows = tl.arange(0, ROWS)
    first = tl.load(first_ptr + rows)
    r = sr_draws(sr_key(seed, step), slot, first, COLS, ALIGNED)
    tl.store(out_ptr + rows[:, None] * COLS + tl.arange(0, COLS)[None, :], r.to(tl.int64))


def test_philox_reference_matches_tl_randint4x(gen, device):
    n = 300
    for _ in range(4):
        seed, slot, step = rand_int(gen, 2**32), rand_int(gen, 2**31), rand_int(gen, 2**32)
        out = torch.empty(n, 4, dtype=torch.int64, device=device)
        _words_kernel[(triton.cdiv(n, 128),)](out, seed, slot, torch.tensor([step], device=device), n, BLOCK=128)
        ref = philox_words(seed, slot, step, torch.arange(n, device=device))
        assert torch.equal(out, ref)
        assert out.min() >= 0 and out.max() < 2**32 and out.unique().numel() == 4 * n
    # the step enters the key mod 2^32 (documented wrap)
    assert torch.equal(philox_words(7, 3, 5, torch.arange(8)), philox_words(7, 3, 5 + 2**32, torch.arange(8)))
    # Philox4x32-10's known answer (Random123's kat_vectors, key 0, counter 0): the words in their standard order
    assert philox_words(0, 0, 0, torch.zeros(1)).tolist() == [[0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]]


def test_element_4i_plus_j_draws_word_j_of_counter_i(gen, device):
    """The mapping: element e draws word e mod 4 of the call at counter (slot, e >> 2), in the reference, in the
    kernel's one-call-per-four path (aligned rows) and in its one-call-per-element fallback (any row start)."""
    seed, slot, step = rand_int(gen, 2**32), rand_int(gen, 2**31), rand_int(gen, 2**32)
    words = philox_words(seed, slot, step, torch.arange(64))
    assert torch.equal(philox_bits(seed, slot, step, torch.arange(256)), words.reshape(-1))
    assert torch.equal(philox_bits(seed, slot, step, torch.tensor([4 * 9 + 2])), words[9, 2:3])
    cols = 32
    for aligned, first in ((True, [0, 36, 4 * 1000, 2**31 - 32]), (False, [0, 37, 4 * 1000 + 3, 2**31 - 33])):
        first_t = torch.tensor(first, dtype=torch.int64)
        out = torch.empty(len(first), cols, dtype=torch.int64, device=device)
        _draws_kernel[(1,)](out, seed, slot, step, first_t.to(device), COLS=cols, ROWS=len(first), ALIGNED=aligned)
        ref = philox_bits(seed, slot, step, first_t[:, None] + torch.arange(cols)[None, :])
        assert torch.equal(out.cpu(), ref), aligned


def mixed_inputs(gen, shape, dtype) -> torch.Tensor:
    """Values across the target's whole range: normals, subnormal-target values, fp32 subnormals (bf16), exact
    target values, signed zeros, the largest finite, values beyond it and non-finite ones."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-30, 17, shape, generator=gen).float())
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randperm(n, generator=gen)
    q = n // 8
    flat[idx[:q]] = torch.randn(q, generator=gen).to(dtype).float()                 # exact: must stay put
    flat[idx[q:2 * q]] = torch.randn(q, generator=gen) * (2.0 ** -24 if dtype == torch.float16 else 2.0 ** -133)
    fmax = torch.finfo(dtype).max
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, fmax, -fmax, 1.0001 * fmax, 3.0e38, -3.4e38, 1e-45]
    flat[idx[2 * q:2 * q + len(specials)]] = torch.tensor(specials)
    return x


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_torch_reference_bit_for_bit(dtype, gen, device):
    rows = 3
    x = mixed_inputs(gen, (rows, 5, 77), dtype)
    slots, seed = rand_slots(gen, rows), rand_int(gen, 2**32)
    for step in (rand_int(gen, 2**31), torch.randint(0, 2**32, (rows,), generator=gen)):
        step_dev = step.to(device) if isinstance(step, torch.Tensor) else step
        out = quantize_sr(x.to(device), seed, slots.to(device), step_dev, dtype).cpu()
        ref = sr_round_torch(x, seed, slots, step, dtype)
        assert out.dtype == ref.dtype == dtype and out.shape == x.shape
        assert torch.equal(as_bits(out), as_bits(ref)), f"{int((as_bits(out) != as_bits(ref)).sum())} mismatches"
        # one slot's block through the reference's int-slot form draws the same bits
        assert torch.equal(as_bits(sr_round_torch(x[1], seed, int(slots[1]), step if isinstance(step, int)
                                                  else step[1:2], dtype)), as_bits(ref[1]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_output_is_a_neighbour_and_exact_values_stay(dtype, gen):
    x = torch.randn(2, 4096, generator=gen) * 2.0 ** rand_int(gen, 8)
    y = sr_round_torch(x, rand_int(gen, 2**32), torch.tensor([3, 9]), rand_int(gen, 100), dtype).double()
    down = x.to(dtype).double()                                   # RN: one of the two neighbours
    e = torch.floor(torch.log2(x.double().abs())).clamp_min(MIN_EXP[dtype])
    gap = torch.exp2(e - MBITS[dtype])
    lo = torch.floor(x.double() / gap) * gap                      # the neighbours around x
    assert ((y == lo) | (y == lo + gap)).all() and ((down == lo) | (down == lo + gap)).all()
    exact = x.to(dtype).float()
    assert torch.equal(quantize_sr(exact, rand_int(gen, 2**32), torch.tensor([3, 9]), 1, dtype), exact.to(dtype))


# --------------------------------------------------------------------------------------------- statistics

@pytest.mark.parametrize("subnormal", [False, True], ids=["normal", "subnormal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unbiased_with_bernoulli_variance(dtype, subnormal, gen, device):
    for _ in range(2):
        x, gap, p = between(gen, dtype, subnormal)
        y = sr_of_constant(x, dtype, gen, device=device).double().cpu()
        lo = math.floor(x / gap) * gap
        assert ((y == lo) | (y == lo + gap)).all()
        assert_unbiased(y, x, gap, p)
        # variance p (1 - p) gap^2: its estimate's SE by the delta method, |1 - 2p| sqrt(p (1 - p) / N) gap^2
        n = y.numel()
        var = y.var(correction=0).item()
        se_var = gap**2 * (abs(1 - 2 * p) * math.sqrt(p * (1 - p) / n) + 1.0 / n)
        assert abs(var - p * (1 - p) * gap**2) <= Z * se_var, (var, p * (1 - p) * gap**2, se_var)


@pytest.mark.skipif(not interpreter_active(), reason="swaps a @triton.jit dependency: interpreter only")
@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_bits_mutant_fails_the_unbiasedness_check(dtype, gen, monkeypatch):
    x, gap, p = between(gen, dtype, False, p_range=(0.15, 0.35) if rand_int(gen, 2) else (0.65, 0.85))
    assert_unbiased(sr_of_constant(x, dtype, gen), x, gap, p)          # the real draws pass

    @triton.jit
    def constant_words(key, counters):
        half = (counters * 0 + 0x80000000).to(tl.uint32)              # half-way: round-to-nearest in disguise
        return half, half, half, half

    monkeypatch.setattr(sr, "_sr_words", constant_words)
    with pytest.raises(AssertionError, match="SE"):
        assert_unbiased(sr_of_constant(x, dtype, gen), x, gap, p)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sr_accumulator_tracks_the_fp64_sum_where_round_to_nearest_stalls(dtype, gen):
    """Add K sub-half-ulp increments into a `dtype` accumulator, rounding after every add (as a state written
    back each decode step). The step is a device tensor bumped in place, as a replayed CUDA graph would."""
    rows, n, K = 2, 256, 192
    gap = 2.0 ** -MBITS[dtype]                                              # accumulator in [1, 2)
    v = (1.0 + torch.randint(0, 1 << (MBITS[dtype] - 2), (rows, n), generator=gen) * gap).to(dtype)
    units = int(gap * 2**23)                                               # fp32 ulps in one gap
    delta = torch.randint(units // 8, units // 3, (rows, n), generator=gen).float() * 2.0 ** -23
    exact = v.double() + K * delta.double()
    acc_sr, acc_rn = v.clone(), v.clone()
    seed, slots, step = rand_int(gen, 2**32), rand_slots(gen, rows), torch.tensor(rand_int(gen, 2**20))
    for _ in range(K):
        acc_sr = quantize_sr(acc_sr.float() + delta, seed, slots, step, dtype)
        acc_rn = (acc_rn.float() + delta).to(dtype)
        step += 1
    err_sr, err_rn = acc_sr.double() - exact, acc_rn.double() - exact
    assert torch.equal(acc_rn, v)                                           # RN never moves
    assert (err_rn <= -(K // 8 - 1) * gap).all()
    # SR: each error is a sum of K zero-mean steps bounded by one gap (Hoeffding: 6 sqrt(K) gaps ~ 1e-8 per elt)
    assert err_sr.abs().max() <= 6 * math.sqrt(K) * gap, err_sr.abs().max() / gap
    se = math.sqrt(K / 4 / err_sr.numel()) * gap                           # per-step variance <= gap^2 / 4
    assert abs(err_sr.mean().item()) <= Z * se, (err_sr.mean().item() / gap, se / gap)


# ----------------------------------------------------------------------------------------- keying of draws

@pytest.mark.parametrize("dtype", DTYPES)
def test_draws_are_fresh_per_slot_step_seed_and_repeat_for_the_same_key(dtype, gen):
    x, gap, _ = between(gen, dtype, False, p_range=(0.5, 0.5))
    X = torch.full((1, 4096), x)
    seed, slot, step = rand_int(gen, 2**31), rand_int(gen, 1000), rand_int(gen, 2**31)
    run = lambda seed=seed, slot=slot, step=step: quantize_sr(X, seed, torch.tensor([slot]), step, dtype)
    base = run()
    up = (base.double() > x).double().mean().item()
    assert abs(up - 0.5) <= 0.1                                              # within a call: fresh per element
    assert torch.equal(as_bits(run()), as_bits(base))                        # same key: same draws
    for other in (run(slot=slot + 1), run(step=step + 1), run(seed=seed + 1), run(step=step + 2**20)):
        differ = (other != base).double().mean().item()                     # independent: 2 p (1 - p) = 1/2
        assert abs(differ - 0.5) <= 0.1, differ
    # the draws follow the slot id, not the row that carries it in a batch
    batch = quantize_sr(X.expand(3, -1).contiguous(), seed, torch.tensor([slot + 7, slot, slot + 3]), step, dtype)
    assert torch.equal(as_bits(batch[1]), as_bits(base[0]))
    steps = torch.tensor([step + 1, step, step + 2])                         # and a per-slot step tensor
    batch = quantize_sr(X.expand(3, -1).contiguous(), seed, torch.tensor([slot + 7, slot, slot + 3]), steps, dtype)
    assert torch.equal(as_bits(batch[1]), as_bits(base[0]))


# ------------------------------------------------------------------------------------------ non-finite guard

@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_inputs_are_never_stored(dtype, gen, device):
    fmax = torch.finfo(dtype).max
    beyond = [math.inf, 1.0001 * fmax, 3.4e38, torch.finfo(torch.float32).max]
    if dtype == torch.float16:
        beyond += [65519.99, 7e4]                                          # RN would give 65504 / inf
    beyond = torch.tensor(beyond)
    nan = torch.tensor([math.nan, -math.nan, float.fromhex("0x1.8p+0") * math.nan])
    fine = torch.randn(40, generator=gen)
    x = torch.cat([beyond, -beyond, nan, fine, torch.tensor([fmax, -fmax])])[None].repeat(2, 1)
    seed, slots, step = rand_int(gen, 2**32), rand_slots(gen, 2), rand_int(gen, 2**31)
    out = quantize_sr(x.to(device), seed, slots.to(device), step, dtype).cpu()
    assert torch.equal(as_bits(out), as_bits(sr_round_torch(x, seed, slots, step, dtype)))
    assert torch.isfinite(out).all()
    nb = len(beyond)
    assert (out[:, :nb] == fmax).all() and (out[:, nb:2 * nb] == -fmax).all()
    assert torch.equal(as_bits(out[:, 2 * nb:2 * nb + 3]), torch.zeros(2, 3, dtype=torch.int16))  # NaN -> +0
    assert (out[:, -2:].double() == torch.tensor([fmax, -fmax], dtype=torch.float64)).all()


def test_argument_checks():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        quantize_sr(x, 0, torch.tensor([0, 1]), 0, torch.float32)
    with pytest.raises(ValueError, match="seed"):
        quantize_sr(x, 2**32, torch.tensor([0, 1]), 0, torch.float16)
    with pytest.raises(ValueError, match="step"):
        quantize_sr(x, 1, torch.tensor([0, 1]), torch.zeros(3, dtype=torch.int64), torch.float16)
    with pytest.raises(ValueError, match="slot_ids"):
        quantize_sr(x, 1, torch.tensor([0]), 0, torch.float16)
