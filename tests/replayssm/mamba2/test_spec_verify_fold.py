"""The "verify_fold" route of the Mamba-2 spec verify (replayssm/mamba2/spec_verify_fold.py: prep, a verify kernel
for the rows that do not flush, a fold kernel for those that do) against the same oracles as the shipped route.

The long protocol run is test_spec.py's (random windows and accepted counts, permuted slots with NULL rows, a late
slot and a restarted one, ring wrap, early flushes; outputs against the float64 window_ref from each slot's
ground truth, every flushed checkpoint and every materialize against it) with route="verify_fold". Added here:
the GPU tiles run by the interpreter (several unrolled verify chunks, a runtime fold loop of several trips, a
masked headdim tile), the ring contents (x, B, dt, bc, checkpoint) against the ref backend, the route name
accepted by every backend, and a bad route refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.checks import NULL_SLOT
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.spec import spec_commit, spec_materialize, spec_verify
from replayssm.testing import rel_err, tolerance
from tests.replayssm.mamba2.test_spec import F16, F32, SMALL, TINY, TRITON_CASES, Case, run_protocol

ROUTE = "verify_fold"


@pytest.mark.parametrize("case", TRITON_CASES + [Case(4, 4, act=F16, geometry=Mamba2Geometry(4, 16, 32, 1))], ids=str)
def test_triton_protocol_run(case, gen, device):
    count = run_protocol("triton", case, gen, device, steps=14, batch=3, num_slots=4, materialize_every=3,
                         route=ROUTE)
    assert count.flushes > 0 and count.origin_wraps > 0 and count.window_wraps > 0 and count.null_rows > 0, count


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_other_backends_take_the_route(backend, gen, device):
    """The route names Triton kernels: every other backend accepts it and computes the same function."""
    count = run_protocol(backend, Case(2, 4, geometry=TINY), gen, device, steps=8, batch=3, num_slots=4,
                         materialize_every=4, route=ROUTE)
    assert count.flushes > 0


def _pair(geo, num_slots, history, T, act, device, gen, backends):
    rings = {b: SpecRing.allocate(geo, num_slots, history, T, F32, act, device) for b in backends}
    state0 = random_state(geo, num_slots, F32, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    return rings, state0, random_params(geo, device, gen)


def test_gpu_tiles_under_interpreter(gen, device, monkeypatch):
    """The GPU launch configs run by the interpreter against the torch backend, half the rows flushing: headdim
    96 in 64-row tiles (a masked second tile), dstate 128 in two unrolled 64-wide verify chunks and a 4-trip
    32-wide fold loop, a history of 4 (ring 8, the ring axis padded to 16), fp16 activations (the tf32x2 split)."""
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    from replayssm.mamba2.spec_verify_fold import KERNELS, default_vf_config

    geo, T = Mamba2Geometry(nheads=2, headdim=96, dstate=128, ngroups=1), 2
    verify, fold = (default_vf_config(k, geo.headdim, geo.dstate, 90) for k in KERNELS[1:])
    assert verify.block_n < geo.dstate and fold.block_n * 2 < geo.dstate and verify.block_m < geo.headdim
    rings, state0, prm = _pair(geo, 3, 4, T, F16, device, gen, ("triton", "torch"))
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32, device=device)
    flushes = 0
    for step in range(5):
        flushes += int(rings["torch"].is_flush[[2, 0]].sum())
        inp = random_step(geo, 3, F16, window=T, device=device, generator=gen)
        ys = {b: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                             slots=slots, backend=b, route=ROUTE) for b, r in rings.items()}
        assert rel_err(ys["triton"][[0, 2]], ys["torch"][[0, 2]]) <= tolerance(F16), step
        assert rel_err(rings["triton"].state, rings["torch"].state) <= 1e-5, step
        accepted = torch.tensor([T, 0, 1 + step % T], dtype=torch.int32, device=device)
        for b, r in rings.items():
            spec_commit(r, accepted, slots=slots, backend=b)
    assert flushes > 0 and not torch.equal(rings["triton"].state, state0)
    assert torch.equal(rings["triton"].state[1], state0[1])
    mats = {b: spec_materialize(r, backend=b, A=prm.A) for b, r in rings.items()}
    assert rel_err(mats["triton"], mats["torch"]) <= 1e-5


def test_ring_contents_match_ref(gen, device):
    """Same inputs into a ref ring and a verify_fold ring: live ring rows, bc, checkpoint and cursors agree."""
    T = 4
    rings, state0, prm = _pair(TINY, 4, 4, T, F16, device, gen, ("ref", "triton"))
    flushes = 0
    for step in range(7):
        slots = torch.tensor([[2, NULL_SLOT, 0], [0, 3, 2]][step % 2], dtype=torch.int32, device=device)
        inp = random_step(TINY, 3, F16, device, window=T, generator=gen)
        live = [s for s in slots.tolist() if s != NULL_SLOT]
        h = {s: int(rings["ref"].write_pos[s]) for s in live}
        flushes += sum(int(rings["ref"].is_flush[s]) for s in live)
        for b, r in rings.items():
            spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                        slots=slots, backend=b, route=ROUTE)
        ref, tri = rings["ref"], rings["triton"]
        for s in live:
            rows = [(int(ref.origin[s]) + k) & (ref.ring_len - 1) for k in range(h[s] + T)]
            assert torch.equal(ref.x[s][:, rows], tri.x[s][:, rows])
            assert torch.equal(ref.B[s][:, rows], tri.B[s][:, rows])
            assert rel_err(tri.dt[s][:, rows], ref.dt[s][:, rows]) <= 1e-6
            assert rel_err(tri.bc[s, :, : h[s] + T], ref.bc[s, :, : h[s] + T]) <= 1e-6
            assert rel_err(tri.state[s], ref.state[s]) <= 1e-5
        accepted = torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32)
        for b, r in rings.items():
            spec_commit(r, accepted, slots=slots, backend=b)
        for name in ("write_pos", "origin", "is_flush"):
            assert torch.equal(getattr(ref, name), getattr(tri, name)), name
    assert flushes > 0
    assert torch.equal(rings["triton"].state[1], state0[1])


def test_routes_agree_at_a_tp_split_production_geometry(gen, device):
    """Nemotron-3-Super at TP 8 (16 heads x headdim 64 x dstate 128, one group), history 8, T 4: two plain
    steps, then one in which the row flushes (h = 8: 8 + 2T > 12); both routes against each other."""
    geo, T = get_geometry("nemotron3_super_120b", tp=8), 4
    rings = {r: SpecRing.allocate(geo, 1, 8, T, device=device) for r in ("fused", ROUTE)}
    state0 = random_state(geo, 1, F32, device, gen)
    prm = random_params(geo, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    for _ in range(3):
        inp = random_step(geo, 1, window=T, device=device, generator=gen)
        ys = {route: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                                 route=route) for route, r in rings.items()}
        assert rel_err(ys[ROUTE], ys["fused"]) <= 1e-5
        assert rel_err(rings[ROUTE].state, rings["fused"].state) <= 1e-5
        for r in rings.values():
            spec_commit(r, torch.full((1,), T, dtype=torch.int32, device=device))
    assert not torch.equal(rings[ROUTE].state, state0)


@pytest.mark.parametrize("backend", ["triton", "torch", "ref", "cpu"])
def test_unknown_route_refused_before_touching_the_ring(backend, gen, device):
    ring = SpecRing.allocate(SMALL, 2, 4, 2, device=device)
    snapshot = ring.clone()
    inp = random_step(SMALL, 2, window=2, device=device, generator=gen)
    prm = random_params(SMALL, device, gen)
    with pytest.raises(ValueError, match="spec route"):
        spec_verify(ring, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], backend=backend, route="fused_fold")
    for attr in ("state", "x", "B", "dt", "bc", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, attr), getattr(snapshot, attr)), attr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 activations need a GPU (interpreter bf16 is garbage)")
@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [F32, torch.bfloat16], ids=str)
def test_bf16_matches_torch_on_gpu(state_dtype, gen):
    """bf16 activations (the truncated bf16x2 split of spec_verify_kernels.state_dot) at Super TP 4."""
    geo, T = get_geometry("nemotron3_super_120b", tp=4), 4
    rings = {b: SpecRing.allocate(geo, 8, 16, T, state_dtype=state_dtype, act_dtype=torch.bfloat16, device="cuda")
             for b in ("triton", "torch")}
    state0 = random_state(geo, 8, F32, "cuda", gen)
    prm = random_params(geo, "cuda", gen)
    for r in rings.values():
        r.state.copy_(state0)
    for _ in range(12):
        inp = random_step(geo, 8, torch.bfloat16, "cuda", window=T, generator=gen)
        ys = {b: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                             backend=b, route=ROUTE) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["torch"]) <= tolerance(torch.bfloat16)
        accepted = torch.randint(1, T + 1, (8,), generator=gen, dtype=torch.int32).cuda()
        for b, r in rings.items():
            spec_commit(r, accepted, backend=b)
    tol = 1e-5 if state_dtype == F32 else tolerance(state_dtype)
    assert rel_err(rings["triton"].state, rings["torch"].state) <= tol
