"""Tune every Triton kernel's launch config at a sweep's geometries and write this device's launch table.

    python -m experiments.tune                                  # GPU: the claims' points of sweep=paper
    python -m experiments.tune --geometry nemotron3_super_120b  # one model's claim points (sweep.models=[...])
    python -m experiments.tune --all -- sweep=smoke             # every point of a sweep (Hydra overrides after --)
    TRITON_INTERPRET=1 python -m experiments.tune --dry-run     # CPU: interpreter, tiny models, fake timer

For each point of the kernel experiments (kernel_decode, kernel_spec) whose backend is triton, the method's
cache is built as the sweep builds it (experiments/harness: the same Workload, allocate, step / verify /
commit), and each phase of its step (AR: step; spec: verify, then commit after one verify; replay_spec also a
chain-tree verify, below) is run once under `launch_table.record()` to learn which kernels it launches and at
which key. Each kernel that has a search
space (its declaration's, below) is then tuned once per (kernel, key, state dtype) by replayssm/tuning.py: state-safe
(every cache tensor and the output are snapshotted and restored), each candidate checked against the default
config's outputs and state, then timed with triton.testing.do_bench (cold L2, 5 ms warm-up, 20 ms of
repetitions: the same budget for every candidate of every kernel, ReplaySSM and baselines alike). The
fastest candidate goes into replayssm/launch_tables/<device>.json (only the fields it changes, with its time,
the default's time and the batch it was tuned at); every later run on that GPU model reads it, and rows say
launch_source=tuned.

The search spaces, the dropped candidates and the keys are the kernels' declarations in
replayssm/launch_registry.py (one entry per kernel: name, key fields, default rule, space, drops; a KDA build of
a GDN kernel is its own kda_ entry, tuned apart, so a GDN entry is never applied to a KDA launch). Triton-only:
block sizes, warps, stages where a loop can pipeline; a candidate larger than the padded dimension it tiles is
left out. Less the candidates that spill in the AOT build: the declarations' drops (GDN / Mamba-2 at the checked
geometries), and every kda_ candidate that spills at Kimi-Linear's geometry for sm_90 or sm_100 in any Triton
version of the AOT audit record (experiments/tune_audit.json, written by experiments/report/kernels/tune_audit.py;
tests/report/test_tune_audit.py fails when a candidate of a kda_ space is not in the record or the record no
longer matches the compiler).
The tree verifies are tuned at the spec points (replay_spec's third phase, tree_verify): the family's
tree_verify on the point's ring with a chain tree of spec_T nodes, keyed like the chain verify (the window is N);
the ancestor mask is a constexpr switch, so tiles and registers depend on N and not on the tree's shape.
A tree of another N (kernel_tree's shapes; that experiment has no GPU path yet) runs the default rule.
Not tuned (their own names, so they always run the default rule): the materialize kernels
(<family>_spec_materialize, gdn_/kda_replay_materialize), tree_ring_move and the cursor kernels (one warp, a
few bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace

import torch

from experiments.harness.budget import claim_rank
from experiments.harness.entry import load_config
from experiments.harness.fixture import PointFixture
from experiments.harness.methods import REGISTRY
from experiments.harness.points import Plan, Point, expand
from experiments.harness.workload import Workload
from experiments.published import CLAIMS
from replayssm import launch_registry, launch_table, tuning
from replayssm.checks import interpreter_active, kernel_arch

EXPERIMENTS = ("kernel_decode", "kernel_spec")
MAX_CANDIDATES = 18           # the budget: no kernel's space is larger (each candidate: one do_bench)


# The AOT audit record of the tuning spaces: {triton version: {geometry: {kernel: {config label: {"sm_<t>":
# [registers, spill bytes]}}}}} (experiments/report/kernels/tune_audit.py; the KDA spaces at Kimi-Linear).
TUNE_AUDIT = Path(__file__).with_name("tune_audit.json")
AUDITED_FAMILIES = ("kda_",)      # kernels whose drops come from the record rather than their declaration


def audited_spills(record: dict | None = None) -> dict[tuple, str]:
    """Dropped candidates of every candidate that spills in the audit record (any version, geometry, target),
    keyed (kernel, route or None, fields), with the reason: a record kernel "name[route]" (a route-keyed kernel,
    audited per route) drops it at that route, a plain "name" at every route (None)."""
    if record is None:
        record = json.loads(TUNE_AUDIT.read_text()) if TUNE_AUDIT.is_file() else {}
    reasons: dict[tuple, list[str]] = {}
    for version, geos in sorted(record.items()):
        for geo, kernels in sorted(geos.items()):
            for name, configs in sorted(kernels.items()):
                kernel, _, route = name.removesuffix("]").partition("[")
                for label, targets in configs.items():
                    fields = tuple((k, int(v) if v.lstrip("-").isdigit() else v)
                                   for k, v in (part.split("=", 1) for part in label.split(",")))
                    for target, (regs, spill) in sorted(targets.items()):
                        if spill:
                            reasons.setdefault((kernel, route or None, fields), []).append(
                                f"{target} spills {spill} B ({regs} registers; triton {version}, {geo})")
    return {key: "; ".join(why) for key, why in reasons.items()}


# Every dropped candidate: the declarations' own (replayssm/launch_registry.py) and the audit record's.
TUNE_DROPPED: dict[tuple, str] = {(name, route, fields): why for name, k in launch_registry.KERNELS.items()
                                  for (route, fields), why in k.dropped.items()}
TUNE_DROPPED.update(audited_spills())


def dropped_reason(kernel: str, key: dict, cand) -> str | None:
    """Why candidate `cand` of `kernel` is not in the space at `key` (TUNE_DROPPED), or None."""
    if not isinstance(cand, dict):
        return None
    fields = tuple(cand.items())      # an entry under route None holds for every route of the kernel
    return TUNE_DROPPED.get((kernel, key.get("route"), fields)) or TUNE_DROPPED.get((kernel, None, fields))


def candidates(kernel: str, key: dict, include_dropped: bool = False) -> list:
    """The search space of `kernel` at `key` (its declaration's; less TUNE_DROPPED unless `include_dropped`,
    which the AOT report builds to keep the reasons true); [] when it has none."""
    space = launch_registry.spec(kernel).candidates(key)
    return space if include_dropped else [c for c in space if dropped_reason(kernel, key, c) is None]


def kernels_of(p: Point) -> tuple[str, ...]:
    """The tunable kernels point `p`'s method launches per step (what `discover` finds at run time; the budget
    estimate counts tuning jobs from it without running anything)."""
    route = "fused" if p.route is None and p.method == "replay_spec" else p.route   # a spec point's default form
    return launch_registry.kernels_of(p.method, p.family, route)


def static_key(kernel: str, p: Point, geometry) -> dict:
    """The key `kernel`'s launch-config function resolves at point `p`: the declaration's key function, the
    one the launch function calls."""
    if not hasattr(geometry, "__dict__"):
        geometry = SimpleNamespace(**dict(geometry))
    return launch_registry.key(kernel, geometry, L=p.buffer_len, route=p.route, window=p.spec_T,
                               history=p.history_len)


def jobs(plans: list[tuple[Plan, list[Point]]]) -> dict[tuple, tuple[int, Point]]:
    """{(kernel, key, state dtype): (candidates, first point)} the tuner would run for these points."""
    out: dict[tuple, tuple[int, Point]] = {}
    for plan, points in plans:
        for p in points:
            geometry = plan.models[p.model_key].geometry
            for kernel in kernels_of(p):
                key = static_key(kernel, p, geometry)
                job = (kernel, launch_table.entry_key(key, p.state_dtype))
                if job not in out:
                    out[job] = (len(candidates(kernel, key)), p)
    return out


def touched_tensors(cache, *extra: torch.Tensor) -> list[torch.Tensor]:
    """Every tensor a call on `cache` may write: the cache itself when it is a tensor (a baseline's state
    pool), else its tensor attributes (and those of an attribute object, e.g.
    a shared cursor), plus `extra` (the output buffer); each storage once."""
    out, seen = [], set()

    def add(t):
        if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)

    for value in [cache] if isinstance(cache, torch.Tensor) else vars(cache).values():
        if isinstance(value, torch.Tensor):
            add(value)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for inner in vars(value).values():
                add(inner)
    for t in extra:
        add(t)
    return out


@dataclass
class Phase:
    name: str            # step | verify | commit
    call: object         # () -> output tensor(s) or None
    touched: list


def phases(p: Point, plan: Plan, device: str, seed: int = 0) -> list[Phase]:
    """The calls of one point's step, on a freshly built cache (the point fixture, experiments/harness/fixture.py,
    as the gate and the timed stack build it: the point's pool and cursor layout)."""
    method = REGISTRY[p.method]
    gen = torch.Generator().manual_seed(seed)
    wl = Workload(plan.models[p.model_key], p, device, gen)
    fx = PointFixture.build(method, method.api(p.family), wl, p)
    fns, cache, slots, kw, out = fx.fns, fx.caches[0], fx.slots, fx.kw, fx.out
    if method.kind == "ar":

        def step():
            method.step(fns, cache, p, kw, slots, out)
            return out
        return [Phase("step", step, touched_tensors(cache, out))]
    counts = torch.randint(1, p.spec_T + 1, (p.batch,), generator=gen, dtype=torch.int32).to(device)
    A = wl.params.get("A")

    def verify():
        method.verify(fns, cache, p, kw, slots, out)
        return out

    def commit():
        method.commit(fns, cache, p, counts, slots, A)

    def commit_after_verify():      # the commit phase starts from a verified window (the stash is filled)
        with launch_table.use_defaults():
            verify()
        return commit

    out_phases = [Phase("verify", verify, touched_tensors(cache, out)),
                  Phase("commit", commit_after_verify, touched_tensors(cache, out))]
    if p.method == "replay_spec" and p.route is None:      # the tree verify is tuned on the fused form's points
        out_phases.append(Phase("tree_verify", _chain_tree_verify(p, cache, kw, slots, out),
                                touched_tensors(cache, out)))
    return out_phases


