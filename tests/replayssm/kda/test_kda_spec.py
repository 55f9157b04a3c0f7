"""ReplaySSM speculative decoding and draft trees for Kimi Delta Attention vs the float64 serial recurrence.

Ground truth: replayssm.kda.ref.window_ref run from the committed state, which advances by states[:, a - 1]
after each commit (GDN's harness, tests/replayssm/gdn/test_gdn_spec.py). Every backend over long runs with
random accepted counts (early flushes, windows across the ring's end, desynchronised rows, NULL_SLOT rows);
Triton also against the torch backend's cache contents after every call.
"""

import pytest
import torch
import triton
import triton.language as tl

from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.cpu.ops import supported_dtypes
from replayssm.delta_rule._tl import split_bf16
from replayssm.delta_rule.spec_verify import split_bf16_trunc
from replayssm.geometry import KDAGeometry, get_geometry
from replayssm.kda import SpecRing, spec_commit, spec_materialize, spec_reset, spec_verify, tree_commit, tree_verify
from replayssm.kda.inputs import random_state, random_step
from replayssm.kda.ref import window_ref
from replayssm.testing import assert_rel_close, nan_like, rel_err, split_route, tolerance

SMALL = KDAGeometry(H=2, HV=4, K=32, V=32)
TINY = KDAGeometry(H=1, HV=2, K=16, V=16)
F32, F16 = torch.float32, torch.float16


def make_ring(gm, num_slots, B, T, gen, state_dtype=F32, act_dtype=F32, device="cpu"):
    ring = SpecRing.allocate(gm, num_slots, B, T, state_dtype=state_dtype, act_dtype=act_dtype, device=device)
    ring.state.copy_(random_state(gm, num_slots, dtype=state_dtype, generator=gen))
    ring.origin.copy_(torch.randint(0, ring.ring_len, (num_slots,), generator=gen, dtype=torch.int32))
    return ring


class SpecRun:
    def __init__(self, rings, backends, slots, gen, use_qk_l2norm=False):
        self.rings, self.backends, self.slots, self.gen, self.l2 = rings, backends, slots, gen, use_qk_l2norm
        self.live = slots != NULL_SLOT
        self.truth = torch.zeros(len(slots), *rings[0].state.shape[1:], dtype=torch.float64)
        self.truth[self.live] = rings[0].state[slots[self.live].long().to(rings[0].device)].double().cpu()
        self.folds = self.wraps = 0

    def step(self, inputs=None, accepted=None):
        ring0, T, live, batch = self.rings[0], self.rings[0].window, self.live, len(self.slots)
        gm, act = ring0.geometry, ring0.act_dtype
        x = inputs or random_step(gm, batch, act_dtype=act, window=T, use_qk_l2norm=self.l2, generator=self.gen)
        dev = ring0.device
        x_dev = {name: t.to(dev) for name, t in x.items()}
        slots = self.slots.to(dev)
        sl = self.slots[live].long().to(dev)
        h, fl = ring0.write_pos[sl], ring0.is_flush[sl] != 0
        self.folds += int((fl & (h > 0)).sum())
        self.wraps += int((ring0.origin[sl] + h + T > ring0.ring_len).sum())
        states, o_ref = window_ref(self.truth, **x, use_qk_l2norm=self.l2)
        tol = tolerance(act, ring0.state_dtype)
        outs = []
        for ring, backend in zip(self.rings, self.backends):
            out = nan_like(torch.empty(batch, T, gm.HV, gm.V, dtype=act, device=dev))
            name, route = split_route(backend)               # "triton:verify_fold": the route's Triton form
            spec_verify(ring, **x_dev, use_qk_l2norm=self.l2, slots=slots, out=out, backend=name, **route)
            out = out.cpu()
            assert_rel_close(f"{backend} output", out[live], o_ref[live], tol, row_dims=3)
            assert out[~live].isnan().all(), f"{backend}: a NULL_SLOT row's output was written"
            outs.append(out)
        if accepted is None:
            accepted = torch.randint(1, T + 1, (batch,), generator=self.gen, dtype=torch.int32)
        self.truth = states[torch.arange(batch), accepted.long() - 1]
        for ring, backend in zip(self.rings, self.backends):
            backend = split_route(backend)[0]
            spec_commit(ring, accepted.to(dev), slots=slots, backend=backend)
            committed = spec_materialize(ring, slots=slots, backend=backend).cpu()
            assert_rel_close(f"{backend} committed state", committed[live], self.truth[live], tol, row_dims=2)
            assert committed[~live].isnan().all()
        return outs


