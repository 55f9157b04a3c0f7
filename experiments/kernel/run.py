"""The kernel experiments' runner (kernel_decode, kernel_spec) as a plain function: config -> rows on disk.
Hydra only drives it (experiments/kernel_decode.py, kernel_spec.py through harness/entry.hydra_entry); tests
and notebooks call `run_experiment(load_config(...))` without the Hydra runtime:

    from experiments.harness.entry import load_config
    from experiments.kernel.run import run_experiment
    result = run_experiment(load_config("kernel_decode", ["sweep=cpu", "sweep.batch=[1]"]))
    result.rows, result.run_dir

Per point: skip if the method cannot run here; correctness gate against the float64 oracle
(status=wrong, no time, when it fails); build a stack of layers, each with its own cache pool (GPU, cold
L2: enough layers to exceed l2_factor x L2); time whole cycles (AR replay: L steps from write_pos 0, plus
the lone flush step; spec: `spec_steps` verify+commit steps of the acceptance schedule, >= 3 flushes);
derive bandwidth from the byte model, footprint and tokens/s. Any exception becomes a row (oom / error)
and the sweep goes on.

Launch configs: every launch a point resolves (replayssm/launch_table.py) is recorded; the row says where they
came from (launch_source: tuned | default | mixed | n/a) and what they were (launch_config). A baseline point
whose kernels ran a tuned config is measured a second time under the default configs
(`launch_table.use_defaults`), as its own row (launch_source=default, config_hash + DEFAULT_SUFFIX), so the
report can give every ratio against the tuned baseline and, beside it, against the default one. The two are
appended in one write; a run directory that still holds a tuned row without its default row (written before
that, or torn by a kill) gets just the default row on resume (`missing_defaults`).
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from experiments.harness import memory, timing
from experiments.harness.bandwidth import cold_point
from experiments.harness.budget import Budget
from experiments.harness.check import gate
from experiments.harness.entry import config_dict
from experiments.harness.env import collect_env, resolve_hardware
from experiments.harness.fixture import PointFixture
from experiments.harness.methods import REGISTRY, Method, MethodUnavailable
from experiments.harness.points import CONF_DIR, Plan, Point, device_sweep, expand
from experiments.harness.serving_shape import cursor_period
from experiments.harness.store import COLUMNS, RunStore, RunTable, failure, parse_shard, run_pending, shard_of
from experiments.harness.workload import Workload
from experiments.published import CLAIMS
from replayssm import launch_table
from replayssm.checks import interpreter_active, kernel_arch

# Methods timed a second time under the default launch configs when their first row ran tuned ones.
BASELINE_METHODS = ("baseline_ar", "baseline_spec", "commit_replay_spec")
DEFAULT_SUFFIX = "-default"


@dataclass
class RunResult:
    run_dir: Path
    run_id: str
    rows: list[dict]                 # the rows this invocation wrote
    resumed_skipped: int = 0         # points already in the run directory (resume)
    env: dict = field(default_factory=dict)


@dataclass
class Context:
    plan: Plan
    run_id: str
    hardware: dict
    copy_GBps: float


def run_experiment(cfg, *, progress: bool | None = None) -> RunResult:
    """Validate, then check and time every point of `cfg`, appending rows to the run directory."""
    data = config_dict(cfg)
    plan = expand(data)                                   # every ValueError happens here, before any work
    threads_before = torch.get_num_threads()
    threads = device_sweep(data["sweep"], plan.device).get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    try:
        return _run(data, plan, progress)
    finally:
        torch.set_num_threads(threads_before)


def _run(data: dict, plan: Plan, progress: bool | None) -> RunResult:
    settings = plan.timing
    shard, shards = parse_shard(data)
    hardware = resolve_hardware(data.get("hardware") or {}, plan.device, CONF_DIR)
    store = RunStore.open(data, hardware["name"])
    # this process's points: its shard (config_hash mod shard.count), less what the run already has
    done = store.done_hashes()
    budget = Budget.of(data)
    mine = [p for p in plan.points if shard_of(p.config_hash(), shards) == shard]
    todo = budget.order([p for p in mine if p.config_hash() not in done], CLAIMS)
    redo = missing_defaults(store, mine, done)     # recorded tuned baselines whose default row is absent
    skipped = len(mine) - len(todo)
    if not todo and not redo:                      # nothing to run: no provenance file, no bandwidth probe
        return RunResult(run_dir=store.run_dir, run_id=store.run_id, rows=[], resumed_skipped=skipped)
    if plan.device == "cuda" and shards > 1:       # one process per GPU: shard i on local GPU i mod count
        torch.cuda.set_device(shard % torch.cuda.device_count())
    copy_bytes = int(settings.get("copy_bytes", 1 << 30))
    probe = None
    if plan.device == "cpu":
        # cold CPU points from a measured bandwidth plateau, not from sysfs (experiments/harness/bandwidth.py)
        probe = cold_stack_bytes(hardware, settings)
    if probe is not None:
        copy_GBps = probe["plateau_copy_GBps"]
    else:
        copy_GBps = timing.measure_copy_GBps(plan.device, copy_bytes if plan.device == "cuda" else copy_bytes // 16)
    env = collect_env(device=plan.device, hardware=hardware, timing=settings, sweep=data["sweep"])
    if probe is not None:
        env["cpu_cold_probe"] = probe
    env.update(run_id=store.run_id, copy_GBps=copy_GBps, copy_bytes=copy_bytes, points=len(plan.points),
               shard={"index": shard, "count": shards, "points": len(mine), "to_run": len(todo)})
    if plan.device == "cpu":
        env["cpu_clock"] = timing.cpu_clock(settings.get("cpu_clock", "auto")).__name__
    env["launch_table"] = launch_table.describe(kernel_arch(plan.device))   # what launch_source=tuned read
    name = store.write_provenance(plan.experiment, env, OmegaConf.to_yaml(data))

    ctx = Context(plan=plan, run_id=store.run_id, hardware=hardware, copy_GBps=copy_GBps)
    rows: list[dict] = []
    show = data.get("progress", True) if progress is None else progress

    host_table = RunTable(store, "host_costs.csv", HOST_COLUMNS, key="config_hash")

    def keep(row: dict) -> bool:
        extra = row.pop("_extra", [])               # the default-launch row of a tuned baseline point
        if store.append(row, extra):                # one write; False: another process wrote this point
            for r in [row, *extra]:
                rows.append(r)
                host = r.pop("_host", {})
                host_table.append_many([{c: r.get(c) for c in HOST_COLUMNS} | host])
            return True
        return False

    # (point, default_only): the missing default rows first (they complete points already recorded), then the
    # points without a row; a default-only item is claimed and keyed by its own config_hash (+ DEFAULT_SUFFIX)
    items = [(p, True) for p in redo] + [(p, False) for p in todo]
    run_pending(items, lambda it: it[0].config_hash() + (DEFAULT_SUFFIX if it[1] else ""),
                lambda it: run_default(it[0], ctx) if it[1] else run_point(it[0], ctx), keep, store.claim,
                experiment=plan.experiment, run_dir=store.run_dir, desc=plan.experiment, show=show,
                stop=budget.expired)
    written = {r["config_hash"] for r in rows}
    skipped += sum(p.config_hash() not in written for p in todo)   # measured meanwhile by another process
    env["host_per_point_s"] = host_summary(host_table.path)
    store.write_json(name, env)
    if plan.device == "cuda":                       # device-wide usage at the end (None when NVML is absent)
        env["nvml_used_bytes_end"] = memory.nvml_used_bytes()
        store.write_json(name, env)
    return RunResult(run_dir=store.run_dir, run_id=store.run_id, rows=rows, resumed_skipped=skipped, env=env)


def cold_stack_bytes(hardware: dict, settings: dict) -> dict | None:
    """CPU: run (or reuse) the bandwidth probe at the run's thread count and size cold stacks past its plateau
    knee: hardware["l2_bytes"] becomes cold_bytes / l2_factor, so the stack rule (layers x layer bytes >=
    l2_factor x l2_bytes) reaches cold_bytes. The sysfs LLC stays in hardware["llc_bytes"] and env.json.
    timing.cpu_cold_probe: cached (default) | fresh | off (off: the sysfs LLC sizes the stack, as before)."""
    probe = cold_point(mode=str(settings.get("cpu_cold_probe", "cached")), llc_bytes=hardware.get("llc_bytes"))
    if probe is None:
        return None
    factor = float(settings["l2_factor"])
    hardware["l2_bytes"] = int(-(-probe["cold_bytes"] // factor))
    hardware["l2_source"] = (f"measured: copy bandwidth plateaus at {probe['plateau_copy_GBps']:.1f} GB/s from "
                             f"{probe['knee_bytes'] >> 20} MiB; cold stacks reach {probe['cold_bytes'] >> 20} MiB "
                             f"({probe['threads']} threads; sysfs LLC {hardware.get('llc_bytes')} B)"
                             + ("" if probe["reached"] else "; plateau not confirmed up to the largest size probed"))
    return probe


HOST_COLUMNS = ["config_hash", "experiment", "model", "method", "batch", "gate_s", "build_s", "capture_s",
                "timing_s", "run_id"]


def host_summary(path: Path) -> dict:
    """Median host seconds per timed point of a run's host_costs.csv: gate, build, capture (warm-up + graph
    capture: GPU), the whole timing call, and build + gate + capture."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["timing_s"]]
    if not rows:
        return {}
    med = {k: statistics.median(float(r[k] or 0) for r in rows) for k in ("gate_s", "build_s", "capture_s",
                                                                         "timing_s")}
    med["host_s"] = statistics.median(sum(float(r[k] or 0) for k in ("gate_s", "build_s", "capture_s"))
                                      for r in rows)
    return med | {"points": len(rows)}


