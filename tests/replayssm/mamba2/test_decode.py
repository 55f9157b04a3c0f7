"""ReplaySSM AR decode for Mamba-2 (replayssm/mamba2/decode.py): every backend against the float64 plain
recurrence (replayssm.mamba2.ref.ssm_step_ref run on an uncached state), and the triton/torch caches
against the ref backend's cache after every step.

The driver runs multi-step schedules where rows map to a random permutation of the slots and some rows
are NULL_SLOT, so the slots' cursors drift apart and flush on different steps. After each step it checks:
outputs of live rows (null rows stay NaN), the slots nobody used are bitwise untouched, a normal step
leaves the checkpoint bitwise untouched, the cursor moved by the protocol, materialize equals the
ground-truth state, and the cache (state, x, B, dt, write_pos) equals the ref backend's.
Triton runs in the interpreter on tiny shapes; production geometries run on torch/ref.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import triton
import triton.language as tl

from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.delta_rule._tl import split_bf16
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.cache import ReplayCache
from replayssm.mamba2.decode import launch_config, materialize, replay_step
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.ref import ssm_step_ref
from replayssm.testing import assert_rel_close, poison_, rel_err, tolerance

F32, F16 = torch.float32, torch.float16
TINY = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)     # 2 heads per group
MINI = Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1)     # the cheapest Triton shape
CACHE_FIELDS = ("state", "x", "B", "dt", "write_pos", "bc")


@dataclass
class Run:
    """Caches of one backend under test (plus a ref twin) and the float64 ground-truth state per slot."""

    backend: str
    route: str
    L: int
    caches: dict[str, ReplayCache]
    truth: torch.Tensor                       # [num_slots, nheads, headdim, dstate] float64
    params: object
    flushes: int = 0
    mixed_steps: int = 0                      # steps where some live rows flushed and others did not
    options: dict = field(default_factory=dict)

    @property
    def cache(self) -> ReplayCache:
        return self.caches[self.backend]


def start(gen, geometry, num_slots, L, backend, route="output_only", state_dtype=F32, act_dtype=F32,
          device="cpu", **options) -> Run:
    cache = ReplayCache.allocate(geometry, num_slots, L, state_dtype, act_dtype, device)
    cache.state.copy_(random_state(geometry, num_slots, state_dtype, device, generator=gen))
    caches = {backend: cache}
    if backend != "ref":
        caches["ref"] = cache.clone()
    return Run(backend, route, L, caches, cache.state.double(), random_params(geometry, device, gen), options=options)


def strided(t: torch.Tensor | None) -> torch.Tensor | None:
    """The same values as a view with padded outer strides (unit stride on the last dim)."""
    if t is None:
        return None
    big = torch.full((*t.shape[:-1], t.shape[-1] + 3), float("nan"), dtype=t.dtype, device=t.device)
    big[..., : t.shape[-1]] = t
    return big[..., : t.shape[-1]]


def schedule(gen, num_slots: int, batch: int, step: int, nulls: bool = True) -> torch.Tensor:
    """Rows -> a random permutation of the slots; on odd steps one row is padding (its slot skips a step)."""
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    if nulls and step % 2 == 1:
        slots[int(torch.randint(batch, (1,), generator=gen))] = NULL_SLOT
    return slots


def do_step(run: Run, gen, slots: torch.Tensor | None, batch: int | None = None) -> None:
    """One replay_step on every cache of the run, checked against the ground truth and the ref cache."""
    opts = run.options
    cache = run.cache
    g, device, act = cache.geometry, cache.device, cache.act_dtype
    batch = batch if slots is None else slots.shape[0]
    slots = None if slots is None else slots.to(device)
    inp = random_step(g, batch, act, device, with_z=opts.get("with_z", True), generator=gen)
    softplus = opts.get("dt_softplus", True)
    if not softplus:  # dt is used as is: keep it a small positive step so the recurrence stays bounded
        inp["dt"] = 0.1 * inp["dt"].abs()
    inp["dt"] = inp["dt"].to(opts.get("dt_dtype", F32))
    p = run.params
    D = p.D if opts.get("with_D", True) else None
    dt_bias = p.dt_bias if opts.get("with_bias", True) else None
    slot_ids = torch.arange(batch, dtype=torch.int32, device=device) if slots is None else slots
    live = slot_ids != NULL_SLOT
    live_slots = slot_ids[live].long()
    z = inp["z"]
    new_truth, y_ref = ssm_step_ref(run.truth[live_slots], inp["x"][live], inp["dt"][live], p.A, inp["B"][live],
                                    inp["C"][live], D, None if z is None else z[live], dt_bias, softplus)
    untouched = torch.ones(cache.num_slots, dtype=torch.bool, device=device)
    untouched[live_slots] = False
    h_before = cache.write_pos.long().clone()
    normal = live_slots[h_before[live_slots] < run.L - 1]
    n_flush = int((h_before[live_slots] == run.L - 1).sum())
    run.flushes += n_flush
    run.mixed_steps += int(0 < n_flush < live_slots.numel())
    tol = tolerance(act, cache.state_dtype)
    mk = strided if opts.get("strided") else (lambda t: t)

    for name, c in run.caches.items():
        before = {f: getattr(c, f).clone() for f in CACHE_FIELDS}
        out = poison_(mk(torch.empty(batch, g.nheads, g.headdim, dtype=act, device=device)))
        y = replay_step(c, mk(inp["x"]), mk(inp["dt"]), p.A, mk(inp["B"]), mk(inp["C"]), D=D, z=mk(z),
                        dt_bias=dt_bias, dt_softplus=softplus, slots=slots, route=run.route, out=out, backend=name)
        assert y is out
        assert_rel_close(f"{name} y", out[live], y_ref, tol)
        assert torch.isnan(out[~live]).all(), f"{name}: a null row's output was written"
        for f in CACHE_FIELDS:
            assert torch.equal(getattr(c, f)[untouched], before[f][untouched]), f"{name}: unused slot {f} changed"
        assert torch.equal(c.state[normal], before["state"][normal]), f"{name}: a normal step wrote the checkpoint"
        expect = torch.where(h_before[live_slots] >= run.L - 1, 0, h_before[live_slots] + 1)
        assert torch.equal(c.write_pos[live_slots].long(), expect), f"{name}: cursor"
    run.truth[live_slots] = new_truth

    for name, c in run.caches.items():
        m = materialize(c, slots=slot_ids if slots is None and batch != c.num_slots else slots, backend=name)
        assert_rel_close(f"{name} materialize", m[live], run.truth[live_slots], tol)
        assert torch.isnan(m[~live]).all()
    assert_same_cache(run.cache, run.caches["ref"], tol)


def assert_same_cache(c: ReplayCache, ref: ReplayCache, tol: float) -> None:
    """Same protocol state as the ref backend: buffers bitwise, dt to fp32 rounding, checkpoint to tol."""
    assert torch.equal(c.write_pos, ref.write_pos), "write_pos differs from the ref backend"
    assert torch.equal(c.x, ref.x) and torch.equal(c.B, ref.B), "x/B buffers differ from the ref backend"
    torch.testing.assert_close(c.dt, ref.dt, rtol=1e-5, atol=0.0)
    assert_rel_close("checkpoint vs ref backend", c.state, ref.state, tol)


def run_schedule(run: Run, gen, steps: int, batch: int, nulls: bool = True) -> Run:
    """`steps` scheduled steps after a prologue that desynchronises the cursors: slot 0 alone for L-1 steps,
    then rows 0..batch-1 together (slot 0 flushes while the others take a normal step)."""
    desync = run.cache.num_slots > 1 and batch > 1 and run.L > 1
    if desync:
        for _ in range(run.L - 1 - int(run.cache.write_pos[0])):
            do_step(run, gen, torch.tensor([0], dtype=torch.int32))
        mixed, others_normal = run.mixed_steps, bool((run.cache.write_pos[1:batch] < run.L - 1).any())
        do_step(run, gen, torch.arange(batch, dtype=torch.int32))
        assert run.mixed_steps == mixed + int(others_normal)
    for step in range(steps):
        do_step(run, gen, schedule(gen, run.cache.num_slots, batch, step, nulls))
    if run.L > 1 and steps >= 2 * run.L:
        assert run.flushes > 1, "the schedule never crossed a flush boundary"
    return run


# --------------------------------------------------------------------------------- torch / ref, full matrix

DTYPES = [(F32, F32), (F16, F32), (F16, F16), (F32, F16), (F32, torch.bfloat16)]  # (act, state)


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
@pytest.mark.parametrize("L", [1, 4, 16])
@pytest.mark.parametrize("act,state", DTYPES)
def test_torch_ref_vs_ground_truth(gen, device, backend, L, act, state):
    run = start(gen, TINY, 3, L, backend, state_dtype=state, act_dtype=act, device=device)
    run_schedule(run, gen, steps=2 * L + 3, batch=3)


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
@pytest.mark.parametrize("options", [
    dict(with_z=False, with_D=False, with_bias=False),
    dict(with_bias=False, dt_softplus=False),
    dict(with_z=True, with_D=False, with_bias=True, dt_dtype=F16),
    dict(strided=True),
])
def test_options_and_strided_inputs(gen, device, backend, options):
    run = start(gen, TINY, 4, 4, backend, device=device, **options)
    run_schedule(run, gen, steps=9, batch=3)


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_default_slots(gen, device, backend):
    """slots=None: rows are slots 0..batch-1, with batch == num_slots (the torch backend's no-gather path),
    then batch < num_slots (a prefix of the pool)."""
    geometry, L = (MINI, 2) if backend == "triton" else (TINY, 4)
    run = start(gen, geometry, 3, L, backend, device=device)
    for _ in range(L + 1):
        do_step(run, gen, None, batch=3)
    for _ in range(2):
        do_step(run, gen, None, batch=2)
    assert run.flushes > 0


def test_torch_default_slots_reads_through_views(gen, device, monkeypatch):
    """slots=None with batch == num_slots: no gather copies of the cache (index_select is never called)."""
    run = start(gen, TINY, 2, 2, "torch", device=device)

    def no_gather(*args, **kwargs):
        raise AssertionError("the torch backend gathered a cache tensor")

    monkeypatch.setattr(torch.Tensor, "index_select", no_gather)
    p = run.params
    for _ in range(2):  # a normal step, then a flush
        inp = random_step(TINY, 2, device=device, generator=gen)
        replay_step(run.cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias, backend="torch")
        materialize(run.cache, backend="torch")
    assert run.cache.write_pos.tolist() == [0, 0]


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_reset_some_slots(gen, device, backend):
    """A new request enters one slot mid-buffer: new checkpoint, empty buffer; the others keep going."""
    geometry, L = (MINI, 3) if backend == "triton" else (TINY, 4)
    run = start(gen, geometry, 3, L, backend, device=device)
    full = torch.tensor([2, 0, 1], dtype=torch.int32)
    for _ in range(2):
        do_step(run, gen, full)
    fresh = random_state(geometry, 1, run.cache.state_dtype, device, generator=gen)
    for c in run.caches.values():
        c.state[1] = fresh[0]
        c.reset(torch.tensor([1], dtype=torch.int32, device=device))
    run.truth[1] = fresh[0].double()
    assert run.cache.write_pos.tolist() == [2, 0, 2]
    for _ in range(3):
        do_step(run, gen, full)
    assert run.flushes > 0


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
@pytest.mark.parametrize("model,tp", [("nemotron3_super_120b", 8), ("nemotron3_nano_4b", 4)])
def test_production_geometry(gen, device, backend, model, tp):
    run = start(gen, get_geometry(model, tp), 3, 4, backend, device=device)
    run_schedule(run, gen, steps=6, batch=2)


@pytest.mark.parametrize("backend", ["torch", "ref", "triton", "cpu"])
def test_l1_is_plain_state_update(gen, device, backend):
    """L = 1 flushes every step: the checkpoint follows the plain recurrence, fp32 error <= 1e-6."""
    geometry = MINI if backend == "triton" else TINY
    run = start(gen, geometry, 2, 1, backend, device=device)
    for step in range(3):
        slots = torch.tensor([1, 0] if step % 2 else [0, 1], dtype=torch.int32, device=device)
        p, inp = run.params, random_step(geometry, 2, generator=gen, device=device)
        out = poison_(torch.empty_like(inp["x"]))
        replay_step(run.cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias, slots=slots,
                    out=out, backend=backend)
        idx = slots.long()
        run.truth[idx], y_ref = ssm_step_ref(run.truth[idx], inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D,
                                             inp["z"], p.dt_bias)
        assert rel_err(out, y_ref) <= 1e-6
        assert rel_err(run.cache.state, run.truth) <= 1e-6
        assert run.cache.write_pos.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------- cpu (fused C kernels)

@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
@pytest.mark.parametrize("act,state", [(F32, F32), (F16, F16), (torch.bfloat16, torch.bfloat16)])
def test_cpu_routes_vs_ground_truth(gen, device, route, act, state):
    """Both routes of the C kernel (its state_and_output normal step rebuilds rows it never stores)."""
    run = start(gen, TINY, 3, 4, "cpu", route, state, act, device)
    run_schedule(run, gen, steps=11, batch=3)


@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
@pytest.mark.parametrize("dstate", [80, 20])
def test_cpu_row_tiles(gen, device, route, dstate):
    """The C row rebuild tiles a row as 64-wide blocks, then 16-wide ones; other widths take the plain loop:
    dstate 80 = one block of each, 20 = the plain loop (the other cpu tests use 16)."""
    geometry = Mamba2Geometry(nheads=2, headdim=16, dstate=dstate, ngroups=1)
    run = start(gen, geometry, 3, 4, "cpu", route, F32, F32, device)
    run_schedule(run, gen, steps=9, batch=3)


# ------------------------------------------------------------------------------------- triton (interpreter)

@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
@pytest.mark.parametrize("act,state", [(F32, F32), (F16, F16), (F16, F32)])
def test_triton_vs_ground_truth(gen, device, route, act, state):
    run = start(gen, TINY, 3, 4, "triton", route, state, act, device)
    run_schedule(run, gen, steps=8, batch=2 if act == F16 else 3)


@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
def test_triton_long_buffer(gen, device, route):
    """L = 16 (the production default): one full buffer, a flush, and the restart."""
    run = start(gen, MINI, 1, 16, "triton", route, device=device)
    run_schedule(run, gen, steps=18, batch=1, nulls=False)
    assert run.flushes == 1


def test_triton_options_and_strided_inputs(gen, device):
    """One head per group (every head owns its B append), no z / bias, fp16 raw dt, strided views; then
    dt used without softplus."""
    geometry = Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=2)
    run = start(gen, geometry, 3, 2, "triton", "state_and_output", device=device, with_z=False, with_bias=False,
                strided=True, dt_dtype=F16)
    run_schedule(run, gen, steps=4, batch=2)
    run.options = dict(with_D=False, with_bias=False, dt_softplus=False)
    run.route = "output_only"
    run_schedule(run, gen, steps=4, batch=2)


@pytest.mark.parametrize("route,arch", [("state_and_output", None), ("output_only", "90"), ("state_and_output", "100")])
def test_triton_headdim80_tiles(gen, device, route, arch, monkeypatch):
    """Nemotron Nano's headdim 80 is not a power of 2: masked tiles. A forced arch runs the GPU launch table
    through the interpreter: several programs per head (BLOCK_M 16: five, BLOCK_M 32: three with the last
    half masked), so only the first tile of a head appends dt and only one program per group appends B."""
    if arch is not None:
        if not interpreter_active():
            pytest.skip("the forced launch table is an interpreter-only check")
        monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    run = start(gen, Mamba2Geometry(nheads=2, headdim=80, dstate=32, ngroups=1), 1, 2, "triton", route, device=device)
    run_schedule(run, gen, steps=3, batch=1, nulls=False)
    assert run.flushes == 1


def test_launch_config_table():
    g = get_geometry("nemotron3_nano_4b", 4)
    # output-only readout (ar_kernels.py): BLOCK_M 32 on 2 warps, 16 where 32 does not divide headdim (80)
    oo = launch_config(g, 16, "output_only", 90)
    assert (oo.block_m, oo.num_warps, oo.block_k) == (16, 2, 16)
    sup = launch_config(get_geometry("nemotron3_super_120b", 1), 16, "output_only", 90)
    assert (sup.block_m, sup.num_warps, sup.block_k) == (32, 2, 16)
    fold = launch_config(g, 16, "output_only", 90, kernel="mamba2_replay_ar_fold")
    assert (fold.block_m, fold.num_warps, fold.block_k, fold.dot_precision) == (32, 4, 32, "tf32x3")
    assert launch_config(g, 16, "state_and_output", 100).block_m == 32
    assert launch_config(g, 16, "state_and_output", 90).dot_precision == "tf32x3"
    interp = launch_config(g, 4, "output_only", 0)
    assert (interp.block_m, interp.block_n, interp.block_l) == (128, 128, 16)
    with pytest.raises(ValueError, match="cannot tile"):
        launch_config(Mamba2Geometry(2, 16, 512, 1), 4, "output_only", 90)


@pytest.mark.parametrize("arch", [None, "90"])
def test_triton_output_only_ragged_tiles(gen, device, arch, monkeypatch):
    """headdim 24 and dstate 24 divide no tile (EVEN_M = EVEN_N = False): the readout's masked loads, in the
    interpreter's whole tiles (one [32, 32] chunk) and under the GPU rule (BLOCK_M 16: two programs, the second
    half masked; two K chunks of 16, the second half masked), the fold's masked chunk; flushes crossed."""
    if arch is not None:
        if not interpreter_active():
            pytest.skip("the forced launch table is an interpreter-only check")
        monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", arch)
    run = start(gen, Mamba2Geometry(nheads=2, headdim=24, dstate=24, ngroups=1), 2, 3, "triton", "output_only",
                device=device)
    run_schedule(run, gen, steps=5, batch=2)
    assert run.flushes >= 2