def assert_same_cache(ring, ref_ring, tol):
    for name in ("state", "u", "k", "g"):
        assert rel_err(getattr(ring, name), getattr(ref_ring, name)) <= tol, name
    for name in ("write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, name), getattr(ref_ring, name)), name


@pytest.mark.parametrize("use_qk_l2norm", [False, True])
@pytest.mark.parametrize("T,B", [(2, 2), (2, 8), (4, 4), (4, 16)])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_long_run_matches_serial_ground_truth(backend, T, B, use_qk_l2norm, gen):
    """40 steps, random accepted counts (random accept / rollback), permuted slots, a NULL row, ring wrap."""
    ring = make_ring(SMALL, 5, B, T, gen)
    slots = torch.tensor([3, NULL_SLOT, 0, 4], dtype=torch.int32)
    run = SpecRun([ring], [backend], slots, gen, use_qk_l2norm)
    for _ in range(40):
        run.step()
    assert run.folds > 0, "no early flush folded a history into the checkpoint"
    assert run.wraps > 0, "no window crossed the ring's end"


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("act_dtype,state_dtype", [(F16, F32), (F32, F16), (F16, F16)])
def test_long_run_half_precision(backend, act_dtype, state_dtype, gen):
    if backend == "cpu" and F16 not in supported_dtypes():
        pytest.skip("this C compiler has no _Float16: backend='cpu' refuses fp16")
    ring = make_ring(SMALL, 3, 4, 2, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    run = SpecRun([ring], [backend], torch.tensor([2, 0, 1], dtype=torch.int32), gen, use_qk_l2norm=True)
    for _ in range(30):
        run.step()
    assert run.folds > 0 and run.wraps > 0


@pytest.mark.parametrize("T,B,gm,act_dtype,state_dtype,use_qk_l2norm", [
    (2, 2, SMALL, F32, F32, True),
    (2, 8, KDAGeometry(H=1, HV=2, K=16, V=32), F32, F32, False),
    (4, 4, KDAGeometry(H=2, HV=2, K=32, V=16), F32, F32, False),
    (4, 8, SMALL, F16, F16, True),
])
def test_triton_matches_ground_truth_and_torch_cache(T, B, gm, act_dtype, state_dtype, use_qk_l2norm, gen):
    ring = make_ring(gm, 3, B, T, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    ring.origin.fill_(ring.ring_len - 3)
    twin = ring.clone()
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    run = SpecRun([ring, twin], ["triton", "torch"], slots, gen, use_qk_l2norm)
    untouched = ring.clone()
    for step in range(7):
        run.step(accepted=torch.tensor([T if step % 3 else 1, 0, T], dtype=torch.int32))
        assert_same_cache(ring, twin, tolerance(act_dtype, state_dtype))
    assert run.folds > 0 and run.wraps > 0
    for name in ("state", "u", "k", "g", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, name)[1], getattr(untouched, name)[1]), f"slot 1 {name} touched"


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_strong_window_decay_stays_finite(backend, gen):
    """Channels decaying by e^-30 per token: over a window of 4 a channel's cumulative decay passes e^-88, so
    exp(G_s) exp(-G_c) would overflow fp32; the pairwise form stays exact and finite."""
    T = 4
    ring = make_ring(TINY, 2, 4, T, gen)
    run = SpecRun([ring], [backend], torch.arange(2, dtype=torch.int32), gen)
    for _ in range(2 if backend == "triton" else 6):
        x = random_step(TINY, 2, window=T, generator=gen)
        x["g"][..., ::2] = -30.0
        out, = run.step(inputs=x)
        assert torch.isfinite(out).all() and torch.isfinite(ring.state).all()


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_kimi_linear_tp_split(backend, gen):
    gm = get_geometry("kimi_linear_48b_a3b", tp=8)
    ring = make_ring(gm, 2, 8, 4, gen)
    run = SpecRun([ring], [backend], torch.tensor([1, 0], dtype=torch.int32), gen, use_qk_l2norm=True)
    for _ in range(5):
        run.step(accepted=torch.tensor([4, 3], dtype=torch.int32))
    assert run.folds > 0


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_chain_tree_is_spec(backend, gen):
    """A chain tree verifies and commits exactly as the chain window."""
    T = 3
    ring = make_ring(SMALL, 2, 6, T, gen)
    twin = ring.clone()
    chain = torch.arange(-1, T - 1, dtype=torch.int32)
    for _ in range(4):
        x = random_step(SMALL, 2, window=T, generator=gen)
        acc = torch.randint(1, T + 1, (2,), generator=gen, dtype=torch.int32)
        o_tree = tree_verify(ring, **x, parents=chain, backend=backend)
        o_spec = spec_verify(twin, **x, backend=backend)
        assert rel_err(o_tree, o_spec) <= 1e-6
        tree_commit(ring, torch.arange(T, dtype=torch.int32).repeat(2, 1), acc, backend=backend)
        spec_commit(twin, acc, backend=backend)
        assert_same_cache(ring, twin, 1e-6)


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_tree_matches_path_recurrence(backend, gen):
    """A binary tree of 7 nodes: every node's output is the serial recurrence along its root-to-node path;
    committing a branch leaves the state of that path."""
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2], dtype=torch.int32)
    paths = {3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 2, 5], 6: [0, 2, 6]}
    ring = make_ring(SMALL, 3, 8, 7, gen)
    S0 = ring.state[[2, 0]].double()
    x = random_step(SMALL, 2, window=7, generator=gen)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    out = tree_verify(ring, **x, parents=parents, slots=slots, backend=backend)
    for leaf, path in paths.items():
        states, o = window_ref(S0, *(x[n][:, path] for n in ("q", "k", "v", "g", "beta")))
        assert_rel_close(f"path to {leaf}", out[:, path], o, tolerance(F32))
    branch = torch.tensor([[0, 2, 5], [0, 1, 4]], dtype=torch.int32)
    tree_commit(ring, branch, torch.tensor([3, 2], dtype=torch.int32), slots=slots, backend=backend)
    st5, _ = window_ref(S0[:1], *(x[n][:1, [0, 2, 5]] for n in ("q", "k", "v", "g", "beta")))
    st1, _ = window_ref(S0[1:], *(x[n][1:, [0, 1]] for n in ("q", "k", "v", "g", "beta")))
    committed = spec_materialize(ring, slots=slots, backend=backend)
    assert_rel_close("committed branch", committed, torch.cat([st5[:, -1], st1[:, -1]]), tolerance(F32))


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_reset_and_strided_inputs(backend, gen):
    gm, T = SMALL, 2
    ring = make_ring(gm, 2, 4, T, gen)
    twin = ring.clone()
    x = random_step(gm, 2, window=T, generator=gen)
    g_buf = torch.full((2, T, gm.HV, gm.K + 5), 7.0)
    g_buf[..., :gm.K] = x["g"]
    g = g_buf[..., :gm.K]                                            # outer strides only
    out_buf = nan_like(torch.empty(2, T, gm.HV, gm.V + 8))
    spec_verify(ring, x["q"], x["k"], x["v"], g, x["beta"], out=out_buf[..., :gm.V], backend=backend)
    expected = spec_verify(twin, **x, backend="ref")
    assert rel_err(out_buf[..., :gm.V], expected) <= tolerance(F32) and out_buf[..., gm.V:].isnan().all()
    assert_same_cache(ring, twin, tolerance(F32))
    spec_commit(ring, torch.tensor([2, 1], dtype=torch.int32), backend=backend)
    spec_reset(ring, torch.tensor([1], dtype=torch.int32), backend=backend)
    assert ring.write_pos.tolist() == [2, 0] and ring.origin[1] == 0


