"""Time budget of a sweep: the estimate printed before a GPU paper sweep starts, the claims-first order of its
points, and the deadline that stops it cleanly (`BUDGET_MIN=N make reproduce`).

    python -m experiments.harness.budget                 # estimate the GPU paper sweep (runs on a CPU box too)
    python -m experiments.harness.budget --calibrate     # re-measure the host constants here -> budget.json

The estimate of one kernel point is its host work plus its device time:
    host   = gate + build (per layer) + launches x host cost per call x (2 warm-up cycles + 1 captured)
             per timed variant (a ReplaySSM AR point has 3: its cycle, and prepare+flush / prepare alone)
    device = per variant: do_bench's warmup_ms + rep_ms + 5 estimate cycles, a cycle being
             steps x layers x batch x (state read + write) / copy bandwidth (the baseline's bytes: an upper
             bound for the replay methods), plus filling the layer stack once (bytes / bandwidth)
The host constants are measured on the machine that runs --calibrate (experiments/harness/budget.json
records which, with the commit and date): the cost of one method call at tiny shapes with the torch backend
(an upper-bound proxy for one Triton launch's host path, which cannot run without a GPU driver), the gate
and the build of a layer at tiny shapes, and a hybrid model's build per layer. The device bandwidth is the
target's measured device copy (h200: 4.3 TB/s, given in the GPU box's description), never a timing.
Whole-model points (e2e_decode, serving) count their model builds (3 per gated point: the gate's two small
models and the timed one) and their timing windows; the accuracy study counts its steps x calls.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CALIBRATION = Path(__file__).with_name("budget.json")
TARGETS = {"h200": {"copy_TBps": 4.3, "l2_bytes": 52428800, "hbm_bytes": 141e9},
           "h100": {"copy_TBps": 3.0, "l2_bytes": 52428800, "hbm_bytes": 80e9}}
PAPER_MODELS = "[nemotron3_nano_4b,nemotron3_super_120b,nemotron3_ultra_550b@tp2,qwen35_4b,qwen35_122b_a10b]"
CALLS_PER_STEP = {"ar": 1, "spec": 2}                 # AR: step; spec: verify + commit


# ------------------------------------------------------------------------------------ claims-first order

def _claims() -> tuple:
    """scripts/published.py's CLAIMS (scripts/ is not a package: imported by path)."""
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from published import CLAIMS

    return CLAIMS


def claim_rank(point, claims=None) -> int:
    """0: the point is a stated setting of a headline claim; 1: of any claim; 2: it answers none. A claim's
    setting is its experiment, model (if named), batch, buffer_len and spec_T (those it states)."""
    rank = 2
    for c in claims if claims is not None else _claims():
        stated = [(c.batch, point.batch), (c.buffer_len, point.buffer_len or getattr(point, "history_len", None)),
                  (c.spec_T, point.spec_T)]
        if c.experiment != point.experiment or not any(want is not None for want, _ in stated):
            continue
        if c.models and not any(point.model.startswith(m) for m in c.models):
            continue
        if all(want is None or want == got for want, got in stated):
            rank = min(rank, 0 if c.headline else 1)
    return rank


def claims_first(points: list) -> list:
    """The points in claim-rank order (stable: the sweep's own order within a rank)."""
    claims = _claims()
    return sorted(points, key=lambda p: claim_rank(p, claims))


