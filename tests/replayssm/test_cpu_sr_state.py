"""Stochastic-rounding state formats on the C backend (issue 36, deliverable 3): float16_sr / bfloat16_sr written by
the C AR kernels themselves (replayssm/cpu/kernels.c): ReplaySSM's AR flush of Mamba-2, GDN and KDA and the
baselines' AR steps (selective_state_update, fused_recurrent_step, KDA's through GDN's kernel).

Bit-exact where bit-exactness is defined: the C Philox draws are philox_bits', the C rounding of any float32 (every
bit pattern: NaN, inf, subnormals) is sr_round_torch's, and every state the kernels write is sr_round_torch of the
kernel's float32 value (a float32 copy of the state run by the same C code: the rounding is the only difference)
for the same (seed, slot, sr_step, element), over a run crossing several flushes with desynchronised cursors, permuted
slots and a NULL_SLOT row; every element on rows of a multiple of 16 (the vector paths), all but a rare element on
other rows (see Run); the output is the plain format's to the bit. Against the torch backend (another fp32
arithmetic) the same draws and counters, all but a rare element on the same 16-bit value and none more than one step
away (unless the value is below the fp32 error); against the float64 oracle (ref) and the unquantised recurrence,
the state-format tests' dtype-keyed tolerances. A deterministic-rounding mutant (the random word zeroed,
ops.SR_BITS_MASK = 0) fails the bit-exact checks. fp16 needs the compiler's _Float16 (skipped
without it, and refused with a clear error); int8 / e4m3 stay refused before any work."""

from __future__ import annotations

import pytest
import torch

from replayssm.checks import NULL_SLOT
from replayssm.cpu import ops
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry
from replayssm.state_format import FormattedState, set_state
from replayssm.stochastic_rounding import philox_bits, sr_round_torch
from replayssm.testing import poison_, rel_err
from tests.replayssm.test_state_formats import LOOSE, TIGHT, Family, run, truth

L, SLOTS, SEED = 4, 3, 0xDEADBEEF
ROW_SLOTS = [2, NULL_SLOT, 0, 1]
START_POS = [0, 1, 3]                  # desynchronised flushes: slot 2 flushes first, then every L steps
FAMILIES = ["mamba2", "gdn", "kda"]
STORAGE = {"float16_sr": torch.float16, "bfloat16_sr": torch.bfloat16}
# "grid": 64- and 16-wide rebuild tiles and 16-lane rows (the 8-lane SR store); "odd": rows of 20 / 6, the scalar
# loops (the one-element SR store)
GEOMS = {
    "mamba2": {"grid": Mamba2Geometry(nheads=4, headdim=8, dstate=80, ngroups=2),
               "odd": Mamba2Geometry(nheads=2, headdim=6, dstate=20, ngroups=1)},
    "gdn": {"grid": GDNGeometry(H=1, HV=2, K=80, V=8), "odd": GDNGeometry(H=1, HV=2, K=20, V=6)},
    "kda": {"grid": KDAGeometry(H=1, HV=2, K=80, V=8), "odd": KDAGeometry(H=1, HV=2, K=20, V=6)},
}


def _skip_without_fp16(fmt: str) -> None:
    if fmt == "float16_sr" and not ops.has_fp16():
        pytest.skip("this C compiler has no _Float16: no fp16 state kernels")


