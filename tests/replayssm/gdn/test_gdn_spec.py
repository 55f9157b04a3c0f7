"""ReplaySSM speculative decoding for Gated DeltaNet: ring verify / commit / reset / materialise.

Ground truth: replayssm.gdn.ref.window_ref (the serial float64 delta rule) run from the committed state,
which advances by states[:, a - 1] after each commit. Every backend is checked against it step by step
over long runs with random accepted counts, and the Triton kernels are also checked against the torch
backend's cache contents (ring rows, checkpoint, cursors) after every call.
"""

import pytest
import torch

from replayssm.checks import NULL_SLOT, interpreter_active, next_pow2
from replayssm.gdn.inputs import random_state, random_step
from replayssm.gdn.ref import l2norm, window_ref
from replayssm.gdn.ring import SpecRing
from replayssm.gdn.spec import spec_commit, spec_materialize, spec_reset, spec_verify
from replayssm.geometry import GDNGeometry, get_geometry
from replayssm.testing import assert_rel_close, nan_like, rel_err, split_route, tolerance

SMALL = GDNGeometry(H=2, HV=4, K=32, V=32)
TINY = GDNGeometry(H=1, HV=2, K=16, V=16)


def make_ring(gm, num_slots, B, T, gen, state_dtype=torch.float32, act_dtype=torch.float32, device="cpu"):
    """A ring with random checkpoints and random origins (an empty history may start at any row: this
    desynchronises the slots' cursors and makes windows cross the ring's end from the first step)."""
    ring = SpecRing.allocate(gm, num_slots, B, T, state_dtype=state_dtype, act_dtype=act_dtype, device=device)
    ring.state.copy_(random_state(gm, num_slots, dtype=state_dtype, generator=gen))
    ring.origin.copy_(torch.randint(0, ring.ring_len, (num_slots,), generator=gen, dtype=torch.int32))
    return ring


