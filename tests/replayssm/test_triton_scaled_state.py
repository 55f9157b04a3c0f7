"""int8 / float8_e4m3fn checkpoints on the Triton backend (issue 36): ReplaySSM's AR folds (GDN / KDA
output_only_fold, Mamba-2 output_only) store the scaled formats, their steps and materialize read them.

Bit-exact: a flush stores state_format.quantize_scaled of the kernel's own float32 value, q and scale, bit for bit;
that value is the same kernel's on a float32 copy of the state holding the dequantised numbers (the fold
dequantises element by element, as state_format.dequantize does, so the two launches differ only in the store).
The readout applies the scale to its sums, not to each element, so its outputs equal the float32 copy's up to
fp32 rounding; for GDN / KDA those outputs' u rows enter the buffer the fold replays, so there the stored values
are quantize_scaled's of a value equal up to fp32 rounding: the same q but for a rare neighbour, the scale within
an ulp (Mamba-2's fold replays inputs only: bit for bit). Against the float64 oracle ("ref" backend, the same
quantisation in float64) the outputs agree within the format's quantum. A NaN / inf never reaches the stored
state or its scale, rows off their flush step and null slots are never written, and every other Triton kernel
refuses the scaled formats before any launch. The mutant check: an int8 store without the rounding (a
truncating conversion) fails the bit-exact tests."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.scaled_rounding import finite_absmax_rows, head_scale, quantize
from replayssm.state_format import (
    TRITON_SCALED_KERNELS,
    FormattedState,
    dequantize,
    quantize_scaled,
    scaled_args,
    set_state,
    state_format,
)
from replayssm.testing import rel_err, tolerance
from tests.replayssm.test_state_formats import Family

L, SLOTS = 4, 3
ROW_SLOTS = [2, NULL_SLOT, 0, 1]
ROUTE = {"mamba2": "output_only", "gdn": "output_only_fold", "kda": "output_only_fold"}
FAMILIES = ["mamba2", "gdn", "kda"]
FORMATS = ["int8", "float8_e4m3fn"]
QUANTUM = {"int8": 1 / 127, "float8_e4m3fn": 2 ** -3}     # relative step of the format near its absmax


def _device() -> str:
    if interpreter_active():
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or a GPU")
    return "cuda"


def _to(d: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """An 8-bit value's position on its grid (neighbours differ by 1): int8 itself, e4m3 by sign and magnitude."""
    if t.dtype == torch.int8:
        return t.cpu().int()
    b = _bits(t).int()
    return torch.where(b >= 128, -(b & 0x7F), b)


