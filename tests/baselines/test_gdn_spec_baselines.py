"""GDN speculative baselines: native per-draft snapshots (vLLM) and commit-time replay (FlashInfer).

Ground truth: replayssm.gdn.ref.window_ref from the committed state, advanced by states[:, a - 1] after each
commit; the committed state of each method (snapshot last[slot] / the checkpoint) is compared after every
commit. Triton runs are also compared with the torch backend's cache contents.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import baselines.gdn_commit_replay as commit_replay
import baselines.gdn_recurrent_spec as native
from replayssm import checks, ring_cursors
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.gdn import spec as gdn_spec
from replayssm.gdn.inputs import random_state, random_step
from replayssm.gdn.ref import l2norm, window_ref
from replayssm.geometry import GDNGeometry, get_geometry
from replayssm.testing import assert_rel_close, nan_like, rel_err, tolerance

SMALL = GDNGeometry(H=2, HV=4, K=32, V=32)
TINY = GDNGeometry(H=1, HV=2, K=16, V=16)
METHODS = {"native": native, "commit_replay": commit_replay}


def make_cache(method, gm, num_slots, T, gen, state_dtype=torch.float32, act_dtype=torch.float32, device="cpu"):
    init = random_state(gm, num_slots, dtype=state_dtype, generator=gen).to(device)
    if method == "native":
        cache = native.SpecStates.allocate(gm, num_slots, T, state_dtype=state_dtype, device=device)
        cache.state[:, 0] = init
    else:
        cache = commit_replay.CommitReplayCache.allocate(gm, num_slots, T, state_dtype=state_dtype,
                                                         act_dtype=act_dtype, device=device)
        cache.state.copy_(init)
    return cache


def committed(method, cache, slots):
    """The committed state of the rows' slots, on the CPU."""
    sl = slots.long().to(cache.device)
    if method == "native":
        return cache.state[sl, cache.last[sl].long()].cpu()
    return cache.state[sl].cpu()


def run_steps(method, caches, backends, slots, gen, steps, act_dtype=torch.float32, use_qk_l2norm=False,
              inputs_fn=None, accepted_fn=None):
    """Verify + commit `steps` times on every (cache, backend); check outputs and committed states."""
    mod, T, dev = METHODS[method], caches[0].window, caches[0].device
    gm = caches[0].geometry
    live, batch = slots != NULL_SLOT, len(slots)
    truth = committed(method, caches[0], slots[live]).double()
    tol = tolerance(act_dtype, caches[0].state_dtype)
    for step in range(steps):
        x = inputs_fn() if inputs_fn else random_step(gm, batch, act_dtype=act_dtype, window=T,
                                                      use_qk_l2norm=use_qk_l2norm, generator=gen)
        states, o_ref = window_ref(truth, **{n: t[live] for n, t in x.items()}, use_qk_l2norm=use_qk_l2norm)
        x_dev = {n: t.to(dev) for n, t in x.items()}
        for cache, backend in zip(caches, backends):
            out = nan_like(torch.empty(batch, T, gm.HV, gm.V, dtype=act_dtype, device=dev))
            mod.spec_verify(cache, **x_dev, use_qk_l2norm=use_qk_l2norm, slots=slots.to(dev), out=out,
                            backend=backend)
            out = out.cpu()
            assert torch.isfinite(out[live]).all()
            assert_rel_close(f"{backend} step {step} output", out[live], o_ref, tol, row_dims=3)
            assert out[~live].isnan().all(), f"{backend}: a NULL_SLOT row's output was written"
        accepted = accepted_fn(step) if accepted_fn else torch.randint(1, T + 1, (batch,), generator=gen,
                                                                       dtype=torch.int32)
        truth = states[torch.arange(int(live.sum())), accepted[live].long() - 1]
        for cache, backend in zip(caches, backends):
            mod.spec_commit(cache, accepted.to(dev), slots=slots.to(dev), backend=backend)
            assert_rel_close(f"{backend} step {step} state", committed(method, cache, slots[live]), truth, tol,
                             row_dims=2)


def assert_same_cache(method, cache, twin, tol):
    names = ("state",) if method == "native" else ("state", "k", "v", "g", "beta")
    for name in names:
        assert rel_err(getattr(cache, name), getattr(twin, name)) <= tol, name
    if method == "native":
        assert torch.equal(cache.last, twin.last)


