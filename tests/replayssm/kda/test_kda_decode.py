"""ReplaySSM Kimi Delta Attention AR decode vs the float64 recurrence (replayssm.kda.ref), every backend.

The scenarios are GDN's (tests/replayssm/gdn/test_gdn_decode.py): random checkpoints, a random count of
buffered entries per slot (desynchronised cursors), NULL_SLOT rows, permuted slots, flushes; the decays are
per key channel and spread over [-2.3, -1e-3] inside every head, so a kernel that treats g as one scalar per
head (or reads the wrong channel) is off by O(1).
"""

import pytest
import torch

from baselines.kda_recurrent import fused_recurrent_step
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.geometry import KDA_MODELS, KDAGeometry, get_geometry
from replayssm.kda import ReplayCache, materialize, replay_step
from replayssm.kda.inputs import random_gate, random_state, random_step
from replayssm.kda.ref import kda_step_ref, l2norm
from replayssm.testing import assert_rel_close, poison_, rel_err, split_route, tolerance

F32, F16 = torch.float32, torch.float16
BACKENDS = ["ref", "torch", "triton", "cpu"]
# the Triton step's routes (its default output-only, the state-and-output tile, and the prep / step / fold kernels
# of replayssm/delta_rule/): all run the scenarios
ROUTED = ["ref", "torch", "triton", "triton:state_and_output", "triton:output_only_fold", "cpu"]
TINY = KDAGeometry(H=2, HV=4, K=32, V=32)      # two value heads per key head