@pytest.mark.parametrize("act", [F32, F16])
def test_triton_output_only_even_gpu_tiles(gen, device, act, monkeypatch):
    """The GPU rule's output-only tiles where they divide the geometry (EVEN_M / EVEN_N: no masks): headdim 64 is two
    BLOCK_M 32 programs per head (only the first appends dt), dstate 32 two K chunks of 16; the fold walks it in one
    chunk of 32. Flushes crossed with desynchronised cursors; fp16 activations take the fold's tf32x2 split."""
    if not interpreter_active():
        pytest.skip("the forced launch table is an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    g = Mamba2Geometry(nheads=2, headdim=64, dstate=32, ngroups=1)
    assert launch_config(g, 4, "output_only", 90).block_m == 32
    run = start(gen, g, 3, 4, "triton", "output_only", F32, act, device)
    run_schedule(run, gen, steps=6, batch=2)
    assert run.flushes >= 2


def test_triton_output_only_ignores_stale_buffer_rows(gen, device):
    """The readout loads every buffer row (and dt, bc) unmasked and selects rows j < h afterwards: rows at and
    past each slot's cursor hold NaN / inf here and must reach neither y nor the checkpoint (a zero weight would
    not do: 0 * inf is NaN). Cursors 0, 2 and L-1 (a flush) in one step."""
    L = 4
    cache = ReplayCache.allocate(TINY, 3, L, device=device)
    cache.state.copy_(random_state(TINY, 3, device=device, generator=gen))
    for slot, h in enumerate((0, 2, L - 1)):
        cache.x[slot, :, :h] = torch.randn(TINY.nheads, h, TINY.headdim, generator=gen).to(device)
        cache.B[slot, :, :h] = torch.randn(TINY.ngroups, h, TINY.dstate, generator=gen).to(device)
        cache.dt[slot, :, :h] = 0.01 + 0.05 * torch.rand(TINY.nheads, h, generator=gen).to(device)
        cache.x[slot, :, h:], cache.B[slot, :, h:] = float("nan"), float("inf")
        cache.dt[slot, :, h:], cache.bc[slot, :, h:] = float("nan"), float("inf")
        cache.write_pos[slot] = h
    ref = cache.clone()
    p, inp = random_params(TINY, device, gen), random_step(TINY, 3, device=device, generator=gen)
    args = (inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias)
    y = replay_step(cache, *args, route="output_only", backend="triton")
    y_ref = replay_step(ref, *args, backend="ref")
    assert torch.isfinite(y).all() and torch.isfinite(cache.state).all()
    assert_rel_close("y", y, y_ref, tolerance(F32))
    assert_rel_close("checkpoint", cache.state, ref.state, tolerance(F32))
    for f in ("x", "B", "dt"):
        torch.testing.assert_close(getattr(cache, f), getattr(ref, f), rtol=1e-6, atol=0.0, equal_nan=True)


@triton.jit
def _split(a_ptr, hi_ptr, lo_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    hi, lo = split_bf16(tl.load(a_ptr + offs))
    tl.store(hi_ptr + offs, hi.to(tl.float32))
    tl.store(lo_ptr + offs, lo.to(tl.float32))


def test_fold_bf16x2_bound_at_mamba2_operands(gen, device):
    """The output-only fold's bf16x2 dot (bf16 activations): S = abar S0 + (X * s) @ B with X, B bf16-exact and the
    fp32 side X * s split into bf16 hi + lo (replayssm/delta_rule/_tl.py, split in Triton: the interpreter
    truncates where the GPU rounds to nearest, the bound covers both). At the fold's shapes (BLOCK_M 32, BLOCK_L 16,
    a K chunk of 32) and the replay weights of random_params' A / dt ranges, every element of the rebuilt state is
    within (2^-14 + BLOCK_L 2^-24) (|X s| @ |B|) of the float64 rebuild (the two products are exact in fp32, so they
    are formed in float64; the interpreter does not emulate a bf16 tl.dot), and the state's relative error sits far
    below the bf16 activations' own tolerance."""
    if device != "cpu":
        pytest.skip("interpreter check")
    M, C, N = 32, 16, 32
    A = -torch.exp(torch.empty(()).uniform_(0.0, 2.77, generator=gen)).double()
    dt = torch.exp(torch.empty(C).uniform_(-6.9, -2.3, generator=gen)).double()
    c = torch.cumsum(dt, 0)
    s = dt * torch.exp(A * (c[-1] - c))                                    # the fold's replay weights
    X = torch.randn(M, C, generator=gen).bfloat16().double()
    B = torch.randn(C, N, generator=gen).bfloat16().double()
    S0 = torch.randn(M, N, generator=gen, dtype=torch.float64)
    xs = (X * s).float()                                                   # fp32, as the kernel forms it
    hi, lo = torch.empty_like(xs), torch.empty_like(xs)
    _split[(1,)](xs.view(-1), hi.view(-1), lo.view(-1), N=M * C)
    assert torch.equal(hi.bfloat16().float(), hi) and torch.equal(lo.bfloat16().float(), lo)
    exact = xs.double() @ B
    split = (hi.double() @ B).float().double() + (lo.double() @ B).float().double()
    assert ((split - exact).abs() <= (2.0 ** -14 + C * 2.0 ** -24) * (xs.double().abs() @ B.abs())).all()
    abar = torch.exp(A * c[-1])
    assert rel_err(abar * S0 + split, abar * S0 + X * s @ B) < 1e-2 * tolerance(torch.bfloat16)


# -------------------------------------------------------------------------------------------- bad input

def _bad_cases():
    def swap(key, fn):
        return lambda kw: kw.update({key: fn(kw[key])})
    return {
        "x shape": swap("x", lambda t: t[:, :, :-1]),
        "B groups": swap("B", lambda t: t[:, :1]),
        "dt shape": swap("dt", lambda t: t[:, None]),
        "A shape": swap("A", lambda t: t[:-1]),
        "z shape": swap("z", lambda t: t[:1]),
        "x dtype": swap("x", lambda t: t.half()),
        "C dtype": swap("C", lambda t: t.half()),
        "out dtype": lambda kw: kw.update(out=torch.empty(kw["x"].shape, dtype=F16)),
        "A dtype": swap("A", lambda t: t.half()),
        "x last stride": swap("x", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),
        "route": lambda kw: kw.update(route="both"),
        "backend": lambda kw: kw.update(backend="cuda"),
        "slot out of range": lambda kw: kw.update(slots=torch.tensor([0, 3], dtype=torch.int32)),
        "duplicate slots": lambda kw: kw.update(slots=torch.tensor([1, 1], dtype=torch.int32)),
        "slots shape": lambda kw: kw.update(slots=torch.tensor([0], dtype=torch.int32)),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bad_input_raises_before_launch(gen, case, backend):
    cache = ReplayCache.allocate(TINY, 3, 4)
    p, inp = random_params(TINY, generator=gen), random_step(TINY, 2, generator=gen)
    kw = dict(cache=cache, A=p.A, D=p.D, dt_bias=p.dt_bias, backend=backend, **inp)
    _bad_cases()[case](kw)
    before = cache.clone()
    with pytest.raises(ValueError):
        replay_step(**kw)
    for f in CACHE_FIELDS:
        assert torch.equal(getattr(cache, f), getattr(before, f))


@pytest.mark.skipif(not interpreter_active(), reason="the interpreter's bf16 guard")
def test_bf16_rejected_under_interpreter(gen):
    cache = ReplayCache.allocate(MINI, 1, 4, act_dtype=torch.bfloat16)
    p, inp = random_params(MINI, generator=gen), random_step(MINI, 1, torch.bfloat16, generator=gen)
    with pytest.raises(ValueError, match="bfloat16"):
        replay_step(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], backend="triton")


def test_dstate_512_cannot_tile(gen):
    g = Mamba2Geometry(nheads=2, headdim=16, dstate=512, ngroups=1)
    cache = ReplayCache.allocate(g, 1, 4)
    p, inp = random_params(g, generator=gen), random_step(g, 1, generator=gen)
    with pytest.raises(ValueError, match="cannot tile"):
        replay_step(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], backend="triton")
    with pytest.raises(ValueError, match="cannot tile"):
        materialize(cache, backend="triton", A=p.A)


def test_materialize_bad_input(gen):
    cache = ReplayCache.allocate(TINY, 2, 4)
    with pytest.raises(ValueError, match="needs A"):
        materialize(cache, backend="torch")
    A = random_params(TINY, generator=gen).A
    with pytest.raises(ValueError):
        materialize(cache, slots=torch.tensor([0, 2], dtype=torch.int32), backend="torch", A=A)
    with pytest.raises(ValueError):
        materialize(cache, backend="bogus", A=A)
    with pytest.raises(ValueError):
        materialize(cache, backend="torch", A=A[:1])
    # h = 0 everywhere: the state is the checkpoint itself.
    cache.state.normal_(generator=gen)
    assert torch.equal(materialize(cache, backend="torch", A=A), cache.state)


# -------------------------------------------------------------------------------------------- GPU only

def cuda_only(fn):
    """GPU-only test: marked `gpu` (scripts/gpu/gpu_check.sh runs `-m gpu` with the interpreter off)."""
    skip = pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(), reason="needs a CUDA device")
    return pytest.mark.gpu(skip(fn))


