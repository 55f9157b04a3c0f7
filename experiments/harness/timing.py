"""Timing: a zero-argument cycle (one or more decode steps over a stack of layers) -> per-step microseconds.

GPU (triton.testing.do_bench with CUDA graphs, as FlashInfer and vLLM benchmark their kernels):
    graph mode   the cycle is captured once in a CUDA graph (after a warm-up on a side stream that JIT-compiles
                 every kernel) and `graph.replay` is timed; eager mode times the Python cycle itself.
    cold L2      `triton.testing.do_bench` (warmup / rep are milliseconds; quantiles [0.5, 0.2, 0.8]); it
                 zeroes a 256 MB buffer before every call, and each layer of the stack has its own state pool,
                 so the state streams from HBM (vLLM's recurrent-decode benchmark).
    warm L2      back-to-back calls timed with CUDA events, no flush (what do_bench_cudagraph does).
CPU: the `torch` backend, warm-up, then `repeats` samples; each sample repeats the cycle until it lasts
`min_sample_us`. Median, p20, p80 of the samples. The clock is the thread's CPU time when torch runs on
one thread (`cpu_clock: auto`): on a shared box a preempted sample then does not count the time another
process held the core (a wall-clock sample longer than a scheduler slice nearly always does), and memory
stalls still count; with several torch threads it is the wall clock (perf_counter).

Every function returns `Timing(median_us, p20_us, p80_us)` per step: sample time / (steps x layers).
The value checks that read tensors back to the host (slot ranges, accepted counts, tree parents) run in the
first calls and the warm-up only: the timed repeats run inside `replayssm.checks.trusted_inputs()`, so a
method's time never includes a host sync of its own input validation (graph capture skips them anyway).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from replayssm.checks import trusted_inputs


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float

    def scaled(self, k: float) -> Timing:
        return Timing(self.median_us * k, self.p20_us * k, self.p80_us * k)


def quantiles(samples: list[float]) -> Timing:
    """Median, p20, p80 of samples (linear interpolation, as torch.quantile)."""
    if not samples:
        raise ValueError("no timing samples")
    s = sorted(samples)
    if len(s) == 1:
        return Timing(s[0], s[0], s[0])
    q = statistics.quantiles(s, n=10, method="inclusive")          # deciles: q[1] = p20, q[7] = p80
    return Timing(statistics.median(s), q[1], q[7])


# ------------------------------------------------------------------------------------------------------ CPU

@contextlib.contextmanager
def no_gc():
    """Garbage collection off while timing (as timeit does): a collection inside a sample is not the method."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


CPU_CLOCKS = ("auto", "wall", "cpu")


def cpu_clock(kind: str = "auto") -> Callable[[], float]:
    """time.thread_time (thread CPU time) or time.perf_counter (wall); auto: CPU time iff torch uses 1 thread."""
    if kind not in CPU_CLOCKS:
        raise ValueError(f"timing.cpu_clock: expected one of {CPU_CLOCKS}, got {kind!r}")
    use_cpu = kind == "cpu" or (kind == "auto" and torch.get_num_threads() == 1)
    return time.thread_time if use_cpu else time.perf_counter