def _family(name: str, shape: str = "grid") -> Family:
    fam = Family(name)
    fam.geom = GEOMS[name][shape]
    return fam


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """A 16-bit float's position on the number line (neighbours differ by 1; +0 and -0 share 0)."""
    b = _bits(t).int()
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def _neighbours(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two 16-bit states of the same draws from float32 values that differ only by fp32 arithmetic: one step apart
    at most, except where the values themselves are below that arithmetic's error (a cancellation near zero, whose
    16-bit steps are finer than the fp32 error of the terms: 1e-6 of the state's scale)."""
    far = (_ordinal(a) - _ordinal(b)).abs() > 1
    tiny = (a.float() - b.float()).abs() <= 1e-6 * b.float().abs().max()
    return bool((~far | tiny).all())


# ------------------------------------------------------------------------------------------ the raw rule

def test_c_philox_draws_are_philox_bits(gen):
    for _ in range(6):
        seed, slot, step, e0 = (int(v) for v in torch.randint(0, 2**32, (4,), generator=gen, dtype=torch.int64))
        n = 8 * int(torch.randint(1, 6, (1,), generator=gen)) + int(torch.randint(0, 8, (1,), generator=gen))
        want = philox_bits(seed, slot, step, (torch.arange(n, dtype=torch.int64) + e0) & 0xFFFFFFFF)
        assert torch.equal(ops.philox(n, e0, slot, seed, step), want), (seed, slot, step, e0, n)


def _raw_inputs(gen) -> torch.Tensor:
    """[4, 1003] float32: every bit pattern at random (NaNs with payloads, +-inf, fp32 subnormals), values over
    fp16's whole range and subnormal grid, the guards' edges; 1003 = 125 8-lane groups and a scalar tail."""
    bits = torch.randint(-2**31, 2**31, (1, 1003), generator=gen, dtype=torch.int64).to(torch.int32)
    mant = torch.rand(2, 1003, generator=gen) * 2 - 1
    expo = torch.randint(-40, 17, (2, 1003), generator=gen).float()
    small = mant * torch.pow(2.0, expo)
    edges = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 65504.0, 65519.0, 65520.0, 7e4,
                          -7e4, 3.39e38, -3.4e38, 2.0**-14, 2.0**-24, 2.0**-25, 1e-45, -1e-40, 2.0**-33, 1.0, -1.5])
    x = torch.cat([bits.view(torch.float32), small, torch.randn(1, 1003, generator=gen)])
    x[3, :edges.numel()] = edges
    return x


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
def test_c_rounding_is_sr_round_torch_bit_for_bit(fmt, gen):
    x = _raw_inputs(gen)
    slots = torch.tensor([0, 5, 2**31 - 1, 3], dtype=torch.int32)
    steps = torch.tensor([0, 7, -1, 2**30], dtype=torch.int32)       # -1: the counter mod 2^32
    want = sr_round_torch(x, SEED, slots.long(), steps.long(), STORAGE[fmt])
    got = ops.sr_round(x, SEED, slots, steps, fmt)
    assert torch.equal(got, _bits(want))
    assert torch.isfinite(got.view(STORAGE[fmt]).float()).all()        # the guards: NaN -> 0, saturate


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
def test_zeroed_random_word_mutant_is_caught_on_the_raw_rule(fmt, gen, monkeypatch):
    x = torch.randn(2, 1003, generator=gen)
    slots, steps = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3, 4], dtype=torch.int32)
    want = _bits(sr_round_torch(x, SEED, slots.long(), steps.long(), STORAGE[fmt]))
    monkeypatch.setattr(ops, "SR_BITS_MASK", 0)
    got = ops.sr_round(x, SEED, slots, steps, fmt)
    assert not torch.equal(got, want)
    # deterministic: the same bits whatever the key (bf16 then truncates, fp16 rounds every inexact value away
    # from zero: r = 0 < frac 2^32)
    assert torch.equal(ops.sr_round(x, SEED ^ 1, slots + 1, steps + 5, fmt), got)


# ------------------------------------------------------------------------------------------ the kernels

