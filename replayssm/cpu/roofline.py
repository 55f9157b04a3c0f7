"""A roofline of this CPU, measured: the most a step of a method can do here, from three rates.

The byte model (replayssm/traffic.py) is the GPU's argument: HBM reads and writes cost the same per byte and
the FLOPs are free, so a step's time is its bytes over one bandwidth. A CPU core breaks both halves:

  * a read-only stream is bound by the misses one core keeps in flight, and writing back lines the same
    pass just read costs little on top, so not writing the state saves far less than half of a step;
  * a rank-J rebuild (a flush, the state-and-output route) does J FMAs per state element, so at L = 16 a
    flush is FMA-bound, not memory-bound.
The rates measured on the development box, and what they predict: replayssm/cpu/README.md.

So each method's floor here is, per (row, step), max(memory time, FLOP time) with
    memory time = (read - paired) / read_rate + 2 paired / update_rate + 2 (write - paired) / update_rate,
    paired = min(read, write)   (writes go back over lines the step read; the rest costs a read for ownership)
    FLOP time   = flops / flop_rate,
summed over the rows and steps a benchmark runs (a core walks rows one after another, so a compute-bound
flush row and a memory-bound readout row do not overlap). `measure` gives the three rates at a thread count
with the CPU kernels' own compiler, flags and OpenMP (replayssm/cpu/kernels.c, the probe functions).
"""

from __future__ import annotations

import ctypes
import time

import torch

from replayssm.cpu.build import library
from replayssm.traffic import Traffic

MIB = 1 << 20


def _best(fn, reps: int) -> float:
    fn()                                   # first touch, page faults, thread start-up
    return min(fn() for _ in range(reps))


def measure(threads: int, nbytes: int = 256 * MIB, reps: int = 5) -> dict:
    """{read_GBps, update_GBps (bytes read + written), flop_GFLOPs (2 per FMA lane), threads, bytes}: the best
    of `reps` passes over a buffer of `nbytes` (pick one past the cache: the cold probe's cold_bytes)."""
    lib = library()
    for name, args in (("replayssm_cpu_probe_read", [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]),
                       ("replayssm_cpu_probe_update", [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]),
                       ("replayssm_cpu_probe_fma", [ctypes.c_int64, ctypes.c_int, ctypes.c_void_p])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_double, args
    buf = torch.full((nbytes // 4,), 0.5, dtype=torch.float32)
    sink = ctypes.c_float()
    n, ptr = buf.numel(), buf.data_ptr()
    read_s = _best(lambda: lib.replayssm_cpu_probe_read(ptr, n, threads, ctypes.byref(sink)), reps)
    update_s = _best(lambda: lib.replayssm_cpu_probe_update(ptr, n, threads), reps)
    iters = 2_000_000
    fma_s = _best(lambda: lib.replayssm_cpu_probe_fma(iters, threads, ctypes.byref(sink)), reps)
    return {"threads": threads, "bytes": nbytes, "read_GBps": nbytes / read_s / 1e9,
            "update_GBps": 2 * nbytes / update_s / 1e9,
            "flop_GFLOPs": 2 * 8 * 12 * iters * threads / fma_s / 1e9,
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def step_seconds(t: Traffic, roof: dict) -> float:
    """The floor of one step (one row): max(memory time, FLOP time) at the measured rates."""
    paired = min(t.read, t.write)
    mem = (t.read - paired) / (roof["read_GBps"] * 1e9) + 2 * t.write / (roof["update_GBps"] * 1e9)
    return max(mem, t.flops / (roof["flop_GFLOPs"] * 1e9))
