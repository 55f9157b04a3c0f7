"""The launch floor: what one kernel launch, and each method's whole step, costs at batch 1 on this GPU.

At batch 1 a decode step moves a few hundred KB and its time is the launches', not the bytes': this is the
floor a per-step time model adds to its bytes / bandwidth term. Measured here, for the GPU's own torch/Triton:

    minimal   a one-program Triton kernel that stores one float (the launch itself)
    methods   each method's step at batch 1 on the headline geometries (Mamba-2: Nemotron-3-Super-120B,
              GDN: Qwen3.5-122B-A10B, TP1), fp32 state, bf16 activations: an AR step (replay_ar per route,
              buffer_len 16), or a spec verify + commit (T = 4, history 16, num_accepted 2); installed peers too

each three ways (the `mode` column):

    graph     triton.testing.do_bench_cudagraph: calls replayed from one CUDA graph (no host launch cost)
    eager     triton.testing.do_bench: CUDA events around each call, L2 flushed between calls
    host      back-to-back calls timed on the host clock between two synchronizes: max(host launch cost,
              GPU time) per call, what an eager decode loop pays

First launches are paid before timing, in parallel: `--jobs N` processes (default 8) each make one entry's
first call, so the JIT compiles and Triton 3.6's C launcher builds (gcc, one per kernel signature) land in
Triton's on-disk cache at once, and the timing process finds them built.

Output (`--out DIR`): DIR/launch_floor.csv, one row per (name, mode) with the columns of COLUMNS (ms_* per
step, `launches` = Triton launches per step, counted once outside timing, `compile_s` = the entry's first call,
in its warm-up process: Triton's JIT compile and, under Triton 3.6, the C launcher it builds per kernel
signature), and DIR/launch_floor.json: the rows plus the torch / Triton versions, `warm` (per entry: first_call_s,
launcher_builds, launcher_s: the C modules Triton built there and their gcc seconds), their totals
warm_launcher_builds / warm_launcher_s and warm_s (the warm-up's wall time), and launcher_builds / launcher_s of
the timing process (0 once warm). A per-step time model reads `ms_median` of mode graph or host (a CUDA-graph
engine or an eager one) for its method, times the layers.

    python -m experiments.launch_floor --out DIR        # on the GPU (scripts/gpu/gpu_check.sh, stage `launch`)
    python -m experiments.launch_floor --plan           # list the entries and whether each can run here
On a CPU (tests) `--device cpu` with TRITON_INTERPRET=1 runs the host mode only, on the tiny models.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.harness.fixture import PointFixture
from experiments.harness.methods import REGISTRY, MethodUnavailable
from experiments.harness.points import Point, load_model_config, model_spec
from experiments.harness.workload import Workload

MODELS = {"mamba2": "nemotron3_super_120b", "gdn": "qwen35_122b_a10b"}
CPU_MODELS = {"mamba2": "tiny_mamba2", "gdn": "tiny_gdn"}
BUFFER_LEN, SPEC_T, HISTORY_LEN, ACCEPTED = 16, 4, 16, 2
COLUMNS = ["name", "family", "model", "method", "route", "batch", "mode", "ms_median", "ms_mean", "ms_min",
           "samples", "launches", "compile_s", "status"]
MODES = ("graph", "eager", "host")


@dataclass(frozen=True)
class Entry:
    """One thing to time: the minimal kernel (method None) or one method's step for one family / route."""

    name: str
    family: str | None = None
    model: str | None = None
    method: str | None = None
    route: str | None = None


def entries(models: dict[str, str] = MODELS) -> list[Entry]:
    """The minimal kernel, then every registered method x family (x route) on `models`."""
    out = [Entry("minimal")]
    for family, model in models.items():
        for m in REGISTRY.values():
            if family in m.families:
                for route in m.routes(family):
                    route = None if route == "fused" else route      # a ring's default form keeps its old name
                    out.append(Entry(f"{family}/{m.name}" + (f"/{route}" if route else ""), family, model, m.name,
                                     route))
    return out


def _point(e: Entry, device: str) -> Point:
    m = REGISTRY[e.method]
    spec = m.kind == "spec"
    backend = m.backend_for("triton", e.family)
    return Point(experiment="launch_floor", family=e.family, model=e.model, tp=1, method=e.method, route=e.route,
                 backend=backend, batch=1, buffer_len=BUFFER_LEN if m.uses_buffer else None,
                 spec_T=SPEC_T if spec else None, history_len=HISTORY_LEN if m.uses_history else None,
                 acceptance=f"fixed:{ACCEPTED}" if spec else None, state_dtype="float32",
                 act_dtype="float32" if device == "cpu" else "bfloat16", context_len=None, timing_mode="launch_floor",
                 l2="flush", torch_compile="false", slot_layout="identity", device=device, seed=0)