class Run:
    """One family on three caches started from the same state: `sc` (the scaled format, Triton), `f32` (float32,
    Triton: the kernel's value before the store) and `ref` (the scaled format, the float64 oracle)."""

    def __init__(self, family: str, fmt: str, device: str, gen: torch.Generator):
        self.fam, self.fmt, self.device = Family(family), fmt, device
        self.params = _to(self.fam.params(gen), device)
        self.slots = torch.tensor(ROW_SLOTS, dtype=torch.int32, device=device)
        alloc = lambda f: self.fam.cache_cls.allocate(self.fam.geom, SLOTS, L, state_dtype=f, device=device)
        self.sc, self.ref, self.f32 = alloc(fmt), alloc(fmt), alloc("float32")
        S0 = self.fam.state(SLOTS, gen) * torch.logspace(-2, 1, SLOTS, dtype=torch.float64)[:, None, None, None]
        for c in (self.sc, self.ref):
            set_state(c, S0.to(device))
        for c in (self.sc, self.ref, self.f32):
            c.write_pos.copy_(torch.tensor([0, 1, 3], dtype=torch.int32))        # desynchronised flushes
        self.f32.state.copy_(dequantize(self.sc.state, self.sc.state_scale))

    def call(self, cache, step: dict, backend: str) -> torch.Tensor:
        return self.fam.decode.replay_step(cache, **step, **self.params, slots=self.slots, backend=backend,
                                           route=ROUTE[self.fam.name])

    def step(self, step: dict) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """One step on the three caches: (slots written, Triton output, oracle output)."""
        step = _to(step, self.device)
        written = [s for s in ROW_SLOTS if s != NULL_SLOT and int(self.sc.write_pos[s]) == L - 1]
        self.before = (self.sc.state.clone(), self.sc.state_scale.clone())
        o = self.call(self.sc, step, "triton")
        o32 = self.call(self.f32, step, "triton")
        o_ref = self.call(self.ref, step, "ref")
        live = self.slots != NULL_SLOT
        # the scale on the sums against the dequantised state's readout: equal up to fp32 rounding, pooled (an
        # element whose terms cancel differs relatively more: seed 933894817, Mamba-2 int8), non-finite alike
        finite = torch.isfinite(o32[live])
        assert torch.equal(finite, torch.isfinite(o[live]))
        assert rel_err(o[live][finite], o32[live][finite]) <= tolerance(torch.float32)
        return written, o, o_ref

    def check_written(self, written: list[int]) -> None:
        """The store is quantize_scaled of the float32 kernel's value, q and scale bit for bit; then the float32
        copy takes the stored (dequantised) value, so both go on from the same numbers."""
        for s in written:
            q, scale = quantize_scaled(self.f32.state[s].cpu(), self.fmt)
            if self.fam.name == "mamba2":
                assert torch.equal(_bits(self.sc.state[s]), _bits(q)), f"slot {s}: stored values"
                assert torch.equal(self.sc.state_scale[s].cpu(), scale), f"slot {s}: scale"
            else:
                same = (_bits(self.sc.state[s]) == _bits(q)).double().mean().item()
                assert same >= 0.99, f"slot {s}: only {same:.4f} of the stored values are quantize_scaled's"
                assert (_ordinal(self.sc.state[s]) - _ordinal(q)).abs().max() <= 1, f"slot {s}: not neighbours"
                torch.testing.assert_close(self.sc.state_scale[s].cpu(), scale, rtol=1e-6, atol=0)
            self.f32.state[s] = dequantize(self.sc.state[s], self.sc.state_scale[s])
        for s in (s for s in range(SLOTS) if s not in written):
            assert torch.equal(_bits(self.sc.state[s]), _bits(self.before[0][s])), f"slot {s} written off its step"
            assert torch.equal(self.sc.state_scale[s], self.before[1][s]), f"slot {s}: scale written off its step"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_scaled_write_is_the_torch_rule_bit_for_bit(family, fmt, gen):
    run = Run(family, fmt, _device(), gen)
    flushed = 0
    for _ in range(3 * L):
        written, o, o_ref = run.step(run.fam.inputs(len(ROW_SLOTS), gen))
        flushed += len(written)
        run.check_written(written)
        # against the float64 oracle: its own quantisation of (up to fp32 rounding) the same state, so a stored
        # value may sit one quantum away; the outputs agree within the format's step of the state's size
        live = run.slots != NULL_SLOT
        scale = o_ref[live].double().abs().amax().item()
        torch.testing.assert_close(o[live].double(), o_ref[live].double(), rtol=0, atol=QUANTUM[fmt] * scale)
        for name, t in run.ref.tensors().items():      # the next step from the same state (no drift compounds)
            t.copy_(run.sc.tensors()[name].to(t.dtype))
    assert flushed >= 2 * SLOTS


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_non_finite_values_never_reach_the_scaled_state(family, fmt, gen):
    """A NaN and an inf in the step's input: the stored state and its scale stay finite (the absmax over the
    finite elements, NaN -> 0, inf saturated), and still equal quantize_scaled of the kernel's float32 value."""
    run = Run(family, fmt, _device(), gen)
    for c in (run.sc, run.f32, run.ref):
        c.write_pos.fill_(L - 1)
    step = run.fam.inputs(len(ROW_SLOTS), gen)
    name = "x" if family == "mamba2" else "v"
    step[name][0].view(-1)[0] = float("nan")
    step[name][2].view(-1)[1] = float("inf")
    written, _, _ = run.step(step)
    assert not torch.isfinite(run.f32.state[ROW_SLOTS[0]]).all()       # the kernel's value did go non-finite
    assert torch.isfinite(run.sc.state.float()).all() and torch.isfinite(run.sc.state_scale).all()
    run.check_written(written)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_materialize_reads_the_scale(family, fmt, gen):
    run = Run(family, fmt, _device(), gen)
    for _ in range(2):
        written, _, _ = run.step(run.fam.inputs(len(ROW_SLOTS), gen))
        run.check_written(written)
    got = run.fam.materialize(run.sc, run.params, "triton")
    want = run.fam.materialize(run.sc, run.params, "torch")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@triton.jit
