"""replayssm.ring_cursors: the speculative ring's cursor protocol on all three backends, for both rings.

The protocol (module docstring): commit(a): if is_flush: origin = (origin + h) & (R - 1), h = a; else
h += a; then is_flush = h + 2T > L. reset: h = origin = 0, is_flush = 0. The hand-worked cases put every
rule on its own slot (non-flush rows, flush rows, an origin that wraps modulo ring_len, is_flush exactly at
h + 2T = L and at L + 1, a flush that flushes again), NULL_SLOT rows with counts that would be rejected on
a live row, and slots outside the batch that must not move. A random cross-check over more rows than one
Triton program covers compares the backends with the ref one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replayssm import ring_cursors
from replayssm.checks import NULL_SLOT
from replayssm.gdn.ring import SpecRing as GDNRing
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.mamba2.cache import SpecRing as Mamba2Ring

BACKENDS = ["ref", "torch", "triton"]
I32 = torch.int32


def _t(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=I32, device=device)


def _ring(family: str, num_slots: int, history: int, window: int, device):
    if family == "mamba2":
        return Mamba2Ring.allocate(Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1), num_slots, history,
                                   window, device=device)
    return GDNRing.allocate(GDNGeometry(H=1, HV=2, K=16, V=16), num_slots, history, window, device=device)


def _set(ring, write_pos, origin, is_flush) -> None:
    for name, values in (("write_pos", write_pos), ("origin", origin), ("is_flush", is_flush)):
        getattr(ring, name).copy_(torch.as_tensor(values, dtype=I32))


def _cursors(ring) -> tuple[list[int], list[int], list[int]]:
    return ring.write_pos.tolist(), ring.origin.tolist(), ring.is_flush.tolist()


# (family, B, T, initial write_pos / origin / is_flush, batch slots, accepted, expected cursors after commit)
COMMIT_CASES = {
    # L = 9, ring_len 16, 2T = 6.
    "mamba2": (6, 3, [2, 2, 5, 3, 4, 3], [0, 7, 14, 3, 9, 11], [0, 0, 1, 1, 0, 1],
               [0, 1, NULL_SLOT, 2, 3], [1, 2, 0, 3, 2],
               # slot 0: 2 + 1 = 3, 3 + 6 = 9 = L -> no flush; slot 1: 2 + 2 = 4, 10 = L + 1 -> flush;
               # slot 2 flushed: origin (14 + 5) & 15 = 3 (wraps), h = 3 -> 9 = L -> no flush;
               # slot 3 flushed: origin 3 + 3 = 6, h = 2; slots 4, 5 not in the batch; the NULL row's 0 is ignored.
               ([3, 4, 3, 2, 4, 3], [0, 7, 3, 6, 9, 11], [0, 1, 0, 0, 0, 1])),
    # L = 8 = ring_len, 2T = 6.
    "gdn": (5, 3, [1, 2, 5, 4, 0, 2], [6, 0, 5, 7, 1, 3], [0, 0, 1, 1, 0, 1],
            [3, NULL_SLOT, 0, 2, 1], [3, 7, 1, 2, 1],
            # slot 3 flushed: origin (7 + 4) & 7 = 3 (wraps), h = 3 -> 9 > 8 -> flushes again;
            # slot 0: 1 + 1 = 2 -> 8 = L -> no flush; slot 2 flushed: origin (5 + 5) & 7 = 2, h = 2 -> no flush;
            # slot 1: 2 + 1 = 3 -> 9 = L + 1 -> flush; slots 4, 5 not in the batch; the NULL row's 7 > T ignored.
            ([2, 3, 2, 3, 0, 2], [6, 0, 2, 3, 1, 3], [0, 1, 0, 1, 0, 1])),
}


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_commit_by_hand(family, backend, device):
    B, T, wp, origin, flush, slots, accepted, expected = COMMIT_CASES[family]
    ring = _ring(family, 6, B, T, device)
    assert ring.max_len == B + T and ring.ring_len == {"mamba2": 16, "gdn": 8}[family]
    _set(ring, wp, origin, flush)
    ring_cursors.commit(ring, _t(accepted, device), _t(slots, device), backend=backend)
    assert _cursors(ring) == expected


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_by_hand(family, backend, device):
    ring = _ring(family, 5, 4, 2, device)
    _set(ring, [3, 1, 4, 2, 0], [5, 2, 7, 1, 6], [1, 0, 1, 1, 0])
    ring_cursors.reset(ring, _t([NULL_SLOT, 3, 0], device), backend=backend)
    assert _cursors(ring) == ([0, 1, 4, 0, 0], [0, 2, 7, 0, 6], [0, 0, 1, 0, 0])
    ring_cursors.reset(ring, backend=backend)                      # default: every slot
    assert _cursors(ring) == ([0] * 5, [0] * 5, [0] * 5)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_all_null_rows_move_nothing(family, backend, device):
    ring = _ring(family, 3, 4, 2, device)
    _set(ring, [1, 4, 2], [3, 0, 7], [0, 1, 1])
    before = _cursors(ring)
    ring_cursors.commit(ring, _t([], device), _t([], device), backend=backend)
    ring_cursors.commit(ring, _t([0, 9], device), _t([NULL_SLOT, NULL_SLOT], device), backend=backend)
    ring_cursors.reset(ring, _t([NULL_SLOT], device), backend=backend)
    ring_cursors.reset(ring, _t([], device), backend=backend)
    assert _cursors(ring) == before


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_backends_agree_over_many_rows(family, gen, device):
    """1100 slots, a permuted batch of 1030 rows (past one program's 1024) with NULL rows, random cursors,
    several commits and a partial reset: torch and triton leave exactly the ref backend's cursors."""
    B, T, n, batch = 6, 3, 1100, 1030
    rings = {b: _ring(family, n, B, T, device) for b in BACKENDS}
    h = (torch.randperm(n, generator=gen) % (B + 1)).to(I32)      # every h in 0..B on ~157 slots, shuffled
    init = (h, torch.randint(0, rings["ref"].ring_len, (n,), generator=gen, dtype=I32),
            (h + 2 * T > B + T).to(I32))
    for r in rings.values():
        _set(r, *init)
    flushes = 0
    for _ in range(3):
        slots = torch.randperm(n, generator=gen)[:batch].to(I32)
        slots[torch.randperm(batch, generator=gen)[:40]] = NULL_SLOT
        accepted = torch.randint(1, T + 1, (batch,), generator=gen, dtype=I32)
        flushes += int(rings["ref"].is_flush[slots[slots != NULL_SLOT].long()].sum())
        for b, r in rings.items():
            ring_cursors.commit(r, accepted.to(device), slots.to(device), backend=b)
    assert flushes > 0        # forced: 471 slots start flagged (h >= 4), at most 110 + 40 rows miss the batch
    reset_slots = torch.randperm(n, generator=gen)[:300].to(I32)
    for b, r in rings.items():
        ring_cursors.reset(r, reset_slots.to(device), backend=b)
    for b in ("torch", "triton"):
        assert _cursors(rings[b]) == _cursors(rings["ref"]), b


def _bad_calls(ring, device):
    T = ring.window
    good = _t([1, T], device)
    return [
        ("count 0 on a live row", lambda: ring_cursors.commit(ring, _t([0, 1], device))),
        ("count > T on a live row",
         lambda: ring_cursors.commit(ring, _t([T + 1, 1], device), _t([1, NULL_SLOT], device))),
        ("count > T under triton", lambda: ring_cursors.commit(ring, _t([1, T + 1], device), backend="triton")),
        ("num_accepted 2-D", lambda: ring_cursors.commit(ring, _t([[1, 1]], device))),
        ("num_accepted float", lambda: ring_cursors.commit(ring, torch.ones(2, device=device))),
        ("num_accepted a list", lambda: ring_cursors.commit(ring, [1, 1])),
        ("slots length != batch", lambda: ring_cursors.commit(ring, good, _t([0], device))),
        ("slot out of range", lambda: ring_cursors.commit(ring, good, _t([0, 3], device))),
        ("slot used twice", lambda: ring_cursors.commit(ring, good, _t([1, 1], device))),
        ("batch > num_slots without slots", lambda: ring_cursors.commit(ring, _t([1, 1, 1, 1], device))),
        ("unknown backend", lambda: ring_cursors.commit(ring, good, backend="cuda")),
        ("reset slot out of range", lambda: ring_cursors.reset(ring, _t([3], device))),
        ("reset slots 2-D", lambda: ring_cursors.reset(ring, _t([[0, 1]], device))),
        ("reset slots float", lambda: ring_cursors.reset(ring, torch.zeros(1, device=device))),
        ("reset unknown backend", lambda: ring_cursors.reset(ring, backend="cuda")),
    ]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_bad_input_raises_before_moving_a_cursor(family, device):
    ring = _ring(family, 3, 4, 2, device)
    _set(ring, [1, 4, 2], [3, 0, 7], [0, 1, 1])
    before = _cursors(ring)
    for name, call in _bad_calls(ring, device):
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"no ValueError for: {name}")
        assert _cursors(ring) == before, name


