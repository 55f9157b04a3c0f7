"""ReplaySSM speculative decoding for Mamba-2: every backend against the serial float64 oracle.

The main check is a long protocol run: random windows, random accepted counts (1..T) per row, rows mapped
to permuted slots with NULL padding rows, one slot entering late and one restarted with a new request
(spec_reset), an idle slot that must never change. At each step the outputs are compared with
replayssm.mamba2.ref.window_ref run from each slot's committed ground-truth state, the ground truth then
advances by the accepted prefix, spec_materialize must equal it, and at every flush the checkpoint must
equal the ground truth at the folded-token count. The cursors are checked against the protocol replayed in
plain Python, and the run counts flushes and ring wrap-arounds so it cannot pass without exercising them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.ref import window_ref
from replayssm.mamba2.spec import spec_commit, spec_materialize, spec_reset, spec_verify
from replayssm.testing import poison_, rel_err, tolerance

SMALL = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)
TINY = Mamba2Geometry(nheads=2, headdim=32, dstate=32, ngroups=2)
F32, F16 = torch.float32, torch.float16


@dataclass
class Case:
    T: int
    history: int
    act: torch.dtype = F32
    state: torch.dtype = F32
    with_z: bool = True
    with_D: bool = True
    geometry: Mamba2Geometry = SMALL
    strided: bool = False
    softplus: bool = True
    accept_lo: int = 1          # accepted counts are drawn from accept_lo..T

    def __str__(self) -> str:
        return (f"T{self.T}-B{self.history}-{str(self.act)[6:]}-{str(self.state)[6:]}"
                f"{'-z' if self.with_z else ''}{'-D' if self.with_D else ''}{'-strided' if self.strided else ''}"
                f"{'' if self.softplus else '-nosoftplus'}-g{self.geometry.ngroups}")


LONG_CASES = [
    Case(2, 2, geometry=Mamba2Geometry(4, 16, 16, 4)),
    Case(2, 8, act=F16, with_z=False, strided=True),
    Case(2, 16, act=F16, state=F16, with_D=False),
    Case(4, 4, geometry=Mamba2Geometry(4, 16, 32, 1), softplus=False),
    Case(4, 8, state=F16, with_z=False, with_D=False),
    Case(4, 16, strided=True),
]
TRITON_CASES = [
    Case(2, 2, strided=True, geometry=TINY),
    Case(4, 8, act=F16, state=F16, with_z=False, accept_lo=3, geometry=SMALL),
]


def _strided(t: torch.Tensor | None) -> torch.Tensor | None:
    """The same values behind non-default outer strides (padding on the last dim, unit stride kept)."""
    if t is None:
        return None
    buf = torch.zeros(*t.shape[:-1], t.shape[-1] + 5, dtype=t.dtype, device=t.device)
    buf[..., : t.shape[-1]] = t
    return buf[..., : t.shape[-1]]


@dataclass
class Counters:
    flushes: int = 0          # verify steps that folded a non-empty history into the checkpoint
    origin_wraps: int = 0     # commits whose new origin crossed ring_len
    window_wraps: int = 0     # verify windows whose ring rows crossed ring_len
    null_rows: int = 0
    resets: int = 0
    flush_positions: set = field(default_factory=set)


def _window_inputs(case: Case, batch: int, device, gen) -> dict:
    inp = random_step(case.geometry, batch, case.act, device, window=case.T, with_z=case.with_z, generator=gen)
    if not case.softplus:
        inp["dt"] = 0.1 * inp["dt"].abs()          # raw dt used as is must stay positive
    if case.strided:
        inp = {k: _strided(v) for k, v in inp.items()}
    return inp


def run_protocol(backend: str, case: Case, gen: torch.Generator, device, steps: int, batch: int, num_slots: int,
                 materialize_every: int = 1, route: str = "fused") -> Counters:
    geo, T = case.geometry, case.T
    ring = SpecRing.allocate(geo, num_slots, case.history, T, case.state, case.act, device)
    R, L = ring.ring_len, ring.max_len
    prm = random_params(geo, device, gen)
    A, D = prm.A, (prm.D if case.with_D else None)
    dt_bias = prm.dt_bias if case.softplus else None
    tol = tolerance(case.act, case.state)

    idle, late = num_slots - 1, num_slots - 2          # idle: never used; late: enters at steps // 3
    active = list(range(num_slots - 2))
    gt = torch.zeros(num_slots, geo.nheads, geo.headdim, geo.dstate, dtype=torch.float64)
    cursors = {s: [0, 0, 0] for s in range(num_slots)}   # write_pos, origin, is_flush replayed in Python

    def enter(slots_list):
        fresh = random_state(geo, len(slots_list), case.state, device, gen)
        ring.state[slots_list] = fresh
        gt[slots_list] = fresh.double().cpu()
        spec_reset(ring, torch.tensor(slots_list, dtype=torch.int32, device=device), backend=backend)
        for s in slots_list:
            cursors[s] = [0, 0, 0]

    enter(list(range(num_slots)))
    idle_before = [t[idle].clone() for t in (ring.state, ring.x, ring.B, ring.dt, ring.write_pos, ring.origin,
                                            ring.is_flush)]
    count = Counters()
    for step in range(steps):
        if step == steps // 3:
            enter([late])
            active.append(late)
            count.resets += 1
        if step == steps // 2 and len(active) > 1:
            assert int(ring.write_pos[active[1]]) > 0 or int(ring.origin[active[1]]) > 0
            enter([active[1]])                         # a new request replaces a running one
            count.resets += 1
        row_slots = active + [NULL_SLOT] * (batch - len(active))
        row_slots = [row_slots[i] for i in torch.randperm(batch, generator=gen).tolist()]
        live = [i for i, s in enumerate(row_slots) if s != NULL_SLOT]
        dead = [i for i, s in enumerate(row_slots) if s == NULL_SLOT]
        live_slots = [row_slots[i] for i in live]
        count.null_rows += len(dead)
        slots_t = torch.tensor(row_slots, dtype=torch.int32, device=device)
        inp = _window_inputs(case, batch, device, gen)
        before = {s: list(cursors[s]) for s in live_slots}
        for s in live_slots:
            h, o, f = before[s]
            assert [int(ring.write_pos[s]), int(ring.origin[s]), int(ring.is_flush[s])] == [h, o, f]
            count.window_wraps += int(o + h + T - 1 >= R)

        out = poison_(torch.empty(batch, T, geo.nheads, geo.headdim, dtype=case.act, device=device))
        y = spec_verify(ring, inp["x"], inp["dt"], A, inp["B"], inp["C"], D, inp["z"], dt_bias,
                        dt_softplus=case.softplus, slots=slots_t, out=out, backend=backend, route=route)
        assert y is out
        assert torch.isnan(y[dead]).all(), "a NULL_SLOT row's output was written"

        sel = {k: (None if v is None else v[live]) for k, v in inp.items()}
        window = (sel["x"], sel["dt"], A, sel["B"], sel["C"], D, sel["z"], dt_bias, case.softplus)
        _, y_ref = window_ref(gt[live_slots].to(device), *window)
        err = rel_err(y[live], y_ref)
        assert err <= tol, f"step {step}: outputs off by {err:.2e} (tol {tol:.0e})"

        flushed = [i for i, s in enumerate(live_slots) if before[s][2] and before[s][0] > 0]
        for i in flushed:
            s = live_slots[i]
            err = rel_err(ring.state[s], gt[s])
            assert err <= tol, f"step {step}: flushed checkpoint of slot {s} off by {err:.2e}"
            h = before[s][0]
            assert h + T <= L < h + 2 * T, "flush outside the early-flush window"
            count.flushes += 1
            count.flush_positions.add(h)

        accepted = torch.randint(case.accept_lo, T + 1, (batch,), generator=gen, dtype=torch.int32)
        accepted[dead] = 0                             # padding rows' counts are ignored
        spec_commit(ring, accepted.to(device), slots=slots_t, backend=backend)
        # Ground truth: a flushed slot continues from its checkpoint as stored (rounded to the state dtype).
        start = gt[live_slots].clone()
        for i in flushed:
            start[i] = start[i].to(case.state).double()
        states, _ = window_ref(start.to(device), *window)
        acc = accepted[live].long()
        gt[live_slots] = states[torch.arange(len(live)), acc - 1].cpu()
        for s, a in zip(live_slots, acc.tolist()):
            h, o, f = cursors[s]
            if f:
                count.origin_wraps += int(o + h >= R)
                o, h = (o + h) & (R - 1), a
            else:
                h += a
            cursors[s] = [h, o, int(h + 2 * T > L)]
            assert [int(ring.write_pos[s]), int(ring.origin[s]), int(ring.is_flush[s])] == cursors[s]

        if (step + 1) % materialize_every == 0 or step == steps - 1:
            mat_slots = torch.tensor(live_slots + [NULL_SLOT], dtype=torch.int32, device=device)
            mat = spec_materialize(ring, mat_slots, backend=backend, A=A)
            err = rel_err(mat[:-1], gt[live_slots])
            assert err <= tol, f"step {step}: materialized state off by {err:.2e}"
            assert torch.isnan(mat[-1]).all()

    for before_t, now in zip(idle_before, (ring.state, ring.x, ring.B, ring.dt, ring.write_pos, ring.origin,
                                            ring.is_flush)):
        assert torch.equal(before_t, now[idle]), "the idle slot's cache changed"
    return count


@pytest.mark.parametrize("case", LONG_CASES, ids=str)
@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_long_protocol_run(backend, case, gen, device):
    count = run_protocol(backend, case, gen, device, steps=48, batch=4, num_slots=5)
    assert count.flushes > 0 and count.origin_wraps > 0 and count.window_wraps > 0 and count.null_rows > 0, count
    assert count.resets == 2


@pytest.mark.parametrize("case", [
    Case(3, 8, geometry=Mamba2Geometry(2, 6, 24, 1)),     # dstate % 8 == 0: 4x4 tiles, then 2 rows of tail
    Case(4, 8, geometry=Mamba2Geometry(2, 5, 20, 1)),     # dstate % 8 != 0: the per-row path
    Case(2, 4, geometry=Mamba2Geometry(2, 9, 40, 1)),     # one spare tile vector, one tail row
], ids=str)
def test_cpu_odd_row_tiles(case, gen, device):
    """backend="cpu" verifies a head's rows in register tiles of 4 rows x 4 window tokens (dot_block): head
    sizes that leave tail rows, windows that leave spare tile vectors, state widths the tile cannot take."""
    count = run_protocol("cpu", case, gen, device, steps=16, batch=3, num_slots=4, materialize_every=4)
    assert count.flushes > 0 and count.window_wraps > 0


@pytest.mark.parametrize("case", TRITON_CASES, ids=str)
def test_triton_protocol_run(case, gen, device):
    count = run_protocol("triton", case, gen, device, steps=14, batch=3, num_slots=4, materialize_every=3)
    assert count.flushes > 0 and count.origin_wraps > 0 and count.window_wraps > 0 and count.null_rows > 0, count


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_tp_split_production_geometry(backend, gen, device):
    """Nemotron-3 Super at TP=8 (16 heads, headdim 64, dstate 128, one group), history 16, window 4."""
    case = Case(4, 16, geometry=get_geometry("nemotron3_super_120b", tp=8), accept_lo=3)
    count = run_protocol(backend, case, gen, device, steps=10, batch=3, num_slots=4, materialize_every=5)
    assert count.flushes > 0


def _live_ring_rows(ring: SpecRing, slot: int, count: int) -> list[int]:
    o = int(ring.origin[slot])
    return [(o + k) & (ring.ring_len - 1) for k in range(count)]


@pytest.mark.parametrize("backend", ["triton", "torch", "cpu"])
def test_cache_contents_match_ref(backend, gen, device):
    """Same inputs into a ref ring and a `backend` ring: live ring rows, bc, checkpoint and cursors agree."""
    geo, T = TINY, 4
    rings = {b: SpecRing.allocate(geo, 4, 4, T, F32, F16, device) for b in ("ref", backend)}
    state0 = random_state(geo, 4, F32, device, gen)
    prm = random_params(geo, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    flushes = 0
    for step in range(7):
        slots = torch.tensor([[2, NULL_SLOT, 0], [0, 3, 2]][step % 2], dtype=torch.int32, device=device)
        inp = random_step(geo, 3, F16, device, window=T, generator=gen)
        live = [s for s in slots.tolist() if s != NULL_SLOT]
        h = {s: int(rings["ref"].write_pos[s]) for s in live}
        flushes += sum(int(rings["ref"].is_flush[s]) for s in live)
        for b, r in rings.items():
            spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                        slots=slots, backend=b)
        ref, other = rings["ref"], rings[backend]
        for s in live:
            rows = _live_ring_rows(ref, s, h[s] + T)
            assert torch.equal(ref.x[s][:, rows], other.x[s][:, rows])
            assert torch.equal(ref.B[s][:, rows], other.B[s][:, rows])
            assert rel_err(other.dt[s][:, rows], ref.dt[s][:, rows]) <= 1e-6
            if backend == "triton":
                assert rel_err(other.bc[s, :, : h[s] + T], ref.bc[s, :, : h[s] + T]) <= 1e-6
            assert rel_err(other.state[s], ref.state[s]) <= 1e-5
        accepted = torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32)
        for b, r in rings.items():
            spec_commit(r, accepted, slots=slots, backend=b)
        for name in ("write_pos", "origin", "is_flush"):
            assert torch.equal(getattr(ref, name), getattr(other, name)), name
    assert flushes > 0
    assert torch.equal(rings["ref"].state[1], state0[1])   # slot 1 never appeared in a batch
    # spec_materialize without A uses the A of the last spec_verify on the ring
    mats = {b: spec_materialize(r, backend=b) for b, r in rings.items()}
    assert rel_err(mats[backend], mats["ref"]) <= 1e-5
    assert torch.equal(mats[backend], spec_materialize(rings[backend], backend=backend, A=prm.A))


def test_triton_gpu_tiles_under_interpreter(gen, device, monkeypatch):
    """The GPU launch config run by the interpreter, flushing every step (B = T), against the torch backend:
    headdim 48 in 32-row tiles (a masked second tile), dstate 64 in 16-wide chunks (a 4-trip loop)."""
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    from replayssm.mamba2.spec_kernels import launch_config

    geo, T = Mamba2Geometry(nheads=2, headdim=48, dstate=64, ngroups=1), 2
    cfg = launch_config(geo.headdim, geo.dstate, 4, 90)
    assert cfg.block_n < geo.dstate and cfg.block_m < geo.headdim
    rings = {b: SpecRing.allocate(geo, 2, 2, T, device=device) for b in ("triton", "torch")}
    state0 = random_state(geo, 2, F32, device, gen)
    prm = random_params(geo, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    slots = torch.tensor([1, 0], dtype=torch.int32, device=device)
    for _ in range(4):
        inp = random_step(geo, 2, window=T, device=device, generator=gen)
        ys = {b: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                             slots=slots, backend=b) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["torch"]) <= 1e-5
        assert rel_err(rings["triton"].state, rings["torch"].state) <= 1e-5
        accepted = torch.randint(1, T + 1, (2,), generator=gen, dtype=torch.int32).to(device)
        for b, r in rings.items():
            spec_commit(r, accepted, slots=slots, backend=b)
    assert not torch.equal(rings["triton"].state, state0)
    mats = {b: spec_materialize(r, backend=b, A=prm.A) for b, r in rings.items()}
    assert rel_err(mats["triton"], mats["torch"]) <= 1e-5


@pytest.mark.parametrize("state_dtype", [F32, F16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T,history", [(2, 2), (4, 8)])
def test_default_slots_match_ref(T, history, state_dtype, gen, device):
    """slots=None with batch == num_slots: the torch backend reads (and, fp32, folds) the checkpoint in place
    as a view; with B = T every row flushes at once. Outputs, checkpoint and cursors against the ref."""
    geo = SMALL
    rings = {b: SpecRing.allocate(geo, 3, history, T, state_dtype, F32, device) for b in ("ref", "torch")}
    state0 = random_state(geo, 3, state_dtype, device, gen)
    prm = random_params(geo, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    flushes = 0
    for _ in range(8):
        inp = random_step(geo, 3, window=T, device=device, generator=gen)
        flushes += int(rings["ref"].is_flush.sum())
        ys = {b: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                             backend=b) for b, r in rings.items()}
        # fp16 checkpoints may round a few elements the other way (fp32 vs float64 fold): tolerance(fp16)
        assert rel_err(ys["torch"], ys["ref"]) <= tolerance(state_dtype)
        assert rel_err(rings["torch"].state, rings["ref"].state) <= tolerance(state_dtype)
        accepted = torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32).to(device)
        for b, r in rings.items():
            spec_commit(r, accepted, backend=b)
        assert torch.equal(rings["torch"].write_pos, rings["ref"].write_pos)
    assert flushes > 0 and not torch.equal(rings["torch"].state, state0)


def test_triton_one_step_tp_split_geometry(gen, device):
    """One non-flush and one flush step of the Triton kernels at Nemotron-3 Nano TP=8 (headdim 80, dstate 128)."""
    geo, T = get_geometry("nemotron3_nano_4b", tp=8), 4
    rings = {b: SpecRing.allocate(geo, 1, 4, T, device=device) for b in ("triton", "torch")}
    state0 = random_state(geo, 1, F32, device, gen)
    prm = random_params(geo, device, gen)
    for r in rings.values():
        r.state.copy_(state0)
    for _ in range(2):
        inp = random_step(geo, 1, window=T, device=device, generator=gen)
        ys = {b: spec_verify(r, inp["x"], inp["dt"], prm.A, inp["B"], inp["C"], prm.D, inp["z"], prm.dt_bias,
                             backend=b) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["torch"]) <= 1e-5
        assert rel_err(rings["triton"].state, rings["torch"].state) <= 1e-5
        for b, r in rings.items():
            spec_commit(r, torch.full((1,), T, dtype=torch.int32, device=device), backend=b)
        assert int(rings["triton"].is_flush[0]) == 1      # h = 4: 4 + 2T > 8, so step 2 folds the history
    assert not torch.equal(rings["triton"].state, state0)


@pytest.mark.parametrize("backend", ["ref", "torch", "triton"])
def test_commit_and_reset_cursor_rules(backend, device):
    """Hand-worked cursors: B=8, T=4 (L=12, ring 16); a flushed slot whose origin wraps; NULL rows skipped."""
    ring = SpecRing.allocate(SMALL, 4, 8, 4, device=device)
    ring.write_pos.copy_(torch.tensor([3, 7, 2, 5], dtype=torch.int32))
    ring.origin.copy_(torch.tensor([0, 12, 5, 9], dtype=torch.int32))
    ring.is_flush.copy_(torch.tensor([0, 1, 0, 1], dtype=torch.int32))
    slots = torch.tensor([1, NULL_SLOT, 0, 2], dtype=torch.int32, device=device)
    spec_commit(ring, torch.tensor([2, 0, 4, 1], dtype=torch.int32, device=device), slots=slots, backend=backend)
    # slot 1 flushed: origin (12 + 7) & 15 = 3, write_pos = 2, 2 + 8 > 12 -> flush 0;
    # slot 0: 3 + 4 = 7 -> 7 + 8 > 12 -> flush 1; slot 2: 2 + 1 = 3 -> flush 0; slot 3 untouched.
    assert ring.write_pos.tolist() == [7, 2, 3, 5]
    assert ring.origin.tolist() == [0, 3, 5, 9]
    assert ring.is_flush.tolist() == [1, 0, 0, 1]
    spec_reset(ring, torch.tensor([3, NULL_SLOT, 0], dtype=torch.int32, device=device), backend=backend)
    assert ring.write_pos.tolist() == [0, 2, 3, 0]
    assert ring.origin.tolist() == [0, 3, 5, 0]
    assert ring.is_flush.tolist() == [0, 0, 0, 0]


def test_history_shorter_than_window_rejected():
    with pytest.raises(ValueError, match="B >= T"):
        SpecRing.allocate(SMALL, 2, 2, 4)


def _bad_inputs(device, gen):
    """(name, backend, callable) triples that must raise ValueError before touching the ring."""
    T = 4
    ring = SpecRing.allocate(SMALL, 3, 8, T, device=device)
    inp = random_step(SMALL, 2, window=T, device=device, generator=gen)
    prm = random_params(SMALL, device, gen)
    x, dt, B, C, z = inp["x"], inp["dt"], inp["B"], inp["C"], inp["z"]
    short = random_step(SMALL, 2, window=T - 1, device=device, generator=gen)
    wide = Mamba2Geometry(4, 16, 512, 2)
    bf16_ring = SpecRing.allocate(SMALL, 2, 8, T, act_dtype=torch.bfloat16, device=device)
    wide_ring = SpecRing.allocate(wide, 1, 4, T, device=device)
    wide_inp = random_step(wide, 1, window=T, device=device, generator=gen)

    def verify(r=ring, backend="torch", **kw):
        args = dict(x=x, dt=dt, A=prm.A, B=B, C=C, D=prm.D, z=z, dt_bias=prm.dt_bias)
        args.update(kw)
        return lambda: spec_verify(r, backend=backend, **args)

    def commit(a, slots=None, backend="torch"):
        return lambda: spec_commit(ring, torch.tensor(a, dtype=torch.int32, device=device),
                                   slots=None if slots is None else torch.tensor(slots, dtype=torch.int32,
                                                                                  device=device), backend=backend)

    cases = [
        ("window length != T", verify(x=short["x"], dt=short["dt"], B=short["B"], C=short["C"], z=short["z"])),
        ("B wrong dstate", verify(B=B[..., :8])),
        ("dt wrong heads", verify(dt=dt[..., :2])),
        ("z wrong shape", verify(z=z[:1])),
        ("A wrong shape", verify(A=prm.A[:2])),
        ("x fp16 on an fp32 ring", verify(x=x.half())),
        ("C int dtype", verify(C=C.to(torch.int32))),
        ("out wrong dtype", verify(out=torch.empty(2, T, 4, 16, dtype=torch.float16, device=device))),
        ("x last dim strided", verify(x=x.transpose(2, 3).contiguous().transpose(2, 3))),
        ("slot out of range", verify(slots=torch.tensor([0, 3], dtype=torch.int32, device=device))),
        ("slot used twice", verify(slots=torch.tensor([1, 1], dtype=torch.int32, device=device))),
        ("unknown backend", verify(backend="cuda")),
        ("dstate > 256 on triton", lambda: spec_verify(wide_ring, wide_inp["x"], wide_inp["dt"], prm.A,
                                                        wide_inp["B"], wide_inp["C"], backend="triton")),
        ("num_accepted 0", commit([0, 2])),
        ("num_accepted > T", commit([1, T + 1], backend="triton")),
        ("num_accepted wrong shape", commit([[1, 2]])),
        ("commit slot out of range", commit([1, 2], slots=[0, 5])),
        ("reset slot out of range", lambda: spec_reset(ring, torch.tensor([3], dtype=torch.int32, device=device))),
        ("materialize A wrong shape", lambda: spec_materialize(ring, backend="torch", A=prm.A[:1])),
        ("materialize without A before any verify", lambda: spec_materialize(ring, backend="torch")),
    ]
    if interpreter_active():
        bx = {k: (v.bfloat16() if k != "dt" and v is not None else v) for k, v in inp.items()}
        cases.append(("bf16 under the interpreter", lambda: spec_verify(
            bf16_ring, bx["x"], bx["dt"], prm.A, bx["B"], bx["C"], backend="triton")))
    return ring, cases


def test_bad_input_raises_before_touching_the_ring(gen, device):
    ring, cases = _bad_inputs(device, gen)
    snapshot = ring.clone()
    for name, call in cases:
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"no ValueError for: {name}")
        for attr in ("state", "x", "B", "dt", "write_pos", "origin", "is_flush"):
            assert torch.equal(getattr(ring, attr), getattr(snapshot, attr)), f"{name} touched ring.{attr}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 activations need a GPU (interpreter bf16 is garbage)")
@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [F32, torch.bfloat16], ids=str)
def test_triton_bf16_matches_torch_on_gpu(state_dtype, gen):
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
                             backend=b) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["torch"]) <= tolerance(torch.bfloat16)
        accepted = torch.randint(1, T + 1, (8,), generator=gen, dtype=torch.int32).cuda()
        for b, r in rings.items():
            spec_commit(r, accepted, backend=b)
    tol = 1e-5 if state_dtype == F32 else tolerance(state_dtype)
    assert rel_err(rings["triton"].state, rings["torch"].state) <= tol