def _quantize_heads_kernel(s_ptr, q_ptr, sc_ptr, A: tl.constexpr, B: tl.constexpr, QMAX: tl.constexpr,
                           IS_INT8: tl.constexpr):
    """Each program quantises one [A, B] head of s with scaled_rounding's helpers (a fold's store, alone)."""
    h = tl.program_id(0)
    offs = h * A * B + tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :]
    S = tl.load(s_ptr + offs)
    scale = head_scale(tl.max(finite_absmax_rows(S, S == S), 0), QMAX)
    tl.store(q_ptr + offs, quantize(S, scale, QMAX, IS_INT8).to(q_ptr.dtype.element_ty))
    tl.store(sc_ptr + h, scale)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_scaled_rule_in_the_kernel_matches_quantize_scaled(fmt):
    """The kernel helpers alone (scaled_rounding.py) on ties, subnormal-range values, zeros, NaN and +-inf: the
    magic-number rounding is torch's round-to-nearest-even, the scale torch's fp32 division."""
    device = _device()
    gen = torch.Generator().manual_seed(3)
    S = torch.randn(5, 16, 32, generator=gen) * torch.logspace(-6, 3, 5)[:, None, None]
    S[1, 3, 4], S[2, 0, 0], S[2, 1, 1], S[3] = float("nan"), float("inf"), -float("inf"), 0.0
    qmax = state_format(fmt).qmax
    step = S[4].abs().amax() / qmax                                # the int8 quantum of head 4
    S[4, 0, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, 126.5, 3.49, 1e-9, -1e-9]) * step
    S[4, 1, :6] = torch.tensor([2 ** -10, 3 * 2 ** -10, -2 ** -10, 2 ** -7, 0.3, 447.0]) * S[4].abs().amax() / qmax
    q = torch.empty(S.shape, dtype=state_format(fmt).storage, device=device)
    scale = torch.empty(5, device=device)
    _quantize_heads_kernel[(5,)](S.to(device), q, scale, A=16, B=32, **scaled_args(state_format(fmt)))
    q_want, scale_want = quantize_scaled(S, fmt)
    assert torch.equal(_bits(q), _bits(q_want))
    assert torch.equal(scale.cpu(), scale_want)


# ------------------------------------------------------------------------------------------ refusals

def test_the_triton_scaled_kernels_are_exactly_the_implemented_ones():
    assert set(TRITON_SCALED_KERNELS) == {
        "gdn.replay[output_only_fold]", "kda.replay[output_only_fold]", "mamba2.replay[output_only]",
        "gdn.materialize", "kda.materialize", "mamba2.materialize"}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family,route", [("gdn", "output_only"), ("gdn", "state_and_output"),
                                          ("kda", "output_only"), ("mamba2", "state_and_output")])
def test_other_triton_routes_refuse_scaled_formats_before_any_launch(family, route, fmt, gen):
    fam = Family(family)
    cache = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt)
    set_state(cache, fam.state(2, gen))
    cache.write_pos.fill_(1)
    before = cache.clone()
    with pytest.raises(ValueError, match=rf"{fmt}.*one program per head.*reduction across the head"):
        fam.decode.replay_step(cache, **fam.inputs(2, gen), **fam.params(gen), route=route, backend="triton")
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_baseline_steps_refuse_scaled_formats_on_triton(family, fmt, gen):
    fam = Family(family)
    with pytest.raises(ValueError, match="reduction across the head"):
        fam.base(FormattedState.allocate(fam.shape(2), fmt), fam.inputs(2, gen), fam.params(gen), None, "triton")