def time_cpu(cycle: Callable[[], None], work_per_cycle: int, *, warmup: int, repeats: int,
             min_sample_us: float, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Per-unit time of `cycle` (work_per_cycle units: steps x layers) on the CPU."""
    t0 = clock()
    cycle()
    one = max(clock() - t0, 1e-7)
    inner = max(1, int(min_sample_us * 1e-6 / one + 0.999))
    for _ in range(warmup):
        for _ in range(inner):
            cycle()
    samples = []
    with no_gc(), trusted_inputs():          # validated by the calls above: no host-synced value check timed
        for _ in range(repeats):
            t0 = clock()
            for _ in range(inner):
                cycle()
            samples.append((clock() - t0) * 1e6 / (inner * work_per_cycle))
    return quantiles(samples)


def time_cpu_prepared(prepare: Callable[[], None], step: Callable[[], None], work: int, *, warmup: int,
                      repeats: int, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Per-unit time of `step` alone, `prepare` (untimed) run before each call: e.g. a lone flush step
    (prepare sets write_pos = L-1)."""
    for _ in range(warmup):
        prepare()
        step()
    samples = []
    with no_gc(), trusted_inputs():
        for _ in range(max(repeats, 5)):
            prepare()
            t0 = clock()
            step()
            samples.append((clock() - t0) * 1e6 / work)
    return quantiles(samples)


# ------------------------------------------------------------------------------------------------------ GPU

CAPTURE_SECONDS = [0.0]   # wall seconds spent in capture_graph (warm-up + capture); the runner reads it per point


def capture_graph(cycle: Callable[[], None], warmup_calls: int = 2) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream (Triton JIT, allocator), then capture one call of `cycle` in a CUDA graph."""
    t0 = time.perf_counter()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup_calls):
            cycle()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cycle()
    torch.cuda.synchronize()
    CAPTURE_SECONDS[0] += time.perf_counter() - t0
    return graph


def bench_gpu(fn: Callable[[], None], *, l2: str, warmup_ms: float, rep_ms: float) -> Timing:
    """Milliseconds -> microseconds per call of `fn`: do_bench (cold L2) or back-to-back events (warm)."""
    if l2 == "cold":
        import triton.testing  # deferred: GPU timing only

        med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
        return Timing(med * 1e3, p20 * 1e3, p80 * 1e3)
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-4)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    n = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return quantiles([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])


def time_gpu(cycle: Callable[[], None], work_per_cycle: int, *, timing_mode: str, l2: str, warmup_ms: float,
             rep_ms: float) -> Timing:
    """Per-unit time of `cycle` on the GPU, graph-replayed or eager.

    Streams, explicitly: everything (capture's warm-up side stream aside) runs on one dedicated timing
    stream, which first waits for the stream that built the caches and inputs; do_bench's L2 flush, the
    graph replays or eager launches and the timing events are all issued on it, so no other work of this
    process lands between an event pair; the caller's stream waits for it at the end."""
    caller = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        if timing_mode == "graph":
            graph = capture_graph(cycle)
            fn = graph.replay
        else:
            cycle()
            torch.cuda.synchronize()
            fn = cycle
        with trusted_inputs():               # eager: the call above ran every value check once
            result = bench_gpu(fn, l2=l2, warmup_ms=warmup_ms, rep_ms=rep_ms).scaled(1.0 / work_per_cycle)
    caller.wait_stream(stream)
    return result


def time_gpu_prepared(prepare: Callable[[], None], step: Callable[[], None], work: int, *, timing_mode: str,
                      l2: str, warmup_ms: float, rep_ms: float) -> Timing:
    """Per-unit time of `step` alone: time (prepare + step) and prepare alone, report the difference. The
    prepare part (a cursor fill per layer) is a few tiny kernels, so the difference is the step's own time."""
    both = time_gpu(lambda: (prepare(), step()), work, timing_mode=timing_mode, l2=l2, warmup_ms=warmup_ms,
                    rep_ms=rep_ms)
    alone = time_gpu(prepare, work, timing_mode=timing_mode, l2=l2, warmup_ms=warmup_ms, rep_ms=rep_ms)
    return Timing(*(max(a - b, 0.0) for a, b in zip((both.median_us, both.p20_us, both.p80_us),
                                                    (alone.median_us, alone.p20_us, alone.p80_us))))


# ---------------------------------------------------------------------------------------------- copy bandwidth

def measure_copy_GBps(device: str, nbytes: int) -> float:
    """Achievable bandwidth of a large torch copy (read + write counted), decimal GB/s: the measured peak."""
    n = max(nbytes // 2 // 4, 1024)                    # two fp32 buffers of nbytes/2 each
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    moved = 2 * n * 4
    if device == "cuda":
        import triton.testing  # deferred: GPU timing only

        ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
        return moved / (ms * 1e-3) / 1e9
    t = time_cpu(lambda: dst.copy_(src), 1, warmup=2, repeats=7, min_sample_us=0)
    return moved / (t.median_us * 1e-6) / 1e9


def maybe_compile(fns: dict, backend: str) -> dict:
    """torch.compile every API function (dynamic=False: one graph per point's shapes)."""
    return {name: torch.compile(fn, backend=backend, dynamic=False) for name, fn in fns.items()}
