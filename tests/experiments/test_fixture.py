"""The point fixture (experiments/harness/fixture.py): a pool larger than the batch and per-row cursor layouts
reached through the methods' own steps, checked by the gate against the float64 oracle, and the sweep axes
that ask for them (sweep.cursors, sweep.pool_factor)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from harness_doubles import compose

from experiments.harness.check import gate
from experiments.harness.fixture import PointFixture, cursor_targets, parse_cursors
from experiments.harness.methods import REGISTRY
from experiments.harness.points import expand
from experiments.harness.serving_shape import cursor_period
from experiments.harness.workload import Workload
from experiments.kernel.run import run_experiment, summarize

GATE = dict(max_batch=8, ar_steps=3)


def _point(tmp_path, method: str, model: str, extra=()):
    exp = "kernel_spec" if method.endswith("_spec") else "kernel_decode"
    plan = expand(compose(tmp_path, exp, [f"sweep.models=[{model}]", "sweep.batch=[8]", "sweep.backend=torch",
                                          "sweep.buffer_len=[6]", "sweep.history_len=[8]", *extra]))
    p = next(p for p in plan.points if p.method == method)
    return plan, p


def test_layouts_and_targets():
    assert parse_cursors("aligned") == "aligned" and parse_cursors(3) == "h=3" and parse_cursors("h=0") == "h=0"
    for bad in ("h=-1", "skewed", -2, True, 1.5):
        with pytest.raises(ValueError, match="sweep.cursors"):
            parse_cursors(bad)
    assert cursor_targets("aligned", 4, 16) == [0, 0, 0, 0]
    assert cursor_targets("staggered", 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]       # every position, evenly
    assert sorted(set(cursor_targets("staggered", 32, 16))) == list(range(16))
    assert cursor_targets("h=5", 3, 16) == [5, 5, 5]
    assert cursor_targets("staggered", 4, None) == [0] * 4                   # no cursor: nothing to prime
    with pytest.raises(ValueError, match="period 4"):
        cursor_targets("h=4", 2, 4)


@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn", "tiny_kda"])
def test_staggered_ar_rows_sit_at_their_positions_in_a_sparse_pool(tmp_path, model, gen):
    plan, p = _point(tmp_path, "replay_ar", model, ["sweep.cursors=[staggered]", "sweep.pool_factor=[4]"])
    assert p.cursors == "staggered" and p.pool_slots == 32
    m = REGISTRY[p.method]
    fx = PointFixture.build(m, m.api(p.family), Workload(plan.models[p.model_key], p, "cpu", gen), p)
    assert fx.num_slots == 32 and fx.slots is not None and len(set(fx.slots.tolist())) == 8
    write_pos = m.flush_cursor(fx.caches[0])
    want = torch.tensor(cursor_targets("staggered", 8, p.buffer_len), dtype=write_pos.dtype)
    assert torch.equal(write_pos[fx.slots.long()].cpu(), want)                # row r at position target[r]
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[fx.slots.long()] = False
    assert int(write_pos[untouched].abs().sum()) == 0                         # slots outside the batch stay


@pytest.mark.parametrize("method", ["replay_ar", "baseline_ar", "replay_spec", "commit_replay_spec"])
@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn", "tiny_kda"])
def test_gate_passes_a_staggered_batch_in_a_sparse_pool(tmp_path, method, model, gen):
    plan, p = _point(tmp_path, method, model, ["sweep.cursors=[staggered]", "sweep.pool_factor=[3]",
                                               "sweep.slot_layout=permuted"])
    wl = Workload(plan.models[p.model_key], p, "cpu", gen)
    m = REGISTRY[p.method]
    acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
    result = gate(m, m.api(p.family), wl, p, acceptance=acc, **GATE)
    assert result.ok, result.message()


@pytest.mark.parametrize("mutant", ["one_row_ahead", "oracle_not_told"])
@pytest.mark.parametrize("method", ["replay_ar", "replay_spec"])
def test_gate_sees_each_rows_cursor(tmp_path, gen, monkeypatch, method, mutant):
    """The oracle follows the primed steps row by row: a fixture that steps one row further than it tells the
    oracle, or primes the cache without telling the oracle at all, fails the gate."""
    plan, p = _point(tmp_path, method, "tiny_gdn", ["sweep.cursors=[staggered]"])
    m = REGISTRY[p.method]
    real = PointFixture.prime

    def primed_wrong(self, cache, targets, track=False):
        real(self, cache, targets, track and mutant != "oracle_not_told")
        if mutant == "one_row_ahead":                    # row 3 takes one more step, untracked
            real(self, cache, [int(r == 3) for r in range(self.rows)], False)

    monkeypatch.setattr(PointFixture, "prime", primed_wrong)
    acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
    result = gate(m, m.api(p.family), Workload(plan.models[p.model_key], p, "cpu", gen), p, acceptance=acc, **GATE)
    assert not result.ok, result.message()


def test_sweep_axes_expand_and_keep_old_hashes(tmp_path):
    base = expand(compose(tmp_path, "kernel_decode"))
    both = expand(compose(tmp_path, "kernel_decode", ["sweep.cursors=[aligned,staggered,2]",
                                                      "sweep.pool_factor=[1,4]"]))
    count = lambda plan, name: sum(p.method == name for p in plan.points)
    assert count(both, "replay_ar") == 3 * 2 * count(base, "replay_ar")     # every layout x every pool
    assert count(both, "baseline_ar") == 2 * count(base, "baseline_ar")     # no cursor: once per pool
    assert {p.cursors for p in both.points if p.method == "baseline_ar"} == {None}
    assert {p.cursors for p in both.points if p.method == "replay_ar"} == {"aligned", "staggered", "h=2"}
    # a point at the defaults hashes as it did before the axes existed: old runs still resume and pair
    p = next(p for p in base.points if p.method == "replay_ar")
    assert p.cursors == "aligned" and p.num_slots == p.batch
    assert p.config_hash() == replace(p, cursors=None, num_slots=0).config_hash()
    assert replace(p, cursors="staggered").config_hash() != p.config_hash()
    assert replace(p, num_slots=4 * p.batch).config_hash() != p.config_hash()
    with pytest.raises(ValueError, match="past the cursor's cycle"):
        expand(compose(tmp_path, "kernel_decode", ["sweep.cursors=[3]"]))     # L = 3: positions 0..2
    with pytest.raises(ValueError, match="sweep.pool_factor"):
        expand(compose(tmp_path, "kernel_decode", ["sweep.pool_factor=[0]"]))


def test_cursor_period_per_method(tmp_path):
    plan = expand(compose(tmp_path, "kernel_spec"))
    ring = next(p for p in plan.points if p.method == "replay_spec")
    assert cursor_period(REGISTRY["replay_spec"], ring) == ring.history_len - ring.spec_T + 2
    assert cursor_period(REGISTRY["baseline_spec"], ring) is None


def test_rows_say_their_layout_and_pool(tmp_path):
    """A CPU sweep with the axes: every row names its cursor layout and pool; the AR replay rows carry the
    steps at h = 0 and L/2 beside the fold (flush_us)."""
    cfg = compose(tmp_path, "kernel_decode", ["sweep.models=[tiny_mamba2]", "sweep.cursors=[staggered]",
                                              "sweep.pool_factor=[2]", "sweep.routes=[output_only]"])
    rows = run_experiment(cfg).rows
    assert rows and all(r["status"] == "ok" for r in rows), summarize(rows)
    assert {r["num_slots"] for r in rows} == {4}
    replay = [r for r in rows if r["method"] == "replay_ar"]
    assert replay and all(r["cursors"] == "staggered" for r in replay)
    assert all(r["step_h0_us"] > 0 and r["step_hmid_us"] > 0 and r["flush_us"] > 0 for r in replay)
    assert all(r["cursors"] is None for r in rows if r["method"] == "baseline_ar")
    assert "staggered" in summarize(rows)


@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn", "tiny_kda"])
def test_ring_positions_split_verify_rows_from_fold_rows(tmp_path, gen, monkeypatch, model):
    """kernel_spec's per-position windows: at h = 0 no row folds, at the last position every row does, and
    every timed repetition starts from the same saved cursors."""
    from experiments.kernel import run

    plan, p = _point(tmp_path, "replay_spec", model)
    m = REGISTRY[p.method]
    settings = dict(plan.timing, max_layers=2, spec_steps=1, hbm_budget_frac=0.5, l2_factor=1.0)
    stack = run.Stack(m, Workload(plan.models[p.model_key], p, "cpu", gen), p, plan.acceptances[p.acceptance],
                      settings, {"l2_bytes": None})
    seen = []                                      # (write_pos, is_flush) of the first layer per repetition

    class Timed:
        median_us = 1.0

    def fake_time(prepare, step, work, p, settings):
        for _ in range(2):                         # two repetitions: each starts from the saved positions
            prepare()
            seen.append((stack.caches[0].write_pos.clone(), stack.caches[0].is_flush.clone()))
            step()
        return Timed()

    monkeypatch.setattr(run, "_time_prepared", fake_time)
    by_h = run._time_ring_positions(stack, m, p, m.api(p.family), settings)
    period = cursor_period(m, p)
    assert sorted(by_h) == [0, period // 2, period - 1]
    flat = seen
    first, last = flat[0], flat[-1]
    assert int(first[0].abs().sum()) == 0 and int(first[1].sum()) == 0          # verify rows: nothing folds
    assert bool((last[1] != 0).all()), last                                       # fold rows: every row folds
    for a, b in zip(flat[::2], flat[1::2]):                                       # repetitions agree
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
