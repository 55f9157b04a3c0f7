"""Mamba-2 selective state update baselines: AR on every backend, vLLM-native spec (one snapshot per window
token), bad inputs. Ground truth: replayssm.mamba2.ref (float64), rounded to the state dtype exactly where the
method stores a state (AR: every token; native spec: every snapshot), so fp16 states compare tightly."""

from __future__ import annotations

import pytest
import torch

from baselines.mamba2_ssu import SpecStates, selective_state_update, spec_commit, spec_reset, spec_verify
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.ref import ssm_step_ref, window_ref
from replayssm.testing import nan_like, rel_err, tolerance

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
BACKENDS = ["ref", "torch", "triton", "cpu"]


def rounded(state64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What a cache of `dtype` holds after storing a float64 state."""
    return state64.to(dtype).double()


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """Same values, odd layout: the two outer dims swapped in memory and the last dim padded (unit stride)."""
    buf = torch.full((t.shape[1], t.shape[0], *t.shape[2:-1], t.shape[-1] + 3), float("nan"), dtype=t.dtype,
                     device=t.device)
    view = buf.transpose(0, 1)[..., :t.shape[-1]]
    view.copy_(t)
    return view


def step_inputs(geom, batch, act_dtype, device, gen, window=None, strided=False, with_z=True, positive_dt=False):
    inp = random_step(geom, batch, act_dtype=act_dtype, device=device, window=window, with_z=with_z, generator=gen)
    if positive_dt:  # dt used as is (no softplus): keep it a small positive step
        inp["dt"] = 0.05 * inp["dt"].abs()
    inp["dt"] = inp["dt"].to(act_dtype)   # dt may come in any float dtype
    if strided:
        inp = {k: v if v is None or k == "dt" else strided_copy(v) for k, v in inp.items()}
        inp["dt"] = inp["dt"].transpose(0, -1).contiguous().transpose(0, -1)  # dt: even a non-unit last stride
    return inp


def slot_map(batch: int, num_slots: int, gen: torch.Generator, null_rows=(), device="cpu") -> torch.Tensor:
    """A random permutation of `batch` distinct slots, with the given rows set to NULL_SLOT."""
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    for r in null_rows:
        slots[r] = NULL_SLOT
    return slots.to(device)


AR_VARIANTS = {
    # z / D / dt_bias on, groups, headdim not a power of two, permuted slots with a null row, strided everything
    "full": dict(geom=Mamba2Geometry(nheads=4, headdim=20, dstate=16, ngroups=2), batch=3, num_slots=5,
                 null_rows=(1,), strided=True, opts=True),
    # nothing optional, softplus off, one group, headdim 80, default slots (row b -> slot b; slot 2 idle)
    "bare": dict(geom=Mamba2Geometry(nheads=2, headdim=80, dstate=32, ngroups=1), batch=2, num_slots=3,
                 null_rows=None, strided=False, opts=False),
}
DTYPE_PAIRS = [(F32, F32), (F32, F16), (F16, F16), (F32, BF16), (BF16, F32), (BF16, BF16)]


@pytest.mark.parametrize("variant", sorted(AR_VARIANTS))
@pytest.mark.parametrize("state_dtype,act_dtype", DTYPE_PAIRS, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("backend", BACKENDS)
def test_ar_matches_ground_truth(backend, state_dtype, act_dtype, variant, gen, device):
    if backend == "triton" and BF16 in (act_dtype, state_dtype) and interpreter_active():
        pytest.skip("bf16 is garbage in the Triton interpreter")
    v = AR_VARIANTS[variant]
    geom, batch, num_slots, opts = v["geom"], v["batch"], v["num_slots"], v["opts"]
    params = random_params(geom, device=device, generator=gen)
    state = random_state(geom, num_slots, dtype=state_dtype, device=device, generator=gen)
    if v["strided"]:  # the pool is a strided view into a bigger allocation
        pool = torch.zeros(num_slots + 1, geom.nheads, geom.headdim, geom.dstate + 8, dtype=state_dtype, device=device)
        pool[1:, ..., :geom.dstate] = state
        state = pool[1:, ..., :geom.dstate]
    truth = state.double().clone()
    D, dt_bias = (params.D, params.dt_bias) if opts else (None, None)
    for _ in range(3):
        slots = None if v["null_rows"] is None else slot_map(batch, num_slots, gen, v["null_rows"], device)
        inp = step_inputs(geom, batch, act_dtype, device, gen, strided=v["strided"], with_z=opts,
                          positive_dt=not opts)
        rows = [r for r in range(batch) if slots is None or int(slots[r]) != NULL_SLOT]
        live = rows if slots is None else [int(slots[r]) for r in rows]
        new, y_ref = ssm_step_ref(truth[live], inp["x"][rows], inp["dt"][rows], params.A, inp["B"][rows],
                                  inp["C"][rows], D, None if inp["z"] is None else inp["z"][rows], dt_bias,
                                  dt_softplus=opts)
        truth[live] = rounded(new, state_dtype)
        before = state.clone()
        out = nan_like(torch.empty(batch, geom.nheads, geom.headdim, dtype=act_dtype, device=device))
        ret = selective_state_update(state, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], D, inp["z"], dt_bias,
                                     dt_softplus=opts, slots=slots, out=out, backend=backend)
        assert ret is out
        tol = tolerance(state_dtype, act_dtype)
        assert rel_err(out[rows], y_ref) <= tol
        assert rel_err(state, truth) <= tol
        untouched = [s for s in range(num_slots) if s not in live]
        assert torch.equal(state[untouched], before[untouched])                  # bit-exact: never written
        null = [r for r in range(batch) if r not in rows]
        assert torch.isnan(out[null]).all()                                      # padded rows left as is


@pytest.mark.parametrize("backend", BACKENDS)
def test_ar_production_geometry(backend, gen, device):
    """Super-120B at full width on torch/ref; its TP8 split (16 heads, 1 group) on Triton (one launch)."""
    tp = 8 if backend == "triton" else 1
    geom = get_geometry("nemotron3_super_120b", tp=tp)
    batch, steps = (1, 1) if backend == "triton" else (2, 2)
    params = random_params(geom, device=device, generator=gen)
    state = random_state(geom, batch, device=device, generator=gen)
    truth = state.double()
    for _ in range(steps):
        inp = step_inputs(geom, batch, F32, device, gen)
        truth, y_ref = ssm_step_ref(truth, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"],
                                    params.dt_bias)
        truth = rounded(truth, F32)
        y = selective_state_update(state, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"],
                                   params.dt_bias, backend=backend)
        assert rel_err(y, y_ref) <= tolerance(F32)
        assert rel_err(state, truth) <= tolerance(F32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ar_tiny_dt_keeps_relative_precision(backend, gen, device):
    """dt' = softplus(-14) ~ 8e-7: log(1 + e^dt) in fp32 would be off by ~7%. From a zero state y = dt' x (B.C),
    so y exposes the softplus precision directly."""
    geom = Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1)
    params = random_params(geom, device=device, generator=gen)
    state = torch.zeros(2, geom.nheads, geom.headdim, geom.dstate, device=device)
    inp = step_inputs(geom, 2, F32, device, gen)
    dt = -14.0 + 0.5 * torch.rand(2, geom.nheads, generator=gen).to(device)
    new, y_ref = ssm_step_ref(state, inp["x"], dt, params.A, inp["B"], inp["C"])
    y = selective_state_update(state, inp["x"], dt, params.A, inp["B"], inp["C"], backend=backend)
    assert rel_err(y, y_ref) <= tolerance(F32)
    assert rel_err(state, new) <= tolerance(F32)


def test_ar_torch_updates_the_pool_in_place(gen):
    """The CPU timing path: fp32 state covering the pool is updated where it lies (same storage, no rebind),
    and a permuted, padded batch matches the dense one row for row."""
    geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)
    params = random_params(geom, generator=gen)
    state = random_state(geom, 3, generator=gen)
    inp = step_inputs(geom, 3, F32, "cpu", gen)
    ptr, permuted = state.data_ptr(), state.clone()
    y = selective_state_update(state, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"],
                               params.dt_bias, backend="torch")
    assert state.data_ptr() == ptr
    perm = torch.tensor([2, 0, 1])
    slots = torch.tensor([2, 0, 1, NULL_SLOT], dtype=torch.int32)
    padded = {k: torch.cat([v[perm], v[:1]]) for k, v in inp.items()}
    out = nan_like(torch.empty(4, geom.nheads, geom.headdim))
    selective_state_update(permuted, padded["x"], padded["dt"], params.A, padded["B"], padded["C"], params.D,
                           padded["z"], params.dt_bias, slots=slots, out=out, backend="torch")
    assert torch.allclose(out[:3], y[perm], rtol=1e-6, atol=1e-6) and torch.isnan(out[3]).all()
    assert torch.allclose(permuted, state, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# vLLM-native speculative decoding
# ----------------------------------------------------------------------------------------------------------

SPEC_GEOM = Mamba2Geometry(nheads=4, headdim=20, dstate=16, ngroups=2)
SPEC_GEOM_TINY = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)


def run_native_stream(backend, T, state_dtype, act_dtype, steps, geom, batch, num_slots, gen, device):
    """`steps` verify+commit rounds with random accepted counts, rows remapped to random slots every step
    (one padded row), one slot re-admitted (reset) every 10 steps; every snapshot and output is checked."""
    params = random_params(geom, device=device, generator=gen)
    states = SpecStates.allocate(geom, num_slots, T, state_dtype=state_dtype, device=device)
    states.state[:, 0] = random_state(geom, num_slots, dtype=state_dtype, device=device, generator=gen)
    states.last.fill_(T - 1)            # garbage cursors: the reset below must clear them
    spec_reset(states, backend=backend)
    assert states.last.eq(0).all()
    truth = states.state[:, 0].double().clone()
    tol = tolerance(state_dtype, act_dtype)
    committed_counts = set()
    for step in range(steps):
        if step % 10 == 9:                                   # a new request enters one slot
            s = int(torch.randint(num_slots, (1,), generator=gen))
            fresh = random_state(geom, 1, dtype=state_dtype, device=device, generator=gen)
            spec_reset(states, torch.tensor([s], dtype=torch.int32, device=device), backend=backend)
            states.state[s, 0] = fresh[0]
            truth[s] = fresh[0].double()
        if step % 3 == 0:                                    # default slots: row b -> slot b
            slots, rows = None, list(range(batch))
            live = rows
        else:
            slots = slot_map(batch, num_slots, gen, (int(torch.randint(batch, (1,), generator=gen)),), device)
            rows = [r for r in range(batch) if int(slots[r]) != NULL_SLOT]
            live = [int(slots[r]) for r in rows]
        inp = step_inputs(geom, batch, act_dtype, device, gen, window=T, strided=step % 2 == 1)
        snaps, y_ref = window_ref(truth[live], inp["x"][rows], inp["dt"][rows], params.A, inp["B"][rows],
                                  inp["C"][rows], params.D, inp["z"][rows], params.dt_bias)
        before = states.state.clone()
        out = nan_like(torch.empty(batch, T, geom.nheads, geom.headdim, dtype=act_dtype, device=device))
        spec_verify(states, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"], params.dt_bias,
                    slots=slots, out=out, backend=backend)
        assert rel_err(out[rows], y_ref) <= tol
        assert torch.isnan(out[[r for r in range(batch) if r not in rows]]).all()
        assert rel_err(states.state[live], rounded(snaps, state_dtype)) <= tol  # snapshot t = after token t
        others = [s for s in range(num_slots) if s not in live]
        assert torch.equal(states.state[others], before[others])

        accepted = torch.randint(1, T + 1, (batch,), generator=gen)
        if step == 0:                        # every row live: a rollback to 1 token and a full accept, forced
            accepted[0], accepted[-1] = 1, T
        accepted = accepted.to(device)
        last_before = states.last.clone()
        spec_commit(states, accepted, slots=slots, backend=backend)
        acc_live = accepted[rows].long().cpu()
        committed_counts.update(acc_live.tolist())
        assert states.last[live].tolist() == (acc_live - 1).tolist()
        assert torch.equal(states.last[others], last_before[others])
        truth[live] = rounded(snaps[torch.arange(len(rows)), acc_live - 1], state_dtype)
        committed = states.committed(torch.tensor(live, device=device))
        assert rel_err(committed, truth[live]) <= tol           # the last accepted token's snapshot
    assert {1, T} <= committed_counts, committed_counts


@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F16, F16), (F32, BF16), (BF16, F32)],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_native_spec_rollback_stream(backend, T, state_dtype, act_dtype, gen, device):
    run_native_stream(backend, T, state_dtype, act_dtype, 40, SPEC_GEOM, 3, 4, gen, device)


@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F16, F16), (BF16, F32)],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("T", [2, 4])
def test_native_spec_rollback_stream_triton(T, state_dtype, act_dtype, gen, device):
    if state_dtype == BF16 and interpreter_active():
        pytest.skip("bf16 state: the Triton interpreter computes on raw bits (GPU-only case)")
    run_native_stream("triton", T, state_dtype, act_dtype, 3, SPEC_GEOM_TINY, 2, 3, gen, device)


def test_spec_states_footprint():
    geom = get_geometry("nemotron3_super_120b")
    states = SpecStates.allocate(geom, 2, 4, device="meta")
    assert states.nbytes() == 2 * 4 * geom.state_numel() * 4 + 2 * 4   # T snapshots + int32 cursor


# ----------------------------------------------------------------------------------------------------------
# Bad inputs: ValueError before anything is touched
# ----------------------------------------------------------------------------------------------------------

def _ar_case(gen):
    geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)
    p = random_params(geom, generator=gen)
    args = dict(state=random_state(geom, 3, generator=gen), **step_inputs(geom, 2, F32, "cpu", gen), A=p.A, D=p.D,
                dt_bias=p.dt_bias)
    return geom, args


AR_BAD = {
    "x shape": lambda a: a.update(x=a["x"][:, :, :8]),
    "x rank": lambda a: a.update(x=a["x"][0]),
    "z shape": lambda a: a.update(z=a["z"][:1]),
    "dt shape": lambda a: a.update(dt=a["dt"][:, :2]),
    "B groups do not divide heads": lambda a: a.update(B=torch.zeros(2, 3, 16), C=torch.zeros(2, 3, 16)),
    "C shape": lambda a: a.update(C=a["C"][:, :, :8]),
    "A dtype": lambda a: a.update(A=a["A"].double()),
    "D shape": lambda a: a.update(D=a["D"][:2]),
    "act dtypes differ": lambda a: a.update(z=a["z"].half()),
    "int act": lambda a: a.update(x=a["x"].int(), z=None, B=a["B"].int(), C=a["C"].int()),
    "state dtype": lambda a: a.update(state=a["state"].double()),
    "state rank": lambda a: a.update(state=a["state"][0]),
    "state not unit-stride": lambda a: a.update(state=a["state"].transpose(2, 3)),
    "x not unit-stride": lambda a: a.update(x=a["x"].transpose(1, 2).contiguous().transpose(1, 2)),
    "slot out of range": lambda a: a.update(slots=torch.tensor([0, 3], dtype=torch.int32)),
    "slot used twice": lambda a: a.update(slots=torch.tensor([1, 1], dtype=torch.int32)),
    "slots shape": lambda a: a.update(slots=torch.tensor([0], dtype=torch.int32)),
    "slots dtype": lambda a: a.update(slots=torch.tensor([0, 1.0])),
    "out dtype": lambda a: a.update(out=torch.empty(2, 4, 16, dtype=F16)),
    "out shape": lambda a: a.update(out=torch.empty(2, 4, 8)),
    "batch > num_slots without slots": lambda a: a.update(state=a["state"][:1]),
    "dstate > 256": lambda a: a.update(state=torch.zeros(3, 4, 16, 512), B=torch.zeros(2, 2, 512),
                                       C=torch.zeros(2, 2, 512)),
    "unknown backend": lambda a: a.update(backend="cuda"),
}


@pytest.mark.parametrize("case", sorted(AR_BAD))
def test_ar_bad_input_raises_before_launch(case, gen):
    _, args = _ar_case(gen)
    args["backend"] = "triton"
    AR_BAD[case](args)
    snapshot = args["state"].clone()
    with pytest.raises(ValueError):
        selective_state_update(**args)
    assert torch.equal(args["state"], snapshot)


@pytest.mark.skipif(not interpreter_active(), reason="only the Triton interpreter rejects bf16")
def test_ar_bf16_rejected_under_interpreter(gen):
    _, args = _ar_case(gen)
    for k in ("x", "z", "B", "C"):
        args[k] = args[k].to(BF16)
    with pytest.raises(ValueError, match="bfloat16"):
        selective_state_update(**args, backend="triton")


def test_spec_bad_input_raises_before_launch(gen):
    geom, T = SPEC_GEOM_TINY, 2
    p = random_params(geom, generator=gen)
    states = SpecStates.allocate(geom, 3, T)
    good = step_inputs(geom, 2, F32, "cpu", gen, window=T)
    bad_windows = [
        dict(good, x=good["x"][:, :1]),                                   # window of the wrong length
        dict(good, B=torch.zeros(2, T, 1, 16)),                           # ngroups differs from the geometry
        dict(good, dt=good["dt"][:, :, :1]),
    ]
    for inp in bad_windows:
        with pytest.raises(ValueError):
            spec_verify(states, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias)
    with pytest.raises(ValueError):
        spec_verify(states.state, good["x"], good["dt"], p.A, good["B"], good["C"])       # not a SpecStates
    for acc in ([0, 1], [1, T + 1], [[1, 1]]):
        with pytest.raises(ValueError, match="num_accepted"):
            spec_commit(states, torch.tensor(acc))
    with pytest.raises(ValueError):
        spec_commit(states, torch.tensor([1, 1]), slots=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError):
        spec_reset(states, torch.tensor([5], dtype=torch.int32))
    assert states.last.eq(0).all() and states.state.eq(0).all()
    for bad in (dict(window=0), dict(window=17), dict(num_slots=0), dict(state_dtype=torch.float64)):
        kw = dict(geometry=geom, num_slots=2, window=2) | bad
        with pytest.raises(ValueError):
            SpecStates.allocate(**kw)
    with pytest.raises(ValueError, match="dstate"):
        SpecStates.allocate(Mamba2Geometry(2, 16, 512, 1), 1, 2, device="meta")