def _chain_tree_verify(p: Point, ring, kw: dict, slots, out):
    """The family's tree verify on the spec point's ring, with a chain tree of spec_T nodes (parents s - 1).

    The tree verifies (<family>_replay_tree) are tuned at the spec points' geometry, not at kernel_tree's tree
    points (that experiment has no GPU path yet): the tree kernel is the chain verify with the ancestor mask as
    a constexpr switch, so its tiles, registers and traffic depend on N (= the window, part of the key) and
    not on the tree's shape; a chain of N nodes times the same work as any N-node tree. A tree run at an N no
    spec point has (kernel_tree's binary2, 2x4, full2ary15) keeps the default rule."""
    tree_verify = import_module(f"replayssm.{p.family}").tree_verify
    parents = torch.arange(-1, p.spec_T - 1, dtype=torch.int32, device=slots.device)

    def call():
        tree_verify(ring, **kw, parents=parents, slots=slots, out=out, backend=p.backend)
        return out
    return call


def discover(phase: Phase) -> tuple[list[launch_table.Launch], object]:
    """The launches of one run of `phase` (under the defaults, state restored after) and the call to tune."""
    snap = tuning.Snapshot(phase.touched)
    call = phase.call
    if phase.name == "commit":
        call = phase.call()           # runs one verify: the snapshot below is taken after it
        snap = tuning.Snapshot(phase.touched)
    try:
        with launch_table.use_defaults(), launch_table.record() as log:
            call()
    finally:
        snap.restore()
    return log, call


