"""Stochastic-rounding state formats on the Triton backend (issue 36 item 3): ReplaySSM's AR flush on the fold
routes (GDN / KDA output_only_fold, Mamba-2 output_only) and the baselines' AR steps write float16_sr /
bfloat16_sr themselves.

Bit-exact: the Triton write of an SR state is sr_round_torch (the torch / ref backends' rule) of the kernel's own
float32 value, for the same (seed, slot, sr_step, element); the float32 value is the same kernel's on a float32
copy of the state (the rounding is the only difference between the two launches). Against the torch backend the
whole sequence (outputs, stored bits, counters) is compared too: the pre-rounding values differ in the last fp32
bits at most, so all but a rare element land on the same fp16 neighbour and none is more than one ulp away. The
counter sr_step advances on the device exactly as the torch backend advances it (flush rows of the replay caches,
every live row of a baseline), a NaN / inf never reaches the stored state, and every other Triton kernel still
refuses the SR formats before any launch, naming what is available (int8 / e4m3:
tests/replayssm/test_triton_scaled_state.py). bfloat16_sr needs
a GPU (the interpreter computes no bf16)."""

from __future__ import annotations

import pytest
import torch

from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.state_format import TRITON_SR_KERNELS, FormattedState, set_state
from replayssm.stochastic_rounding import sr_round_torch
from tests.replayssm.test_state_formats import Family

L, SLOTS, SEED = 4, 3, 0xDEADBEEF
ROW_SLOTS = [2, NULL_SLOT, 0, 1]
ROUTE = {"mamba2": "output_only", "gdn": "output_only_fold", "kda": "output_only_fold"}
FAMILIES = ["mamba2", "gdn", "kda"]


def _device() -> str:
    if interpreter_active():
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 or a GPU")
    return "cuda"


def _formats() -> list:
    gpu_only = pytest.mark.skipif(interpreter_active() or not torch.cuda.is_available(),
                                  reason="bfloat16 state: the interpreter computes no bf16 (GPU only)")
    return ["float16_sr", pytest.param("bfloat16_sr", marks=gpu_only)]


