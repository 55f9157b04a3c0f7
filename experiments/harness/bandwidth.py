"""Where a CPU's memory bandwidth plateaus: the working set a cold CPU point must exceed.

sysfs says how big the last-level cache is, not how much of it this process can use: on a 2-core Xeon VM
whose sysfs reports a 480 MiB L3, a one-thread copy runs at 26 GiB/s up to 16 MiB and plateaus at 13 GiB/s
from 64 MiB on; sizing the layer stack from the sysfs value there (4 x 480 MiB) is unreachable, so every
point was cache-resident. This probe measures instead: read (a sum) and copy bandwidth over working sets
from 1 MiB to `max_bytes`, on the run's torch thread count; the plateau is the median copy bandwidth of the
three largest sets; the knee is the smallest working set from which every larger one stays within
`tolerance` of the plateau. A cold stack must reach `cold_bytes` = 2 x knee (one doubling past it).

The result is cached per machine and thread count (a JSON file under the user cache directory, keyed by
hostname, CPU model, core count, sysfs LLC and threads) and recorded in env.json beside the sysfs value.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch

from experiments.harness.env import cpu_name

MIB = 1 << 20
TOLERANCE = 0.15
MODES = ("cached", "fresh", "off")


def cache_dir() -> Path:
    env = os.environ.get("REPLAYSSM_BW_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "replayssm" / "bandwidth"


def _best_seconds(fn, nbytes: int, min_total_s: float = 0.01, reps: int = 3) -> float:
    """Fastest of `reps` samples (each repeats fn until it lasts min_total_s), per call: the least disturbed
    sample is the bandwidth the hardware gives (other processes only ever slow a sample down)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_total_s / one))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def measure(max_bytes: int = 1 << 29, min_bytes: int = MIB) -> list[dict]:
    """[{bytes, read_GBps, copy_GBps}] per working set (powers of 2); copy counts read + write, decimal GB/s.
    The copy's working set is src + dst (each half of it); the read's is one buffer of that size."""
    rows = []
    size = min_bytes
    while size <= max_bytes:
        n = size // 4
        buf = torch.ones(n, dtype=torch.float32)
        read_s = _best_seconds(buf.sum, size)
        src, dst = buf[: n // 2], torch.empty(n // 2, dtype=torch.float32)
        copy_s = _best_seconds(functools.partial(dst.copy_, src), size)
        rows.append({"bytes": size, "read_GBps": size / read_s / 1e9, "copy_GBps": size / copy_s / 1e9})
        del buf, src, dst
        size *= 2
    return rows


def knee(rows: list[dict], tolerance: float = TOLERANCE) -> dict:
    """Plateau copy bandwidth (median of the three largest working sets) and the knee: the smallest working
    set from which every larger one is within `tolerance` above the plateau. reached: at least three sizes on
    the plateau and none of them `tolerance` below it (else bandwidth may still be falling past the largest
    size measured: the stack is sized from the knee all the same, and the note says so)."""
    if len(rows) < 3:
        raise ValueError("the bandwidth probe needs at least three working-set sizes")
    plateau = statistics.median(r["copy_GBps"] for r in rows[-3:])
    read_plateau = statistics.median(r["read_GBps"] for r in rows[-3:])
    at = len(rows) - 1
    while at > 0 and rows[at - 1]["copy_GBps"] <= plateau * (1 + tolerance):
        at -= 1
    return {"plateau_copy_GBps": plateau, "plateau_read_GBps": read_plateau, "knee_bytes": rows[at]["bytes"],
            "cold_bytes": 2 * rows[at]["bytes"],
            "reached": at <= len(rows) - 3 and min(r["copy_GBps"] for r in rows[at:]) >= plateau * (1 - tolerance)}


def _key(threads: int, llc_bytes: int | None, max_bytes: int) -> str:
    ident = f"{socket.gethostname()}|{cpu_name()}|{os.cpu_count()}|{llc_bytes}|{threads}|{max_bytes}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def cold_point(threads: int | None = None, *, mode: str = "cached", llc_bytes: int | None = None,
               max_bytes: int = 1 << 29) -> dict | None:
    """The probe's result for this machine at `threads` (default: torch's current count): knee(), the
    per-size rows, threads, where it came from ("measured" or the cache file). mode: "cached" reuses this
    machine's earlier result, "fresh" measures again (and refreshes the cache), "off" returns None."""
    if mode not in MODES:
        raise ValueError(f"timing.cpu_cold_probe: unknown mode {mode!r}; expected one of {list(MODES)}")
    if mode == "off":
        return None
    threads = torch.get_num_threads() if threads is None else int(threads)
    path = cache_dir() / f"{_key(threads, llc_bytes, max_bytes)}.json"
    if mode == "cached" and path.exists():
        try:
            result = json.loads(path.read_text())
            return dict(result, source=str(path))
        except (OSError, ValueError):
            pass
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = measure(max_bytes)
    finally:
        torch.set_num_threads(before)
    result = {**knee(rows), "threads": threads, "rows": rows, "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass                       # an unwritable cache only costs the next run another probe
    return dict(result, source="measured")