def test_bad_inputs_raise(gen):
    T = 2
    ring = SpecRing.allocate(TINY, 2, 4, T)
    x = random_step(TINY, 2, window=T, generator=gen)
    parents = torch.tensor([-1, 0], dtype=torch.int32)
    bad = [dict(g=x["g"][..., 0].contiguous()),                      # a scalar g per head (GDN's shape)
           dict(g=torch.zeros(2, T, TINY.HV, TINY.K + 1)),
           dict(g=torch.zeros(2, T, TINY.HV + 1, TINY.K)),
           dict(g=x["g"].double()),
           dict(g=torch.repeat_interleave(x["g"], 2, -1)[..., ::2]),  # K not unit stride
           dict(q=torch.randn(2, T, 2, 16)),
           dict(backend="cuda")]
    for b in bad:
        kwargs = {**x, "backend": "torch", **b}
        with pytest.raises(ValueError):
            spec_verify(ring, **kwargs)
        with pytest.raises(ValueError):
            tree_verify(ring, **kwargs, parents=parents)
    from replayssm.gdn import SpecRing as GDNRing
    from replayssm.gdn import spec_verify as gdn_verify
    with pytest.raises(ValueError):
        gdn_verify(ring, **{**x, "g": x["g"][..., 0].contiguous()}, backend="torch")
    with pytest.raises(ValueError):
        spec_verify(GDNRing.allocate(get_geometry("qwen35_4b", 16), 2, 4, T), **x, backend="torch")
    assert (ring.u == 0).all() and (ring.write_pos == 0).all()