# ------------------------------------------------------------------------------------------------ points

def blank_row(p: Point, run_id: str) -> dict:
    row = {c: None for c in COLUMNS}
    for c in ("experiment", "family", "model", "tp", "method", "route", "backend", "batch", "buffer_len", "spec_T",
              "history_len", "acceptance", "state_dtype", "act_dtype", "context_len", "timing_mode", "l2", "cursors"):
        row[c] = getattr(p, c)
    row["num_slots"] = p.pool_slots
    row.update(compiled=False, threads=torch.get_num_threads(), config_hash=p.config_hash(), run_id=run_id,
               message="", geometry=geometry_label(p.geometry))
    return row


def geometry_label(geometry) -> str:
    """A point's geometry (Point.geometry: sorted (key, value) pairs, or a geometry dataclass) as one cell."""
    if hasattr(geometry, "__dataclass_fields__"):
        geometry = sorted(asdict(geometry).items())
    return " ".join(f"{k}={v}" for k, v in geometry)


def wants_default(method: str, launch_source: str | None) -> bool:
    """Whether a row of `method` that ran `launch_source` configs comes with a default-launch row."""
    return method in BASELINE_METHODS and launch_source in ("tuned", "mixed")


def missing_defaults(store: RunStore, points: list[Point], done: set[str]) -> list[Point]:
    """The points of `points` whose row is recorded and asks for a default-launch row (`wants_default`) that
    the run directory lacks: a run written before the pair became one write, or torn by a kill, keeps the tuned
    row alone, and a resume skips its config_hash; these get just their default row (`run_default`)."""
    if not any(p.method in BASELINE_METHODS and p.config_hash() in done for p in points):
        return []                                   # nothing recorded could need one: rows.csv is not read
    tuned = {r["config_hash"] for r in store.read_rows() if wants_default(r["method"], r["launch_source"])}
    return [p for p in points if p.config_hash() in tuned and p.config_hash() + DEFAULT_SUFFIX not in done]