@cuda_only
@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
def test_cuda_bf16_and_fp32_parity(gen, route):
    for act, state, L in ((torch.bfloat16, F32, 4), (F32, F32, 16), (F32, torch.bfloat16, 8)):
        run = start(gen, get_geometry("nemotron3_nano_4b", 4), 6, L, "triton", route, state, act, "cuda")
        run_schedule(run, gen, steps=2 * L + 2, batch=5)


@cuda_only
@pytest.mark.parametrize("route", ["output_only", "state_and_output"])
def test_cuda_graph_capture(gen, route):
    """The whole step (3-4 launches, device cursors) replays from a CUDA graph like the eager calls."""
    g, L = get_geometry("nemotron3_super_120b", 8), 4
    run = start(gen, g, 4, L, "triton", route, device="cuda")
    eager = run.caches["ref"]  # a clone of the starting cache, stepped eagerly with the same kernels
    p = run.params
    static = random_step(g, 4, device="cuda", generator=gen)
    slots = torch.tensor([3, NULL_SLOT, 0, 1], dtype=torch.int32, device="cuda")
    out = torch.empty_like(static["x"])
    args = lambda c, o: replay_step(c, static["x"], static["dt"], p.A, static["B"], static["C"], p.D, static["z"],
                                    p.dt_bias, slots=slots, route=route, out=o, backend="triton")
    args(run.cache, out)  # warm-up compiles, outside the capture (a normal step: the checkpoint is untouched)
    run.cache.write_pos.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        args(run.cache, out)
    run.cache.write_pos.zero_()
    for _ in range(2 * L + 1):
        for k, v in random_step(g, 4, device="cuda", generator=gen).items():
            static[k].copy_(v)
        graph.replay()
        out_eager = poison_(torch.empty_like(out))
        args(eager, out_eager)
        live = slots != NULL_SLOT
        assert_rel_close("graph vs eager", out[live], out_eager[live], 1e-6)
        for f in ("state", "x", "B", "dt", "write_pos"):
            assert torch.equal(getattr(run.cache, f), getattr(eager, f)), f"graph vs eager: {f}"
    torch.cuda.synchronize()