def test_torch_and_ref_backends_do_not_import_triton():
    """The kernels are jitted on the first Triton-backend call: a Mamba-2 spec step on the torch backend
    runs where triton is absent or TRITON_INTERPRET is set after import."""
    code = (
        "import sys, torch\n"
        "from replayssm.mamba2 import SpecRing, spec_commit, spec_reset\n"
        "from replayssm.geometry import Mamba2Geometry\n"
        "ring = SpecRing.allocate(Mamba2Geometry(2, 16, 16, 1), 2, 4, 2)\n"
        "spec_reset(ring, backend='torch')\n"
        "spec_commit(ring, torch.tensor([2, 1], dtype=torch.int32), backend='torch')\n"
        "spec_commit(ring, torch.tensor([1, 1], dtype=torch.int32), backend='ref')\n"
        "assert ring.write_pos.tolist() == [3, 2] and ring.is_flush.tolist() == [1, 0], ring\n"
        "assert 'triton' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------ one cursor, every layer

def _layer_inputs(family, geo, batch, T, gen):
    """One layer's step (T None) or window inputs, as the family's public step functions take them."""
    if family == "gdn":
        from replayssm.gdn.inputs import random_step as gdn_step

        return dict(gdn_step(geo, batch, window=T, generator=gen))
    from replayssm.mamba2.inputs import random_params
    from replayssm.mamba2.inputs import random_step as m2_step

    p, x = random_params(geo, generator=gen), m2_step(geo, batch, window=T, generator=gen)
    return dict(x=x["x"], dt=x["dt"], A=p.A, B=x["B"], C=x["C"], D=p.D, z=x["z"], dt_bias=p.dt_bias)


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_shared_spec_cursor_equals_per_layer_cursors(family, backend, gen):
    """Two layers' rings on one SpecCursor, committed once per step, against the same two layers with their
    own cursors committed per layer: identical outputs, checkpoints, rings and cursors over early flushes."""
    from replayssm.geometry import GDNGeometry, Mamba2Geometry
    from replayssm.ring_cursors import SpecCursor

    if family == "gdn":
        from replayssm.gdn import spec as mod
        geo = GDNGeometry(H=1, HV=2, K=16, V=16)
    else:
        from replayssm.mamba2 import spec as mod
        geo = Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1)
    B, T, num_slots = 4, 2, 3
    cursor = SpecCursor.allocate(num_slots, B, T)
    shared = [mod.SpecRing.allocate(geo, num_slots, B, T, cursor=cursor) for _ in range(2)]
    own = [mod.SpecRing.allocate(geo, num_slots, B, T) for _ in range(2)]
    for a, b in zip(shared, own):
        a.state.normal_(generator=gen)
        b.state.copy_(a.state)
    assert shared[0].write_pos is shared[1].write_pos is cursor.write_pos
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    for step in range(6):
        inputs = [_layer_inputs(family, geo, 3, T, gen) for _ in range(2)]
        for layer in range(2):
            o_shared = mod.spec_verify(shared[layer], **inputs[layer], slots=slots, backend=backend)
            o_own = mod.spec_verify(own[layer], **inputs[layer], slots=slots, backend=backend)
            assert torch.equal(o_shared[[0, 2]], o_own[[0, 2]]), (step, layer)
        accepted = torch.tensor([T if step % 3 else 1, 0, T], dtype=torch.int32)
        cursor.commit(accepted, slots, backend=backend)
        for ring in own:
            mod.spec_commit(ring, accepted, slots=slots, backend=backend)
        for a, b in zip(shared, own):
            for name in ("state", "write_pos", "origin", "is_flush"):
                assert torch.equal(getattr(a, name), getattr(b, name)), (step, name)
    assert int(cursor.origin[2]) > 0, "no flush moved the origin"
    with pytest.raises(ValueError, match="shares a SpecCursor"):
        mod.spec_commit(shared[0], accepted, slots=slots, backend=backend)
    with pytest.raises(ValueError, match="shares a SpecCursor"):
        mod.spec_reset(shared[0], backend=backend)
    cursor.reset(backend=backend)
    assert not shared[1].write_pos.any() and not shared[0].origin.any()
    with pytest.raises(ValueError, match="shared cursor is for"):
        mod.SpecRing.allocate(geo, num_slots, B + 4, T, cursor=cursor)


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
@pytest.mark.parametrize("backend", ["triton", "torch", "ref"])
def test_shared_decode_cursor_equals_per_layer_cursors(family, backend, gen):
    """Two layers' AR caches on one DecodeCursor, advanced once per step, against the same two layers with their
    own cursors: identical outputs, checkpoints and cursors over a flush; the shared step launches no cursor
    kernel of its own (one advance launch per step, for every layer)."""
    from replayssm.geometry import GDNGeometry, Mamba2Geometry
    from replayssm.ring_cursors import DecodeCursor
    from replayssm.testing_traffic import TrafficCounter

    if family == "gdn":
        from replayssm.gdn import decode as mod
        from replayssm.gdn.cache import ReplayCache
        geo = GDNGeometry(H=1, HV=2, K=16, V=16)
    else:
        from replayssm.mamba2 import decode as mod
        from replayssm.mamba2.cache import ReplayCache
        geo = Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1)
    L, num_slots = 3, 3
    cursor = DecodeCursor.allocate(num_slots, L)
    shared = [ReplayCache.allocate(geo, num_slots, L, cursor=cursor) for _ in range(2)]
    own = [ReplayCache.allocate(geo, num_slots, L) for _ in range(2)]
    for a, b in zip(shared, own):
        a.state.normal_(generator=gen)
        b.state.copy_(a.state)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    for step in range(4):
        inputs = [_layer_inputs(family, geo, 3, None, gen) for _ in range(2)]
        with TrafficCounter() as counter:
            for layer in range(2):
                out_s = mod.replay_step(shared[layer], **inputs[layer], slots=slots, backend=backend)
                out_o = mod.replay_step(own[layer], **inputs[layer], slots=slots, backend=backend)
                assert torch.equal(out_s[[0, 2]], out_o[[0, 2]]), (step, layer)
            cursor.advance(slots, backend=backend)
        if backend == "triton":
            advances = [lch.kernel for lch in counter.launches if "advance" in lch.kernel]
            assert len(advances) == 3, advances        # one per own layer, one for the shared cursor
        for a, b in zip(shared, own):
            assert torch.equal(a.state, b.state) and torch.equal(a.write_pos, b.write_pos), step
    assert int(cursor.write_pos[2]) == 4 % L
    cursor.reset(torch.tensor([2], dtype=torch.int32), backend=backend)
    assert int(shared[1].write_pos[2]) == 0
    with pytest.raises(ValueError, match="shared cursor is for"):
        ReplayCache.allocate(geo, num_slots, L + 1, cursor=cursor)