class Run:
    """One family and kind ("replay" or "baseline") on four holders started from the same state: `sr` (the SR
    format, backend cpu), `rn` (the plain format of the same storage, cpu: the same kernel instantiation with the
    cast store), `f32` (float32, cpu: the kernel's value before rounding) and `ref` (the SR format, torch backend).
    rn, f32 and ref take sr's state after every step (no fp32 drift compounds).

    `exact`: the f32 kernel's value is the SR kernel's to the bit, and the output the plain store's. It is on the
    rows of a multiple of 16 (the explicit 8-lane paths, every production geometry). On other rows the scalar
    loops' reductions, which gcc vectorises at a width set by the state's dtype and by the store in the loop
    (-fassociative-math), may sum in another order, so a rare pre-rounding value differs in its last bit there
    (the outputs likewise, as plain float16 vs float32 do)."""

    def __init__(self, fam: Family, kind: str, fmt: str, gen: torch.Generator, route: str | None = None,
                 exact: bool = True):
        self.fam, self.kind, self.fmt, self.route, self.exact = fam, kind, fmt, route, exact
        self.params = fam.params(gen)
        self.slots = torch.tensor(ROW_SLOTS, dtype=torch.int32)
        S0 = fam.state(SLOTS, gen)
        if kind == "replay":
            alloc = lambda f: fam.cache_cls.allocate(fam.geom, SLOTS, L, state_dtype=f, sr_seed=SEED)
        else:
            alloc = lambda f: FormattedState.allocate(fam.shape(SLOTS), f, sr_seed=SEED)
        self.sr, self.ref, self.f32, self.rn = alloc(fmt), alloc(fmt), alloc("float32"), alloc(fmt[:-3])
        for h in (self.sr, self.ref):
            set_state(h, S0)
        self.f32.state.copy_(self.sr.state.float())
        self.rn.state.copy_(self.sr.state)
        if kind == "replay":
            for c in (self.sr, self.ref, self.f32, self.rn):
                c.write_pos.copy_(torch.tensor(START_POS, dtype=torch.int32))

    def call(self, holder, step: dict, backend: str) -> torch.Tensor:
        name = "x" if self.fam.name == "mamba2" else "v"
        out = poison_(torch.empty_like(step[name]))
        kw = dict(slots=self.slots, backend=backend, out=out)
        if self.kind == "replay":
            if self.route is not None:
                kw["route"] = self.route
            return self.fam.decode.replay_step(holder, **step, **self.params, **kw)
        mod = self.fam.baseline
        fn = mod.selective_state_update if self.fam.name == "mamba2" else mod.fused_recurrent_step
        return fn(holder, **step, **self.params, **kw)

    def flush_all(self) -> None:
        """Replay: every live row's next step is its flush."""
        if self.kind == "replay":
            for c in (self.sr, self.ref, self.f32, self.rn):
                c.write_pos.fill_(L - 1)

    def written(self) -> list[int]:
        if self.kind == "replay":
            return [s for s in ROW_SLOTS if s != NULL_SLOT and int(self.sr.write_pos[s]) == L - 1]
        return [s for s in ROW_SLOTS if s != NULL_SLOT]

    def step(self, step: dict) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on the four holders: (slots written, sr_step before, cpu SR output, torch output)."""
        before, written = self.sr.sr_step.clone(), self.written()
        o = self.call(self.sr, step, "cpu")
        o_rn = self.call(self.rn, step, "cpu")
        o32 = self.call(self.f32, step, "cpu")
        o_ref = self.call(self.ref, step, "torch")
        live = self.slots != NULL_SLOT
        assert torch.isnan(o[~live]).all() and torch.isfinite(o[live]).all(), "a live row unwritten / NULL row touched"
        if self.exact:
            assert torch.equal(o[live], o_rn[live]), "the rounding rule must not change the output"
        for other in (o_rn, o32):
            torch.testing.assert_close(o[live], other[live], rtol=1e-5, atol=1e-6)
        self.rn.state.copy_(self.sr.state)
        return written, before, o, o_ref

    def check_written(self, written: list[int], before: torch.Tensor) -> None:
        """The C SR write is sr_round_torch of the C float32 value, bit for bit; then the float32 copy takes the
        stored value (so both go on from the same state); a slot not written is untouched."""
        storage = self.sr.state.dtype
        for s in written:
            want = sr_round_torch(self.f32.state[s], SEED, s, int(before[s]), storage)
            if self.exact:
                assert torch.equal(_bits(self.sr.state[s]), _bits(want)), f"slot {s}"
            else:
                same = (_bits(self.sr.state[s]) == _bits(want)).double().mean().item()
                assert same >= 0.99, f"slot {s}: only {same:.4f} of the bits are the torch rule's"
                assert _neighbours(self.sr.state[s], want), f"slot {s}"
            self.f32.state[s] = self.sr.state[s].float()
        for s in (s for s in range(SLOTS) if s not in written):
            assert torch.equal(self.f32.state[s], self.sr.state[s].float()), f"slot {s} written off its step"


def _run_and_check(run: Run, gen, steps: int) -> int:
    writes = 0
    for _ in range(steps):
        written, before, o, o_ref = run.step(run.fam.inputs(len(ROW_SLOTS), gen))
        writes += len(written)
        run.check_written(written, before)
        expect = before.clone()                          # +1 per write of the slot, nothing else
        expect[written] += 1
        assert torch.equal(run.sr.sr_step, expect) and torch.equal(run.sr.sr_step, run.ref.sr_step)
        live = run.slots != NULL_SLOT
        torch.testing.assert_close(o[live].double(), o_ref[live].double(), rtol=2e-3, atol=2e-3)
        same = (_bits(run.sr.state) == _bits(run.ref.state)).double().mean().item()
        assert same >= 0.99, f"only {same:.4f} of the stored bits equal the torch backend's"
        assert _neighbours(run.sr.state, run.ref.state)
        for name, t in run.ref.tensors().items():
            t.copy_(run.sr.tensors()[name])
    return writes


@pytest.mark.parametrize("shape", ["grid", "odd"])
@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_sr_write_is_the_torch_rule_bit_for_bit(family, kind, fmt, shape, gen):
    _skip_without_fp16(fmt)
    run = Run(_family(family, shape), kind, fmt, gen, exact=shape == "grid")
    steps = 3 * L + 1
    writes = _run_and_check(run, gen, steps)
    # replay: slot 2 flushes at steps 0, 4, 8, 12, slot 0 at 3, 7, 11, slot 1 at 2, 6, 10; baseline: every step
    assert writes == (10 if kind == "replay" else steps * SLOTS)
    assert run.sr.sr_step.tolist() == ([4, 4, 5] if kind == "replay" else [1 + steps] * SLOTS)   # set_state: 1


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
def test_mamba2_state_and_output_route_flushes_the_same_way(fmt, gen):
    """The C Mamba-2 kernel's two routes differ in the normal step only; the flush (the SR write) is one code."""
    _skip_without_fp16(fmt)
    run = Run(_family("mamba2"), "replay", fmt, gen, route="state_and_output")
    assert _run_and_check(run, gen, 2 * L) == 6