def build_step(e: Entry, device: str) -> Callable[[], None]:
    """One batch-1 step of `e` as a zero-argument callable (inputs, cache and slots made once, here)."""
    if e.method is None:
        return _minimal(device)
    m = REGISTRY[e.method]
    p = _point(e, device)
    reason = m.unavailable(e.family, device, p.backend)
    if reason is not None:
        raise MethodUnavailable(reason)
    spec = model_spec(load_model_config(e.model), 1)
    wl = Workload(spec, p, device, torch.Generator().manual_seed(0))
    fx = PointFixture.build(m, m.api(e.family), wl, p, 1)        # the cache and inputs every runner builds
    fns, cache, kw, out = fx.fns, fx.caches[0], fx.kw, fx.out
    if m.kind == "ar":
        return lambda: m.step(fns, cache, p, kw, None, out)
    accepted = torch.full((1,), ACCEPTED, dtype=torch.int32, device=device)
    A = wl.params.get("A")

    def step():
        m.verify(fns, cache, p, kw, None, out)
        m.commit(fns, cache, p, accepted, None, A)
    return step


def _minimal(device: str) -> Callable[[], None]:
    import triton
    import triton.language as tl

    @triton.jit
    def _store_one(x_ptr):
        tl.store(x_ptr, 1.0)

    x = torch.zeros(1, dtype=torch.float32, device=device)
    return lambda: _store_one[(1,)](x)


@contextlib.contextmanager
def launch_counter() -> Iterator[list[int]]:
    """Count Triton launches (`kernel[grid](...)` calls, compiled or interpreted) inside the block."""
    from triton.runtime import interpreter, jit

    count = [0]
    patched = [(cls, cls.run) for cls in (jit.JITFunction, interpreter.InterpretedFunction)]
    for cls, run in patched:
        def counted(self, *args, _run=run, **kwargs):
            count[0] += 1
            return _run(self, *args, **kwargs)
        cls.run = counted
    try:
        yield count
    finally:
        for cls, run in patched:
            cls.run = run


@contextlib.contextmanager
def launcher_builds() -> Iterator[list[float]]:
    """Time every C module Triton builds inside the block (3.6: one launcher per kernel signature at first
    launch; 3.7 builds none per kernel). Yields the list of build seconds."""
    from triton.runtime import build

    seconds: list[float] = []
    original = build._build

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - t0)
    build._build = timed
    try:
        yield seconds
    finally:
        build._build = original


def host_ms(fn: Callable[[], None], sync: Callable[[], None], min_s: float = 0.05, max_calls: int = 2000,
            samples: int = 5) -> list[float]:
    """Per-call ms of back-to-back calls (host clock, synchronized at both ends): `samples` runs of as many
    calls as fill min_s / samples (at least one). The caller has made the first call."""
    t0, n = time.perf_counter(), 0
    while n < max_calls and time.perf_counter() - t0 < min_s / samples:
        fn()
        n += 1
    sync()
    calls = max(1, n)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3 / calls)
    return out