def run_point(p: Point, ctx: Context) -> dict:
    """One row for one point (and, for a baseline that ran tuned launch configs, its default-config row in
    row["_extra"]); never raises (a failure is the row's status)."""
    with launch_table.record() as launches:
        row = _run_point(p, ctx)
    row["launch_source"], row["launch_config"] = launch_table.summarize(launches)
    if wants_default(p.method, row["launch_source"]):
        row["_extra"] = [run_default(p, ctx)]
    return row


def run_default(p: Point, ctx: Context) -> dict:
    """The default-launch row of baseline point `p` (launch_source=default, config_hash + DEFAULT_SUFFIX)."""
    with launch_table.use_defaults(), launch_table.record() as launches:
        default = _run_point(p, ctx)
    default["launch_source"], default["launch_config"] = launch_table.summarize(launches)
    default["config_hash"] = p.config_hash() + DEFAULT_SUFFIX
    return default


def _run_point(p: Point, ctx: Context) -> dict:
    row = blank_row(p, ctx.run_id)
    method = REGISTRY[p.method]
    notes: list[str] = []
    try:
        reason = method.unavailable(p.family, p.device, p.backend)   # a module that fails to import: error
        if reason:
            row.update(status="skipped", message=reason)
            return row
        memory.reset_peak(p.device)
        status = _measure(p, method, ctx, row, notes)
    except MethodUnavailable as exc:
        status, notes = "skipped", [str(exc)]
    except Exception as exc:  # noqa: BLE001 - a failing point is recorded, the sweep goes on
        status, note = failure(exc)
        notes.append(note)
    finally:
        row["peak_mem_bytes"] = memory.peak_bytes(p.device)
        if p.device == "cuda":
            torch.cuda.empty_cache()
    row.update(status=status, message="; ".join(n for n in notes if n))
    return row