@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_zeroed_random_word_mutant_fails_the_kernel_check(family, kind, gen, monkeypatch):
    """Every draw zeroed (deterministic rounding): the written states are no longer the torch rule's."""
    fmt = "float16_sr" if ops.has_fp16() else "bfloat16_sr"
    run = Run(_family(family), kind, fmt, gen)
    run.flush_all()                    # every live row flushes
    monkeypatch.setattr(ops, "SR_BITS_MASK", 0)
    written, before, _, _ = run.step(run.fam.inputs(len(ROW_SLOTS), gen))
    assert written and torch.equal(run.sr.sr_step[written], before[written] + 1)
    with pytest.raises(AssertionError, match="slot"):
        run.check_written(written, before)


@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_draws_depend_on_seed_and_counter(family, kind, gen):
    """The same seed and counters store the same bits; another seed, or the counters one write further, others."""
    fmt = "bfloat16_sr"
    step = _family(family).inputs(len(ROW_SLOTS), gen)
    stored = []
    for seed, bump in ((SEED, 0), (SEED, 0), (SEED ^ 1, 0), (SEED, 1)):
        r = Run(_family(family), kind, fmt, torch.Generator().manual_seed(7))
        r.sr.sr_seed = seed
        r.sr.sr_step += bump
        if kind == "replay":
            r.sr.write_pos.fill_(L - 1)
        r.call(r.sr, step, "cpu")
        stored.append(_bits(r.sr.state).clone())
    assert torch.equal(stored[0], stored[1])
    assert not torch.equal(stored[0], stored[2]) and not torch.equal(stored[0], stored[3])