def tune_points(plan: Plan, points: list[Point], *, timer=None, tol: float = 1e-4, log=print,
                entries: dict | None = None) -> dict:
    """Tune every (kernel, key, state dtype) the points launch that `entries` does not have yet; returns the
    table entries {kernel: {entry key: {...}}}, `entries` extended (nothing written)."""
    entries = {} if entries is None else entries
    for p in points:
        for phase in phases(p, plan, p.device):
            tune_phase(phase, p, entries, timer=timer, tol=tol, log=log)
    return entries


def tune_phase(phase: Phase, p: Point, entries: dict, *, timer=None, tol: float = 1e-4, log=print) -> dict:
    """Tune each kernel one phase launches (that has a space and no entry yet) into `entries`."""
    launches, call = discover(phase)
    for launch in {(x.kernel, x.key): x for x in launches}.values():
        if launch.key in entries.get(launch.kernel, {}):
            continue
        key = dict(part.split("=", 1) for part in launch.key.split("|")[0].split(",") if part)
        space = candidates(launch.kernel, {k: int(v) if v.lstrip("-").isdigit() else v for k, v in key.items()})
        if not space:
            continue
        if len(space) > MAX_CANDIDATES:
            raise ValueError(f"{launch.kernel}: {len(space)} candidates > the budget of {MAX_CANDIDATES}")
        t0 = time.perf_counter()
        trials = tuning.tune(launch.kernel, call, phase.touched, space, timer=timer, tol=tol)
        best, default = tuning.best(trials), launch.config
        cfg = launch_table.fields(launch_table.apply(default, launch_table.fields(best.config)))
        changed = {k: v for k, v in cfg.items() if default.get(k) != v}
        entries.setdefault(launch.kernel, {})[launch.key] = {
            "config": changed, "ms": best.ms, "default_ms": tuning.default_ms(trials), "candidates": len(space),
            "rejected": sum(1 for t in trials if t.ms is None), "batch": p.batch, "model": p.model,
            "method": p.method}
        log(f"{launch.kernel:22s} {launch.key:48s} {launch_table.config_label(changed) or '(default)':28s} "
            f"{best.ms:.4g} ms (default {tuning.default_ms(trials):.4g} ms; {len(space)} candidates, "
            f"{time.perf_counter() - t0:.1f} s)")
    return entries


