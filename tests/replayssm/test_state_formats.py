"""State formats (replayssm/state_format.py) for the ReplaySSM AR checkpoint and the baselines' state, all three
families, torch and ref backends: quantisation-aware equivalence (torch against the float64 oracle that applies
the same quantisation and random bits, tight; both against the unquantised float64 recurrence, format-keyed),
the int8 round trip, SR unbiasedness of the checkpoint (a deterministic-rounding mutant is caught), the
non-finite and slot-reuse guards (each with the mutant it catches), and the refusals before any launch."""

from __future__ import annotations

import pytest
import torch

import replayssm.state_format as sf
from baselines import gdn_recurrent, kda_recurrent, mamba2_ssu
from replayssm.checks import NULL_SLOT
from replayssm.gdn import cache as gdn_cache
from replayssm.gdn import decode as gdn_decode
from replayssm.gdn import inputs as gdn_inputs
from replayssm.gdn.ref import gdn_step_ref
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry
from replayssm.kda import cache as kda_cache
from replayssm.kda import decode as kda_decode
from replayssm.kda import inputs as kda_inputs
from replayssm.mamba2 import cache as m2_cache
from replayssm.mamba2 import decode as m2_decode
from replayssm.mamba2 import inputs as m2_inputs
from replayssm.mamba2.ref import ssm_step_ref
from replayssm.state_format import FormattedState, read_state, set_state, write_state
from replayssm.testing import rel_err

NEW = ["float16_sr", "bfloat16_sr", "int8", "float8_e4m3fn"]
ALL = ["float32", "float16", "bfloat16", *NEW]
# torch vs ref: the same quantisation and random bits, so they differ only where fp32 and fp64 arithmetic land on
# opposite sides of a rounding boundary (a rare one-step flip of one element).
TIGHT = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 4e-3, "float16_sr": 1e-3, "bfloat16_sr": 4e-3,
         "int8": 4e-3, "float8_e4m3fn": 1e-2}
# either against the unquantised float64 recurrence, over ~3L steps (a write per step for the baselines)
LOOSE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2, "float16_sr": 4e-3, "bfloat16_sr": 3e-2,
         "int8": 5e-2, "float8_e4m3fn": 0.15}
L, SLOTS = 4, 3
ROW_SLOTS = [2, NULL_SLOT, 0, 1]       # permuted rows and a padding row