class SpecRun:
    """Drive rings through verify + commit against the float64 serial ground truth."""

    def __init__(self, rings, backends, slots, gen, use_qk_l2norm=False):
        self.rings, self.backends, self.slots, self.gen = rings, backends, slots, gen
        self.l2 = use_qk_l2norm
        self.device = rings[0].device
        live = slots != NULL_SLOT
        self.live = live
        self.truth = torch.zeros(len(slots), *rings[0].state.shape[1:], dtype=torch.float64)
        self.truth[live] = rings[0].state[slots[live].long().to(self.device)].double().cpu()
        self.flushes = self.folds = self.wraps = 0

    def step(self, inputs=None, accepted=None):
        ring0, T, dev = self.rings[0], self.rings[0].window, self.device
        batch, live = len(self.slots), self.live
        gm, act = ring0.geometry, ring0.act_dtype
        x = inputs or random_step(gm, batch, act_dtype=act, window=T, use_qk_l2norm=self.l2, generator=self.gen)
        x_dev = {name: t.to(dev) for name, t in x.items()}
        slots, sl = self.slots.to(dev), self.slots[live].long().to(dev)
        h, fl = ring0.write_pos[sl], ring0.is_flush[sl] != 0
        self.flushes += int(fl.sum())
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
            assert_rel_close(f"{backend} output", out[live], o_ref[live], tol, row_dims=3)   # [row, T, HV]
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
    """Same checkpoint, ring rows and cursors (rows past the window are stale in both: compare all)."""
    for name in ("state", "u", "k", "g"):
        assert rel_err(getattr(ring, name), getattr(ref_ring, name)) <= tol, name
    for name in ("write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, name), getattr(ref_ring, name)), name


@pytest.mark.parametrize("use_qk_l2norm", [False, True])
@pytest.mark.parametrize("T,B", [(2, 2), (2, 8), (2, 16), (4, 4), (4, 8), (4, 16)])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_long_run_matches_serial_ground_truth(backend, T, B, use_qk_l2norm, gen):
    """48 steps, random accepted counts, permuted slots in a bigger pool, desynchronised cursors."""
    ring = make_ring(SMALL, 5, B, T, gen)
    slots = torch.tensor([3, 0, 4], dtype=torch.int32)
    run = SpecRun([ring], [backend], slots, gen, use_qk_l2norm)
    for _ in range(48):
        run.step()
    assert run.folds > 0, "no early flush folded a history into the checkpoint"
    assert run.wraps > 0, "no window crossed the ring's end"
    assert (ring.write_pos[slots.long()] <= B).all()


@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.float16, torch.float32), (torch.float32, torch.float16),
                                                   (torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_long_run_half_precision(backend, act_dtype, state_dtype, gen):
    """fp16 ring / checkpoint: rounding where the cache stores, bounded and not accumulating over 40 steps."""
    ring = make_ring(SMALL, 3, 4, 2, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    run = SpecRun([ring], [backend], torch.tensor([2, 0, 1], dtype=torch.int32), gen, use_qk_l2norm=True)
    for _ in range(40):
        run.step()
    assert run.folds > 0 and run.wraps > 0


@pytest.mark.parametrize("T,B,gm,act_dtype,state_dtype,use_qk_l2norm", [
    (2, 2, SMALL, torch.float32, torch.float32, True),
    (2, 8, GDNGeometry(H=1, HV=2, K=16, V=32), torch.float32, torch.float32, False),
    (4, 4, GDNGeometry(H=2, HV=2, K=32, V=16), torch.float32, torch.float32, False),
    (4, 8, SMALL, torch.float16, torch.float16, True),
])
def test_triton_matches_ground_truth_and_torch_cache(T, B, gm, act_dtype, state_dtype, use_qk_l2norm, gen):
    """Triton kernels under the interpreter: outputs vs ground truth, cache contents vs the torch backend."""
    ring = make_ring(gm, 3, B, T, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    ring.origin.fill_(ring.ring_len - 3)                     # the first windows already cross the ring's end
    twin = ring.clone()
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    run = SpecRun([ring, twin], ["triton", "torch"], slots, gen, use_qk_l2norm)
    untouched = ring.clone()
    # Accepted counts chosen so every case flushes early (T when B = T, then a run of full windows).
    for step in range(7):
        accepted = torch.tensor([T if step % 3 else 1, 0, T], dtype=torch.int32)   # NULL row: any count
        run.step(accepted=accepted)
        assert_same_cache(ring, twin, tolerance(act_dtype, state_dtype))
    assert run.folds > 0 and run.wraps > 0
    for name in ("state", "u", "k", "g", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, name)[1], getattr(untouched, name)[1]), f"slot 1 {name} touched"


@pytest.mark.parametrize("T,B,gm,act_dtype,state_dtype,use_qk_l2norm", [
    (4, 8, GDNGeometry(H=2, HV=4, K=32, V=16), torch.float32, torch.float32, True),
    (2, 4, GDNGeometry(H=1, HV=2, K=24, V=40), torch.float16, torch.float32, False),   # K, V tails
    (3, 8, GDNGeometry(H=2, HV=2, K=16, V=16), torch.float16, torch.float16, True),    # 2T = 6 of 8 rows
])
def test_verify_fold_route_matches_ground_truth_and_torch_cache(T, B, gm, act_dtype, state_dtype, use_qk_l2norm,
                                                                gen):
    """route="verify_fold" (replayssm/delta_rule/spec_*.py: prep, verify, fold) under the interpreter, random
    accept counts: outputs and committed states vs the float64 serial ground truth, cache contents (checkpoint,
    ring rows, cursors) vs the torch backend after every step, a NULL row untouched, windows across the ring's
    end, early flushes folding non-empty histories."""
    ring = make_ring(gm, 4, B, T, gen, state_dtype=state_dtype, act_dtype=act_dtype)
    ring.origin[2] = ring.ring_len - 2                       # slot 2's first window crosses the ring's end
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


def test_verify_fold_main_kernels_have_no_family_flag():
    """structure-review §4.1 rule 1 for the ring verify's route: the verify and the fold carry no family constexpr
    (GDN and KDA launch the same two); what differs lives in the preps, which write one workspace layout (x read at
    head i_hv // X_GROUP, the fold's weights at a K stride, 0 for GDN)."""
    import inspect

    from replayssm.delta_rule import spec_fold, spec_verify

    for module, kernel in ((spec_verify, spec_verify.spec_verify_kernel), (spec_fold, spec_fold.spec_fold_kernel)):
        src = inspect.getsource(module)
        for flag in ("PRE_X", "PER_CHANNEL", "IS_KDA", "FAMILY"):
            assert flag not in src, f"{module.__name__} names {flag}"
        fn = kernel
        while hasattr(fn, "fn"):                 # @triton.heuristics -> JITFunction -> the Python function
            fn = fn.fn
        names = [p.upper() for p in inspect.signature(fn).parameters]
        assert "STATE_PTR" in names, names
        assert not [n for n in names if "KDA" in n or "GDN" in n or "CHANNEL" in n or n.startswith("PRE")], names
    # the fold's one layout constexpr is derived from an argument (the weights' K stride), never passed
    assert set(spec_fold.spec_fold_kernel.values) == {"W_ALONG_K"}
    assert spec_fold.spec_fold_kernel.values["W_ALONG_K"]({"stride_w_k": 0}) is False


@pytest.mark.parametrize("arch", ["90", "100"])
def test_verify_fold_gpu_tiles_under_interpreter(arch, gen, monkeypatch):
    """The route's GPU configs run by the interpreter (K = 80 in three 32-wide state chunks, the last masked;
    V = 72 over BV 64 and the fold's BV 32 tiles, tails masked; two value heads per key head): outputs and
    committed states vs the ground truth, the cache vs the torch backend, over early flushes."""
    if not interpreter_active():
        pytest.skip("the forced launch configs are an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    from replayssm.delta_rule.spec_launch import default_config

    gm, T, B = GDNGeometry(H=1, HV=2, K=80, V=72), 2, 4
    cfg = default_config("gdn_ring_verify", gm.K, gm.V, int(arch))
    assert (gm.K + cfg["BKT"] - 1) // cfg["BKT"] == 3 and (gm.V + cfg["BV"] - 1) // cfg["BV"] == 2
    ring = make_ring(gm, 3, B, T, gen)
    twin = ring.clone()
    run = SpecRun([ring, twin], ["triton:verify_fold", "torch"], torch.tensor([2, 0], dtype=torch.int32), gen,
                  use_qk_l2norm=True)
    for step in range(4):
        run.step(accepted=torch.tensor([T, 1 + step % 2], dtype=torch.int32))
        assert_same_cache(ring, twin, tolerance(torch.float32))
    assert run.folds > 0


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu", "triton"])
def test_spec_route_accepted_and_checked(backend, gen):
    """Every backend takes both routes and computes the same function; an unknown route raises before anything
    is written, whatever the backend."""
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
    assert rel_err(o_vf, o_fused) <= tolerance(torch.float32)
    assert_same_cache(ring, twin, tolerance(torch.float32))


@pytest.mark.parametrize("T,gm", [
    (4, GDNGeometry(H=1, HV=2, K=24, V=5)),    # 2T = 8: 2-row x 8 tiles, then one tail row
    (3, GDNGeometry(H=1, HV=2, K=40, V=7)),    # 2T = 6: two spare tile vectors
    (2, GDNGeometry(H=1, HV=2, K=24, V=6)),    # 2T = 4: 4-row x 4 tiles, then 2 tail rows
    (4, GDNGeometry(H=1, HV=1, K=20, V=4)),    # K % 8 != 0: the per-row path
])
def test_cpu_odd_row_tiles(T, gm, gen):
    """backend="cpu" forms a head's 2T dots in register tiles of adjacent rows (dot_block): value-head sizes
    that leave tail rows, windows that leave spare tile vectors, key widths the tile cannot take."""
    ring = make_ring(gm, 3, 8, T, gen)
    run = SpecRun([ring], ["cpu"], torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32), gen, use_qk_l2norm=True)
    for _ in range(16):
        run.step()
    assert run.folds > 0 and run.wraps > 0


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "triton:verify_fold", "cpu"])
def test_ill_conditioned_window(backend, gen):
    """beta 0.999 and nearly parallel keys (k_s = normalize(k0 + 1e-3 noise)): the unit lower triangular
    solve stays as accurate as the serial recurrence (fp32 tolerance 1e-5, measured ~3e-7)."""
    T, batch = 4, 2
    ring = make_ring(SMALL, batch, 4, T, gen)
    run = SpecRun([ring], [backend], torch.arange(batch, dtype=torch.int32), gen)
    for _ in range(3 if backend.startswith("triton") else 12):
        x = random_step(SMALL, batch, window=T, generator=gen)
        k0 = torch.randn(batch, 1, SMALL.H, SMALL.K, generator=gen)
        x["k"] = l2norm(k0 + 1e-3 * torch.randn(batch, T, SMALL.H, SMALL.K, generator=gen)).float()
        x["beta"].fill_(0.999)
        out, = run.step(inputs=x)
        assert torch.isfinite(out).all()
        assert torch.isfinite(ring.u).all() and torch.isfinite(ring.state).all()


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_strided_inputs_and_output(backend, gen):
    """q, k, v as views into one packed [batch, T, 2HK + HV V] tensor (vLLM's mixed_qkv); out a padded view."""
    gm, T, batch = SMALL, 2, 2
    ring = make_ring(gm, batch, 4, T, gen)
    twin = ring.clone()
    x = random_step(gm, batch, window=T, generator=gen)
    hk, vv = gm.H * gm.K, gm.HV * gm.V
    packed = torch.cat([x["q"].flatten(2), x["k"].flatten(2), x["v"].flatten(2)], -1)
    q = packed[..., :hk].unflatten(-1, (gm.H, gm.K))
    k = packed[..., hk:2 * hk].unflatten(-1, (gm.H, gm.K))
    v = packed[..., 2 * hk:2 * hk + vv].unflatten(-1, (gm.HV, gm.V))
    g = torch.cat([x["g"], x["beta"]], -1)[..., :gm.HV]                # outer strides only
    beta = torch.cat([x["g"], x["beta"]], -1)[..., gm.HV:]
    out_buf = nan_like(torch.empty(batch, T, gm.HV, gm.V + 8))
    out = out_buf[..., :gm.V]
    assert not q.is_contiguous() and not out.is_contiguous() and not g.is_contiguous()
    spec_verify(ring, q, k, v, g, beta, slots=None, out=out, backend=backend)
    expected = spec_verify(twin, **x, backend="ref")
    assert rel_err(out, expected) <= tolerance(torch.float32)
    assert out_buf[..., gm.V:].isnan().all()
    assert_same_cache(ring, twin, tolerance(torch.float32))


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_tp_split_qwen_geometry(backend, gen):
    """Qwen3.5-4B at TP=8 (H=2, HV=4, K=V=128), B=16, T=4."""
    gm = get_geometry("qwen35_4b", tp=8)
    ring = make_ring(gm, 2, 16, 4, gen)
    run = SpecRun([ring], [backend], torch.tensor([1, 0], dtype=torch.int32), gen, use_qk_l2norm=True)
    for _ in range(8):
        run.step(accepted=torch.tensor([4, 3], dtype=torch.int32))
    assert run.folds > 0