def plan_points(experiments, overrides, claims_only: bool) -> list[tuple[Plan, list[Point]]]:
    """Per experiment: its plan and the triton points to tune (one per configuration, its largest batch;
    with `claims_only` the points that state a published claim's setting)."""
    out = []
    for name in experiments:
        plan = expand(load_config(name, list(overrides)))
        chosen: dict[tuple, Point] = {}
        for p in plan.points:
            if p.backend != "triton" or p.method.startswith("peer:"):
                continue
            if claims_only and claim_rank(p, CLAIMS) == 2:
                continue
            sig = (p.model_key, p.method, p.route, p.buffer_len, p.spec_T, p.history_len, p.state_dtype, p.act_dtype)
            if sig not in chosen or p.batch > chosen[sig].batch:
                chosen[sig] = p
        out.append((plan, list(chosen.values())))
    return out


def fake_timer():
    """The dry run's timer: runs the call once and returns 1, 2, 3 ... ms, so the first candidate to pass
    wins (after the default's reference trial). It checks the procedure, never a speed."""
    count = [0]

    def timer(fn):
        fn()
        count[0] += 1
        return float(count[0])
    return timer


def main(argv=None) -> int:
    args, overrides = _parse(argv)
    if args.geometry:
        overrides = [*overrides, f"sweep.models=[{','.join(args.geometry)}]"]
    if args.dry_run:
        if not interpreter_active():
            print("tune --dry-run: set TRITON_INTERPRET=1 (the kernels run in the interpreter)", file=sys.stderr)
            return 2
        overrides = ["sweep=smoke", "sweep.on_cpu.backend=triton", "sweep.on_cpu.batch=[2]", *overrides]
    elif not torch.cuda.is_available():
        print("tune: needs a CUDA GPU (the interpreter's timings mean nothing); --dry-run checks the procedure",
              file=sys.stderr)
        return 2
    elif not any(o.startswith("sweep=") for o in overrides):
        overrides = ["sweep=paper", *overrides]
    arch = kernel_arch("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    device = launch_table.device_name(arch)
    directory = args.out or (Path(tempfile.mkdtemp(prefix="tune-dry-")) if args.dry_run else launch_table.table_dir())
    entries: dict[str, dict] = {}
    t0 = time.perf_counter()
    claims_only = not (args.all or args.dry_run)
    for plan, points in plan_points(args.experiment or EXPERIMENTS, overrides, claims_only=claims_only):
        print(f"{plan.experiment}: {len(points)} points to tune on {device}")
        tune_points(plan, points, timer=fake_timer() if args.dry_run else None, entries=entries)
    meta = {"triton": _version("triton"), "torch": torch.__version__, "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
            time.gmtime()), "dry_run": bool(args.dry_run), "tune_seconds": round(time.perf_counter() - t0, 1)}
    path = launch_table.save(device, entries, meta, Path(directory))
    print(f"tune: {sum(len(v) for v in entries.values())} entries for {device} -> {path}")
    return 0


def _version(name: str) -> str:
    try:
        return __import__(name).__version__
    except Exception:  # noqa: BLE001
        return "?"


def _parse(argv):
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="interpreter, tiny models, fake timer, a temp dir")
    ap.add_argument("--experiment", action="append", choices=EXPERIMENTS)
    ap.add_argument("--all", action="store_true", help="every triton point, not only the claims' settings")
    ap.add_argument("--geometry", action="append", metavar="MODEL",
                    help="only these models (conf/model names, @tpN allowed): sweep.models=[...]")
    ap.add_argument("--out", type=Path, help=f"table directory (default: ${launch_table.TABLE_ENV} or "
                                             "replayssm/launch_tables)")
    return ap.parse_args(argv), overrides


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