def fold_entries(S0, u, k, g, h):
    """Ground truth after h cached entries: S <- S diag(exp(g_j)) + u_j k_j^T, float64.
    S0 [HV, V, K]; u [HV, L, V]; k [H, L, K]; g [HV, L, K]."""
    HV, H = S0.shape[0], k.shape[0]
    S = S0.double()
    for j in range(h):
        kj = k[:, j].double().repeat_interleave(HV // H, 0)
        S = S * torch.exp(g[:, j].double())[:, None, :] + u[:, j].double()[:, :, None] * kj[:, None, :]
    return S


def random_cache(gm, num_slots, L, act_dtype, state_dtype, gen, device):
    cache = ReplayCache.allocate(gm, num_slots, L, state_dtype=state_dtype, act_dtype=act_dtype, device=device)
    cache.state.copy_(random_state(gm, num_slots, dtype=state_dtype, generator=gen))
    cache.u.copy_(torch.randn(num_slots, gm.HV, L, gm.V, generator=gen) * 0.3)
    cache.k.copy_(l2norm(torch.randn(num_slots, gm.H, L, gm.K, generator=gen)))
    cache.g.copy_(random_gate((num_slots,), gm.HV, L * gm.K, gen).view(num_slots, gm.HV, L, gm.K))
    cache.write_pos.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    cache.write_pos[0] = L - 1          # slot 0 flushes on its next step
    truth = torch.stack([fold_entries(cache.state[s].cpu(), cache.u[s].cpu(), cache.k[s].cpu(), cache.g[s].cpu(),
                                      int(cache.write_pos[s])) for s in range(num_slots)])
    return cache, truth


def run_scenario(backend, gm, L, act_dtype, state_dtype, steps, gen, device, use_qk_l2norm=False, scale=None,
                 batch=3, extra_slots=2):
    backend, route = split_route(backend)
    tol = tolerance(act_dtype, state_dtype)
    num_slots = batch + extra_slots
    cache, truth = random_cache(gm, num_slots, L, act_dtype, state_dtype, gen, device)
    flushes = 0
    for step in range(steps):
        slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
        live = torch.rand(batch, generator=gen) < 0.75
        live[step % batch] = True
        if step == 0:
            slots[slots == 0] = slots[0].clone()
            slots[0] = 0
        slots[~live] = NULL_SLOT
        inp = random_step(gm, batch, act_dtype, device, use_qk_l2norm=use_qk_l2norm, generator=gen)
        out = poison_(torch.empty(batch, gm.HV, gm.V, dtype=act_dtype, device=device))
        before = cache.clone()
        replay_step(cache, **inp, scale=scale, use_qk_l2norm=use_qk_l2norm, slots=slots.to(device), out=out,
                    backend=backend, **route)
        rows, sl = live.nonzero().flatten(), slots[live].long()
        S_true, o_true, _ = kda_step_ref(truth[sl], *(inp[n].cpu()[rows] for n in ("q", "k", "v", "g", "beta")),
                                         scale=scale, use_qk_l2norm=use_qk_l2norm)
        truth[sl] = S_true
        assert_rel_close(f"step {step} output", out[rows.to(device)], o_true, tol, row_dims=2)
        assert torch.isnan(out[(~live).to(device)].float()).all(), "a NULL_SLOT row's output was written"
        idle = torch.ones(num_slots, dtype=torch.bool)
        idle[sl] = False
        for name in ("state", "u", "k", "g", "write_pos"):
            assert torch.equal(getattr(cache, name)[idle.to(device)], getattr(before, name)[idle.to(device)]), \
                f"step {step}: {name} of a slot not in the batch changed"
        was = before.write_pos[sl.to(device)].long()
        flushes += int((was == L - 1).sum())
        assert torch.equal(cache.write_pos[sl.to(device)].long(), torch.where(was == L - 1, 0, was + 1))
    assert_rel_close("materialized state", materialize(cache, backend=backend), truth, tol, row_dims=2)
    assert flushes > 0, "the scenario never crossed a flush"


SCENARIOS = [  # (L, act, state, use_qk_l2norm, scale)
    (1, F32, F32, True, None),
    (4, F32, F32, False, 0.3),
    (16, F32, F32, True, None),
    (4, F16, F32, True, None),
    (16, F16, F16, False, 0.5),
    (4, F32, F16, True, 0.2),
]


@pytest.mark.parametrize("backend", ROUTED)
@pytest.mark.parametrize("L, act, state, l2, scale", SCENARIOS)
def test_replay_matches_ground_truth(backend, L, act, state, l2, scale, gen, device):
    steps = L + 3 if backend.startswith("triton") else 2 * L + 6
    run_scenario(backend, TINY, L, act, state, steps, gen, device, use_qk_l2norm=l2, scale=scale)


@pytest.mark.parametrize("backend", BACKENDS + ["triton:output_only_fold"])
def test_single_key_head_geometry(backend, gen, device):
    gm = KDAGeometry(H=1, HV=3, K=16, V=32)   # non-power-of-two head count, K < V
    run_scenario(backend, gm, 4, F32, F32, 8, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_kimi_linear_tp_split(backend, gen, device):
    gm = get_geometry("kimi_linear_48b_a3b", 8)
    assert gm == KDAGeometry(H=4, HV=4, K=128, V=128) and KDA_MODELS["kimi_linear_48b_a3b"].HV == 32
    run_scenario(backend, gm, 4, F32, F32, 6, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


def test_backends_leave_the_same_cache(gen, device):
    """ref, torch, triton and cpu write the same buffer entries, cursors and checkpoint (up to fp32 rounding)."""
    cache0, _ = random_cache(TINY, 4, 4, F32, F32, gen, device)
    caches = {b: cache0.clone() for b in BACKENDS}
    for _ in range(5):
        slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32, device=device)
        inp = random_step(TINY, 3, device=device, use_qk_l2norm=True, generator=gen)
        for b, c in caches.items():
            replay_step(c, **inp, use_qk_l2norm=True, slots=slots, backend=b)
    for b in ("torch", "triton", "cpu"):
        for name in ("state", "u", "k", "g"):
            err = rel_err(getattr(caches[b], name), getattr(caches["ref"], name))
            assert err <= 1e-6, f"{b}: cache.{name} differs from ref by {err:.2e}"
        assert torch.equal(caches[b].write_pos, caches["ref"].write_pos)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("state_dtype", [F32, F16])
def test_buffer_len_one_is_the_baseline(backend, state_dtype, gen, device):
    """L = 1 flushes every step: the same outputs and state as the KDA fused recurrent step."""
    batch = 3
    cache = ReplayCache.allocate(TINY, batch, 1, state_dtype=state_dtype, device=device)
    cache.state.copy_(random_state(TINY, batch, dtype=state_dtype, generator=gen))
    state = cache.state.clone()
    tol = 1e-6 if state_dtype == F32 else tolerance(state_dtype)
    for step in range(3):
        inp = random_step(TINY, batch, device=device, use_qk_l2norm=True, generator=gen)
        o_replay = replay_step(cache, **inp, use_qk_l2norm=True, backend=backend)
        o_base = fused_recurrent_step(state, **inp, use_qk_l2norm=True, backend=backend)
        assert rel_err(o_replay, o_base) <= tol, f"step {step}: outputs differ"
        assert rel_err(cache.state, state) <= tol, f"step {step}: states differ"


def synced_run(backend, gm, L, steps, batch, gen, device):
    """All rows in step: after every flush the checkpoint equals the ground truth."""
    backend, route = split_route(backend)
    cache = ReplayCache.allocate(gm, batch, L, device=device)
    cache.state.copy_(random_state(gm, batch, generator=gen))
    truth = cache.state.double().cpu()
    worst, checked = 0.0, 0
    for step in range(steps):
        inp = random_step(gm, batch, device=device, use_qk_l2norm=True, generator=gen)
        o = replay_step(cache, **inp, use_qk_l2norm=True, backend=backend, **route)
        truth, o_true, _ = kda_step_ref(truth, *(inp[n].cpu() for n in ("q", "k", "v", "g", "beta")),
                                        use_qk_l2norm=True)
        worst = max(worst, rel_err(o, o_true))
        if (step + 1) % L == 0:
            assert int(cache.write_pos.abs().sum()) == 0
            assert rel_err(cache.state, truth) <= tolerance(F32), f"step {step}: checkpoint"
            checked += 1
    assert worst <= tolerance(F32), f"worst output error {worst:.2e}"
    assert checked == steps // L
    assert rel_err(materialize(cache, backend=backend), truth) <= tolerance(F32)


@pytest.mark.slow
def test_long_run_torch(gen, device):
    synced_run("torch", TINY, 16, 400, 2, gen, device)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "triton:state_and_output", "triton:output_only_fold"])