@pytest.mark.parametrize("backend", ["triton", "triton:verify_fold"])
@pytest.mark.parametrize("arch", ["90", "100"])
def test_gpu_tile_table_under_interpreter(arch, backend, gen, monkeypatch):
    """The GPU launch table under the interpreter: [32, 16] tiles walk K = 48 in three tiles (per-tile history
    weights, per-tile window decays and decay-weighted dots) and V = 40 in two programs, two value heads per key
    head (verify_fold: the prep's register cap, the verify's TW2-wide state product on sm_90, TW on sm_100).
    Outputs vs the ground truth and cache contents vs torch, over early flushes."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    gm = KDAGeometry(H=1, HV=2, K=48, V=40)
    ring = make_ring(gm, 2, 4, 2, gen)
    twin = ring.clone()
    run = SpecRun([ring, twin], [backend, "torch"], torch.tensor([1, 0], dtype=torch.int32), gen, True)
    for _ in range(4):
        run.step(accepted=torch.tensor([2, 2], dtype=torch.int32))
        assert_same_cache(ring, twin, tolerance(F32))
    assert run.folds > 0


def test_ring_allocation_bytes():
    ring = SpecRing.allocate(SMALL, 3, 16, 4, state_dtype=F16, act_dtype=F16)
    assert ring.g.shape == (3, 4, 32, 32) and ring.g.dtype == F32
    per_slot = 4 * 32 * 32 * 2 + 4 * 32 * 32 * 2 + 2 * 32 * 32 * 2 + 4 * 32 * 32 * 4 + 3 * 4
    assert ring.nbytes() == 3 * per_slot
    with pytest.raises(ValueError):
        SpecRing.allocate(SMALL, 2, 2, 4)


@pytest.mark.parametrize("T,B,gm,act_dtype,state_dtype,use_qk_l2norm", [
    (4, 8, KDAGeometry(H=2, HV=4, K=32, V=16), F32, F32, True),
    (2, 4, KDAGeometry(H=1, HV=2, K=24, V=40), F16, F32, False),    # K, V tails
    (3, 8, KDAGeometry(H=2, HV=2, K=16, V=16), F16, F16, True),     # 2T = 6 of 8 rows
    (8, 16, KDAGeometry(H=1, HV=2, K=16, V=16), F32, F32, True),    # 2T = 16 rows: the solve's tl.dot branch
])
def test_verify_fold_route_matches_ground_truth_and_torch_cache(T, B, gm, act_dtype, state_dtype, use_qk_l2norm,
                                                                gen):
    """route="verify_fold" (replayssm/delta_rule/spec_*.py, the per-channel prep) under the interpreter, random
    accept counts: outputs and committed states vs the float64 serial ground truth, the cache vs the torch
    backend after every step, a NULL row untouched, ring wrap, early flushes folding non-empty histories."""
    ring = make_ring(gm, 4, B, T, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    ring.origin[2] = ring.ring_len - 2
    twin = ring.clone()
    slots = torch.tensor([2, NULL_SLOT, 0, 3], dtype=torch.int32)
    run = SpecRun([ring, twin], ["triton:verify_fold", "torch"], slots, gen, use_qk_l2norm)
    untouched = ring.clone()
    for _ in range(10):
        run.step()
        assert_same_cache(ring, twin, tolerance(act_dtype, state_dtype))
    assert run.folds > 0 and run.wraps > 0
    for name in ("state", "u", "k", "g", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, name)[1], getattr(untouched, name)[1]), f"slot 1 {name} touched"


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu", "triton"])
def test_spec_route_accepted_and_checked(backend, gen):
    """Both routes on every backend, the same function; an unknown route raises before anything is written."""
    T = 2
    ring = make_ring(TINY, 2, 4, T, gen)
    ring.write_pos.fill_(2)
    ring.u.copy_(torch.randn(ring.u.shape, generator=gen) * 0.1)
    ring.g.copy_(-torch.rand(ring.g.shape, generator=gen) * 0.1)
    ring.is_flush.copy_(torch.tensor([1, 0], dtype=torch.int32))
    x = random_step(TINY, 2, window=T, generator=gen)
    before = ring.clone()
    with pytest.raises(ValueError, match="spec route"):
        spec_verify(ring, **x, backend=backend, route="fold_verify")
    assert_same_cache(ring, before, 0.0)
    twin = ring.clone()
    o_vf = spec_verify(ring, **x, backend=backend, route="verify_fold")
    o_fused = spec_verify(twin, **x, backend=backend, route="fused")
    assert rel_err(o_vf, o_fused) <= tolerance(F32)
    assert_same_cache(ring, twin, tolerance(F32))


@triton.jit
def _split(a_ptr, hi_ptr, lo_ptr, N: tl.constexpr, TRUNC: tl.constexpr):
    offs = tl.arange(0, N)
    if TRUNC:
        hi, lo = split_bf16_trunc(tl.load(a_ptr + offs))
    else:
        hi, lo = split_bf16(tl.load(a_ptr + offs))
    tl.store(hi_ptr + offs, hi.to(tl.float32))
    tl.store(lo_ptr + offs, lo.to(tl.float32))


@pytest.mark.parametrize("trunc", [False, True])
def test_verify_fold_bf16x3_bound(trunc, gen):
    """KDA's verify under 16-bit activations multiplies the state by the prep's decayed vectors, neither bf16-exact:
    bf16x3 splits both (_tl.split_bf16, or spec_verify.split_bf16_trunc: hi by clearing the low 16 bits, the
    verify's, the fold's and the KDA prep's split; run here in Triton) and keeps ah bh + ah bl + al bh. Within
    (3 * 2^-14 + C 2^-24) (|A| @ |B|) of A @ B in float64 (the interpreter truncates where the GPU rounds
    to nearest: the bound covers both); the bf16 products are exact in fp32, so they are formed here in float64
    (the interpreter's bf16 tl.dot is not emulated)."""
    if not interpreter_active():
        pytest.skip("interpreter check")
    M, C, N = 64, 32, 16
    parts = []
    for shape in ((M, C), (C, N)):
        X = torch.randn(*shape, generator=gen) * torch.exp(torch.randn(*shape, generator=gen) * 3)
        hi, lo = torch.empty_like(X), torch.empty_like(X)
        _split[(1,)](X.view(-1), hi.view(-1), lo.view(-1), N=X.numel(), TRUNC=trunc)
        assert torch.equal(hi.bfloat16().float(), hi) and torch.equal(lo.bfloat16().float(), lo)
        parts.append((X.double(), hi.double(), lo.double()))
    (A, ah, al), (B, bh, bl) = parts
    exact = A @ B
    split = sum((x @ y).float().double() for x, y in ((ah, bh), (ah, bl), (al, bh)))
    bound = (3 * 2.0 ** -14 + C * 2.0 ** -24) * (A.abs() @ B.abs())
    assert ((split - exact).abs() <= bound).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(),
                    reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, F32), (F32, F32), (F16, F16)])
@pytest.mark.parametrize("backend", ["triton", "triton:verify_fold"])
def test_gpu_kimi_geometry(backend, act_dtype, state_dtype, gen):
    """Real kernels at Kimi-Linear TP 8 (H = HV = 4, K = V = 128), B = 16, T = 4, the GPU launch configs (the
    verify_fold route under bf16 / fp16 activations: bf16x3 state products, tf32x3 under fp32)."""
    gm = get_geometry("kimi_linear_48b_a3b", tp=8)
    ring = make_ring(gm, 9, 16, 4, gen, state_dtype=state_dtype, act_dtype=act_dtype, device="cuda")
    ring.origin[4] = ring.ring_len - 2
    slots = torch.tensor([4, NULL_SLOT, 0, 8, 2, 7, NULL_SLOT, 1], dtype=torch.int32)
    run = SpecRun([ring], [backend], slots, gen, use_qk_l2norm=True)
    for _ in range(24):
        run.step()
    assert run.folds > 0 and run.wraps > 0
