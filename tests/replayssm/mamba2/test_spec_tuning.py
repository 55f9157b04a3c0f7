"""The Mamba-2 spec tile space and its state-safe tuning mode, on the interpreter with a tiny space."""

from __future__ import annotations

import pytest
import torch

from replayssm import launch_table
from replayssm.checks import interpreter_active
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2 import spec_kernels as sk
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.spec import spec_reset
from replayssm.mamba2.spec_tuning import TOUCHED, best, tune_spec_tiles

GEO = Mamba2Geometry(nheads=2, headdim=32, dstate=32, ngroups=1)


def test_tile_space_and_table():
    space = sk.spec_tile_candidates(64, 4)
    assert space and all(c.block_n in sk.SPEC_TILE_BLOCK_N and c.verify_warps in sk.SPEC_TILE_WARPS for c in space)
    assert not any(sk.dropped_reason(c) for c in space)
    everything = sk.spec_tile_candidates(64, 4, include_dropped=True)
    assert len(everything) == len(space) + sum(1 for c in everything if sk.dropped_reason(c))
    assert len(everything) == 18 and len(space) == 11
    assert len({c.label for c in everything}) == len(everything)
    # the default rule where nothing is tuned; an override wins while it is active
    default = sk.launch_config(64, 128, 32, 90, window=4)
    assert (default.block_n, default.verify_warps) == (16, 4)
    with launch_table.override("mamba2_replay_spec", space[-1]):
        assert sk.launch_config(64, 128, 32, 90, window=4) == space[-1]
    assert sk.launch_config(64, 128, 32, 90, window=4) == default


@pytest.mark.skipif(not interpreter_active(), reason="runs the kernels in the interpreter")
def test_tuning_restores_the_ring_and_rejects_a_wrong_tile(gen, monkeypatch):
    """Two candidates (16- and 32-wide dstate chunks, a 32-row T padding), a ring with one flush row and one
    plain row: every trial is timed by a timer that runs verify three times (refolding the flush row), yet
    the ring ends bit-for-bit as it began. A candidate whose kernel computes something else is rejected."""
    T = 2
    ring = SpecRing.allocate(GEO, 3, 2, T)
    ring.state.copy_(random_state(GEO, 3, generator=gen))
    spec_reset(ring)
    ring.write_pos[:] = torch.tensor([0, 2, 1], dtype=torch.int32)
    ring.is_flush[:] = torch.tensor([0, 1, 0], dtype=torch.int32)
    ring.x.normal_(generator=gen)
    ring.B.normal_(generator=gen)
    ring.dt.uniform_(0.01, 0.1, generator=gen)
    p = random_params(GEO, generator=gen)
    x = random_step(GEO, 2, window=T, generator=gen)
    inputs = dict(x=x["x"], dt=x["dt"], A=p.A, B=x["B"], C=x["C"], D=p.D, z=x["z"], dt_bias=p.dt_bias)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    before = {name: getattr(ring, name).clone() for name in TOUCHED}
    good = [sk.SpecLaunchConfig(32, 16, 4, 4, 1), sk.SpecLaunchConfig(32, 32, 2, 2, 1, block_t=32)]
    calls = []

    def timer(fn):
        for _ in range(3):
            fn()
        calls.append(1)
        return float(len(calls))

    trials = tune_spec_tiles(ring, inputs, slots=slots, candidates=good, timer=timer)
    assert [t.error for t in trials] == ["", ""] and [t.ms for t in trials] == [1.0, 2.0]
    assert best(trials).config == good[0]
    for name, t in before.items():
        assert torch.equal(getattr(ring, name), t), f"{name} changed by tuning"

    from replayssm.mamba2 import spec

    real_verify = spec.spec_verify

    def wrong_under_bad_tiles(*args, **kwargs):         # a tile that computes something else
        out = real_verify(*args, **kwargs)
        return out.add_(1.0) if launch_table.active_override("mamba2_replay_spec") is good[1] else out

    monkeypatch.setattr(spec, "spec_verify", wrong_under_bad_tiles)
    bad = tune_spec_tiles(ring, inputs, slots=slots, candidates=[good[1]], timer=timer)
    assert bad[0].ms is None and bad[0].error
    with pytest.raises(ValueError, match="no tile candidate ran"):
        best(bad)
    for name, t in before.items():
        assert torch.equal(getattr(ring, name), t), f"{name} changed by a rejected trial"