def measure(e: Entry, device: str, rep_ms: int, first_call_s: float | None = None) -> list[dict]:
    """Rows for one entry: every mode this device has (graph and eager need CUDA), or one `skipped` row.
    first_call_s: the entry's first call in a warm-up process (the compiles), else this process's first call."""
    base = {"name": e.name, "family": e.family or "", "model": e.model or "", "method": e.method or "minimal",
            "route": e.route or "", "batch": 1}
    try:
        fn = build_step(e, device)
    except MethodUnavailable as exc:
        return [{**base, "mode": "-", "status": f"skipped: {exc}"}]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with launch_counter() as launches:
        fn()                                  # the first call: JIT compile (+ Triton 3.6's C launcher build)
    sync()
    here = round(time.perf_counter() - t0, 3)
    first = {"launches": launches[0], "compile_s": here if first_call_s is None else first_call_s}
    # the interpreter (a CPU check of the entries, not a floor) takes ~0.1-1 s a call: 3 samples there
    timers: dict[str, Callable[[], list[float]]] = {"host": lambda: host_ms(fn, sync, samples=5 if device == "cuda"
                                                                            else 3)}
    if device == "cuda":
        import triton.testing as tt
        timers["graph"] = lambda: tt.do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
        timers["eager"] = lambda: tt.do_bench(fn, warmup=rep_ms // 4, rep=rep_ms, return_mode="all")
    rows = []
    for mode in MODES:
        if mode not in timers:
            continue
        try:
            ms = [float(t) for t in timers[mode]()]
            rows.append({**base, **first, "mode": mode, "ms_median": statistics.median(ms),
                         "ms_mean": statistics.fmean(ms), "ms_min": min(ms), "samples": len(ms), "status": "ok"})
        except Exception as exc:  # noqa: BLE001 - a mode that fails is a row that says why; the rest still run
            rows.append({**base, **first, "mode": mode, "status": f"error: {type(exc).__name__}: {str(exc)[:160]}"})
    return rows


def warm(e: Entry, device: str) -> dict:
    """The first call of one entry (this process): its seconds and the C modules Triton built for it."""
    try:
        with launcher_builds() as builds:
            t0 = time.perf_counter()
            build_step(e, device)()
            if device == "cuda":
                torch.cuda.synchronize()
    except MethodUnavailable as exc:
        return {"name": e.name, "status": f"skipped: {exc}"}
    return {"name": e.name, "status": "ok", "first_call_s": round(time.perf_counter() - t0, 3),
            "launcher_builds": len(builds), "launcher_s": round(sum(builds), 3)}


def warm_parallel(todo: list[Entry], device: str, jobs: int, timeout_s: float = 120) -> list[dict]:
    """`warm` for every entry, `jobs` processes at a time (each one line of JSON on its stdout)."""
    def one(e: Entry) -> dict:
        cmd = [sys.executable, "-m", "experiments.launch_floor", "--warm-only", "--device", device, "--only", e.name]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"name": e.name, "status": f"error: warm-up over {timeout_s:g} s"}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            return {"name": e.name, "status": f"error: warm-up rc={proc.returncode}: {proc.stderr.strip()[-200:]}"}
        return json.loads(lines[-1])
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, todo))


def write(out_dir: Path, rows: list[dict], meta: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "launch_floor.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    (out_dir / "launch_floor.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for launch_floor.csv / launch_floor.json")
    ap.add_argument("--plan", action="store_true", help="list the entries and whether each can run; time nothing")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench / do_bench_cudagraph repetition time")
    ap.add_argument("--only", action="append", help="entry name (repeatable; default all)")
    ap.add_argument("--jobs", type=int, default=8, help="parallel first-launch processes (1: none, in-process)")
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)   # one warm-up process
    args = ap.parse_args(argv)
    models = MODELS if args.device == "cuda" else CPU_MODELS
    todo = [e for e in entries(models) if not args.only or e.name in args.only]
    if args.plan:
        for e in todo:
            reason = None if e.method is None else REGISTRY[e.method].unavailable(e.family, args.device, "triton")
            print(f"{e.name:<40} {e.model or '-':<22} {'ok' if reason is None else 'skipped: ' + reason}")
        print(f"{len(todo)} entries x modes {', '.join(MODES)} at batch 1")
        return 0
    if args.warm_only:
        for e in todo:
            print(json.dumps(warm(e, args.device)), flush=True)
        return 0
    if args.out is None:
        ap.error("--out DIR is needed unless --plan")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("launch_floor: no CUDA device (use --plan, or --device cpu with TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    import triton

    meta = {"torch": torch.__version__, "triton": triton.__version__, "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "rep_ms": args.rep_ms}
    t0 = time.perf_counter()
    warmed = warm_parallel(todo, args.device, args.jobs) if args.jobs > 1 else []
    meta.update(warm=warmed, warm_s=round(time.perf_counter() - t0, 3),
                warm_launcher_builds=sum(w.get("launcher_builds", 0) for w in warmed),
                warm_launcher_s=round(sum(w.get("launcher_s", 0.0) for w in warmed), 3))
    if warmed:
        print(f"launch_floor: first launches in {args.jobs} processes: {meta['warm_s']:.1f} s, Triton built "
              f"{meta['warm_launcher_builds']} C modules ({meta['warm_launcher_s']:.1f} s of gcc)", flush=True)
    first_call = {w["name"]: w["first_call_s"] for w in warmed if "first_call_s" in w}
    rows: list[dict] = []
    with launcher_builds() as builds:
        for e in todo:
            rows += measure(e, args.device, args.rep_ms, first_call.get(e.name))
            write(args.out, rows, {**meta, "launcher_builds": len(builds), "launcher_s": round(sum(builds), 3)})
            r = rows[-1]
            print(f"{e.name:<40} {r['status']:<8} " + "  ".join(
                f"{x['mode']} {x['ms_median'] * 1e3:.1f} us" for x in rows if x["name"] == e.name and "ms_median" in x),
                flush=True)
    print(f"launch_floor: {len(rows)} rows; Triton built {len(builds)} C modules in {sum(builds):.1f} s "
          f"-> {args.out / 'launch_floor.csv'}")
    return 0 if all(not r["status"].startswith("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
