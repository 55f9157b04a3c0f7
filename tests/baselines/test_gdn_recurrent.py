"""Baseline fused recurrent GDN step vs the float64 delta-rule ground truth, all backends.

Each scenario runs several steps on a slot pool with permuted slots and random NULL_SLOT rows; the
ground truth keeps one float64 state per slot.
"""

import pytest
import torch

from baselines.gdn_recurrent import fused_recurrent_step
from replayssm.checks import NULL_SLOT
from replayssm.gdn.inputs import random_state, random_step
from replayssm.gdn.ref import gdn_step_ref
from replayssm.geometry import GDNGeometry, get_geometry
from replayssm.testing import assert_rel_close, poison_, rel_err, tolerance

F32, F16 = torch.float32, torch.float16
BACKENDS = ["ref", "torch", "triton", "cpu"]
TINY = GDNGeometry(H=2, HV=4, K=32, V=32)


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view with padded outer strides (every other row, padded last dim)."""
    big = torch.full((2 * t.shape[0], *t.shape[1:-1], t.shape[-1] + 3), 7.0, dtype=t.dtype, device=t.device)
    big[::2, ..., :t.shape[-1]] = t
    view = big[::2, ..., :t.shape[-1]]
    assert not view.is_contiguous()
    return view


def run_scenario(backend, gm, act_dtype, state_dtype, steps, gen, device, use_qk_l2norm=False, scale=None,
                 strided=False, batch=3, extra_slots=2):
    tol = tolerance(act_dtype, state_dtype)
    num_slots = batch + extra_slots
    state = random_state(gm, num_slots, dtype=state_dtype, device=device, generator=gen)
    if strided:   # a pool slice, as when layers share one allocation: outer strides are not the shape's
        pool = torch.zeros(num_slots, 2, gm.HV, gm.V, gm.K, dtype=state_dtype, device=device)
        pool[:, 1] = state
        state = pool[:, 1]
    truth = state.double().cpu()
    for step in range(steps):
        slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
        live = torch.rand(batch, generator=gen) < 0.75
        live[step % batch] = True
        slots[~live] = NULL_SLOT
        inp = random_step(gm, batch, act_dtype, device, use_qk_l2norm=use_qk_l2norm, generator=gen)
        out = poison_(torch.empty(batch, gm.HV, gm.V, dtype=act_dtype, device=device))
        if strided:
            inp = {name: strided_copy(t) for name, t in inp.items()}
            out = strided_copy(out)
        before = state.clone()
        fused_recurrent_step(state, **inp, scale=scale, use_qk_l2norm=use_qk_l2norm, slots=slots.to(device),
                             out=out, backend=backend)
        rows, sl = live.nonzero().flatten(), slots[live].long()
        S_true, o_true, _ = gdn_step_ref(truth[sl], *(inp[n].cpu()[rows] for n in ("q", "k", "v", "g", "beta")),
                                         scale=scale, use_qk_l2norm=use_qk_l2norm)
        truth[sl] = S_true
        assert_rel_close(f"step {step} output", out[rows.to(device)], o_true, tol, row_dims=2)
        assert torch.isnan(out[(~live).to(device)].float()).all(), "a NULL_SLOT row's output was written"
        idle = torch.ones(num_slots, dtype=torch.bool)
        idle[sl] = False
        assert torch.equal(state[idle.to(device)], before[idle.to(device)]), "a slot not in the batch changed"
        assert_rel_close(f"step {step} state", state, truth, tol, row_dims=2)
    if strided:
        assert not pool[:, 0].any(), "the neighbouring layer's states were written"


SCENARIOS = [  # (act, state, use_qk_l2norm, scale, strided)
    (F32, F32, True, None, False),
    (F32, F32, False, 0.3, True),
    (F16, F32, True, None, True),
    (F16, F16, False, 0.5, False),
    (F32, F16, True, None, True),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act, state, l2, scale, strided", SCENARIOS)
def test_step_matches_ground_truth(backend, act, state, l2, scale, strided, gen, device):
    run_scenario(backend, TINY, act, state, 4 if backend == "triton" else 8, gen, device, use_qk_l2norm=l2,
                 scale=scale, strided=strided)


@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_geometry(backend, gen, device):
    gm = GDNGeometry(H=1, HV=3, K=16, V=48)   # V not a power of two: masked value rows
    run_scenario(backend, gm, F32, F32, 3, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
@pytest.mark.parametrize("model", ["qwen35_122b_a10b", "qwen35_4b"])
def test_tp_split_geometry(backend, model, gen, device):
    run_scenario(backend, get_geometry(model, 8), F32, F32, 3, gen, device, use_qk_l2norm=True, batch=2,
                 extra_slots=1)


def test_triton_tp_split_geometry(gen, device):
    run_scenario("triton", get_geometry("qwen35_122b_a10b", 8), F32, F32, 1, gen, device, use_qk_l2norm=True,
                 batch=1, extra_slots=1)


def test_backends_agree(gen, device):
    state0 = random_state(TINY, 4, device=device, generator=gen)
    states = {b: state0.clone() for b in BACKENDS}
    slots = torch.tensor([3, NULL_SLOT, 1], dtype=torch.int32, device=device)
    for _ in range(3):
        inp = random_step(TINY, 3, device=device, use_qk_l2norm=True, generator=gen)
        outs = {b: fused_recurrent_step(s, **inp, use_qk_l2norm=True, slots=slots, backend=b)
                for b, s in states.items()}
        for b in ("torch", "triton", "cpu"):
            assert rel_err(outs[b][[0, 2]], outs["ref"][[0, 2]]) <= 1e-6
            assert rel_err(states[b], states["ref"]) <= 1e-6


def test_default_slots_use_the_first_rows_of_a_larger_pool(gen, device):
    """slots=None maps row i to slot i, also when the pool has more slots than the batch."""
    state = random_state(TINY, 5, device=device, generator=gen)
    for backend in BACKENDS:
        s = state.clone()
        inp = random_step(TINY, 3, device=device, generator=gen)
        o = fused_recurrent_step(s, **inp, backend=backend)
        S_true, o_true, _ = gdn_step_ref(state[:3], **inp)
        assert rel_err(o, o_true) <= tolerance(F32) and rel_err(s[:3], S_true) <= tolerance(F32)
        assert torch.equal(s[3:], state[3:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_before_touching_the_state(backend, gen, device):
    gm, b = TINY, 3
    state = random_state(gm, 4, device=device, generator=gen)
    before = state.clone()
    inp = random_step(gm, b, device=device, generator=gen)
    f = lambda *shape, dtype=F32: torch.randn(*shape, device=device).to(dtype)
    bad = [
        dict(q=f(b, gm.H, gm.K + 1)), dict(k=f(b, gm.H + 1, gm.K)), dict(v=f(b, gm.HV, gm.V + 1)),
        dict(q=f(b, 3, gm.K), k=f(b, 3, gm.K)),                       # HV=4 not a multiple of H=3
        dict(g=f(b, gm.HV + 1)), dict(beta=f(b)), dict(k=inp["k"].half()), dict(v=inp["v"].half()),
        dict(g=inp["g"].double()), dict(beta=inp["beta"].half()), dict(out=f(b, gm.HV, gm.V, dtype=F16)),
        dict(out=f(b + 1, gm.HV, gm.V)), dict(v=f(b, gm.HV, 2 * gm.V)[..., ::2]),
        dict(slots=torch.tensor([0, 4, 1], dtype=torch.int32, device=device)),
        dict(slots=torch.tensor([2, 2, NULL_SLOT], dtype=torch.int32, device=device)),
        dict(scale=[0.1]), dict(use_qk_l2norm="yes"), dict(backend="numpy"),
        dict(state=state.double()), dict(state=state.to(torch.int8)), dict(state=state[:, :2]),
        dict(state=state[..., ::2]), dict(state=state[0]),
    ]
    for override in bad:
        kwargs = {"state": state, "backend": backend, **inp, **override}
        with pytest.raises(ValueError):
            fused_recurrent_step(**kwargs)
            pytest.fail(f"no ValueError for {sorted(override)}")
    assert torch.equal(state, before)
    big_k = GDNGeometry(H=1, HV=1, K=512, V=16)
    with pytest.raises(ValueError, match="K=512"):
        fused_recurrent_step(random_state(big_k, 1, device=device), **random_step(big_k, 1, device=device),
                             backend=backend)


def test_bf16_rejected_by_the_interpreter(gen, device):
    if device != "cpu":
        pytest.skip("the interpreter only runs on CPU")
    state = random_state(TINY, 2, generator=gen)
    inp = random_step(TINY, 2, act_dtype=torch.bfloat16, generator=gen)
    with pytest.raises(ValueError, match="bfloat16"):
        fused_recurrent_step(state, **inp, backend="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, F32), (F32, torch.bfloat16)])
def test_bf16_on_gpu(act_dtype, state_dtype, gen):
    run_scenario("triton", TINY, act_dtype, state_dtype, 6, gen, "cuda", use_qk_l2norm=True)


@pytest.mark.parametrize("arch", ["90", "100"])
def test_gpu_tile_table_under_interpreter(arch, gen, device, monkeypatch):
    """The GPU table through the interpreter: [16, K] tiles, three V-tile programs per head (the last masked)."""
    if device != "cpu":
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    from baselines.gdn_recurrent import recurrent_launch_config

    gm = GDNGeometry(H=1, HV=2, K=32, V=40)
    assert -(-gm.V // recurrent_launch_config(gm.K, gm.V, F32, int(arch)).block_v) == 3
    run_scenario("triton", gm, F32, F32, 3, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)
