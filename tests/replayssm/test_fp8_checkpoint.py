"""Experimental fp8 (e4m3 + per-head scale) checkpoint of the ReplaySSM AR caches: the quantisation rule, the
torch and ref backends against the float64 plain recurrence (null slots, desynchronised cursors, flushes),
the footprint, and every refusal (the native spec snapshots, Triton) before any work."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from experiments.accuracy import Series, _point
from experiments.accuracy_series import with_state_dtype
from experiments.harness.methods import REGISTRY
from experiments.harness.points import load_model_config, model_spec
from experiments.harness.workload import Workload
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.fp8_checkpoint import E4M3_MAX, FP8_STATE_DTYPE, dequantize, quantize
from replayssm.testing import poison_, rel_err, tolerance

FP8 = FP8_STATE_DTYPE
TOL = tolerance(torch.float32, FP8)
MODELS = ["tiny_mamba2", "tiny_gdn"]


def setup(model: str, backend: str, gen, L: int = 4, num_slots: int = 3, route: str | None = None):
    """(method, fns, point, workload, cache) of replay_ar with an fp8 checkpoint holding a random state."""
    spec = model_spec(load_model_config(model), None)
    route = route or ("output_only" if spec.family == "mamba2" else None)
    p = _point(spec, Series(spec.key, "realistic", "float32", "replay_ar", "float32", L, route),
               dict(rows=num_slots, backend=backend, device="cpu", spec_T=2, history_len=4, acceptance="rate:0.7"), 0)
    wl = Workload(spec, p, "cpu", gen)
    method = REGISTRY["replay_ar"]
    cache = method.allocate(p, with_state_dtype(wl, FP8), num_slots, "cpu")
    return method, method.api(spec.family), p, wl, cache


def materialized(cache, wl, backend: str) -> torch.Tensor:
    if wl.family == "mamba2":
        from replayssm.mamba2.decode import materialize
        return materialize(cache, backend=backend, A=wl.params["A"])
    from replayssm.gdn.decode import materialize
    return materialize(cache, backend=backend)


# ------------------------------------------------------------------------------------------ the rule

def test_quantize_rule_per_head_absmax_and_zero_guard(gen):
    S = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    S[1, 2] = 0.0                                          # an all-zero head: scale 1, not 0/0
    q, scale = quantize(S)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (2, 3)
    want = (S.abs().amax(dim=(-2, -1)) / E4M3_MAX).float()
    want[1, 2] = 1.0
    assert torch.equal(scale, want)
    back = dequantize(q, scale, torch.float64)
    assert torch.isfinite(back).all() and torch.equal(back[1, 2], S[1, 2])
    # each element within half an e4m3 ulp (2^-4 relative) of its value; the largest hits 448 exactly
    normal = S.abs() >= scale.double()[..., None, None] * 2.0 ** -6
    assert ((back - S).abs() <= 2.0 ** -4 * S.abs() + 1e-300)[normal].all()
    assert (q.float().abs().amax(dim=(-2, -1))[scale != 1.0] == E4M3_MAX).all()


@pytest.mark.parametrize("ratio", [1e2, 1e6])
def test_scale_is_per_head(ratio, gen):
    """A head ratio x larger than the others leaves their precision alone. At 1e5 one scale per slot
    would round the small heads to e4m3 subnormals or zero: checked below, so this test can tell the two apart."""
    S = torch.randn(2, 4, 8, 16, generator=gen, dtype=torch.float64)
    S[:, 0] *= ratio
    q, scale = quantize(S)
    errs = [rel_err(dequantize(q[:, h], scale[:, h], torch.float64), S[:, h]) for h in range(4)]
    assert max(errs) <= TOL, errs
    if ratio >= 1e6:                                       # the counterfactual: one scale for the whole slot
        slot_scale = (S.abs().amax(dim=(1, 2, 3)) / E4M3_MAX)[:, None, None, None]
        coarse = (S / slot_scale).to(FP8).double() * slot_scale
        assert rel_err(coarse[:, 1:], S[:, 1:]) > 4 * TOL    # ~1: flushed to 0


# ------------------------------------------------------------------------------------------ backends

@pytest.mark.parametrize("backend", ["torch", "ref"])
@pytest.mark.parametrize("model", MODELS)
def test_fp8_checkpoint_vs_float64_recurrence(model, backend, gen):
    """Random schedule with null rows (so cursors desynchronise and slots flush at different steps), every
    output and the materialised state against the float64 plain recurrence; null rows stay NaN."""
    method, fns, p, wl, cache = setup(model, backend, gen)
    n, L, steps = cache.num_slots, cache.buffer_len, 3 * cache.buffer_len + 2
    truth = wl.random_state(n).double()
    method.set_state(cache, truth.float())
    assert rel_err(materialized(cache, wl, backend), truth) <= TOL      # set_state quantised like a flush
    flushes, desync = torch.zeros(n, dtype=torch.int64), False
    for t in range(steps):
        live = torch.rand(n, generator=gen) < 0.7 if t else torch.arange(n) == 0   # step 0: slot 0 alone
        live[t % n] = True                                 # every slot steps >= 4 times: each one flushes
        slots = torch.where(live, torch.arange(n), NULL_SLOT).to(torch.int32)
        inp = wl.inputs(n)
        new_state, y_ref = wl.oracle_step(truth, inp)
        flushes += (live & (cache.write_pos.long() == L - 1)).long()
        out = poison_(wl.out(n))
        method.step(fns, cache, p, wl.call_kwargs(inp), slots, out)
        assert rel_err(out[live], y_ref[live]) <= TOL, f"step {t}"
        assert torch.isnan(out[~live]).all()
        truth = torch.where(live.view(n, 1, 1, 1), new_state, truth)
        desync |= len(set(cache.write_pos.tolist())) > 1
    assert int(flushes.min()) >= 1 and desync              # every slot flushed, at different steps
    assert rel_err(materialized(cache, wl, backend), truth) <= TOL
    assert torch.isfinite(cache.state.float()).all() and (cache.state_scale > 0).all()


@pytest.mark.parametrize("model", MODELS)
def test_torch_and_ref_leave_the_same_fp8_cache(model, gen):
    """The ref oracle quantises by the same rule: after the same steps both backends hold the same e4m3
    checkpoint up to a rare one-ulp flip (the float32 and float64 sums differ below e4m3's resolution)."""
    runs = [setup(model, b, torch.Generator().manual_seed(int(gen.initial_seed()))) for b in ("torch", "ref")]
    S0 = runs[0][3].random_state(3).float()
    for method, _, _, _, cache in runs:
        method.set_state(cache, S0)
    for _ in range(runs[0][4].buffer_len + 1):             # one flush of every slot, then one more step
        inp = runs[0][3].inputs(3)
        for method, fns, p, wl, cache in runs:
            method.step(fns, cache, p, wl.call_kwargs(inp), None, wl.out(3))
    (_, _, _, _, a), (_, _, _, _, b) = runs
    assert torch.equal(a.state_scale, b.state_scale) or rel_err(a.state_scale, b.state_scale) < 1e-6
    same = a.state.view(torch.uint8) == b.state.view(torch.uint8)
    assert same.float().mean() > 0.99
    assert torch.equal(a.write_pos, b.write_pos)


def test_nbytes_counts_the_scale():
    from replayssm.geometry import Mamba2Geometry
    from replayssm.mamba2.cache import ReplayCache

    g = Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=1)
    c8, c32 = (ReplayCache.allocate(g, 3, 4, state_dtype=d) for d in (FP8, torch.float32))
    assert c8.state_scale.shape == (3, 4) and c32.state_scale is None
    assert c8.nbytes() == c32.nbytes() - 3 * c32.state.numel() + 4 * c8.state_scale.numel()
    assert torch.equal(c8.clone().state_scale, c8.state_scale)