@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_non_finite_values_never_reach_the_sr_state(family, kind, gen):
    """A NaN and an inf in the step's input: the stored state stays finite and is still sr_round_torch of the
    kernel's float32 value (NaN -> 0, +-inf saturated)."""
    run = Run(_family(family), kind, "bfloat16_sr", gen)
    run.flush_all()
    step = run.fam.inputs(len(ROW_SLOTS), gen)
    name = "x" if family == "mamba2" else "v"
    step[name][0].view(-1)[0] = float("nan")
    step[name][2].view(-1)[1] = float("inf")
    before, written = run.sr.sr_step.clone(), run.written()
    for h in (run.sr, run.f32):
        run.call(h, step, "cpu")
    assert not torch.isfinite(run.f32.state[ROW_SLOTS[0]]).all()        # the kernel's value did go non-finite
    assert torch.isfinite(run.sr.state.float()).all()
    run.check_written(written, before)


# ------------------------------------------------------------------------------------------ float64 oracle

@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_matches_the_quantising_oracle_and_the_float64_recurrence(family, kind, fmt, gen):
    """A 3L-step run, never re-synchronised: against ref (float64, the same quantisation and draws) within the
    state-format tests' tight tolerance of the dtype, against the unquantised float64 recurrence within the loose."""
    _skip_without_fp16(fmt)
    fam = _family(family)
    params = fam.params(gen)
    S0 = fam.state(SLOTS, gen)
    steps = [fam.inputs(len(ROW_SLOTS), gen) for _ in range(3 * L)]
    outs_c, final_c, held = run(fam, kind, fmt, "cpu", S0, steps, params)
    outs_r, final_r, held_r = run(fam, kind, fmt, "ref", S0, steps, params)
    outs_x, final_x = truth(fam, S0, steps, params)
    live = [r for r, s in enumerate(ROW_SLOTS) if s != NULL_SLOT]
    for i, (oc, orf, ox) in enumerate(zip(outs_c, outs_r, outs_x)):
        assert rel_err(oc[live], orf[live]) <= TIGHT[fmt], f"step {i}: cpu vs ref output"
        assert rel_err(oc[live], ox[live]) <= LOOSE[fmt], f"step {i}: cpu vs float64 output"
    assert rel_err(final_c, final_r) <= TIGHT[fmt], "cpu vs ref state"
    assert rel_err(final_c, final_x) <= LOOSE[fmt], "cpu vs float64 state"
    assert torch.equal(held.sr_step, held_r.sr_step)


# ------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fmt", ["int8", "float8_e4m3fn"])
def test_formats_without_c_kernels_are_refused_before_any_work(family, fmt, gen):
    fam = _family(family)
    params, step = fam.params(gen), fam.inputs(2, gen)
    cache = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt)
    set_state(cache, fam.state(2, gen))
    before = cache.clone()
    # (an fp8 storage tensor may be refused by replayssm/checks.py's check_backend instead: no fp8 state kernels)
    why = rf"backend='cpu'.*({fmt}.*float32, float16, bfloat16, float16_sr, bfloat16_sr.*'torch' and 'ref' only|fp8)"
    with pytest.raises(ValueError, match=why):
        fam.replay(cache, step, params, None, "cpu")
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name
    state = FormattedState.allocate(fam.shape(2), fmt)
    with pytest.raises(ValueError, match=rf"backend='cpu'.*{fmt}.*float16_sr, bfloat16_sr"):
        fam.base(state, step, params, None, "cpu")
    assert not state.state.float().any()


@pytest.mark.parametrize("kind", ["replay", "baseline"])
def test_float16_sr_without_float16_is_a_clear_error(kind, gen, monkeypatch):
    monkeypatch.setattr(ops, "has_fp16", lambda: False)       # a compiler without _Float16
    fam = _family("gdn")
    step = fam.inputs(2, gen)
    if kind == "replay":
        holder = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype="float16_sr")
        holder.write_pos.fill_(1)
    else:
        holder = FormattedState.allocate(fam.shape(2), "float16_sr")
    before = {n: t.clone() for n, t in holder.tensors().items()}
    with pytest.raises(ValueError, match=r"backend='cpu' has no kernel for .* dtype torch.float16.*_Float16"):
        (fam.replay if kind == "replay" else fam.base)(holder, step, {}, None, "cpu")
    for name, t in holder.tensors().items():
        assert torch.equal(t, before[name]), name
