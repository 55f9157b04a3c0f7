"""CPU micro-benchmark: baseline AR decode vs ReplaySSM AR decode, torch backend (`make bench-cpu`).

Mamba-2 at Nemotron-3-Super-120B geometry (128 heads, headdim 64, dstate 128, 8 groups) and GDN at
Qwen3.5-122B-A10B geometry (H 16, HV 64, K = V = 128), batch 32, buffer L = 16, fp32 state and activations.

A ReplaySSM time always covers a whole flush cycle (L consecutive steps from write_pos 0, reported per step),
never a lone non-flush step; the flush step's own time is reported beside it. Each method runs in its
fastest form on this machine (eager or torch.compile, chosen by a short probe and recorded): the baseline
gets the same care as ReplaySSM. The ratio table printed at the end compares rows of this session only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from benchmarks.conftest import RATIOS, RESULTS
from replayssm.geometry import get_geometry
from replayssm.testing import rel_err

BATCH = 32
BUFFER_LEN = 16
ROUNDS = 5
COMPILED_TOL = 1e-5  # fp32: a compiled form may reorder sums, never change the result beyond that


@dataclass
class Subject:
    """A timed callable and every tensor it mutates (so a compiled form can be checked against eager)."""

    fn: Callable[[], None]
    mutated: list[torch.Tensor]


@dataclass
class Case:
    family: str
    model: str
    baseline: Callable[[], Subject]                 # () -> one baseline step
    replay: Callable[[], tuple[Subject, Subject]]   # () -> (one flush cycle, the flush step alone)
    byte_ratio: Callable[[], float]


def _mamba2_inputs():
    from replayssm.mamba2.inputs import random_params, random_step

    geom = get_geometry("nemotron3_super_120b")
    gen = torch.Generator().manual_seed(0)
    return geom, random_params(geom, generator=gen), random_step(geom, BATCH, generator=gen)


def _mamba2_baseline():
    from baselines.mamba2_ssu import selective_state_update
    from replayssm.mamba2.inputs import random_state

    geom, p, inp = _mamba2_inputs()
    state = random_state(geom, BATCH)
    out = torch.empty_like(inp["x"])
    return Subject(lambda: selective_state_update(state, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"],
                                                  p.dt_bias, out=out, backend="torch"), [state, out])


def _mamba2_replay():
    from replayssm.mamba2.cache import ReplayCache
    from replayssm.mamba2.decode import replay_step
    from replayssm.mamba2.inputs import random_state

    geom, p, inp = _mamba2_inputs()
    cache = ReplayCache.allocate(geom, BATCH, BUFFER_LEN)
    cache.state.copy_(random_state(geom, BATCH))
    out = torch.empty_like(inp["x"])

    def step():
        replay_step(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias, out=out,
                    backend="torch")

    return _cycle_and_flush(step, cache.write_pos, [cache.state, cache.x, cache.B, cache.dt, cache.write_pos, out])


def _mamba2_byte_ratio() -> float:
    from replayssm import traffic

    geom = get_geometry("nemotron3_super_120b")
    base = traffic.mamba2_baseline_ar(geom, state_bytes=4, act_bytes=4)
    rep = traffic.mamba2_replay_ar_cycle(geom, BUFFER_LEN, "output_only", state_bytes=4, act_bytes=4)
    return base.total / rep.total


def _gdn_inputs():
    from replayssm.gdn.inputs import random_step

    geom = get_geometry("qwen35_122b_a10b")
    return geom, random_step(geom, BATCH, generator=torch.Generator().manual_seed(0))


def _gdn_baseline():
    from baselines.gdn_recurrent import fused_recurrent_step
    from replayssm.gdn.inputs import random_state

    geom, inp = _gdn_inputs()
    state = random_state(geom, BATCH)
    out = torch.empty_like(inp["v"])
    return Subject(lambda: fused_recurrent_step(state, **inp, out=out, backend="torch"), [state, out])


def _gdn_replay():
    from replayssm.gdn.cache import ReplayCache
    from replayssm.gdn.decode import replay_step
    from replayssm.gdn.inputs import random_state

    geom, inp = _gdn_inputs()
    cache = ReplayCache.allocate(geom, BATCH, BUFFER_LEN)
    cache.state.copy_(random_state(geom, BATCH))
    out = torch.empty_like(inp["v"])
    return _cycle_and_flush(lambda: replay_step(cache, **inp, out=out, backend="torch"), cache.write_pos,
                            [cache.state, cache.u, cache.k, cache.g, cache.write_pos, out])


def _gdn_byte_ratio() -> float:
    from replayssm import traffic

    geom = get_geometry("qwen35_122b_a10b")
    base = traffic.gdn_baseline_ar(geom, state_bytes=4, act_bytes=4)
    rep = traffic.gdn_replay_ar_cycle(geom, BUFFER_LEN, state_bytes=4, act_bytes=4)
    return base.total / rep.total


def _cycle_and_flush(step, write_pos: torch.Tensor, mutated: list[torch.Tensor]) -> tuple[Subject, Subject]:
    """(L steps from write_pos 0: one whole flush cycle, the flush step alone)."""

    def cycle():
        for _ in range(BUFFER_LEN):
            step()

    def flush():
        write_pos.fill_(BUFFER_LEN - 1)
        step()

    write_pos.zero_()
    return Subject(cycle, mutated), Subject(flush, mutated)


CASES = {
    "mamba2": Case("mamba2", "nemotron3_super_120b", _mamba2_baseline, _mamba2_replay, _mamba2_byte_ratio),
    "gdn": Case("gdn", "qwen35_122b_a10b", _gdn_baseline, _gdn_replay, _gdn_byte_ratio),
}


def _probe(fn: Callable[[], None], reps: int = 3) -> float:
    fn()  # warm-up (and compilation for compiled forms)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _same_effect(subject: Subject, compiled: Callable[[], None]) -> float:
    """Largest relative error between the tensors one eager call and one compiled call leave behind."""
    start = [t.clone() for t in subject.mutated]
    subject.fn()
    eager = [t.clone() for t in subject.mutated]
    for t, s in zip(subject.mutated, start):
        t.copy_(s)
    compiled()
    err = max(rel_err(t, e) if t.is_floating_point() else float(not torch.equal(t, e))
              for t, e in zip(subject.mutated, eager))
    for t, s in zip(subject.mutated, start):
        t.copy_(s)
    return err


def _fastest_form(subject: Subject) -> tuple[Callable[[], None], str]:
    """Eager or torch.compile, whichever is faster here. The compiled form is only eligible if one call of it
    leaves the same state, buffers, cursors and outputs as one eager call; otherwise (or if compiling fails)
    the eager form is timed and the reason recorded."""
    fn = subject.fn
    eager_s = _probe(fn)
    try:
        compiled = torch.compile(fn)
        compiled_s = _probe(compiled)
        err = _same_effect(subject, compiled)
    except Exception as exc:  # noqa: BLE001 - any compiler failure means: time the eager form
        return fn, f"eager ({eager_s * 1e3:.1f} ms; torch.compile failed: {type(exc).__name__})"
    if err > COMPILED_TOL:
        return fn, f"eager ({eager_s * 1e3:.1f} ms; torch.compile disagreed with eager: rel err {err:.1e})"
    if compiled_s < eager_s:
        return compiled, f"torch.compile ({compiled_s * 1e3:.1f} ms vs eager {eager_s * 1e3:.1f} ms)"
    return fn, f"eager ({eager_s * 1e3:.1f} ms vs torch.compile {compiled_s * 1e3:.1f} ms)"


def _skip_if_missing(family: str, exc: ImportError):
    pytest.skip(f"{family} methods not importable: {exc}")


@pytest.mark.parametrize("family", list(CASES))
def test_baseline_ar(benchmark, family):
    case = CASES[family]
    try:
        subject = case.baseline()
    except ImportError as exc:
        _skip_if_missing(family, exc)
    fn, form = _fastest_form(subject)
    benchmark.extra_info.update(model=case.model, batch=BATCH, form=form, per="step")
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    RESULTS[f"{family}/baseline"] = {"s": benchmark.stats.stats.median, "form": form}


@pytest.mark.parametrize("family", list(CASES))
def test_replay_ar(benchmark, family):
    case = CASES[family]
    try:
        cycle, flush = case.replay()
    except ImportError as exc:
        _skip_if_missing(family, exc)
    fn, form = _fastest_form(cycle)
    flush_fn, _ = _fastest_form(flush)
    flush_s = min(_probe(flush_fn) for _ in range(ROUNDS))
    benchmark.extra_info.update(model=case.model, batch=BATCH, buffer_len=BUFFER_LEN, form=form,
                                per=f"flush cycle of {BUFFER_LEN} steps", flush_ms=flush_s * 1e3)
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    RESULTS[f"{family}/replay"] = {"s": benchmark.stats.stats.median / BUFFER_LEN, "form": form, "flush_s": flush_s}


@pytest.mark.parametrize("family", list(CASES))
def test_ratio(family):
    """Not a pass/fail on speed: collects the measured ratio of this session for the summary table."""
    base, rep = RESULTS.get(f"{family}/baseline"), RESULTS.get(f"{family}/replay")
    if base is None or rep is None:
        pytest.skip(f"{family}: both benchmarks must run in this session to form a ratio")
    case = CASES[family]
    RATIOS.append({
        "family": family, "geometry": case.model, "batch": BATCH, "L": BUFFER_LEN,
        "baseline_ms": base["s"] * 1e3, "replay_ms": rep["s"] * 1e3, "flush_ms": rep["flush_s"] * 1e3,
        "measured": base["s"] / rep["s"], "model": case.byte_ratio(),
        "baseline_form": base["form"], "replay_form": rep["form"],
    })