def _measure(p: Point, method: Method, ctx: Context, row: dict, notes: list[str]) -> str:
    plan, settings = ctx.plan, ctx.plan.timing
    spec = plan.models[p.model_key]
    gen = torch.Generator().manual_seed(p.seed * 1_000_003 + int(p.config_hash()[:8], 16))
    wl = Workload(spec, p, p.device, gen)
    acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
    fns = method.api(p.family)

    host = row["_host"] = {}                       # host seconds of this point (host_costs.csv, not rows.csv)
    t0 = time.perf_counter()
    result = gate(method, fns, wl, p, max_batch=int(settings["check_max_batch"]),
                  ar_steps=int(settings["check_ar_steps"]), acceptance=acc)
    host["gate_s"] = time.perf_counter() - t0
    row["rel_err"] = result.rel_err
    notes.append(result.message())
    if not result.ok:
        return "wrong"
    if p.backend == "triton" and p.device == "cpu" and interpreter_active():
        notes.append("Triton interpreter: correctness only, never timed")
        return "ok"

    t0 = time.perf_counter()
    stack = Stack(method, wl, p, acc, settings, ctx.hardware)
    host["build_s"] = time.perf_counter() - t0
    notes.append(stack.note)
    row["cache_resident"] = stack.cache_resident
    timing.CAPTURE_SECONDS[0] = 0.0
    t0 = time.perf_counter()
    best, flush = _time_variants(stack, method, wl, p, settings, notes, row)
    host.update(timing_s=time.perf_counter() - t0, capture_s=timing.CAPTURE_SECONDS[0])
    row.update(median_us=best.median_us, p20_us=best.p20_us, p80_us=best.p80_us,
               flush_us=flush.median_us if flush else None)
    mean_acc = float(stack.counts.float().mean()) if stack.counts is not None else None
    row["mean_accepted"] = mean_acc
    row["footprint_bytes"] = memory.footprint_per_sequence(method.footprint(stack.caches[0]), stack.num_slots)
    row["tokens_per_s"] = p.batch * (mean_acc or 1.0) / (best.median_us * 1e-6)
    try:
        traffic = method.traffic(p, wl, stack.counts.cpu() if stack.counts is not None else None)
    except Exception as exc:  # noqa: BLE001 - the byte model is derived data: its failure is a note
        traffic = None
        notes.append(f"bytes_model failed: {type(exc).__name__}: {str(exc)[:120]}")
    if traffic is None:
        row["bytes_model"] = math.nan
        if not notes[-1].startswith("bytes_model failed"):
            notes.append("bytes_model: not modelled (replayssm.traffic missing or no entry)")
    else:
        row["bytes_model"] = traffic.total * p.batch
        row["byte_model_ratio"] = _partner_ratio(method, p, wl, stack.counts, traffic, notes)
        gbps = row["bytes_model"] / (best.median_us * 1e3)
        row["achieved_GBps"] = gbps
        row["pct_peak_measured"] = 100 * gbps / ctx.copy_GBps if ctx.copy_GBps else None
        peak = ctx.hardware.get("peak_hbm_TBps")
        row["pct_peak_datasheet"] = 100 * gbps / (peak * 1e3) if peak else None
    return "ok"


