"""CPU benchmark of every method (`make bench-cpu`): per method and thread count, ms/step, achieved bandwidth
(the byte model's bytes / time), % of this machine's measured copy plateau, the speedup over the method's
partner and the byte model's ratio for it. Cases: benchmarks/cpu_cases.py. Backend: $REPLAYSSM_BENCH_BACKEND
(default cpu, the fused C/OpenMP kernels; torch times the vectorised PyTorch form); thread counts:
$REPLAYSSM_BENCH_THREADS (default "1,2"). Timings are pytest-benchmark medians of whole cycles (AR: L steps
from an empty buffer, flush included; spec: 10 verify + commit steps from a reset). Never a pass criterion.

A shared box's bandwidth drifts by tens of percent within minutes, and a method and its partner timed a
minute apart can land on either side of a drift. So each speedup is also measured paired (test_paired):
the method's and its partner's cycles alternate, PAIRED_ROUNDS times, and the table reports the median of
the per-round ratios beside the ratio of the two pytest-benchmark medians.
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
import torch

from benchmarks.conftest import RESULTS, plateau, roof
from benchmarks.cpu_cases import BATCH, BUFFER_LEN, MODELS, build, cases
from experiments.harness.methods import REGISTRY
from replayssm.cpu.roofline import step_seconds

BACKEND = os.environ.get("REPLAYSSM_BENCH_BACKEND", "cpu")
THREADS = [int(t) for t in os.environ.get("REPLAYSSM_BENCH_THREADS", "1,2").split(",")]
ROUNDS = 5
PAIRED_ROUNDS = 7


@pytest.fixture(params=THREADS, ids=lambda t: f"threads{t}")
def threads(request):
    plateau(request.param)                       # probed before this thread count's first timing
    roof(request.param)
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("family,method,route", cases(BACKEND),
                         ids=lambda v: v if isinstance(v, str) else "-")
def test_method(benchmark, threads, family, method, route):
    used = REGISTRY[method].backend_for(BACKEND, family)
    if used != BACKEND:
        pytest.skip(f"{family} {method} has no backend={BACKEND} kernel (it runs on {used}): time it with "
                    f"REPLAYSSM_BENCH_BACKEND={used}")
    case = build(family, method, route, BACKEND)
    benchmark.extra_info.update(family=family, method=case.label, backend=case.backend, threads=threads,
                                steps=case.steps, bytes_per_step=case.bytes_per_step, model=MODELS[family],
                                batch=BATCH, buffer_len=BUFFER_LEN, per=f"cycle of {case.steps} steps")
    benchmark.pedantic(case.cycle, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    rates = roof(threads)
    roof_ms = (sum(step_seconds(t, rates) for t in case.row_steps) / case.steps * 1e3) if rates else None
    benchmark.extra_info.update(roof_ms=roof_ms, roof_rates=rates)
    RESULTS[(threads, family, case.label)] = {
        "ms": benchmark.stats.stats.median / case.steps * 1e3, "bytes": case.bytes_per_step, "roof_ms": roof_ms,
        "backend": case.backend, "partner": case.partner, "method": method,
    }


def _seconds_per_step(case) -> float:
    t0 = time.perf_counter()
    case.cycle()
    return (time.perf_counter() - t0) / case.steps


@pytest.mark.parametrize("family,method,route", [c for c in cases(BACKEND) if REGISTRY[c[1]].partner],
                         ids=lambda v: v if isinstance(v, str) else "-")
def test_paired(threads, family, method, route):
    """The speedup over the partner from alternating cycles (partner, method, partner, ...): each round's ratio
    sees the machine as both sides did, within a second of each other."""
    partner = REGISTRY[method].partner
    used = {REGISTRY[m].backend_for(BACKEND, family) for m in (method, partner)}
    if used != {BACKEND}:
        pytest.skip(f"{family} {method} / {partner} run on {sorted(used)}, not both on backend={BACKEND}")
    base, case = build(family, partner, None, BACKEND), build(family, method, route, BACKEND)
    base.cycle()
    case.cycle()                                  # warm: first touch of the caches, thread start-up
    ratios = []
    for _ in range(PAIRED_ROUNDS):
        ratios.append(_seconds_per_step(base) / _seconds_per_step(case))
    row = RESULTS.get((threads, family, case.label))
    if row is not None:                           # test_method ran first (file order) and made the row
        row["paired"] = statistics.median(ratios)
        row["paired_ratios"] = ratios