def test_triton_one_step_at_tp_split_qwen_geometry(gen):
    gm = get_geometry("qwen35_4b", tp=8)
    ring = make_ring(gm, 2, 16, 4, gen)
    ring.write_pos.fill_(13)
    ring.is_flush.fill_(1)                                   # a flush step with a long history
    ring.u.copy_(torch.randn(ring.u.shape, generator=gen) * 0.1)
    ring.k.copy_(l2norm(torch.randn(ring.k.shape, generator=gen)).float())
    ring.g.copy_(-torch.rand(ring.g.shape, generator=gen) * 0.1)
    twin = ring.clone()
    x = random_step(gm, 1, window=4, generator=gen, use_qk_l2norm=True)
    slots = torch.tensor([1], dtype=torch.int32)
    out = spec_verify(ring, **x, use_qk_l2norm=True, slots=slots, backend="triton")
    expected = spec_verify(twin, **x, use_qk_l2norm=True, slots=slots, backend="ref")
    assert rel_err(out, expected) <= tolerance(torch.float32)
    assert_same_cache(ring, twin, tolerance(torch.float32))


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_reset_and_cursor_protocol(backend, gen):
    """Commit moves cursors exactly as documented; reset empties the history of the named slots only."""
    T, B = 2, 4
    ring = make_ring(TINY, 4, B, T, gen)
    ring.write_pos.copy_(torch.tensor([1, 2, 3, 0], dtype=torch.int32))
    ring.is_flush.copy_(torch.tensor([0, 0, 1, 0], dtype=torch.int32))
    ring.origin.copy_(torch.tensor([7, 6, 5, 0], dtype=torch.int32))
    slots = torch.tensor([0, 1, 2, NULL_SLOT], dtype=torch.int32)
    spec_commit(ring, torch.tensor([2, 1, 2, 7], dtype=torch.int32), slots=slots, backend=backend)
    # L = 6, ring_len 8: slot 0: h 1 + 2 = 3, 3 + 4 > 6 -> flush; slot 1: 3 -> flush;
    # slot 2 flushed: origin (5 + 3) & 7 = 0, h = 2 -> 2 + 4 > 6 no; slot 3 (not in the batch) unchanged.
    assert ring.write_pos.tolist() == [3, 3, 2, 0]
    assert ring.origin.tolist() == [7, 6, 0, 0]
    assert ring.is_flush.tolist() == [1, 1, 0, 0]
    spec_reset(ring, slots=torch.tensor([1, NULL_SLOT, 0], dtype=torch.int32), backend=backend)
    assert ring.write_pos.tolist() == [0, 0, 2, 0]
    assert ring.origin.tolist() == [0, 0, 0, 0]
    assert ring.is_flush.tolist() == [0, 0, 0, 0]
    committed = spec_materialize(ring, slots=torch.tensor([1, 0], dtype=torch.int32), backend=backend)
    assert rel_err(committed, ring.state[[1, 0]]) <= tolerance(torch.float32)


