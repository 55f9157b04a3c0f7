"""State formats (replayssm/state_format.py) on the ReplaySSM speculative rings, all three families, chain and tree:
quantisation-aware equivalence over long runs (torch against the float64 oracle that applies the same quantisation
and random bits, tight; both against the unquantised float64 recurrence, format-keyed) under random accept /
rollback with desynchronised cursors, ring wrap and a null row; SR reproducibility, independence and restart on
slot reuse, unbiasedness of the flush fold (a round-to-nearest mutant is caught); the per-(slot, head) scale of
the scaled formats; the refusals of the Triton and C backends before any launch; and the spec baselines' state
(commit replay's frozen checkpoint, native's snapshots) in every format (baselines/spec_formats.py)."""

from __future__ import annotations

import pytest
import torch

import replayssm.state_format as sf
from baselines import (
    gdn_commit_replay,
    gdn_recurrent_spec,
    kda_commit_replay,
    kda_recurrent_spec,
    mamba2_commit_replay,
    mamba2_ssu,
)
from replayssm import gdn, kda, mamba2
from replayssm.checks import NULL_SLOT
from replayssm.gdn import inputs as gdn_inputs
from replayssm.gdn.ref import window_ref as gdn_window_ref
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry
from replayssm.kda import inputs as kda_inputs
from replayssm.kda.ref import window_ref as kda_window_ref
from replayssm.mamba2 import inputs as m2_inputs
from replayssm.mamba2.ref import window_ref as m2_window_ref
from replayssm.state_format import read_state, set_state
from replayssm.testing import nan_like, rel_err
from tests.replayssm.tree_cases import random_commit, random_tree

NEW = ["float16_sr", "bfloat16_sr", "int8", "float8_e4m3fn"]
ALL = ["float32", "float16", "bfloat16", *NEW]
# torch vs ref: the same quantisation and random bits; they differ only where fp32 and fp64 arithmetic land on
# opposite sides of a rounding boundary (a rare flip of one element at one flush), as in test_state_formats.py
TIGHT = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 4e-3, "float16_sr": 1e-3, "bfloat16_sr": 4e-3,
         "int8": 4e-3, "float8_e4m3fn": 1e-2}
# either against the unquantised float64 recurrence over a run of several flushes (the checkpoint rounded at each)
LOOSE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2, "float16_sr": 4e-3, "bfloat16_sr": 3e-2,
         "int8": 5e-2, "float8_e4m3fn": 0.15}
SLOTS = 4                               # slot 3 is never used by a row: it must never change
ROW_SLOTS = [2, NULL_SLOT, 0, 1]        # permuted rows and a padding row
LIVE = [r for r, s in enumerate(ROW_SLOTS) if s != NULL_SLOT]
B_HIST, T = 4, 2                        # L = 6, ring_len 8: a flush every 1-3 windows