# ------------------------------------------------------------------------------------------ refusals

# Every method takes every state format on torch / ref: baseline_ar through a FormattedState (tests/replayssm/
# test_state_formats.py), the spec methods' caches themselves (tests/replayssm/test_spec_state_formats.py); their
# Triton kernels refuse fp8 before any launch
@pytest.mark.parametrize("name", ["baseline_spec", "commit_replay_spec", "replay_spec"])
@pytest.mark.parametrize("model", MODELS)
def test_spec_methods_take_fp8_on_torch_and_refuse_it_on_triton(model, name, gen):
    spec = model_spec(load_model_config(model), None)
    method = REGISTRY[name]
    s = Series(spec.key, "realistic", "float32", name, "float32", None, None)
    p = _point(spec, s, dict(rows=2, spec_T=2, history_len=4, acceptance="rate:0.7", backend="torch",
                             device="cpu"), 0)
    wl = with_state_dtype(Workload(spec, p, "cpu", gen), FP8)
    cache = method.allocate(p, wl, 2, "cpu")
    assert cache.state_format == "float8_e4m3fn" and cache.state.dtype == FP8 and cache.state_scale is not None
    method.set_state(cache, wl.random_state(2).float())
    fns = method.api(spec.family)
    kw = wl.call_kwargs(wl.inputs(2, window=2))
    assert torch.isfinite(method.verify(fns, cache, p, kw, None, wl.out(2, window=2)).float()).all()
    before = cache.clone()
    with pytest.raises(ValueError, match="float8_e4m3fn.*'torch' and 'ref'"):
        method.verify(fns, cache, dataclasses.replace(p, backend="triton"), kw, None, wl.out(2, window=2))
    for field, t in cache.tensors().items():
        assert torch.equal(t.view(torch.uint8), before.tensors()[field].view(torch.uint8)), field


@pytest.mark.skipif(not interpreter_active(), reason="CPU tensors reach the Triton backend only in the interpreter")
@pytest.mark.parametrize("model", MODELS)
def test_triton_routes_without_scaled_kernels_refuse_fp8_before_any_work(model, gen):
    """The shipped GDN output_only and Mamba-2 state_and_output routes write a head from several programs: no
    e4m3 store (the fold routes have one: tests/replayssm/test_triton_scaled_state.py)."""
    route = "state_and_output" if model == "tiny_mamba2" else "output_only"
    method, fns, p, wl, cache = setup(model, "triton", gen, route=route)
    method.set_state(cache, wl.random_state(3).float())
    before = cache.clone()
    with pytest.raises(ValueError, match="float8_e4m3fn.*reduction across the head"):
        method.step(fns, cache, p, wl.call_kwargs(wl.inputs(3)), None, wl.out(3))
    torch.testing.assert_close(materialized(cache, wl, "triton"), materialized(cache, wl, "torch"))
    for name, t in cache.tensors().items():
        assert torch.equal(t.view(torch.uint8) if t.dtype == FP8 else t, before.tensors()[name].view(torch.uint8)
                           if t.dtype == FP8 else before.tensors()[name]), name