def test_long_run_triton(backend, gen, device):
    synced_run(backend, KDAGeometry(H=1, HV=2, K=16, V=16), 4, 40, 2, gen, device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_materialize_slots_and_null_rows(backend, gen, device):
    cache, truth = random_cache(TINY, 5, 8, F32, F32, gen, device)
    before = cache.clone()
    slots = torch.tensor([4, NULL_SLOT, 1], dtype=torch.int32, device=device)
    out = poison_(torch.empty(3, TINY.HV, TINY.V, TINY.K, device=device))
    materialize(cache, slots=slots, backend=backend, out=out)
    assert rel_err(out[0], truth[4]) <= 1e-6 and rel_err(out[2], truth[1]) <= 1e-6
    assert torch.isnan(out[1]).all()
    for name in ("state", "u", "k", "g", "write_pos"):
        assert torch.equal(getattr(cache, name), getattr(before, name)), f"materialize wrote cache.{name}"


def test_cache_allocate_and_bytes(device):
    gm = get_geometry("kimi_linear_48b_a3b", 8)
    cache = ReplayCache.allocate(gm, 3, 16, state_dtype=F16, act_dtype=torch.bfloat16, device=device)
    assert cache.g.shape == (3, gm.HV, 16, gm.K) and cache.g.dtype == F32
    # the per-channel g: K fp32 per value head and entry, where GDN's cache holds one
    per_slot = gm.HV * gm.V * gm.K * 2 + 16 * (gm.HV * gm.V * 2 + gm.H * gm.K * 2 + gm.HV * gm.K * 4) + 4
    assert cache.nbytes() == 3 * per_slot


def _bad_calls(cache, inp, device):
    gm, b = cache.geometry, inp["q"].shape[0]
    f = lambda *shape, dtype=F32: torch.randn(*shape, device=device).to(dtype)
    return [
        ("scalar g per head (GDN's shape)", dict(g=f(b, gm.HV))),
        ("g wrong K", dict(g=f(b, gm.HV, gm.K + 1))),
        ("g wrong heads", dict(g=f(b, gm.HV + 1, gm.K))),
        ("g window shape", dict(g=f(b, 1, gm.HV, gm.K))),
        ("g K stride", dict(g=f(b, gm.HV, 2 * gm.K)[..., ::2])),
        ("g dtype", dict(g=inp["g"].half())),
        ("q shape", dict(q=f(b, gm.H, gm.K + 1))),
        ("v shape", dict(v=f(b, gm.HV, gm.V - 1))),
        ("beta shape", dict(beta=f(b, gm.HV, gm.K))),
        ("out dtype", dict(out=f(b, gm.HV, gm.V, dtype=F16))),
        ("slot out of range", dict(slots=torch.tensor([0, 9, 1], dtype=torch.int32, device=device))),
        ("slot twice", dict(slots=torch.tensor([1, 1, 0], dtype=torch.int32, device=device))),
        ("backend", dict(backend="cuda")),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_before_touching_the_cache(backend, gen, device):
    cache, _ = random_cache(TINY, 4, 4, F32, F32, gen, device)
    before = cache.clone()
    inp = random_step(TINY, 3, device=device, generator=gen)
    for label, override in _bad_calls(cache, inp, device):
        with pytest.raises(ValueError):
            replay_step(cache, **{"backend": backend, **inp, **override})
            pytest.fail(f"{label}: no ValueError")
    for name in ("state", "u", "k", "g", "write_pos"):
        assert torch.equal(getattr(cache, name), getattr(before, name))


def test_family_caches_are_not_interchangeable(gen):
    from replayssm.gdn import ReplayCache as GDNCache
    from replayssm.gdn import replay_step as gdn_replay_step
    from replayssm.geometry import GDNGeometry

    inp = random_step(TINY, 2, generator=gen)
    with pytest.raises(ValueError):
        gdn_replay_step(ReplayCache.allocate(TINY, 2, 4), **inp, backend="torch")
    with pytest.raises(ValueError):
        replay_step(GDNCache.allocate(GDNGeometry(2, 4, 32, 32), 2, 4), **inp, backend="torch")
    with pytest.raises(ValueError):
        ReplayCache.allocate(GDNGeometry(2, 4, 32, 32), 2, 4)


def test_baseline_bad_g_and_null_rows(gen, device):
    state = random_state(TINY, 3, generator=gen).to(device)
    inp = random_step(TINY, 2, device=device, generator=gen)
    with pytest.raises(ValueError):
        fused_recurrent_step(state, **{**inp, "g": inp["g"][..., 0]}, backend="torch")
    before = state.clone()
    slots = torch.tensor([NULL_SLOT, 2], dtype=torch.int32, device=device)
    for backend in BACKENDS:
        st = before.clone()
        out = poison_(torch.empty(2, TINY.HV, TINY.V, device=device))
        fused_recurrent_step(st, **inp, slots=slots, out=out, backend=backend)
        S, o, _ = kda_step_ref(before[2:3].cpu(), *(inp[n][1:2].cpu() for n in ("q", "k", "v", "g", "beta")))
        assert_rel_close(f"{backend} baseline output", out[1:], o, tolerance(F32))
        assert_rel_close(f"{backend} baseline state", st[2:], S, tolerance(F32))
        assert torch.isnan(out[0]).all() and torch.equal(st[:2], before[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("route", ["output_only", "state_and_output", "output_only_fold"])
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, F32), (F32, torch.bfloat16)])
def test_bf16_on_gpu(act_dtype, state_dtype, route, gen):
    run_scenario(f"triton:{route}", TINY, 4, act_dtype, state_dtype, 7, gen, "cuda", use_qk_l2norm=True)


GPU_TILES = KDAGeometry(H=1, HV=2, K=128, V=40)     # the GPU launch table: three V tiles, the last masked


@pytest.mark.parametrize("route", ["output_only", "state_and_output", "output_only_fold"])
@pytest.mark.parametrize("arch", ["90", "100"])
def test_gpu_tile_table_under_interpreter(arch, route, gen, device, monkeypatch):
    """The GPU launch table under the interpreter: several V-tile programs per (row, value head), g's K row and
    the shared key appended by one program each, a flush folding the tile kept in registers."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    run_scenario(f"triton:{route}", GPU_TILES, 4, F32, F32, 5, gen, device, use_qk_l2norm=True, batch=2,
                 extra_slots=1)


@pytest.mark.parametrize("backend", ["torch", "ref"])
def test_fp8_checkpoint(backend, gen):
    """The experimental e4m3 checkpoint (replayssm/fp8_checkpoint.py) on the KDA cache: quantised at every flush,
    within the fp8-keyed tolerance of the float64 recurrence from the dequantised start; Triton's default route
    (output_only) refuses it (output_only_fold stores it: tests/replayssm/test_triton_scaled_state.py)."""
    from replayssm.fp8_checkpoint import FP8_STATE_DTYPE, dequantize, write_checkpoint

    cache = ReplayCache.allocate(TINY, 2, 4, state_dtype=FP8_STATE_DTYPE)
    write_checkpoint(cache, slice(None), random_state(TINY, 2, generator=gen))
    truth = dequantize(cache.state, cache.state_scale, torch.float64)
    for _ in range(9):
        s = random_step(TINY, 2, generator=gen)
        o = replay_step(cache, **s, backend=backend)
        truth, o_ref, _ = kda_step_ref(truth, *(s[n] for n in ("q", "k", "v", "g", "beta")))
        assert_rel_close("fp8 output", o, o_ref, tolerance(FP8_STATE_DTYPE))
    assert_rel_close("fp8 state", materialize(cache, backend=backend), truth, tolerance(FP8_STATE_DTYPE))
    with pytest.raises(ValueError, match="float8_e4m3fn.*reduction across the head"):
        replay_step(cache, **random_step(TINY, 2, generator=gen), backend="triton")


def test_output_only_fold_strong_decay(gen, device):
    """The prep's per-channel weights under a strongly decaying gate (log decays down to -12 per token: products
    near fp32's underflow over 16 entries) and a nearly constant one: every factor is a decay, nothing overflows,
    and the outputs stay within tolerance of the float64 recurrence across two flushes."""
    gm, L, batch = KDAGeometry(H=1, HV=2, K=16, V=16), 16, 2
    cache = ReplayCache.allocate(gm, batch, L, device=device)
    cache.state.copy_(random_state(gm, batch, generator=gen))
    truth = cache.state.double().cpu()
    for step in range(2 * L + 1):
        inp = random_step(gm, batch, device=device, use_qk_l2norm=True, generator=gen)
        strong = -12.0 * torch.rand(batch, gm.HV, gm.K, generator=gen)
        strong[:, :, : gm.K // 2] = -1e-4            # half the channels barely decay
        inp["g"] = strong.to(device)
        out = poison_(torch.empty(batch, gm.HV, gm.V, device=device))
        replay_step(cache, **inp, use_qk_l2norm=True, out=out, backend="triton", route="output_only_fold")
        truth, o_true, _ = kda_step_ref(truth, *(inp[n].cpu() for n in ("q", "k", "v", "g", "beta")),
                                        use_qk_l2norm=True)
        assert torch.isfinite(out).all()
        assert_rel_close(f"step {step} output", out, o_true, tolerance(F32), row_dims=2)
    assert int(cache.write_pos.sum()) == batch          # two flushes crossed, one entry buffered since
    assert rel_err(materialize(cache, backend="triton"), truth) <= tolerance(F32)