class Family:
    """One family's ring, entry points, inputs and float64 serial window behind one interface."""

    def __init__(self, name: str, gen: torch.Generator):
        self.name, self.gen = name, gen
        if name == "mamba2":
            self.geom, self.mod = Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2), mamba2
            p = m2_inputs.random_params(self.geom, generator=gen)
            self.params = {"A": p.A, "D": p.D, "dt_bias": p.dt_bias}
        else:
            cls, self.mod = (GDNGeometry, gdn) if name == "gdn" else (KDAGeometry, kda)
            self.geom, self.params = cls(H=1, HV=2, K=16, V=8), {}

    def shape(self, n: int) -> tuple[int, ...]:
        g = self.geom
        return (n, g.nheads, g.headdim, g.dstate) if self.name == "mamba2" else (n, g.HV, g.V, g.K)

    def state(self, n: int) -> torch.Tensor:
        return torch.randn(*self.shape(n), generator=self.gen, dtype=torch.float64) * 0.3

    def ring(self, fmt, S0: torch.Tensor, num_slots: int = SLOTS, history: int = B_HIST, window: int = T,
             seed: int = 1234, origins: torch.Tensor | None = None):
        ring = self.mod.SpecRing.allocate(self.geom, num_slots, history, window, state_dtype=fmt, sr_seed=seed)
        set_state(ring, S0)
        if origins is not None:                       # an empty history may start at any row: windows wrap early
            ring.origin.copy_(origins)
        return ring

    def window(self, batch: int, n: int = T) -> dict:
        mod = {"mamba2": m2_inputs, "gdn": gdn_inputs, "kda": kda_inputs}[self.name]
        return mod.random_step(self.geom, batch, window=n, generator=self.gen)

    def out(self, batch: int, n: int = T) -> torch.Tensor:
        g = self.geom
        lead = (batch, n, g.nheads, g.headdim) if self.name == "mamba2" else (batch, n, g.HV, g.V)
        return nan_like(torch.empty(lead))

    def verify(self, ring, w, slots, backend, out=None, parents=None):
        fn = self.mod.spec_verify if parents is None else self.mod.tree_verify
        kw = {} if parents is None else {"parents": parents}
        if self.name == "mamba2":
            p = self.params
            return fn(ring, w["x"], w["dt"], p["A"], w["B"], w["C"], p["D"], w["z"], p["dt_bias"], slots=slots,
                      out=out, backend=backend, **kw)
        return fn(ring, **w, slots=slots, out=out, backend=backend, **kw)

    def materialize(self, ring, slots, backend) -> torch.Tensor:
        kw = {"A": self.params["A"]} if self.name == "mamba2" else {}
        return self.mod.spec_materialize(ring, slots, backend=backend, **kw).double()

    def serial(self, S: torch.Tensor, w: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(states [batch, n, ...], outputs [batch, n, ...]) of the float64 recurrence over window w from S."""
        if self.name == "mamba2":
            p = self.params
            return m2_window_ref(S, w["x"], w["dt"], p["A"], w["B"], w["C"], p["D"], w["z"], p["dt_bias"])
        return (gdn_window_ref if self.name == "gdn" else kda_window_ref)(S, **w)


FAMILIES = ["mamba2", "gdn", "kda"]


def _slots() -> torch.Tensor:
    return torch.tensor(ROW_SLOTS, dtype=torch.int32)


def _take(w: dict, b: int, nodes: list[int]) -> dict:
    """Row b's window inputs at `nodes` (a tree branch as a chain), batch 1."""
    idx = torch.tensor(nodes, dtype=torch.long)
    return {k: None if v is None else v[b: b + 1, idx] for k, v in w.items()}


def _assert_same_rings(ring_t, ring_r, fmt: str, what: str) -> None:
    """The stored checkpoints (dequantised), the SR counters and the scales of two rings agree."""
    got, want = read_state(ring_t, slice(None), torch.float64), read_state(ring_r, slice(None), torch.float64)
    assert rel_err(got, want) <= TIGHT[fmt], f"{what}: torch vs ref checkpoint"
    if ring_t.sr_step is not None:
        assert torch.equal(ring_t.sr_step, ring_r.sr_step), f"{what}: SR write counters"
    if ring_t.state_scale is not None:
        assert rel_err(ring_t.state_scale, ring_r.state_scale) <= TIGHT[fmt], f"{what}: scales"
    for name in ("write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring_t, name), getattr(ring_r, name)), f"{what}: {name}"


# ------------------------------------------------------------------------------------------ chain: long runs

@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("family", FAMILIES)
def test_long_chain_run_torch_matches_quantising_oracle_and_float64(family, fmt, gen):
    """14 windows with accepted counts drawn in 1..T per row (rollback of the rest), random origins, a null row
    and an idle slot: the outputs, the committed state after every commit and the checkpoints of torch and ref
    agree tightly (same rounding, same draws); both follow the float64 recurrence within the format's tolerance."""
    fam = Family(family, gen)
    S0 = fam.state(SLOTS)
    origins = torch.randint(0, 8, (SLOTS,), generator=gen, dtype=torch.int32)
    rings = {be: fam.ring(fmt, S0, origins=origins) for be in ("torch", "ref")}
    idle = {be: (r.state[3].clone(), None if r.state_scale is None else r.state_scale[3].clone())
            for be, r in rings.items()}
    slots, live_slots = _slots(), torch.tensor([ROW_SLOTS[r] for r in LIVE])
    truth = torch.zeros(len(ROW_SLOTS), *S0.shape[1:], dtype=torch.float64)
    truth[LIVE] = S0[live_slots]
    folds = wraps = 0
    for step in range(14):
        w = fam.window(len(ROW_SLOTS))
        r0 = rings["torch"]
        h = r0.write_pos[live_slots]
        folds += int(((r0.is_flush[live_slots] != 0) & (h > 0)).sum())
        wraps += int((r0.origin[live_slots] + h + T > r0.ring_len).sum())
        states, y_x = fam.serial(truth, w)
        y = {be: fam.verify(r, w, slots, be, out=fam.out(len(ROW_SLOTS))).double() for be, r in rings.items()}
        for be in y:
            assert y[be][1].isnan().all(), f"{be}: the null row's output was written"
        assert rel_err(y["torch"][LIVE], y["ref"][LIVE]) <= TIGHT[fmt], f"step {step}: torch vs ref output"
        assert rel_err(y["ref"][LIVE], y_x[LIVE]) <= LOOSE[fmt], f"step {step}: ref vs float64 output"
        accepted = torch.randint(1, T + 1, (len(ROW_SLOTS),), generator=gen, dtype=torch.int32)
        truth = states[torch.arange(len(ROW_SLOTS)), accepted.long() - 1]
        committed = {}
        for be, r in rings.items():
            fam.mod.spec_commit(r, accepted, slots=slots, backend=be)
            committed[be] = fam.materialize(r, slots, be)
            assert committed[be][1].isnan().all()
        assert rel_err(committed["torch"][LIVE], committed["ref"][LIVE]) <= TIGHT[fmt], f"step {step}: committed"
        assert rel_err(committed["ref"][LIVE], truth[LIVE]) <= LOOSE[fmt], f"step {step}: ref vs float64 state"
        assert rel_err(committed["torch"][LIVE], truth[LIVE]) <= LOOSE[fmt], f"step {step}: torch vs float64 state"
        _assert_same_rings(rings["torch"], rings["ref"], fmt, f"step {step}")
    assert folds >= 6 and wraps >= 2, (folds, wraps)       # the run crossed flushes and the ring's end
    for be, r in rings.items():
        assert torch.equal(r.state[3].view(torch.uint8), idle[be][0].view(torch.uint8)), f"{be}: idle slot"
        if r.state_scale is not None:
            assert torch.equal(r.state_scale[3], idle[be][1])
        if r.sr_step is not None:                           # set_state, then one write per fold with history
            assert r.sr_step[3] == 1 and int(r.sr_step.sum()) == SLOTS + folds


# ------------------------------------------------------------------------------------------ trees

@pytest.mark.parametrize("fmt", ["float16", "float16_sr", "bfloat16_sr", "int8", "float8_e4m3fn"])
@pytest.mark.parametrize("family", FAMILIES)
def test_tree_run_torch_matches_quantising_oracle_and_float64(family, fmt, gen):
    """Random draft trees of 4 nodes per row, a random accepted branch prefix committed, several flushes: torch
    (ancestor-masked algebra) and ref (the float64 path recurrence) agree tightly, outputs along each branch and
    the committed state follow the float64 recurrence of the branch within the format's tolerance."""
    N, hist = 4, 6
    fam = Family(family, gen)
    S0 = fam.state(SLOTS)
    rings = {be: fam.ring(fmt, S0, history=hist, window=N) for be in ("torch", "ref")}
    slots, live_slots = _slots(), torch.tensor([ROW_SLOTS[r] for r in LIVE])
    truth = torch.zeros(len(ROW_SLOTS), *S0.shape[1:], dtype=torch.float64)
    truth[LIVE] = S0[live_slots]
    folds = 0
    for step in range(8):
        trees = [random_tree(N, gen) for _ in ROW_SLOTS]
        parents = torch.tensor(trees, dtype=torch.int32)
        path, accepted = random_commit(trees, N, gen)
        w = fam.window(len(ROW_SLOTS), N)
        r0 = rings["torch"]
        folds += int(((r0.is_flush[live_slots] != 0) & (r0.write_pos[live_slots] > 0)).sum())
        y = {be: fam.verify(r, w, slots, be, out=fam.out(len(ROW_SLOTS), N), parents=parents).double()
             for be, r in rings.items()}
        assert y["torch"][1].isnan().all() and y["ref"][1].isnan().all()
        assert rel_err(y["torch"][LIVE], y["ref"][LIVE]) <= TIGHT[fmt], f"step {step}: torch vs ref tree output"
        for b in LIVE:
            branch = [int(s) for s in path[b] if s >= 0]
            states, y_x = fam.serial(truth[b: b + 1], _take(w, b, branch))
            assert rel_err(y["ref"][b, branch], y_x[0]) <= LOOSE[fmt], f"step {step} row {b}: branch outputs"
            truth[b] = states[0, int(accepted[b]) - 1]
        for be, r in rings.items():
            fam.mod.tree_commit(r, path, accepted, slots=slots, backend=be)
        committed = {be: fam.materialize(r, slots, be) for be, r in rings.items()}
        assert rel_err(committed["torch"][LIVE], committed["ref"][LIVE]) <= TIGHT[fmt]
        assert rel_err(committed["ref"][LIVE], truth[LIVE]) <= LOOSE[fmt], f"step {step}: committed vs float64"
        _assert_same_rings(rings["torch"], rings["ref"], fmt, f"tree step {step}")
    assert folds >= 3, folds


# ------------------------------------------------------------------------------------------ stochastic rounding

def _run(fam: Family, ring, windows: list[dict], counts: list[torch.Tensor], slots, backend="torch") -> None:
    for w, a in zip(windows, counts):
        fam.verify(ring, w, slots, backend)
        fam.mod.spec_commit(ring, a, slots=slots, backend=backend)


def _schedule(fam: Family, batch: int, steps: int, gen) -> tuple[list[dict], list[torch.Tensor]]:
    return ([fam.window(batch) for _ in range(steps)],
            [torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32) for _ in range(steps)])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sr_rings_are_reproducible_per_seed_and_slots_draw_independently(family, fmt, gen):
    """Same seed and schedule: bit-identical rings, on torch and on ref; another seed: other bits. Two slots
    holding the same state and fed the same windows round their folds differently (the slot is in the counter)."""
    fam = Family(family, gen)
    S0 = fam.state(1).expand(2, *fam.shape(1)[1:])
    windows = [{k: None if v is None else v[:1].expand(2, *v.shape[1:]).contiguous() for k, v in w.items()}
               for w in _schedule(fam, 2, 8, gen)[0]]
    counts = [torch.full((2,), T, dtype=torch.int32)] * 8             # both rows accept alike: a fold every 2nd
    slots = torch.tensor([0, 1], dtype=torch.int32)
    runs = {}
    for key, seed, backend in (("a", 11, "torch"), ("b", 11, "torch"), ("c", 12, "torch"), ("r", 11, "ref")):
        ring = fam.ring(fmt, S0, num_slots=2, seed=seed)
        _run(fam, ring, windows, counts, slots, backend)
        runs[key] = ring
    a, b, c, r = runs["a"], runs["b"], runs["c"], runs["r"]
    assert a.sr_step.tolist() == [4, 4], "set_state + 3 folds"
    assert torch.equal(_bits(a.state), _bits(b.state)) and torch.equal(a.sr_step, b.sr_step)
    assert not torch.equal(_bits(a.state), _bits(c.state))
    assert torch.equal(a.sr_step, r.sr_step) and rel_err(read_state(a, slice(None)), read_state(r, slice(None))) \
        <= TIGHT[fmt]
    assert not torch.equal(_bits(a.state[0]), _bits(a.state[1]))          # same values, independent draws
    assert rel_err(read_state(a, 0), read_state(a, 1)) <= LOOSE[fmt]


@pytest.mark.parametrize("fmt", ["float16_sr", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_slot_reuse_restarts_draws_and_scale(family, fmt, gen):
    """A new request in a reused slot (set_state, then spec_reset) rounds exactly as in a fresh ring: the SR
    counter restarts and the scale is rewritten, so nothing of the previous request survives. The mutant (the
    counter left where the previous request put it) draws other bits."""
    fam = Family(family, gen)
    S_a, S_b = fam.state(1) * 50, fam.state(1)
    sched_a = _schedule(fam, 1, 5, gen)
    sched_b = (_schedule(fam, 1, 6, gen)[0], [torch.full((1,), T, dtype=torch.int32)] * 6)   # folds at 3 and 5
    slot = torch.tensor([1], dtype=torch.int32)

    def request_b(ring, bump: int = 0) -> torch.Tensor:
        set_state(ring, S_b, slot)
        if bump:
            ring.sr_step[1] += bump
        fam.mod.spec_reset(ring, slot, backend="torch")
        _run(fam, ring, *sched_b, slot)
        return ring.state[1].clone()

    used = fam.ring(fmt, fam.state(2), num_slots=2, seed=7)
    set_state(used, S_a, slot)
    _run(fam, used, *sched_a, slot)
    fresh = fam.ring(fmt, fam.state(2), num_slots=2, seed=7)
    want = request_b(fresh)
    got = request_b(used)
    assert torch.equal(_bits(got), _bits(want))
    if used.state_scale is not None:
        assert torch.equal(used.state_scale[1], fresh.state_scale[1])
    else:
        assert used.sr_step[1] == fresh.sr_step[1] == 3                   # set_state + 2 folds
        mutant = request_b(fam.ring(fmt, fam.state(2), num_slots=2, seed=7), bump=3)
        assert not torch.equal(_bits(mutant), _bits(want))


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mbits, emin = (10, -14) if dtype == torch.float16 else (7, -126)
    e = torch.floor(torch.log2(x.abs())).clamp_min(emin)
    return torch.pow(2.0, e - mbits)


@pytest.mark.parametrize("fmt", ["float16_sr", "bfloat16_sr"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sr_flush_fold_is_unbiased_and_a_nearest_mutant_is_caught(family, fmt, gen, monkeypatch):
    """N slots hold one (representable) state and see the same two windows: the first is committed whole (h = T,
    so the next verify flushes), the second folds it into the checkpoint. Each slot draws its own bits, so the
    mean of the N folded checkpoints converges to the float64 fold within 0.5 ulp / sqrt(N); round-to-nearest
    (the mutant: state_format._sr_round) sits a quarter ulp off on average."""
    fam, N = Family(family, gen), 256
    dtype = sf.FORMATS[fmt].storage
    S0 = fam.state(1).to(dtype).double()
    w1, w2 = fam.window(1), fam.window(1)
    want = fam.serial(S0, w1)[0][0, T - 1]                           # the committed state the flush stores
    nz = want != 0
    wide = [{k: None if v is None else v.expand(N, *v.shape[1:]).contiguous() for k, v in w.items()} for w in (w1, w2)]
    full = torch.full((N,), T, dtype=torch.int32)

    def mean_err_in_ulps() -> float:
        ring = fam.ring(fmt, S0.expand(N, *S0.shape[1:]), num_slots=N, history=T, seed=99)   # L = 2T
        fam.verify(ring, wide[0], None, "torch")
        fam.mod.spec_commit(ring, full, backend="torch")
        assert bool((ring.is_flush != 0).all())
        fam.verify(ring, wide[1], None, "torch")
        assert ring.sr_step.tolist() == [2] * N                      # set_state + the fold
        mean = read_state(ring, slice(None), torch.float64).mean(0)
        return float(((mean - want).abs() / _ulp(want, dtype))[nz].mean())

    assert mean_err_in_ulps() < 0.08
    monkeypatch.setattr(sf, "_sr_round", lambda x, seed, ids, step, dtype: x.float().to(dtype))
    assert mean_err_in_ulps() > 0.15


# ------------------------------------------------------------------------------------------ scaled formats

@pytest.mark.parametrize("fmt", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", ["torch", "ref"])
def test_flush_scale_is_the_stored_heads_absmax(family, fmt, backend, gen):
    """At every fold the checkpoint of each (slot, head) gets scale = absmax(S_h) / qmax of that head's folded
    state (S_h: the committed state just before the verify), its largest stored magnitude is qmax, and it
    dequantises to S_h within the format's rounding; heads of different magnitude keep their own scale."""
    fam = Family(family, gen)
    f = sf.FORMATS[fmt]
    S0 = fam.state(SLOTS) * torch.logspace(-2, 2, fam.shape(1)[1], dtype=torch.float64)[None, :, None, None]
    ring = fam.ring(fmt, S0)
    slots = _slots()
    checked = 0
    for _ in range(10):
        live_slots = slots[slots != NULL_SLOT].long()
        fold = live_slots[(ring.is_flush[live_slots] != 0) & (ring.write_pos[live_slots] > 0)]
        S_h = fam.materialize(ring, fold.to(torch.int32), backend)                 # [n, heads, a, b]
        fam.verify(ring, fam.window(len(ROW_SLOTS)), slots, backend)
        if fold.numel():
            absmax = S_h.abs().amax((-2, -1))
            assert torch.allclose(ring.state_scale[fold].double(), absmax / f.qmax, rtol=1e-5)
            q = ring.state[fold].double().abs().amax((-2, -1))
            assert (q == f.qmax).all()
            back = read_state(ring, fold, torch.float64)
            step = ring.state_scale[fold].double()[..., None, None]
            bound = step / 2 if fmt == "int8" else absmax[..., None, None] / 16      # half a step / e4m3's 2^-4
            assert ((back - S_h).abs() <= bound * (1 + 1e-4) + 1e-7).all()
            checked += fold.numel()
        fam.mod.spec_commit(ring, torch.randint(1, T + 1, (len(ROW_SLOTS),), generator=gen, dtype=torch.int32),
                            slots=slots, backend=backend)
    assert checked >= 6


# ------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("fmt", NEW)
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_and_cpu_refuse_non_plain_rings_before_any_work(family, fmt, gen):
    fam = Family(family, gen)
    ring = fam.ring(fmt, fam.state(SLOTS), history=6, window=4)
    ring.is_flush.fill_(1)
    ring.write_pos.fill_(2)
    before = ring.clone()
    w = fam.window(2, 4)
    parents = torch.tensor([-1, 0, 0, 1], dtype=torch.int32)
    for backend in ("triton", "cpu"):
        if sf.FORMATS[fmt].stochastic:       # a backend writing the SR formats in other (AR) kernels names them
            match = f"backend='{backend}' has no kernel writing state format '{fmt}' in {family}.replay_spec.*" \
                    "float32, float16, bfloat16.*'torch' and 'ref'"
            tree_match = f"'{fmt}' in {family}.replay_tree"
        else:
            match = tree_match = f"backend='{backend}' has no kernels for state format '{fmt}'.*float32, float16, " \
                                 "bfloat16.*'torch' and 'ref' only"
        with pytest.raises(ValueError, match=match):
            fam.verify(ring, w, None, backend)
        with pytest.raises(ValueError, match=tree_match):
            fam.verify(ring, w, None, backend, parents=parents)
        with pytest.raises(ValueError, match=f"'{fmt}'"):
            fam.materialize(ring, None, backend)
        if family == "mamba2" and backend == "triton":
            with pytest.raises(ValueError, match=r"replay_spec\[verify_fold\]" if sf.FORMATS[fmt].stochastic
                               else "no kernels"):
                p = fam.params
                mamba2.spec_verify(ring, w["x"], w["dt"], p["A"], w["B"], w["C"], backend="triton",
                                   route="verify_fold")
    for name, t in ring.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name


@pytest.mark.parametrize("family", FAMILIES)
def test_triton_spec_materialize_reads_a_plain_ring(family, gen):
    """The plain formats keep their Triton path: a ring verified on torch (fp16 checkpoint, folds) materialises on
    Triton as on torch."""
    fam = Family(family, gen)
    ring = fam.ring("float16", fam.state(SLOTS), origins=torch.randint(0, 8, (SLOTS,), generator=gen,
                                                                      dtype=torch.int32))
    _run(fam, ring, *_schedule(fam, len(ROW_SLOTS), 4, gen), _slots())
    slots = _slots()
    got, want = fam.materialize(ring, slots, "triton"), fam.materialize(ring, slots, "torch")
    assert rel_err(got[LIVE], want[LIVE]) <= 1e-5 and got[1].isnan().all()


# ------------------------------------------------------------------------------------------ baselines

class Baseline:
    """A spec baseline of one family: commit replay (a frozen checkpoint, rounded once per commit) or native (T
    snapshots per slot, rounded once per verify), behind the ring's interface."""

    def __init__(self, fam: Family, kind: str):
        self.fam, self.kind = fam, kind
        self.mod = {("mamba2", "commit_replay"): mamba2_commit_replay, ("gdn", "commit_replay"): gdn_commit_replay,
                    ("kda", "commit_replay"): kda_commit_replay, ("mamba2", "native"): mamba2_ssu,
                    ("gdn", "native"): gdn_recurrent_spec, ("kda", "native"): kda_recurrent_spec}[fam.name, kind]

    def allocate(self, fmt, S0: torch.Tensor, seed: int = 77):
        n = S0.shape[0]
        if self.kind == "commit_replay":
            cache = self.mod.CommitReplayCache.allocate(self.fam.geom, n, T, state_dtype=fmt, sr_seed=seed)
            set_state(cache, S0)
        else:
            cache = self.mod.SpecStates.allocate(self.fam.geom, n, T, state_dtype=fmt, sr_seed=seed)
            set_state(cache, S0[:, None].expand(n, T, *S0.shape[1:]))   # every snapshot; last = 0
        return cache

    def committed(self, cache, live_slots: torch.Tensor) -> torch.Tensor:
        if self.kind == "commit_replay":
            return read_state(cache, live_slots, torch.float64)
        return cache.committed()[live_slots].double()

    def verify(self, cache, w, slots, backend, out=None):
        if self.fam.name == "mamba2":
            p = self.fam.params
            return self.mod.spec_verify(cache, w["x"], w["dt"], p["A"], w["B"], w["C"], p["D"], w["z"], p["dt_bias"],
                                        slots=slots, out=out, backend=backend)
        return self.mod.spec_verify(cache, **w, slots=slots, out=out, backend=backend)

    def commit(self, cache, accepted, slots, backend):
        A = (self.fam.params["A"],) if self.fam.name == "mamba2" and self.kind == "commit_replay" else ()
        self.mod.spec_commit(cache, accepted, *A, slots=slots, backend=backend)


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("kind", ["commit_replay", "native"])
@pytest.mark.parametrize("family", FAMILIES)
def test_spec_baselines_torch_match_quantising_oracle_and_float64(family, kind, fmt, gen):
    """The baselines' speculative state in every format (baselines/spec_formats.py): verify reads it dequantised,
    commit replay rounds its checkpoint once per commit, native its T snapshots once per verify; torch and ref
    agree tightly (same rounding, same draws), both follow the float64 recurrence within the format's tolerance."""
    fam = Family(family, gen)
    base = Baseline(fam, kind)
    S0 = fam.state(SLOTS)
    caches = {be: base.allocate(fmt, S0) for be in ("torch", "ref")}
    slots, live_slots = _slots(), torch.tensor([ROW_SLOTS[r] for r in LIVE])
    truth = torch.zeros(len(ROW_SLOTS), *S0.shape[1:], dtype=torch.float64)
    truth[LIVE] = S0[live_slots]
    for step in range(8):
        w = fam.window(len(ROW_SLOTS))
        states, y_x = fam.serial(truth, w)
        y = {be: base.verify(c, w, slots, be, out=fam.out(len(ROW_SLOTS))).double() for be, c in caches.items()}
        assert y["torch"][1].isnan().all() and y["ref"][1].isnan().all()
        assert rel_err(y["torch"][LIVE], y["ref"][LIVE]) <= TIGHT[fmt], f"step {step}: torch vs ref output"
        assert rel_err(y["ref"][LIVE], y_x[LIVE]) <= LOOSE[fmt], f"step {step}: ref vs float64 output"
        accepted = torch.randint(1, T + 1, (len(ROW_SLOTS),), generator=gen, dtype=torch.int32)
        truth = states[torch.arange(len(ROW_SLOTS)), accepted.long() - 1]
        for be, c in caches.items():
            base.commit(c, accepted, slots, be)
        got = {be: base.committed(c, live_slots) for be, c in caches.items()}
        assert rel_err(got["torch"], got["ref"]) <= TIGHT[fmt], f"step {step}: torch vs ref committed state"
        assert rel_err(got["ref"], truth[LIVE]) <= LOOSE[fmt], f"step {step}: ref vs float64 committed state"
    t, r = caches["torch"], caches["ref"]
    if t.sr_step is not None:                       # set_state + one write per commit / verify; slot 3 idle
        assert torch.equal(t.sr_step, r.sr_step) and t.sr_step.tolist() == [9, 9, 9, 1]
    if t.state_scale is not None:
        assert rel_err(t.state_scale, r.state_scale) <= TIGHT[fmt]
        assert t.state_scale.shape == t.state.shape[:-2]                 # per (slot, [snapshot,] head)


@pytest.mark.parametrize("fmt", ["bfloat16_sr", "float8_e4m3fn"])
@pytest.mark.parametrize("kind", ["commit_replay", "native"])
@pytest.mark.parametrize("family", FAMILIES)
def test_spec_baselines_refuse_non_plain_on_triton_and_cpu(family, kind, fmt, gen):
    fam = Family(family, gen)
    base = Baseline(fam, kind)
    cache = base.allocate(fmt, fam.state(2))
    before = cache.clone()
    for backend in ("triton", "cpu"):
        with pytest.raises(ValueError, match=f"'{fmt}'.*float32, float16, bfloat16.*'torch' and 'ref'"):
            base.verify(cache, fam.window(2), None, backend)
        if kind == "commit_replay":                 # native: the commit moves a cursor only (any format)
            with pytest.raises(ValueError, match=f"'{fmt}'.*'torch' and 'ref'"):
                base.commit(cache, torch.ones(2, dtype=torch.int32), None, backend)
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name]), name


# ------------------------------------------------------------------------------------------ allocation

@pytest.mark.parametrize("family", FAMILIES)
def test_ring_allocation_carries_the_format(family, gen):
    fam = Family(family, gen)
    heads = fam.shape(1)[1]
    ring = fam.mod.SpecRing.allocate(fam.geom, 3, 4, 2, state_dtype="bfloat16_sr", sr_seed=9)
    assert ring.state.dtype == torch.bfloat16 and ring.sr_step.tolist() == [0, 0, 0] and ring.sr_seed == 9
    assert sf.format_of(ring).name == "bfloat16_sr" and ring.state_scale is None
    ring = fam.mod.SpecRing.allocate(fam.geom, 3, 4, 2, state_dtype=torch.int8)
    assert sf.format_of(ring).name == "int8" and ring.state_scale.shape == (3, heads) and ring.sr_step is None
    plain = fam.mod.SpecRing.allocate(fam.geom, 3, 4, 2, state_dtype=torch.float16)
    assert sf.format_of(plain).name == "float16" and plain.state_scale is None and plain.sr_step is None
    assert ring.nbytes() == plain.nbytes() - ring.state.numel() + 3 * heads * 4     # int8 state + fp32 scales
    assert torch.equal(ring.clone().state_scale, ring.state_scale)
    with pytest.raises(ValueError, match="names no state format"):
        fam.mod.SpecRing.allocate(fam.geom, 3, 4, 2, state_dtype="float12")
    with pytest.raises(ValueError, match="sr_seed"):
        fam.mod.SpecRing.allocate(fam.geom, 3, 4, 2, state_dtype="float16_sr", sr_seed=2**32)