class Family:
    """One family's entry points, inputs and float64 plain recurrence, behind one interface."""

    def __init__(self, name: str):
        self.name = name
        if name == "mamba2":
            self.geom = Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2)
            self.cache_cls, self.decode, self.baseline = m2_cache.ReplayCache, m2_decode, mamba2_ssu
        else:
            gm_cls, mods = (GDNGeometry, (gdn_cache, gdn_decode, gdn_recurrent)) if name == "gdn" else \
                (KDAGeometry, (kda_cache, kda_decode, kda_recurrent))
            self.geom = gm_cls(H=1, HV=2, K=16, V=8)
            self.cache_cls, self.decode, self.baseline = mods[0].ReplayCache, mods[1], mods[2]

    def shape(self, n: int) -> tuple[int, ...]:
        g = self.geom
        return (n, g.nheads, g.headdim, g.dstate) if self.name == "mamba2" else (n, g.HV, g.V, g.K)

    def params(self, gen) -> dict:
        if self.name != "mamba2":
            return {}
        p = m2_inputs.random_params(self.geom, generator=gen)
        return {"A": p.A, "D": p.D, "dt_bias": p.dt_bias}

    def inputs(self, batch: int, gen) -> dict:
        mod = {"mamba2": m2_inputs, "gdn": gdn_inputs, "kda": kda_inputs}[self.name]
        return mod.random_step(self.geom, batch, generator=gen)

    def state(self, n: int, gen) -> torch.Tensor:
        return torch.randn(*self.shape(n), generator=gen, dtype=torch.float64) * 0.3

    def replay(self, cache, step: dict, params: dict, slots, backend: str) -> torch.Tensor:
        return self.decode.replay_step(cache, **step, **params, slots=slots, backend=backend)

    def base(self, state, step: dict, params: dict, slots, backend: str) -> torch.Tensor:
        fn = self.baseline.selective_state_update if self.name == "mamba2" else self.baseline.fused_recurrent_step
        return fn(state, **step, **params, slots=slots, backend=backend)

    def materialize(self, cache, params: dict, backend: str) -> torch.Tensor:
        kw = {"A": params["A"]} if self.name == "mamba2" else {}
        return self.decode.materialize(cache, backend=backend, **kw)

    def truth_step(self, S: torch.Tensor, step: dict, params: dict, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(new state [1, ...], output [1, ...]) of the plain float64 recurrence for one row."""
        r = slice(row, row + 1)
        if self.name == "mamba2":
            z = step["z"][r] if step.get("z") is not None else None
            return ssm_step_ref(S, step["x"][r], step["dt"][r], params["A"], step["B"][r], step["C"][r],
                                params["D"], z, params["dt_bias"], True)
        S2, o, _ = gdn_step_ref(S, *(step[n][r] for n in ("q", "k", "v", "g", "beta")))
        return S2, o


FAMILIES = ["mamba2", "gdn", "kda"]


def run(fam: Family, kind: str, fmt: str, backend: str, S0: torch.Tensor, steps: list[dict], params: dict):
    """Run `steps` from S0 on one holder; returns (outputs per step, final state float64)."""
    slots = torch.tensor(ROW_SLOTS, dtype=torch.int32)
    if kind == "replay":
        holder = fam.cache_cls.allocate(fam.geom, SLOTS, L, state_dtype=fmt, sr_seed=1234)
        set_state(holder, S0)
        holder.write_pos.copy_(torch.tensor([0, 1, 3], dtype=torch.int32))   # desynchronised flushes
    else:
        holder = FormattedState.allocate(fam.shape(SLOTS), fmt, sr_seed=1234)
        set_state(holder, S0)
    outs = []
    for step in steps:
        if kind == "replay":
            outs.append(fam.replay(holder, step, params, slots, backend).double())
        else:
            outs.append(fam.base(holder, step, params, slots, backend).double())
    final = fam.materialize(holder, params, backend) if kind == "replay" else holder.read(dtype=torch.float64)
    return outs, final.double(), holder


def truth(fam: Family, S0: torch.Tensor, steps: list[dict], params: dict):
    S, outs = S0.clone(), []
    for step in steps:
        o = torch.zeros(len(ROW_SLOTS), *fam.inputs(1, None)["x" if fam.name == "mamba2" else "v"].shape[1:],
                        dtype=torch.float64)
        for row, slot in enumerate(ROW_SLOTS):
            if slot != NULL_SLOT:
                S2, y = fam.truth_step(S[slot:slot + 1], step, params, row)
                S[slot], o[row] = S2[0], y[0]
        outs.append(o)
    return outs, S


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("kind", ["replay", "baseline"])
@pytest.mark.parametrize("family", FAMILIES)
def test_torch_matches_quantising_oracle_and_the_float64_recurrence(family, kind, fmt, gen):
    fam = Family(family)
    params = fam.params(gen)
    S0 = fam.state(SLOTS, gen)
    steps = [fam.inputs(len(ROW_SLOTS), gen) for _ in range(3 * L)]
    outs_t, final_t, _ = run(fam, kind, fmt, "torch", S0, steps, params)
    outs_r, final_r, _ = run(fam, kind, fmt, "ref", S0, steps, params)
    outs_x, final_x = truth(fam, S0, steps, params)
    live = [r for r, s in enumerate(ROW_SLOTS) if s != NULL_SLOT]
    for i, (ot, orf, ox) in enumerate(zip(outs_t, outs_r, outs_x)):
        assert rel_err(ot[live], orf[live]) <= TIGHT[fmt], f"step {i}: torch vs ref output"
        assert rel_err(orf[live], ox[live]) <= LOOSE[fmt], f"step {i}: ref vs float64 output"
    assert rel_err(final_t, final_r) <= TIGHT[fmt], "torch vs ref state"
    assert rel_err(final_r, final_x) <= LOOSE[fmt], "ref vs float64 state"
    assert rel_err(final_t, final_x) <= LOOSE[fmt], "torch vs float64 state"


# ------------------------------------------------------------------------------------------ int8 rule

def test_int8_round_trip_within_half_a_step(gen):
    S = torch.randn(3, 4, 8, 16, generator=gen, dtype=torch.float64) * torch.logspace(-3, 3, 4, dtype=torch.float64)[
        None, :, None, None]
    S[2, 1] = 0.0
    q, scale = sf.quantize_scaled(S, "int8")
    assert q.dtype == torch.int8 and scale.shape == (3, 4) and scale[2, 1] == 1.0
    assert int(q.abs().max()) <= 127 and int(q.min()) >= -127
    back = sf.dequantize(q, scale, torch.float64)
    step = scale.double()[..., None, None]
    assert ((back - S).abs() <= step / 2 * (1 + 1e-12)).all()
    assert torch.equal(scale, (S.abs().amax((-2, -1)) / 127).where(scale != 1.0, 1.0).float())
    assert (q.abs().amax((-2, -1))[scale != 1.0] == 127).all()
    assert torch.equal(sf.quantize_scaled(-S, "int8")[0], -q)          # symmetric, half to even


# ------------------------------------------------------------------------------------------ SR unbiasedness

def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mbits, emin = (10, -14) if dtype == torch.float16 else (7, -126)
    e = torch.floor(torch.log2(x.abs())).clamp_min(emin)
    return torch.pow(2.0, e - mbits)


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sr_checkpoint_is_unbiased_and_a_nearest_mutant_is_caught(family, fmt, gen, monkeypatch):
    """N slots hold one state and flush the same token (L = 1: the checkpoint is written at every step): each
    slot draws its own bits, so the mean of the N SR'd checkpoints converges to the float64 flush result, to
    within 0.5 ulp / sqrt(N) per element. Round-to-nearest (the mutant) sits a quarter ulp off on average."""
    fam, N = Family(family), 256
    dtype = sf.FORMATS[fmt].storage
    params = fam.params(gen)
    S0 = fam.state(1, gen).to(dtype).double()                      # representable: set_state is exact
    step1 = fam.inputs(1, gen)
    step = {k: (None if v is None else v.expand(N, *v.shape[1:]).contiguous()) for k, v in step1.items()}
    want = fam.truth_step(S0, step1, params, 0)[0][0]
    nz = want != 0

    def mean_err_in_ulps() -> float:
        cache = fam.cache_cls.allocate(fam.geom, N, 1, state_dtype=fmt, sr_seed=99)
        set_state(cache, S0.expand(N, *S0.shape[1:]))
        fam.replay(cache, step, params, None, "torch")
        mean = read_state(cache, slice(None), torch.float64).mean(0)
        return float(((mean - want).abs() / _ulp(want, dtype))[nz].mean())

    assert mean_err_in_ulps() < 0.08
    monkeypatch.setattr(sf, "_sr_round", lambda x, seed, ids, step, dtype: x.float().to(dtype))
    assert mean_err_in_ulps() > 0.15


# ------------------------------------------------------------------------------------------ guards

@pytest.mark.parametrize("fmt", NEW)
def test_non_finite_values_never_reach_the_stored_state(fmt, gen, monkeypatch):
    S = torch.randn(2, 3, 4, 8, generator=gen, dtype=torch.float64)
    S[0, 0, 0, 0], S[0, 0, 1, 1], S[0, 0, 2, 2], S[1, 2, 3, 3] = float("nan"), float("inf"), -float("inf"), 1e39
    h = FormattedState.allocate((2, 3, 4, 8), fmt)
    write_state(h, slice(None), S)
    back = h.read(dtype=torch.float64)
    assert torch.isfinite(back).all()
    assert back[0, 0, 0, 0] == 0.0                                       # NaN -> 0
    assert back[0, 0, 1, 1] > 0 and back[0, 0, 2, 2] < 0                 # +-inf saturate
    finite = torch.isfinite(S) & (S.abs() < 1e30)
    finite[0, 0] = finite[1, 2] = False                                  # the saturated heads: their scale is theirs
    assert rel_err(back[finite], S[finite]) < 0.1                        # the rest of the state is untouched
    if sf.FORMATS[fmt].scaled:                                           # mutant: the scale from the raw absmax
        def unguarded(S, fmt):
            f = sf.state_format(fmt)
            scale = (S.abs().amax((-2, -1)) / f.qmax).float()
            return (S / scale.double()[..., None, None]).to(f.storage), scale
        monkeypatch.setattr(sf, "quantize_scaled", unguarded)
        write_state(h, slice(None), S)
        assert not torch.isfinite(h.read(dtype=torch.float64)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_nan_input_leaves_baseline_and_checkpoint_finite(family, gen):
    fam = Family(family)
    params = fam.params(gen)
    step = fam.inputs(2, gen)
    step["x" if family == "mamba2" else "v"][0, 0, 0] = float("nan")
    for fmt in NEW:
        h = FormattedState.allocate(fam.shape(2), fmt)
        set_state(h, fam.state(2, gen))
        fam.base(h, step, params, None, "torch")
        assert torch.isfinite(h.read()).all(), fmt
        cache = fam.cache_cls.allocate(fam.geom, 2, 1, state_dtype=fmt)  # L = 1: this step flushes
        set_state(cache, fam.state(2, gen))
        fam.replay(cache, step, params, None, "torch")
        assert torch.isfinite(read_state(cache, slice(None))).all(), fmt


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_slot_reuse_restarts_counter_and_scale(family, fmt, gen):
    """A new request in a reused slot rounds exactly as in a fresh cache: set_state restarts the SR counter
    and rewrites the scale, so nothing of the slot's previous request survives. The mutant (a counter left
    where the previous request put it) draws other bits."""
    fam = Family(family)
    params = fam.params(gen)
    S_a, S_b = fam.state(1, gen) * 100, fam.state(1, gen)
    steps_a = [fam.inputs(1, gen) for _ in range(5)]
    steps_b = [fam.inputs(1, gen) for _ in range(5)]
    slot = torch.tensor([1], dtype=torch.int32)

    def request_b(cache, bump: int = 0) -> torch.Tensor:
        set_state(cache, S_b, slot)
        if bump and cache.sr_step is not None:
            cache.sr_step[1] += bump
        cache.reset(slot)
        for s in steps_b:
            fam.replay(cache, s, params, slot, "torch")
        return cache.state[1].clone()

    used = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt, sr_seed=7)
    set_state(used, S_a, slot)
    for s in steps_a:
        fam.replay(used, s, params, slot, "torch")
    fresh = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt, sr_seed=7)
    want = request_b(fresh)
    got = request_b(used)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    if used.state_scale is not None:
        assert torch.equal(used.state_scale[1], fresh.state_scale[1])
    else:
        assert torch.equal(used.sr_step, fresh.sr_step)
        mutant = request_b(fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt, sr_seed=7), bump=3)
        assert not torch.equal(mutant.view(torch.uint8), want.view(torch.uint8))


def test_sr_draws_follow_the_seed(gen):
    fam = Family("gdn")
    S0, step = fam.state(2, gen), fam.inputs(2, gen)
    states = []
    for seed in (5, 5, 6):
        cache = fam.cache_cls.allocate(fam.geom, 2, 1, state_dtype="float16_sr", sr_seed=seed)
        set_state(cache, S0)
        fam.replay(cache, step, {}, None, "torch")
        states.append(cache.state.clone())
        assert cache.sr_step.tolist() == [2, 2]                          # set_state + one flush
    assert torch.equal(states[0], states[1]) and not torch.equal(states[0], states[2])


# ------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fmt", ["int8"])
def test_backends_without_the_format_refuse_before_any_work(family, fmt, gen):
    fam = Family(family)
    params = fam.params(gen)
    step = fam.inputs(2, gen)
    cache = fam.cache_cls.allocate(fam.geom, 2, 2, state_dtype=fmt)
    set_state(cache, fam.state(2, gen))
    before = cache.clone()
    # float16_sr / bfloat16_sr: Triton writes them on the fold routes and the baselines' AR steps (tests/replayssm/
    # test_triton_sr_state.py, which also checks the other Triton routes' refusal), the C AR kernels everywhere
    # (tests/replayssm/test_cpu_sr_state.py, which checks the C refusal of int8 / e4m3)
    # int8 on Triton: Mamba-2's default route (output_only) stores it (tests/replayssm/test_triton_scaled_state.py,
    # which checks the other Triton routes' refusal); GDN / KDA's default (output_only) refuses it
    backends = ["cpu"] if family == "mamba2" else ["triton", "cpu"]
    for backend in backends:
        with pytest.raises(ValueError, match=f"{fmt}.*float32, float16, bfloat16.*'torch' and 'ref' only"):
            fam.replay(cache, step, params, None, backend)
        with pytest.raises(ValueError, match="float32, float16, bfloat16"):
            fam.base(FormattedState.allocate(fam.shape(2), fmt), step, params, None, backend)
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name


def test_names_at_allocation():
    gm = GDNGeometry(H=1, HV=2, K=16, V=8)
    c = gdn_cache.ReplayCache.allocate(gm, 2, 4, state_dtype="bfloat16_sr")
    assert c.state.dtype == torch.bfloat16 and c.sr_step.dtype == torch.int32 and sf.format_of(c).stochastic
    c = gdn_cache.ReplayCache.allocate(gm, 2, 4, state_dtype=torch.float16)
    assert sf.format_of(c).name == "float16" and c.sr_step is None and c.state_scale is None
    assert gdn_cache.ReplayCache.allocate(gm, 2, 4, state_dtype="int8").state_scale.shape == (2, 2)
    from replayssm.gdn.ring import SpecRing
    assert SpecRing.allocate(gm, 2, 4, 2, state_dtype="bfloat16").state.dtype == torch.bfloat16
    assert SpecRing.allocate(gm, 2, 4, 2, state_dtype="int8").state_scale.shape == (2, 2)   # every format (the
    # spec rings' own tests: tests/replayssm/test_spec_state_formats.py)
    with pytest.raises(ValueError, match="names no state format"):
        gdn_cache.ReplayCache.allocate(gm, 2, 4, state_dtype="float12")
    with pytest.raises(ValueError, match="sr_seed"):
        gdn_cache.ReplayCache.allocate(gm, 2, 4, state_dtype="float16_sr", sr_seed=-1)