@pytest.mark.parametrize("use_qk_l2norm", [False, True])
@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_long_run_matches_serial_ground_truth(method, backend, T, use_qk_l2norm, gen):
    """40 steps with random accepted counts; permuted slots in a bigger pool and a NULL_SLOT row."""
    cache = make_cache(method, SMALL, 5, T, gen)
    slots = torch.tensor([3, NULL_SLOT, 0, 4], dtype=torch.int32)
    untouched = cache.clone()
    run_steps(method, [cache], [backend], slots, gen, 40, use_qk_l2norm=use_qk_l2norm)
    for slot in (1, 2):
        assert torch.equal(cache.state[slot], untouched.state[slot]), f"slot {slot} touched"


@pytest.mark.parametrize("K", [20, 48])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_cpu_row_widths(method, K, gen):
    """The C serial row keeps a K % 16 == 0 row in vector registers; other widths take the scalar loop."""
    gm = GDNGeometry(H=1, HV=2, K=K, V=16)
    cache = make_cache(method, gm, 3, 3, gen)
    run_steps(method, [cache], ["cpu"], torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32), gen, 12,
              use_qk_l2norm=True)


@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.float16, torch.float32), (torch.float32, torch.float16),
                                                   (torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_long_run_half_precision(method, backend, act_dtype, state_dtype, gen):
    cache = make_cache(method, SMALL, 3, 4, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    run_steps(method, [cache], [backend], torch.tensor([2, 0, 1], dtype=torch.int32), gen, 40,
              act_dtype=act_dtype, use_qk_l2norm=True)


@pytest.mark.parametrize("T,act_dtype,state_dtype,use_qk_l2norm", [
    (2, torch.float32, torch.float32, True),
    (4, torch.float16, torch.float16, False),
])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_triton_matches_ground_truth_and_torch_cache(method, T, act_dtype, state_dtype, use_qk_l2norm, gen):
    """Triton under the interpreter: outputs and committed states vs ground truth, caches vs torch backend."""
    gm = SMALL if T == 2 else GDNGeometry(H=1, HV=2, K=16, V=32)
    cache = make_cache(method, gm, 3, T, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    twin = cache.clone()
    untouched = cache.clone()
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    counts = [[T, 5, 1], [1, 0, T], [T - 1, 9, 2], [T, -3, T]]        # NULL row: any count is ignored
    for step in range(4):
        run_steps(method, [cache, twin], ["triton", "torch"], slots, gen, 1, act_dtype=act_dtype,
                  use_qk_l2norm=use_qk_l2norm, accepted_fn=lambda s, step=step: torch.tensor(counts[step],
                                                                                             dtype=torch.int32))
        assert_same_cache(method, cache, twin, tolerance(act_dtype, state_dtype))
    assert torch.equal(cache.state[1], untouched.state[1])


@pytest.mark.parametrize("backend", ["torch", "ref", "triton"])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_ill_conditioned_window(method, backend, gen):
    """beta 0.999, nearly parallel keys: the serial recurrence is stable; no NaN, fp32 tolerance."""
    T, batch = 4, 2
    cache = make_cache(method, SMALL, batch, T, gen)

    def inputs():
        x = random_step(SMALL, batch, window=T, generator=gen)
        k0 = torch.randn(batch, 1, SMALL.H, SMALL.K, generator=gen)
        x["k"] = l2norm(k0 + 1e-3 * torch.randn(batch, T, SMALL.H, SMALL.K, generator=gen)).float()
        x["beta"].fill_(0.999)
        return x

    run_steps(method, [cache], [backend], torch.arange(batch, dtype=torch.int32), gen,
              2 if backend == "triton" else 10, inputs_fn=inputs)


@pytest.mark.parametrize("backend", ["torch", "ref"])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_tp_split_qwen_geometry(method, backend, gen):
    """Qwen3.5-4B at TP=8 (H=2, HV=4, K=V=128), T=4."""
    gm = get_geometry("qwen35_4b", tp=8)
    cache = make_cache(method, gm, 2, 4, gen)
    run_steps(method, [cache], [backend], torch.tensor([1, 0], dtype=torch.int32), gen, 4, use_qk_l2norm=True)


@pytest.mark.parametrize("backend", ["torch", "ref", "triton"])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_strided_inputs(method, backend, gen):
    """q, k, v as views into one packed [batch, T, 2HK + HV V] tensor; out a padded view."""
    gm, T, batch = SMALL, 2, 2
    cache = make_cache(method, gm, batch, T, gen)
    twin = cache.clone()
    x = random_step(gm, batch, window=T, generator=gen)
    hk = gm.H * gm.K
    packed = torch.cat([x["q"].flatten(2), x["k"].flatten(2), x["v"].flatten(2)], -1)
    q = packed[..., :hk].unflatten(-1, (gm.H, gm.K))
    k = packed[..., hk:2 * hk].unflatten(-1, (gm.H, gm.K))
    v = packed[..., 2 * hk:].unflatten(-1, (gm.HV, gm.V))
    gb = torch.cat([x["g"], x["beta"]], -1)
    out_buf = nan_like(torch.empty(batch, T, gm.HV, gm.V + 8))
    mod = METHODS[method]
    mod.spec_verify(cache, q, k, v, gb[..., :gm.HV], gb[..., gm.HV:], out=out_buf[..., :gm.V], backend=backend)
    expected = mod.spec_verify(twin, **x, backend="ref")
    assert rel_err(out_buf[..., :gm.V], expected) <= tolerance(torch.float32)
    assert out_buf[..., gm.V:].isnan().all()
    assert_same_cache(method, cache, twin, tolerance(torch.float32))


@pytest.mark.parametrize("backend", ["torch", "ref", "triton"])
def test_native_reset_reads_snapshot_zero(backend, gen):
    cache = make_cache("native", TINY, 3, 2, gen)
    cache.last.copy_(torch.tensor([1, 1, 1], dtype=torch.int32))
    native.spec_reset(cache, slots=torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32), backend=backend)
    assert cache.last.tolist() == [0, 1, 0]
    native.spec_commit(cache, torch.tensor([1, 2, 0], dtype=torch.int32),
                       slots=torch.tensor([1, 0, NULL_SLOT], dtype=torch.int32), backend=backend)
    assert cache.last.tolist() == [1, 0, 0]


def test_memory_footprint():
    """Native keeps T states per slot; commit replay one state plus a window stash."""
    T = 4
    states = native.SpecStates.allocate(SMALL, 3, T)
    assert states.state.shape == (3, T, SMALL.HV, SMALL.V, SMALL.K)
    state_bytes = SMALL.HV * SMALL.V * SMALL.K * 4
    assert states.nbytes() == 3 * (T * state_bytes + 4)
    cache = commit_replay.CommitReplayCache.allocate(SMALL, 3, T, act_dtype=torch.float16)
    stash = SMALL.H * T * SMALL.K * 2 + SMALL.HV * T * SMALL.V * 2 + 2 * SMALL.HV * T * 4
    assert cache.nbytes() == 3 * (state_bytes + stash)


@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_bad_inputs_raise(method, gen):
    T, mod = 2, METHODS[method]
    cache = make_cache(method, TINY, 2, T, gen)
    snapshot = cache.clone()
    x = random_step(TINY, 2, window=T, generator=gen)

    def verify(**changes):
        mod.spec_verify(cache, **{**x, **changes}, backend="torch")

    with pytest.raises(ValueError, match="window"):
        verify(**random_step(TINY, 2, window=3, generator=gen))
    with pytest.raises(ValueError, match="shape"):
        verify(q=torch.randn(2, T, 2, 16))
    with pytest.raises(ValueError, match="dtype"):
        verify(v=x["v"].half())
    with pytest.raises(ValueError, match="dtype"):
        verify(beta=x["beta"].half())
    with pytest.raises(ValueError, match="unit stride"):
        verify(k=torch.repeat_interleave(x["k"], 2, -1)[..., ::2])
    with pytest.raises(ValueError, match="slot out of range"):
        mod.spec_verify(cache, **x, slots=torch.tensor([0, 5], dtype=torch.int32), backend="torch")
    for bad in ([0, 1], [1, T + 1]):
        with pytest.raises(ValueError, match="num_accepted"):
            mod.spec_commit(cache, torch.tensor(bad, dtype=torch.int32), backend="torch")
    with pytest.raises(ValueError, match="bfloat16"):
        bf = {n: (t.bfloat16() if n in ("q", "k", "v") else t) for n, t in x.items()}
        if method == "commit_replay":
            bf_cache = commit_replay.CommitReplayCache.allocate(TINY, 2, T, act_dtype=torch.bfloat16)
        else:
            bf_cache = native.SpecStates.allocate(TINY, 2, T)
        mod.spec_verify(bf_cache, **bf, backend="triton")
    wide = GDNGeometry(H=1, HV=1, K=512, V=16)
    with pytest.raises(ValueError, match="cannot tile"):
        mod.spec_verify(make_cache(method, wide, 1, 2, gen), **random_step(wide, 1, window=2, generator=gen),
                        backend="triton")
    with pytest.raises(ValueError, match="window"):
        (native.SpecStates.allocate(TINY, 2, 0) if method == "native"
         else commit_replay.CommitReplayCache.allocate(TINY, 2, 0))
    assert_same_cache(method, cache, snapshot, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(),
                    reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16),
                                                   (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_gpu_production_geometry(method, act_dtype, state_dtype, gen):
    """Real kernels at Qwen3.5-4B (H=16, HV=32, K=V=128), T=4, the GPU launch config."""
    cache = make_cache(method, get_geometry("qwen35_4b"), 9, 4, gen, state_dtype=state_dtype, act_dtype=act_dtype,
                       device="cuda")
    slots = torch.tensor([4, NULL_SLOT, 0, 8, 2, 7, NULL_SLOT, 1], dtype=torch.int32)
    run_steps(method, [cache], ["triton"], slots, gen, 16, act_dtype=act_dtype, use_qk_l2norm=True)


class AtenOps(TorchDispatchMode):
    """Every aten op dispatched inside the block: on a GPU each one is a kernel (or a host sync)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", ["native", "commit_replay", "replay_ring"])
def test_captured_step_launches_only_its_kernels(method, gen, monkeypatch):
    """Under CUDA-graph capture a speculative step is its Triton launches and nothing else: no slot mask, no
    torch.where, no host sync, in verify or commit (as the ReplaySSM ring, the last case). The capture is
    simulated (checks.capturing patched) and the launchers replaced by recorders, so any aten op left in
    the step is an extra kernel in the timed graph."""
    monkeypatch.setattr(checks, "capturing", lambda: True)       # every value check asks checks.capturing
    launched = []
    record = lambda name: (lambda *a, **k: launched.append(name))  # noqa: E731
    T, batch = 2, 3
    if method == "replay_ring":
        mod = gdn_spec
        cache = gdn_spec.SpecRing.allocate(TINY, 4, 2, T)
        monkeypatch.setattr(gdn_spec.spec_kernels, "verify_triton", record("verify"))
        monkeypatch.setattr(ring_cursors, "commit_triton", record("commit"))
    else:
        mod = METHODS[method]
        cache = make_cache(method, TINY, 4, T, gen)
        monkeypatch.setattr(mod, "_verify_triton", record("verify"))
        monkeypatch.setattr(mod, "_set_last_triton" if method == "native" else "_commit_triton", record("commit"))
    x = random_step(TINY, batch, window=T, generator=gen)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    out = torch.empty(batch, T, TINY.HV, TINY.V)
    accepted = torch.tensor([1, 7, 2], dtype=torch.int32)      # the padding row's count is never read
    mode = AtenOps()
    with mode:
        mod.spec_verify(cache, **x, slots=slots, out=out, backend="triton")
        mod.spec_commit(cache, accepted, slots=slots, backend="triton")
    assert launched == ["verify", "commit"]
    assert mode.ops == [], mode.ops


@pytest.mark.parametrize("method", ["native", "commit_replay"])
def test_gpu_tile_table_under_interpreter(method, gen, monkeypatch):
    """The GPU table (serial_launch_config: [16, K] tiles) through the interpreter: three V-tile programs per
    value head (the last masked), two value heads per key head; verify and commit vs the ground truth and
    the torch backend's cache."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    gm, T = GDNGeometry(H=1, HV=2, K=32, V=40), 2
    assert -(-gm.V // native.serial_launch_config(gm, "cpu")["BV"]) == 3
    cache = make_cache(method, gm, 3, T, gen)
    twin = cache.clone()
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    counts = lambda step: torch.tensor([1 + step % T, 7, T - step % T], dtype=torch.int32)   # noqa: E731
    run_steps(method, [cache, twin], ["triton", "torch"], slots, gen, 3, use_qk_l2norm=True,
              accepted_fn=counts)                # rollbacks and full accepts on both rows, not left to chance
    assert_same_cache(method, cache, twin, tolerance(torch.float32))