def _partner_ratio(method: Method, p: Point, wl: Workload, counts, traffic, notes: list[str]) -> float | None:
    """The byte model's partner / method bytes per step at this point (the partner is what aggregate pairs
    the method with: replay_ar -> baseline_ar, replay_spec -> baseline_spec, ...): the speedup a purely
    bandwidth-bound method would reach. Both see the same acceptance schedule, so per step = per token.
    None for a method without a partner (the baselines, peers)."""
    if method.partner is None:
        return None
    try:
        other = REGISTRY[method.partner].traffic(p, wl, counts.cpu() if counts is not None else None)
    except Exception as exc:  # noqa: BLE001 - derived data: a note, not a failed point
        notes.append(f"byte_model_ratio failed: {type(exc).__name__}: {str(exc)[:120]}")
        return None
    if other is None or not traffic.total:
        return None
    return float(other.total / traffic.total)


class Stack:
    """`layers` caches (each its own pool of the point's `num_slots` slots, primed to the point's cursor layout
    by experiments/harness/fixture.py) with shared inputs; the cycle to time."""

    def __init__(self, method: Method, wl: Workload, p: Point, acc, settings: dict, hardware: dict):
        self.method, self.wl, self.p = method, wl, p
        # the states are drawn on the device: a stack sized past the LLC / L2 holds gigabytes
        self.fx = PointFixture.build(method, method.api(p.family), wl, p, fast_state=True)
        self.num_slots = self.fx.num_slots
        first = self.fx.caches[0]
        budget = memory.free_bytes(p.device)
        budget = int(budget * float(settings["hbm_budget_frac"])) if budget is not None else None
        self.layers, note = memory.stack_layers(method.footprint(first), l2=p.l2, l2_bytes=hardware.get("l2_bytes"),
                                                l2_factor=float(settings["l2_factor"]),
                                                max_layers=int(settings["max_layers"]), budget_bytes=budget,
                                                unreachable_one=p.device == "cpu")
        for _ in range(self.layers - 1):
            self.fx.add_cache()
        self.caches = self.fx.caches
        # a stack that stayed under l2_factor x L2 (LLC on a CPU) is timed from cache: the row says so
        self.cache_resident = memory.cache_resident(self.layers, method.footprint(first), l2=p.l2,
                                                    l2_bytes=hardware.get("l2_bytes"),
                                                    l2_factor=float(settings["l2_factor"]))
        self.note = f"layers={self.layers}" + (f" ({note})" if note else "")
        self.slots, self.kw, self.out = self.fx.slots, self.fx.kw, self.fx.out
        self.A = wl.params.get("A")
        self.acc = acc
        self.counts = None
        if method.kind == "ar":
            self.steps = p.buffer_len if method.uses_buffer else 1
        else:
            self.steps = self._spec_steps(int(settings["spec_steps"]))
            self.counts = acc.sample(p.spec_T, p.batch, self.steps, wl.generator).to(p.device)

    def _spec_steps(self, requested: int) -> int:
        """At least `requested`, and enough to pass 3 flushes of the ring at one accepted token per step."""
        if not self.method.uses_history:
            return requested
        between = self.p.history_len - self.p.spec_T + 2
        return max(requested, 3 * between)

    def cycle(self, fns: dict):
        m, p, caches, kw, slots, out = self.method, self.p, self.caches, self.kw, self.slots, self.out
        if m.kind == "ar":
            def run():
                for _ in range(self.steps):
                    for c in caches:
                        m.step(fns, c, p, kw, slots, out)
        else:
            counts, A = self.counts, self.A

            def run():
                for i in range(self.steps):
                    for c in caches:
                        m.verify(fns, c, p, kw, slots, out)
                        m.commit(fns, c, p, counts[i], slots, A)
        return run

    def one_step(self, fns: dict):
        m, p, kw, slots, out = self.method, self.p, self.kw, self.slots, self.out

        def run():
            for c in self.caches:
                m.step(fns, c, p, kw, slots, out)
        return run


