"""ReplaySSM Gated DeltaNet AR decode vs the float64 delta-rule ground truth (replayssm.gdn.ref), all backends.

Every scenario starts from a cache whose slots hold a random checkpoint, a random number of valid
buffered entries and so desynchronised cursors; each step leaves random rows as NULL_SLOT padding and
maps the others to permuted slots of a larger pool. The ground truth keeps one float64 state per slot.
"""

import pytest
import torch

from baselines.gdn_recurrent import fused_recurrent_step
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.gdn.cache import ReplayCache
from replayssm.gdn.decode import materialize, replay_step
from replayssm.gdn.inputs import random_state, random_step
from replayssm.gdn.ref import gdn_step_ref, l2norm
from replayssm.geometry import GDNGeometry, get_geometry
from replayssm.testing import assert_rel_close, poison_, rel_err, split_route, tolerance

F32, F16 = torch.float32, torch.float16
BACKENDS = ["ref", "torch", "triton", "cpu"]
# the Triton step has two routes (its default output-only and the state-and-output tile): both run the scenarios
ROUTED = ["ref", "torch", "triton", "triton:state_and_output", "cpu"]
TINY = GDNGeometry(H=2, HV=4, K=32, V=32)      # two value heads per key head


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view with padded outer strides (every other row, padded last dim)."""
    big = torch.full((2 * t.shape[0], *t.shape[1:-1], t.shape[-1] + 3), 7.0, dtype=t.dtype, device=t.device)
    big[::2, ..., :t.shape[-1]] = t
    view = big[::2, ..., :t.shape[-1]]
    assert not view.is_contiguous()
    return view


def fold_entries(S0: torch.Tensor, u: torch.Tensor, k: torch.Tensor, g: torch.Tensor, h: int) -> torch.Tensor:
    """The ground-truth state after h cached entries: S <- exp(g_j) S + u_j k_j^T, float64.
    S0 [HV, V, K]; u [HV, L, V]; k [H, L, K]; g [HV, L]."""
    HV, H = S0.shape[0], k.shape[0]
    S = S0.double()
    for j in range(h):
        kj = k[:, j].double().repeat_interleave(HV // H, 0)
        S = torch.exp(g[:, j].double())[:, None, None] * S + u[:, j].double()[:, :, None] * kj[:, None, :]
    return S


def random_cache(gm, num_slots, L, act_dtype, state_dtype, gen, device):
    """A cache with a random checkpoint and a random count of valid entries per slot; its ground truth."""
    cache = ReplayCache.allocate(gm, num_slots, L, state_dtype=state_dtype, act_dtype=act_dtype, device=device)
    cache.state.copy_(random_state(gm, num_slots, dtype=state_dtype, generator=gen))
    u = torch.randn(num_slots, gm.HV, L, gm.V, generator=gen) * 0.3
    k = l2norm(torch.randn(num_slots, gm.H, L, gm.K, generator=gen))
    g = -torch.exp(torch.empty(num_slots, gm.HV, L).uniform_(-6.9, -0.36, generator=gen))
    cache.u.copy_(u)
    cache.k.copy_(k)
    cache.g.copy_(g)
    cache.write_pos.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    cache.write_pos[0] = L - 1          # slot 0 flushes on its next step
    truth = torch.stack([fold_entries(cache.state[s].cpu(), cache.u[s].cpu(), cache.k[s].cpu(), cache.g[s].cpu(),
                                      int(cache.write_pos[s])) for s in range(num_slots)])
    return cache, truth


def run_scenario(backend, gm, L, act_dtype, state_dtype, steps, gen, device, use_qk_l2norm=False, scale=None,
                 strided=False, batch=3, extra_slots=2):
    backend, route = split_route(backend)
    tol = tolerance(act_dtype, state_dtype)
    num_slots = batch + extra_slots
    cache, truth = random_cache(gm, num_slots, L, act_dtype, state_dtype, gen, device)
    flushes = 0
    for step in range(steps):
        slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
        live = torch.rand(batch, generator=gen) < 0.75
        live[step % batch] = True
        if step == 0:                   # row 0 (live) gets slot 0, which flushes
            slots[slots == 0] = slots[0].clone()
            slots[0] = 0
        slots[~live] = NULL_SLOT
        inp = random_step(gm, batch, act_dtype, device, use_qk_l2norm=use_qk_l2norm, generator=gen)
        out = poison_(torch.empty(batch, gm.HV, gm.V, dtype=act_dtype, device=device))
        if strided:
            inp = {name: strided_copy(t) for name, t in inp.items()}
            out = strided_copy(out)
        before = cache.clone()
        replay_step(cache, **inp, scale=scale, use_qk_l2norm=use_qk_l2norm, slots=slots.to(device), out=out,
                    backend=backend, **route)

        rows, sl = live.nonzero().flatten(), slots[live].long()
        S_true, o_true, _ = gdn_step_ref(truth[sl], *(inp[n].cpu()[rows] for n in ("q", "k", "v", "g", "beta")),
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
        expect_pos = torch.where(was == L - 1, 0, was + 1)
        assert torch.equal(cache.write_pos[sl.to(device)].long(), expect_pos)
    assert_rel_close("materialized state", materialize(cache, backend=backend), truth, tol, row_dims=2)
    assert flushes > 0, "the scenario never crossed a flush"


SCENARIOS = [  # (L, act, state, use_qk_l2norm, scale, strided)
    (1, F32, F32, True, None, False),
    (4, F32, F32, False, 0.3, True),
    (16, F32, F32, True, None, True),
    (4, F16, F32, True, None, False),
    (16, F16, F16, False, 0.5, True),
    (1, F16, F16, False, None, True),
    (4, F32, F16, True, 0.2, False),
]


@pytest.mark.parametrize("backend", ROUTED)
@pytest.mark.parametrize("L, act, state, l2, scale, strided", SCENARIOS)
def test_replay_matches_ground_truth(backend, L, act, state, l2, scale, strided, gen, device):
    steps = L + 3 if backend.startswith("triton") else 2 * L + 6
    run_scenario(backend, TINY, L, act, state, steps, gen, device, use_qk_l2norm=l2, scale=scale, strided=strided)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_key_head_geometry(backend, gen, device):
    gm = GDNGeometry(H=1, HV=3, K=16, V=32)   # non-power-of-two head count, K < V
    run_scenario(backend, gm, 4, F32, F32, 8, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
@pytest.mark.parametrize("model", ["qwen35_122b_a10b", "qwen35_4b"])
def test_tp_split_geometry(backend, model, gen, device):
    gm = get_geometry(model, 8)
    run_scenario(backend, gm, 4, F32, F32, 6, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


@pytest.mark.parametrize("K", [80, 20])
def test_cpu_row_tiles(K, gen, device):
    """The C flush rebuilds a key row as 64-wide blocks, then 16-wide ones; other widths take the plain loop:
    K 80 = one block of each, 20 = the plain loop."""
    run_scenario("cpu", GDNGeometry(H=1, HV=2, K=K, V=16), 4, F32, F32, 9, gen, device, batch=2, extra_slots=1)


def test_triton_tp_split_geometry(gen, device):
    gm = get_geometry("qwen35_122b_a10b", 8)
    run_scenario("triton", gm, 4, F32, F32, 2, gen, device, use_qk_l2norm=True, batch=1, extra_slots=1)


def test_backends_leave_the_same_cache(gen, device):
    """ref, torch, triton and cpu write the same buffer entries, cursors and checkpoint (up to fp32 rounding)."""
    gm, L = TINY, 4
    cache0, _ = random_cache(gm, 4, L, F32, F32, gen, device)
    caches = {b: cache0.clone() for b in BACKENDS}
    for _ in range(L + 1):
        slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32, device=device)
        inp = random_step(gm, 3, device=device, use_qk_l2norm=True, generator=gen)
        for b, c in caches.items():
            replay_step(c, **inp, use_qk_l2norm=True, slots=slots, backend=b)
    ref = caches["ref"]
    for b in ("torch", "triton", "cpu"):
        for name in ("state", "u", "k", "g"):
            err = rel_err(getattr(caches[b], name), getattr(ref, name))
            assert err <= 1e-6, f"{b}: cache.{name} differs from ref by {err:.2e}"
        assert torch.equal(caches[b].write_pos, ref.write_pos)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("state_dtype", [F32, F16, torch.bfloat16])
def test_buffer_len_one_is_the_baseline(backend, state_dtype, gen, device):
    """L = 1 flushes every step: the same outputs and state as fused_recurrent_step."""
    if backend == "triton" and state_dtype == torch.bfloat16 and interpreter_active():
        pytest.skip("bf16 state: the Triton interpreter computes on raw bits (GPU-only case)")
    gm, batch = TINY, 3
    cache = ReplayCache.allocate(gm, batch, 1, state_dtype=state_dtype, device=device)
    cache.state.copy_(random_state(gm, batch, dtype=state_dtype, generator=gen))
    state = cache.state.clone()
    tol = 1e-6 if state_dtype == F32 else tolerance(state_dtype)
    for step in range(3):
        inp = random_step(gm, batch, device=device, use_qk_l2norm=True, generator=gen)
        o_replay = replay_step(cache, **inp, use_qk_l2norm=True, backend=backend)
        o_base = fused_recurrent_step(state, **inp, use_qk_l2norm=True, backend=backend)
        assert rel_err(o_replay, o_base) <= tol, f"step {step}: outputs differ"
        assert rel_err(cache.state, state) <= tol, f"step {step}: states differ"
        assert int(cache.write_pos.abs().sum()) == 0


def synced_run_checkpoints(backend, gm, L, steps, batch, gen, device):
    """All rows in step: after every flush the checkpoint must equal the ground-truth state."""
    backend, route = split_route(backend)
    cache = ReplayCache.allocate(gm, batch, L, device=device)
    cache.state.copy_(random_state(gm, batch, generator=gen))
    truth = cache.state.double().cpu()
    worst, checked = 0.0, 0
    for step in range(steps):
        inp = random_step(gm, batch, device=device, use_qk_l2norm=True, generator=gen)
        o = replay_step(cache, **inp, use_qk_l2norm=True, backend=backend, **route)
        truth, o_true, _ = gdn_step_ref(truth, *(inp[n].cpu() for n in ("q", "k", "v", "g", "beta")),
                                        use_qk_l2norm=True)
        worst = max(worst, rel_err(o, o_true))
        if (step + 1) % L == 0:
            assert int(cache.write_pos.abs().sum()) == 0
            err = rel_err(cache.state, truth)
            assert err <= tolerance(F32), f"step {step}: checkpoint error {err:.2e}"
            checked += 1
    assert worst <= tolerance(F32), f"worst output error {worst:.2e}"
    assert checked == steps // L
    assert rel_err(materialize(cache, backend=backend), truth) <= tolerance(F32)


@pytest.mark.slow
def test_long_run_torch(gen, device):
    synced_run_checkpoints("torch", TINY, 16, 1008, 2, gen, device)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "triton:state_and_output"])
def test_long_run_triton(backend, gen, device):
    synced_run_checkpoints(backend, GDNGeometry(H=1, HV=2, K=16, V=16), 4, 104, 2, gen, device)


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


def test_cache_allocate_and_bookkeeping(device):
    gm = get_geometry("qwen35_122b_a10b", 8)
    cache = ReplayCache.allocate(gm, 3, 16, state_dtype=F16, act_dtype=torch.bfloat16, device=device)
    assert cache.state.shape == (3, gm.HV, gm.V, gm.K) and cache.state_dtype == F16
    assert cache.u.shape == (3, gm.HV, 16, gm.V) and cache.act_dtype == torch.bfloat16
    assert cache.k.shape == (3, gm.H, 16, gm.K) and cache.g.shape == (3, gm.HV, 16) and cache.g.dtype == F32
    per_slot = gm.HV * gm.V * gm.K * 2 + 16 * (gm.HV * gm.V * 2 + gm.H * gm.K * 2 + gm.HV * 4) + 4
    assert cache.nbytes() == 3 * per_slot and cache.num_slots == 3 and cache.null_slot == NULL_SLOT
    cache.write_pos.fill_(5)
    twin = cache.clone()
    cache.reset(torch.tensor([1], dtype=torch.int32, device=device))
    assert cache.write_pos.tolist() == [5, 0, 5] and twin.write_pos.tolist() == [5, 5, 5]
    cache.reset()
    assert cache.write_pos.tolist() == [0, 0, 0]


def _bad_calls(cache, inp, device):
    """(label, kwargs overrides) that must each raise ValueError before any launch."""
    gm, b = cache.geometry, inp["q"].shape[0]
    f = lambda *shape, dtype=F32: torch.randn(*shape, device=device).to(dtype)
    return [
        ("q shape", dict(q=f(b, gm.H, gm.K + 1))),
        ("k heads", dict(k=f(b, gm.H + 1, gm.K))),
        ("v shape", dict(v=f(b, gm.HV, gm.V - 1))),
        ("g shape", dict(g=f(b, gm.HV + 1))),
        ("beta batch", dict(beta=f(b + 1, gm.HV))),
        ("q dtype", dict(q=inp["q"].half())),
        ("g dtype", dict(g=inp["g"].half())),
        ("beta dtype", dict(beta=inp["beta"].double())),
        ("q last-dim stride", dict(q=f(b, gm.H, 2 * gm.K)[..., ::2])),
        ("out shape", dict(out=f(b, gm.HV, gm.V + 1))),
        ("out dtype", dict(out=f(b, gm.HV, gm.V, dtype=F16))),
        ("slot out of range", dict(slots=torch.tensor([0, 9, 1], dtype=torch.int32, device=device))),
        ("slot twice", dict(slots=torch.tensor([1, 1, 0], dtype=torch.int32, device=device))),
        ("slots dtype", dict(slots=torch.tensor([0.0, 1.0, 2.0], device=device))),
        ("slots shape", dict(slots=torch.tensor([0, 1], dtype=torch.int32, device=device))),
        ("scale", dict(scale="0.1")),
        ("l2norm flag", dict(use_qk_l2norm=1)),
        ("backend", dict(backend="cuda")),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_before_touching_the_cache(backend, gen, device):
    cache, _ = random_cache(TINY, 4, 4, F32, F32, gen, device)
    before = cache.clone()
    inp = random_step(TINY, 3, device=device, generator=gen)
    for label, override in _bad_calls(cache, inp, device):
        kwargs = {"backend": backend, **inp, **override}
        with pytest.raises(ValueError):
            replay_step(cache, **kwargs)
            pytest.fail(f"{label}: no ValueError")
    for name in ("state", "u", "k", "g", "write_pos"):
        assert torch.equal(getattr(cache, name), getattr(before, name))


def test_bad_geometry_and_allocation(device):
    with pytest.raises(ValueError):
        GDNGeometry(H=2, HV=3, K=16, V=16)          # HV not a multiple of H
    big_k = GDNGeometry(H=1, HV=1, K=512, V=16)
    cache = ReplayCache.allocate(big_k, 1, 4, device=device)
    inp = random_step(big_k, 1, device=device)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="K=512"):
            replay_step(cache, **inp, backend=backend)
        with pytest.raises(ValueError, match="K=512"):
            materialize(cache, backend=backend)
    for bad in (dict(num_slots=0), dict(buffer_len=0), dict(state_dtype=torch.float64),
                dict(act_dtype=torch.float64), dict(geometry=(1, 1, 16, 16))):
        args = {"geometry": TINY, "num_slots": 2, "buffer_len": 4, **bad}
        with pytest.raises(ValueError):
            ReplayCache.allocate(**args, device=device)
    with pytest.raises(ValueError):
        replay_step("not a cache", **random_step(TINY, 1, device=device))


def test_bf16_rejected_by_the_interpreter(gen, device):
    if device != "cpu":
        pytest.skip("the interpreter only runs on CPU")
    cache = ReplayCache.allocate(TINY, 2, 4, act_dtype=torch.bfloat16)
    inp = random_step(TINY, 2, act_dtype=torch.bfloat16, generator=gen)
    with pytest.raises(ValueError, match="bfloat16"):
        replay_step(cache, **inp, backend="triton")
    replay_step(cache, **inp, backend="torch")      # bf16 is fine off the interpreter
    assert cache.write_pos.tolist() == [1, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("route", ["output_only", "state_and_output", "output_only_fold"])
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, F32), (F32, torch.bfloat16)])
def test_bf16_on_gpu(act_dtype, state_dtype, route, gen):
    run_scenario(f"triton:{route}", TINY, 4, act_dtype, state_dtype, 7, gen, "cuda", use_qk_l2norm=True)


GPU_TILES = GDNGeometry(H=1, HV=2, K=128, V=40)     # GPU table: [16, 128] / [32, 128] tiles, the last V tile masked


@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
@pytest.mark.parametrize("arch", ["90", "100"])
def test_gpu_tile_table_under_interpreter(arch, route, gen, device, monkeypatch):
    """The GPU launch table run by the interpreter: several V-tile programs per (row, value head), so the
    u rows are appended by their own tile, g and the shared key (two value heads per key head) by one
    program each, and a flush folds the tile it kept in registers. Outputs, checkpoint and materialize vs
    the float64 ground truth, over a flush, on both routes (state-and-output: 3 V tiles; output-only: 2)."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    from replayssm.gdn.decode_kernels import replay_launch_config

    cfg = replay_launch_config(GPU_TILES.K, GPU_TILES.V, F32, int(arch), route=route)
    tiles = {"output_only": 2, "state_and_output": 3}[route]
    assert cfg.block_kt == GPU_TILES.K and -(-GPU_TILES.V // cfg.block_v) == tiles and cfg.dot_precision == "tf32x3"
    run_scenario(f"triton:{route}", GPU_TILES, 4, F32, F32, 5, gen, device, use_qk_l2norm=True, batch=2,
                 extra_slots=1)


# ---------------------------------------------------------------------------------------------------------
# The output_only_fold route (replayssm/delta_rule/: prep, step, fold kernels)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from replayssm.delta_rule._tl import split_bf16  # noqa: E402

FOLD = "triton:output_only_fold"


@triton.jit
def _split(a_ptr, hi_ptr, lo_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    hi, lo = split_bf16(tl.load(a_ptr + offs))
    tl.store(hi_ptr + offs, hi.to(tl.float32))
    tl.store(lo_ptr + offs, lo.to(tl.float32))


@pytest.mark.parametrize("L, act, state, l2, scale, strided", SCENARIOS)
def test_output_only_fold_matches_ground_truth(L, act, state, l2, scale, strided, gen, device):
    """Token by token over 2L + 1 steps (flushes crossed), desynchronised cursors, NULL rows, NaN-poisoned outputs,
    permuted slots of a larger pool, fp32 / fp16 state, L in {1, 4, 16}."""
    run_scenario(FOLD, TINY, L, act, state, 2 * L + 1, gen, device, use_qk_l2norm=l2, scale=scale, strided=strided)


def test_output_only_fold_single_key_head(gen, device):
    gm = GDNGeometry(H=1, HV=3, K=16, V=32)   # non-power-of-two value heads per key head (the prep's padded group)
    run_scenario(FOLD, gm, 4, F32, F32, 9, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


def test_output_only_fold_long_run(gen, device):
    """A few hundred synchronised steps: the checkpoint after every flush equals the float64 state."""
    synced_run_checkpoints(FOLD, GDNGeometry(H=1, HV=2, K=16, V=16), 16, 208, 2, gen, device)


def test_output_only_fold_leaves_the_live_cache_of_ref(gen, device):
    """The same checkpoint, cursors and live buffer rows (j < write_pos) as the float64 loops; the route also writes
    row L-1 on a flush (the fold's last entry), which no reader sees."""
    gm, L = TINY, 4
    ref, _ = random_cache(gm, 4, L, F32, F32, gen, device)
    fold = ref.clone()
    for _ in range(L + 2):
        slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32, device=device)
        inp = random_step(gm, 3, device=device, use_qk_l2norm=True, generator=gen)
        replay_step(ref, **inp, use_qk_l2norm=True, slots=slots, backend="ref")
        replay_step(fold, **inp, use_qk_l2norm=True, slots=slots, backend="triton", route="output_only_fold")
    assert torch.equal(fold.write_pos, ref.write_pos)
    assert rel_err(fold.state, ref.state) <= 1e-6
    for s, h in enumerate(ref.write_pos.tolist()):
        for name in ("u", "k", "g"):
            err = rel_err(getattr(fold, name)[s, :, :h], getattr(ref, name)[s, :, :h])
            assert err <= 1e-6, f"slot {s}: cache.{name} differs from ref by {err:.2e}"


@pytest.mark.parametrize("act", [F32, F16])
@pytest.mark.parametrize("arch", ["90", "100"])
def test_output_only_fold_gpu_tiles_under_interpreter(arch, act, gen, device, monkeypatch):
    """The GPU default rules run by the interpreter: [32, 32] step chunks and several V tiles (the last masked),
    the fold's K walk in 32-column chunks with its GPU dot (tf32x3 for fp32 keys, tf32x2 for fp16 keys)."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    from replayssm.delta_rule.launch import KERNELS, ar_config

    step, fold = (ar_config(name, GPU_TILES.K, GPU_TILES.V, 4, F32, int(arch)) for name in KERNELS[1:])
    assert (step.block_v, step.block_k, fold.block_k) == (32, 32, 32)
    run_scenario(FOLD, GPU_TILES, 4, act, F32, 6, gen, device, use_qk_l2norm=True, batch=2, extra_slots=1)


def test_output_only_fold_split_bf16_bound(gen, device):
    """The fold's bf16x2 dot (replayssm/delta_rule/_tl.py): with bf16-exact keys B, hi @ B + lo @ B is within
    (2^-14 + BC 2^-24) (|A| @ |B|) of A @ B in float64. The split runs in Triton (the interpreter truncates
    where the GPU rounds to nearest: the bound covers both); the two products are exact in fp32, so they are
    formed here in float64 (the interpreter's bf16 tl.dot is not emulated)."""
    if device != "cpu":
        pytest.skip("interpreter check")
    M, C, N = 32, 32, 32
    A = torch.randn(M, C, generator=gen) * torch.exp(torch.randn(M, C, generator=gen) * 3)   # wide magnitudes
    B = torch.randn(C, N, generator=gen).bfloat16().float()
    hi, lo = torch.empty_like(A), torch.empty_like(A)
    _split[(1,)](A.view(-1), hi.view(-1), lo.view(-1), N=M * C)
    assert torch.equal(hi.bfloat16().float(), hi) and torch.equal(lo.bfloat16().float(), lo)   # bf16-exact parts
    assert ((A.double() - hi.double() - lo.double()).abs() <= 2.0 ** -14 * A.double().abs()).all()
    exact = A.double() @ B.double()
    split = (hi.double() @ B.double()).float().double() + (lo.double() @ B.double()).float().double()
    bound = (2.0 ** -14 + C * 2.0 ** -24) * (A.double().abs() @ B.double().abs())
    assert ((split - exact).abs() <= bound).all()


def test_output_only_fold_is_delta_rule_only(gen, device):
    """GDN and KDA share the route's kernels (KDA's prep is its own); Mamba-2 refuses the name before anything is
    written."""
    from replayssm.checks import FAMILY_ROUTES, check_route

    assert "output_only_fold" in FAMILY_ROUTES["gdn"] and "output_only_fold" in FAMILY_ROUTES["kda"]
    with pytest.raises(ValueError, match="output_only_fold"):
        check_route("output_only_fold", "mamba2")


def test_output_only_fold_main_kernel_has_no_family_flag():
    """structure-review §4.1 rule 1: the main step and the fold carry no family constexpr (family work lives in the
    prep kernels; the fold reads the decays at a stride along K, 0 for GDN), so GDN and KDA launch the same two."""
    import inspect

    from replayssm.delta_rule import ar_fold, ar_step

    for module, kernel in ((ar_step, ar_step.ar_step_kernel), (ar_fold, ar_fold.ar_fold_kernel)):
        src = inspect.getsource(module)
        for flag in ("PER_CHANNEL", "IS_KDA", "FAMILY"):
            assert flag not in src, f"{module.__name__} names {flag}"
        names = [p.upper() for p in inspect.signature(kernel.fn).parameters]
        assert not [n for n in names if "KDA" in n or "GDN" in n or "CHANNEL" in n], names