def test_allocation_shapes_and_bytes():
    ring = SpecRing.allocate(SMALL, 3, 16, 4, state_dtype=torch.float16, act_dtype=torch.float16)
    assert ring.max_len == 20 and ring.ring_len == 32 == next_pow2(20)
    assert ring.state.shape == (3, 4, 32, 32) and ring.u.shape == (3, 4, 32, 32)
    assert ring.k.shape == (3, 2, 32, 32) and ring.g.shape == (3, 4, 32) and ring.g.dtype == torch.float32
    assert ring.write_pos.dtype == ring.origin.dtype == ring.is_flush.dtype == torch.int32
    per_slot = 4 * 32 * 32 * 2 + 4 * 32 * 32 * 2 + 2 * 32 * 32 * 2 + 4 * 32 * 4 + 3 * 4
    assert ring.nbytes() == 3 * per_slot
    twin = ring.clone()
    twin.u.fill_(1.0)
    assert (ring.u == 0).all()


def test_bad_inputs_raise(gen):
    T = 2
    ring = SpecRing.allocate(TINY, 2, 4, T)
    x = random_step(TINY, 2, window=T, generator=gen)

    def verify(**changes):
        spec_verify(ring, **{**x, **changes}, backend="torch")

    with pytest.raises(ValueError, match="window"):
        verify(**random_step(TINY, 2, window=3, generator=gen))
    with pytest.raises(ValueError, match="shape"):
        verify(q=torch.randn(2, T, 2, 16))
    with pytest.raises(ValueError, match="shape"):
        verify(v=torch.randn(2, T, TINY.HV, 8))
    with pytest.raises(ValueError, match="dtype"):
        verify(k=x["k"].half())
    with pytest.raises(ValueError, match="dtype"):
        verify(g=x["g"].double())
    with pytest.raises(ValueError, match="unit stride"):
        verify(v=torch.repeat_interleave(x["v"], 2, -1)[..., ::2])
    with pytest.raises(ValueError, match="out"):
        spec_verify(ring, **x, out=torch.empty(2, T, TINY.HV, TINY.V, dtype=torch.float16), backend="torch")
    with pytest.raises(ValueError, match="slot out of range"):
        spec_verify(ring, **x, slots=torch.tensor([0, 2], dtype=torch.int32), backend="torch")
    with pytest.raises(ValueError, match="more than one row"):
        spec_verify(ring, **x, slots=torch.tensor([1, 1], dtype=torch.int32), backend="torch")
    with pytest.raises(ValueError, match="backend"):
        spec_verify(ring, **x, backend="cuda")
    for bad in ([0, 1], [1, T + 1]):
        with pytest.raises(ValueError, match="num_accepted"):
            spec_commit(ring, torch.tensor(bad, dtype=torch.int32), backend="torch")
    with pytest.raises(ValueError, match="num_accepted"):
        spec_commit(ring, torch.tensor([1.0, 1.0]), backend="torch")
    with pytest.raises(ValueError, match="B=2 < window T=4"):
        SpecRing.allocate(TINY, 2, 2, 4)
    with pytest.raises(ValueError, match="GDNGeometry"):
        SpecRing.allocate(object(), 2, 4, 2)
    with pytest.raises(ValueError, match="bfloat16"):
        bf = SpecRing.allocate(TINY, 2, 4, T, act_dtype=torch.bfloat16)
        spec_verify(bf, **{n: (t.bfloat16() if n in "qkv" else t) for n, t in x.items()}, backend="triton")
    wide = GDNGeometry(H=1, HV=1, K=512, V=16)
    big = SpecRing.allocate(wide, 1, 2, 2)
    with pytest.raises(ValueError, match="cannot tile"):
        spec_verify(big, **random_step(wide, 1, window=2, generator=gen), backend="triton")
    # Nothing was written by the rejected calls.
    assert (ring.u == 0).all() and (ring.write_pos == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(),
                    reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                                                   (torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("backend", ["triton", "triton:verify_fold"])
def test_gpu_production_geometry(backend, act_dtype, state_dtype, gen):
    """Real kernels at Qwen3.5-4B (H=16, HV=32, K=V=128), B=16, T=4, the GPU launch config (tf32x3 dots; the
    verify_fold route: bf16x2 / tf32x2 splits of the state against the raw window rows)."""
    gm = get_geometry("qwen35_4b")
    ring = make_ring(gm, 9, 16, 4, gen, state_dtype=state_dtype, act_dtype=act_dtype, device="cuda")
    ring.origin[4] = ring.ring_len - 2                       # slot 4's first window crosses the ring's end
    slots = torch.tensor([4, NULL_SLOT, 0, 8, 2, 7, NULL_SLOT, 1], dtype=torch.int32)
    run = SpecRun([ring], [backend], slots, gen, use_qk_l2norm=True)
    for _ in range(24):                                      # B - T + 2 = 14 steps force a fold
        run.step()
    assert run.folds > 0 and run.wraps > 0


@pytest.mark.parametrize("arch", ["90", "100"])
def test_gpu_tile_table_under_interpreter(arch, gen, monkeypatch):
    """The GPU launch table run by the interpreter: [32, 16] tiles walk K = 48 in three tiles (the fold stores
    and the readouts accumulate across them) and V = 40 in two programs (the second masked), two value heads
    share a key head, so the window's k rows, g rows and u rows each have one owning program. Outputs and
    committed states vs the ground truth, cache contents vs the torch backend, over early flushes."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    from replayssm.gdn.spec_kernels import launch_config

    gm, T, B = GDNGeometry(H=1, HV=2, K=48, V=40), 2, 4
    cfg = launch_config(gm, B, T, "cpu")
    assert (gm.K + cfg["BKT"] - 1) // cfg["BKT"] == 3 and (gm.V + cfg["BV"] - 1) // cfg["BV"] == 2
    ring = make_ring(gm, 3, B, T, gen)
    twin = ring.clone()
    run = SpecRun([ring, twin], ["triton", "torch"], torch.tensor([2, 0], dtype=torch.int32), gen, use_qk_l2norm=True)
    for step in range(4):
        run.step(accepted=torch.tensor([T, 1 + step % 2], dtype=torch.int32))
        assert_same_cache(ring, twin, tolerance(torch.float32))
    assert run.folds > 0