def _to(d: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """A 16-bit float's position on the number line (neighbours differ by 1; +0 and -0 share 0)."""
    b = _bits(t.cpu()).int()
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


class Run:
    """One family and kind ("replay" or "baseline") on three holders started from the same state: `sr` (the SR
    format, Triton), `f32` (float32, Triton: the kernel's value before rounding) and `ref` (the SR format, torch)."""

    def __init__(self, family: str, kind: str, fmt: str, device: str, gen: torch.Generator):
        self.fam, self.kind, self.fmt, self.device = Family(family), kind, fmt, device
        self.params = _to(self.fam.params(gen), device)
        self.slots = torch.tensor(ROW_SLOTS, dtype=torch.int32, device=device)
        S0 = self.fam.state(SLOTS, gen)
        if kind == "replay":
            alloc = lambda f: self.fam.cache_cls.allocate(self.fam.geom, SLOTS, L, state_dtype=f, sr_seed=SEED,
                                                          device=device)
            self.sr, self.ref, self.f32 = alloc(fmt), alloc(fmt), alloc("float32")
            for c in (self.sr, self.ref, self.f32):
                c.write_pos.copy_(torch.tensor([0, 1, 3], dtype=torch.int32))     # desynchronised flushes
        else:
            alloc = lambda f: FormattedState.allocate(self.fam.shape(SLOTS), f, device=device, sr_seed=SEED)
            self.sr, self.ref, self.f32 = alloc(fmt), alloc(fmt), alloc("float32")
        for h in (self.sr, self.ref):
            set_state(h, S0.to(device))
        self.f32.state.copy_(self.sr.state.float())

    def call(self, holder, step: dict, backend: str) -> torch.Tensor:
        if self.kind == "replay":
            return self.fam.decode.replay_step(holder, **step, **self.params, slots=self.slots, backend=backend,
                                               route=ROUTE[self.fam.name])
        return self.fam.base(holder, step, self.params, self.slots, backend)

    def step(self, step: dict) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on the three holders: (slots written, sr_step before, Triton SR output, torch output)."""
        step = _to(step, self.device)
        before = self.sr.sr_step.clone()
        if self.kind == "replay":
            written = [s for s in ROW_SLOTS if s != NULL_SLOT and int(self.sr.write_pos[s]) == L - 1]
        else:
            written = [s for s in ROW_SLOTS if s != NULL_SLOT]
        o = self.call(self.sr, step, "triton")
        o32 = self.call(self.f32, step, "triton")
        o_ref = self.call(self.ref, step, "torch")
        live = self.slots != NULL_SLOT
        torch.testing.assert_close(o[live], o32[live], rtol=0, atol=0, equal_nan=True,
                                   msg="the rounding must not change the output")
        return written, before, o, o_ref

    def check_written(self, written: list[int], before: torch.Tensor) -> None:
        """The SR write is sr_round_torch of the float32 kernel's value, bit for bit; then the float32 copy takes
        the stored value (so both holders go on from the same state)."""
        storage = self.sr.state.dtype
        for s in written:
            want = sr_round_torch(self.f32.state[s].cpu(), SEED, s, int(before[s]), storage)
            assert torch.equal(_bits(self.sr.state[s].cpu()), _bits(want)), f"slot {s}"
            self.f32.state[s] = self.sr.state[s].float()
        untouched = [s for s in range(SLOTS) if s not in written]
        for s in untouched:
            assert torch.equal(self.f32.state[s], self.sr.state[s].float()), f"slot {s} written off its step"


@pytest.mark.parametrize("fmt", _formats())
@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_sr_write_is_the_torch_rule_bit_for_bit(family, kind, fmt, gen):
    run = Run(family, kind, fmt, _device(), gen)
    flushed = 0
    for _ in range(2 * L):
        written, before, o, o_ref = run.step(run.fam.inputs(len(ROW_SLOTS), gen))
        flushed += len(written)
        run.check_written(written, before)
        # the device counters advance as the torch backend's do: +1 per write, nothing else
        expect = before.clone()
        expect[written] += 1
        assert torch.equal(run.sr.sr_step, expect) and torch.equal(run.sr.sr_step, run.ref.sr_step)
        # against the torch backend: the same draws, values equal up to fp32 rounding of the pre-rounding state
        live = run.slots != NULL_SLOT
        torch.testing.assert_close(o[live].float(), o_ref[live].float(), rtol=2e-3, atol=2e-3)
        same = (_bits(run.sr.state.cpu()) == _bits(run.ref.state.cpu())).double().mean().item()
        assert same >= 0.99, f"only {same:.4f} of the stored bits equal the torch backend's"
        assert (_ordinal(run.sr.state) - _ordinal(run.ref.state)).abs().max() <= 1      # neighbours at worst
        for name, t in run.ref.tensors().items():      # the next step from the same state (no drift compounds)
            t.copy_(run.sr.tensors()[name])
    assert flushed >= (SLOTS if kind == "replay" else 2 * L * SLOTS)


@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_draws_depend_on_seed_and_counter_not_on_the_host(family, kind, gen):
    """Two holders with another seed store other bits; the same seed and counters store the same bits (the key is
    read from the device counter, so a second run from a reset counter repeats the first)."""
    device = _device()
    step = Family(family).inputs(len(ROW_SLOTS), gen)
    runs = []
    for seed in (SEED, SEED, SEED ^ 1):
        g = torch.Generator().manual_seed(7)
        r = Run(family, kind, "float16_sr", device, g)
        for h in (r.sr,):
            h.sr_seed = seed
        if kind == "replay":
            r.sr.write_pos.fill_(L - 1)                      # every live row flushes
        r.call(r.sr, _to(step, device), "triton")
        runs.append(_bits(r.sr.state.cpu()))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_non_finite_values_never_reach_the_sr_state(family, kind, gen):
    """A NaN and an inf in the step's input: the stored state stays finite, and still equals sr_round_torch of the
    kernel's float32 value (NaN -> 0, +-inf saturated)."""
    run = Run(family, kind, "float16_sr", _device(), gen)
    if kind == "replay":
        for c in (run.sr, run.f32, run.ref):
            c.write_pos.fill_(L - 1)
    step = run.fam.inputs(len(ROW_SLOTS), gen)
    name = "x" if family == "mamba2" else "v"
    step[name][0].view(-1)[0] = float("nan")
    step[name][2].view(-1)[1] = float("inf")
    written, before, _, _ = run.step(step)
    assert not torch.isfinite(run.f32.state[ROW_SLOTS[0]]).all()       # the kernel's value did go non-finite
    assert torch.isfinite(run.sr.state.float()).all()
    run.check_written(written, before)


# ------------------------------------------------------------------------------------------ refusals

def test_the_triton_sr_kernels_are_exactly_the_implemented_ones():
    assert set(TRITON_SR_KERNELS) == {
        "gdn.replay[output_only_fold]", "kda.replay[output_only_fold]", "mamba2.replay[output_only]",
        "gdn.recurrent", "kda.recurrent", "mamba2.ssu", "gdn.materialize", "kda.materialize", "mamba2.materialize"}


@pytest.mark.parametrize("family,route", [("gdn", "output_only"), ("gdn", "state_and_output"),
                                          ("kda", "output_only"), ("kda", "state_and_output"),
                                          ("mamba2", "state_and_output")])
def test_other_triton_routes_refuse_sr_before_any_launch(family, route, gen):
    fam = Family(family)
    cache = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype="float16_sr")
    set_state(cache, fam.state(2, gen))
    cache.write_pos.fill_(1)
    before = cache.clone()
    step = fam.inputs(2, gen)
    with pytest.raises(ValueError, match=rf"float16_sr.*{family}\.replay\[{route}\].*output_only_fold.*"
                                         r"spec rings.*'torch' and 'ref'"):
        fam.decode.replay_step(cache, **step, **fam.params(gen), route=route, backend="triton")
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name


# The C backend writes float16_sr / bfloat16_sr in its AR kernels too: tests/replayssm/test_cpu_sr_state.py.


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_graph_replays_draw_fresh_bits(family, kind, fmt, gen):
    """The counter lives on the device: a captured step replayed N times advances sr_step N times and stores what
    N eager steps store (the same keys), with no host state per step."""
    if interpreter_active() or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g0 = torch.Generator().manual_seed(11)
    graph_run, eager_run = Run(family, kind, fmt, "cuda", g0), None
    eager_run = Run(family, kind, fmt, "cuda", torch.Generator().manual_seed(11))
    if kind == "replay":
        for r in (graph_run, eager_run):
            r.sr.write_pos.fill_(L - 2)                     # the warm-up step, then flushes every L steps
    step = _to(graph_run.fam.inputs(len(ROW_SLOTS), gen), "cuda")
    for r in (graph_run, eager_run):
        r.call(r.sr, step, "triton")                        # warm-up (first-step workspaces, compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_run.call(graph_run.sr, step, "triton")
    for _ in range(2 * L):
        graph.replay()
        eager_run.call(eager_run.sr, step, "triton")
    torch.cuda.synchronize()
    assert torch.equal(graph_run.sr.sr_step, eager_run.sr.sr_step)
    assert torch.equal(_bits(graph_run.sr.state), _bits(eager_run.sr.state))
    assert int(graph_run.sr.sr_step.max()) > 2
