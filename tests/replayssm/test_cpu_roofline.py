"""replayssm/cpu/roofline.py: the floor of a step from measured rates (what `make bench-cpu` prints as
roof ms / %roof). Rates are machine facts and never a pass criterion: only the model's arithmetic and the
probe's plumbing are checked."""

from __future__ import annotations

import pytest

from replayssm import traffic
from replayssm.cpu.roofline import measure, step_seconds
from replayssm.geometry import Mamba2Geometry
from replayssm.traffic import Traffic

RATES = {"read_GBps": 20.0, "update_GBps": 30.0, "flop_GFLOPs": 100.0}


def test_read_only_write_back_and_flops_bound():
    # 1 GB read only: 1 / 20 s
    assert step_seconds(Traffic(1e9, 0, 0), RATES) == pytest.approx(1 / 20)
    # 1 GB read and written back in place: 2 GB at the update rate
    assert step_seconds(Traffic(1e9, 1e9, 0), RATES) == pytest.approx(2 / 30)
    # writes beyond the reads (native spec snapshots) also pay the update rate: 1 GB read, 3 GB written
    assert step_seconds(Traffic(1e9, 3e9, 0), RATES) == pytest.approx(6 / 30)
    # compute-bound: 10 GFLOP against 1 GB read
    assert step_seconds(Traffic(1e9, 0, 1e10), RATES) == pytest.approx(0.1)


def test_flush_is_compute_bound_where_a_readout_is_not():
    """At the Super geometry a J = 16 flush does 36 FLOPs per state element: a CPU with 100 GFLOP/s and
    30 GB/s in-place floors it at its FLOPs, while the output-only readout floors at the read rate."""
    g = Mamba2Geometry(nheads=128, headdim=64, dstate=128, ngroups=8)
    flush = traffic.mamba2_replay_ar(g, 16, 15, "output_only", 4, 4)
    readout = traffic.mamba2_replay_ar(g, 16, 3, "output_only", 4, 4)
    assert step_seconds(flush, RATES) == pytest.approx(flush.flops / 1e11)
    assert step_seconds(readout, RATES) == pytest.approx((readout.read - readout.write) / 2e10
                                                         + 2 * readout.write / 3e10)


def test_probe_returns_positive_rates():
    r = measure(1, nbytes=1 << 20, reps=1)
    assert r["threads"] == 1 and r["bytes"] == 1 << 20
    assert all(r[k] > 0 for k in ("read_GBps", "update_GBps", "flop_GFLOPs"))