@dataclass(frozen=True)
class Budget:
    """`budget:` of the config: deadline (unix seconds, null: none), claims_first (order points by claim)."""

    deadline: float | None = None
    claims_first: bool = False

    @classmethod
    def of(cls, data: dict) -> Budget:
        b = data.get("budget") or {}
        deadline = b.get("deadline")
        if deadline is not None and not isinstance(deadline, (int, float)):
            raise ValueError(f"budget.deadline: {deadline!r}; expected unix seconds or null")
        return cls(deadline=float(deadline) if deadline is not None else None,
                   claims_first=bool(b.get("claims_first", False)))

    def expired(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def order(self, points: list) -> list:
        return claims_first(points) if self.claims_first else list(points)


# ------------------------------------------------------------------------------------------- estimate

@dataclass
class Line:
    experiment: str
    points: int
    host_s: float
    device_s: float

    @property
    def total_s(self) -> float:
        return self.host_s + self.device_s


def _state_bytes(spec, dtype_bytes: int) -> int:
    from replayssm.traffic import gdn_state_bytes, mamba2_state_bytes

    f = mamba2_state_bytes if spec.family == "mamba2" else gdn_state_bytes
    return f(spec.geometry, dtype_bytes)


def kernel_line(plan, cal: dict, target: dict) -> Line:
    from experiments.harness.memory import stack_layers
    from experiments.harness.methods import REGISTRY
    from experiments.harness.points import DTYPES

    t, bw = plan.timing, target["copy_TBps"] * 1e12
    host = device = 0.0
    for p in plan.points:
        m = REGISTRY[p.method]
        spec = plan.models[p.model_key]
        layer = _state_bytes(spec, DTYPES[p.state_dtype].itemsize) * p.batch
        layers, _ = stack_layers(layer, l2=p.l2, l2_bytes=target["l2_bytes"], l2_factor=float(t["l2_factor"]),
                                 max_layers=int(t["max_layers"]), budget_bytes=int(target["hbm_bytes"] / 2))
        if m.kind == "ar":
            steps = p.buffer_len if m.uses_buffer and p.buffer_len else 1
        else:
            steps = int(t["spec_steps"])
            if m.uses_history and p.history_len:
                steps = max(steps, 3 * (p.history_len - p.spec_T + 2))
        variants = 3 if (m.kind == "ar" and m.uses_buffer and p.buffer_len) else 1
        launches = steps * layers * CALLS_PER_STEP[m.kind]
        host += cal["gate_s"] + layers * cal["build_layer_s"] + variants * 3 * launches * cal["call_host_us"] * 1e-6
        cycle = steps * layers * 2 * layer / bw
        device += layers * layer / bw + variants * ((float(t["warmup_ms"]) + float(t["rep_ms"])) / 1e3 + 5 * cycle)
    return Line(plan.experiment, len(plan.points), host, device)


def hybrid_line(plan, cal: dict, target: dict) -> Line:
    """e2e_decode / serving: per point, its model builds (host per built layer + weights / bandwidth) and its
    timing window (warmup_ms + rep_ms) plus one profiled cycle."""
    bw = target["copy_TBps"] * 1e12
    host = device = 0.0
    for p in plan.points:
        spec = plan.specs[p.model_key]
        builds = 1 if p.method == "baseline_ar" and p.experiment == "e2e_decode" else 3
        layers = len(spec.block()) if p.build == "block" else len(spec.pattern)
        host += builds * layers * cal["hybrid_build_layer_s"]
        weights = getattr(spec, "weight_bytes", None)
        device += builds * (weights() if callable(weights) else 0) / bw
        device += (float(plan.timing["warmup_ms"]) + float(plan.timing["rep_ms"])) / 1e3
    return Line(plan.experiment, len(plan.points), host, device)


def accuracy_line(series: list, sweep: dict, cal: dict) -> Line:
    """The accuracy study: steps x method calls per series, host-bound at its few heads."""
    calls = sum(int(sweep["steps"]) * CALLS_PER_STEP["spec" if "spec" in s.method else "ar"] * 2 for s in series)
    return Line("accuracy", len(series), calls * cal["call_host_us"] * 1e-6, 0.0)


def estimate(overrides: dict[str, list[str]] | None = None, target: str = "h200",
             cal: dict | None = None) -> list[Line]:
    """The GPU paper sweep of `make reproduce` (its experiments and overrides), estimated on any machine:
    CUDA is only pretended while the configs expand (nothing is allocated or launched)."""
    from unittest import mock

    import torch

    from experiments.harness.points import expand
    from experiments.harness.runner import config_dict, load_config

    cal = cal or json.loads(CALIBRATION.read_text())
    tgt = TARGETS[target]
    over = overrides or {}
    lines = []
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        for exp in ("kernel_decode", "kernel_spec"):
            cfg = load_config(exp, ["sweep=paper", f"sweep.models={PAPER_MODELS}", "device=cuda",
                                    *over.get(exp, [])])
            lines.append(kernel_line(expand(config_dict(cfg)), cal, tgt))
        from experiments.hybrid.sweep import expand as hybrid_expand

        for exp, sweep in (("e2e_decode", "paper_e2e"), ("serving", "paper_serving")):
            data = config_dict(load_config(exp, [f"sweep={sweep}", "device=cuda", *over.get(exp, [])]))
            lines.append(hybrid_line(hybrid_expand(data, exp, {"name": target, **tgt}), cal, tgt))
        from experiments import accuracy as acc

        data = config_dict(load_config("accuracy", ["sweep=accuracy_paper", "device=cuda",
                                                    *over.get("accuracy", [])]))
        sweep = acc.validate(data)
        specs = {s.key: acc.acs.few_heads(s, sweep["heads"]) for s in acc._models(data)}
        lines.append(accuracy_line(acc.plan_series(sweep, specs.values()), sweep, cal))
    return lines


def render(lines: list[Line], cal: dict, target: str) -> str:
    out = [f"estimate of the GPU paper sweep on one {target} (calibrated {cal['measured_on']}, "
           f"{cal['date']}, commit {cal['commit']}):",
           f"  {'experiment':<14} {'points':>7} {'host min':>9} {'device min':>11} {'total min':>10}"]
    for ln in lines:
        out.append(f"  {ln.experiment:<14} {ln.points:>7} {ln.host_s / 60:>9.1f} {ln.device_s / 60:>11.1f} "
                   f"{ln.total_s / 60:>10.1f}")
    total = sum(ln.total_s for ln in lines)
    out.append(f"  {'total':<14} {sum(ln.points for ln in lines):>7} {sum(ln.host_s for ln in lines) / 60:>9.1f} "
               f"{sum(ln.device_s for ln in lines) / 60:>11.1f} {total / 60:>10.1f}")
    out.append(f"  host constants: call {cal['call_host_us']:.1f} us, gate {cal['gate_s'] * 1e3:.1f} ms, "
               f"build {cal['build_layer_s'] * 1e3:.2f} ms/layer, hybrid build {cal['hybrid_build_layer_s'] * 1e3:.1f}"
               f" ms/layer; device copy {TARGETS[target]['copy_TBps']} TB/s")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- calibration

def calibrate() -> dict:
    """Measure the host constants here: tiny shapes, torch backend, CPU, one thread."""
    import statistics

    import torch

    from experiments.harness.check import gate
    from experiments.harness.env import short_sha
    from experiments.harness.methods import REGISTRY
    from experiments.harness.points import expand
    from experiments.harness.runner import Stack, config_dict, load_config
    from experiments.harness.workload import Workload

    torch.set_num_threads(1)
    cfg = load_config("kernel_decode", ["sweep=cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[1]",
                                        "sweep.buffer_len=[8]", "method.names=[replay_ar]", "device=cpu"])
    plan = expand(config_dict(cfg))
    p, settings = plan.points[0], dict(plan.timing, max_layers=8)
    m, spec = REGISTRY[p.method], plan.models[plan.points[0].model_key]
    wl = Workload(spec, p, "cpu", torch.Generator().manual_seed(0))
    fns = m.api(p.family)
    gates, builds, calls = [], [], []
    for _ in range(5):
        t0 = time.perf_counter()
        gate(m, fns, wl, p, max_batch=8, ar_steps=3)
        gates.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        stack = Stack(m, wl, p, None, settings, {"l2_bytes": None})
        builds.append((time.perf_counter() - t0) / stack.layers)
        cycle = stack.cycle(fns)
        t0 = time.perf_counter()
        cycle()
        calls.append((time.perf_counter() - t0) / (stack.steps * stack.layers) * 1e6)
    from experiments.hybrid import run as hybrid_run
    from experiments.hybrid.sweep import expand as hybrid_expand

    data = config_dict(load_config("e2e_decode", ["sweep=e2e_cpu", "device=cpu"]))
    hplan = hybrid_expand(data, "e2e_decode", {"name": "cpu"})
    hp = min(hplan.points, key=lambda q: q.batch * len(hplan.specs[q.model_key].pattern))
    hspec = hplan.specs[hp.model_key]
    hbuilds = []
    for _ in range(3):
        t0 = time.perf_counter()
        hybrid_run.build(hp, hspec, hp.context_len + 8, 0)
        built = len(hspec.block()) if hp.build == "block" else len(hspec.pattern)
        hbuilds.append((time.perf_counter() - t0) / built)
    import platform

    return {"call_host_us": statistics.median(calls), "gate_s": statistics.median(gates),
            "build_layer_s": statistics.median(builds), "hybrid_build_layer_s": statistics.median(hbuilds),
            "measured_on": f"{platform.processor() or platform.machine()} CPU, torch {torch.__version__}, "
                           f"1 thread, tiny shapes ({p.model}, {hp.model})",
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": short_sha()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="re-measure the host constants -> budget.json")
    ap.add_argument("--target", default="h200", choices=sorted(TARGETS))
    ap.add_argument("--max-min", type=float, default=None, help="exit 1 when the estimate exceeds this")
    ap.add_argument("--json", type=Path, help="write the estimate here too")
    args = ap.parse_args(argv)
    if args.calibrate:
        cal = calibrate()
        CALIBRATION.write_text(json.dumps(cal, indent=2, sort_keys=True) + "\n")
        print(f"calibration -> {CALIBRATION}: {cal}")
    cal = json.loads(CALIBRATION.read_text())
    lines = estimate(target=args.target, cal=cal)
    print(render(lines, cal, args.target))
    total_min = sum(ln.total_s for ln in lines) / 60
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "calibration": cal, "total_min": total_min,
                                         "lines": [ln.__dict__ | {"total_s": ln.total_s} for ln in lines]},
                                        indent=2) + "\n")
    if args.max_min is not None and total_min > args.max_min:
        print(f"estimate {total_min:.1f} min exceeds {args.max_min:g} min", file=sys.stderr)
        return 1
    return 0 if math.isfinite(total_min) else 1


if __name__ == "__main__":
    sys.exit(main())