def _time_variants(stack: Stack, method: Method, wl: Workload, p: Point, settings: dict, notes: list[str], row: dict):
    """Time eager and/or compiled (sweep.torch_compile), keep the faster; then the lone flush step (AR replay).

    A compiled variant must pass the gate too; with `auto` a variant that fails to compile or to pass is
    dropped with a note, with `true` the failure is the point's error."""
    fns = method.api(p.family)
    variants = {"false": [False], "true": [True], "auto": [False, True]}[p.torch_compile]
    timed: dict[bool, timing.Timing] = {}
    apis: dict[bool, dict] = {}
    for compiled in variants:
        use = fns
        if compiled:
            try:
                use = timing.maybe_compile(fns, settings.get("compile_backend", "inductor"))
                check = gate(method, use, wl, p, max_batch=int(settings["check_max_batch"]),
                             ar_steps=int(settings["check_ar_steps"]), acceptance=stack.acc)
                if not check.ok:
                    raise RuntimeError(f"compiled variant failed the gate: {check.message()}")
            except Exception as exc:  # noqa: BLE001
                if p.torch_compile == "true":
                    raise
                notes.append(f"torch.compile dropped: {type(exc).__name__}: {str(exc)[:120]}")
                continue
        apis[compiled] = use
        timed[compiled] = _time_cycle(stack.cycle(use), stack.steps * stack.layers, p, settings)
    compiled = min(timed, key=lambda k: timed[k].median_us)
    row["compiled"] = compiled
    if len(timed) > 1:
        notes.append(f"eager {timed[False].median_us:.4g} us vs compiled {timed[True].median_us:.4g} us")
    flush = None
    if method.flush_cursor(stack.caches[0]) is not None:
        # One step with every row at write position h, for h = 0, L/2 and L-1 (the fold: flush_us): the cycle's
        # median is their mean over the L positions, and the spread between them is what a staggered batch
        # averages out. The last one resets write_pos to 0: the caches are back at the start of a cycle.
        by_h = {}
        for h in sorted({0, p.buffer_len // 2, p.buffer_len - 1}):
            def prepare(h=h):
                for c in stack.caches:
                    method.flush_cursor(c).fill_(h)
            by_h[h] = _time_prepared(prepare, stack.one_step(apis[compiled]), stack.layers, p, settings)
        flush = by_h[p.buffer_len - 1]
        row["step_h0_us"] = by_h[0].median_us
        row["step_hmid_us"] = by_h[p.buffer_len // 2].median_us
    elif method.kind == "spec" and method.uses_history:
        by_h = _time_ring_positions(stack, method, p, apis[compiled], settings)
        period = cursor_period(method, p)
        flush = by_h[period - 1]
        row["step_h0_us"] = by_h[0].median_us
        row["step_hmid_us"] = by_h[period // 2].median_us
    return timed[compiled], flush


def _time_ring_positions(stack: Stack, method: Method, p: Point, fns: dict, settings: dict) -> dict:
    """A spec ring's window (verify + commit of one accepted token) with every row at ring position h, for
    h = 0 (verify rows: nothing to fold), the middle, and the last position before the early flush (fold
    rows: every row folds its buffer into the checkpoint). Each position is reached through the method's own
    steps from a fresh ring (cursors zeroed, as set_state leaves them), then the cursors are saved and
    copied back before every timed repetition, so each repetition starts at the same positions."""
    period = cursor_period(method, p)
    ones = torch.ones(p.batch, dtype=torch.int32, device=p.device)
    out = {}
    for h in sorted({0, period // 2, period - 1}):
        for c in stack.caches:
            for t in method.cursor_tensors(c):
                t.zero_()
            stack.fx.prime(c, [h] * p.batch)
        saved = [[t.clone() for t in method.cursor_tensors(c)] for c in stack.caches]

        def prepare(saved=saved):
            for c, cursors in zip(stack.caches, saved):
                for t, v in zip(method.cursor_tensors(c), cursors):
                    t.copy_(v)

        def window():
            for c in stack.caches:
                method.verify(fns, c, p, stack.kw, stack.slots, stack.out)
                method.commit(fns, c, p, ones, stack.slots, stack.A)
        out[h] = _time_prepared(prepare, window, stack.layers, p, settings)
    return out


def _time_cycle(cycle, work: int, p: Point, settings: dict) -> timing.Timing:
    if p.device == "cuda":
        return timing.time_gpu(cycle, work, timing_mode=p.timing_mode, l2=p.l2,
                               warmup_ms=float(settings["warmup_ms"]), rep_ms=float(settings["rep_ms"]))
    return timing.time_cpu(cycle, work, warmup=int(settings["cpu_warmup"]), repeats=int(settings["cpu_repeats"]),
                           min_sample_us=float(settings["cpu_min_sample_us"]),
                           clock=timing.cpu_clock(settings.get("cpu_clock", "auto")))


def _time_prepared(prepare, step, work: int, p: Point, settings: dict) -> timing.Timing:
    if p.device == "cuda":
        return timing.time_gpu_prepared(prepare, step, work, timing_mode=p.timing_mode, l2=p.l2,
                                        warmup_ms=float(settings["warmup_ms"]), rep_ms=float(settings["rep_ms"]))
    return timing.time_cpu_prepared(prepare, step, work, warmup=int(settings["cpu_warmup"]),
                                    repeats=int(settings["cpu_repeats"]),
                                    clock=timing.cpu_clock(settings.get("cpu_clock", "auto")))


# ----------------------------------------------------------------------------------------------- summary

def summarize(rows: list[dict], limit: int = 200) -> str:
    """A plain-text table of rows: the config keys that vary, the median time and the status."""
    if not rows:
        return "(no rows)"
    head = ["model", "tp", "batch", "pool", "L/T", "acc", "method", "route", "cursors", "median_us", "flush_us",
            "GB/s", "status"]
    lines = []
    for r in rows[:limit]:
        lines.append([r["model"], r["tp"], r["batch"], r.get("num_slots") or r["batch"], _window(r),
                      r["acceptance"] or "", r["method"], r["route"] or "", r.get("cursors") or "",
                      _fmt(r["median_us"]), _fmt(r["flush_us"]), _fmt(r["achieved_GBps"]), r["status"]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    text = [fmt.format(*head)] + [fmt.format(*map(str, line)) for line in lines]
    if len(rows) > limit:
        text.append(f"... {len(rows) - limit} more rows")
    text.append("status: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(text)


def _window(r: dict) -> str:
    """The L/T cell: "L=16" (AR replay), "T=4 B=16" (spec with a history ring), "T=4" (spec without one)."""
    if r.get("buffer_len") is not None:
        return f"L={r['buffer_len']}"
    parts = [f"{k}={r[c]}" for k, c in (("T", "spec_T"), ("B", "history_len")) if r.get(c) is not None]
    return " ".join(parts)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.4g}"
