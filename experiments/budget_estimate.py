"""The estimate of the GPU paper sweep, printed before `make reproduce` starts one (the deadline and the
claims-first order of a running sweep are experiments/harness/budget.py).

    python -m experiments.budget_estimate                # estimate the GPU paper sweep (runs on a CPU box too)
    python -m experiments.budget_estimate --calibrate    # re-measure the host constants here -> budget_estimate.json

The estimate of one kernel point is its host work plus its device time:
    host   = gate + build (per layer) + launches x host cost per call x (2 warm-up cycles + 1 captured)
             per timed variant (a point with a cursor, ReplaySSM AR or ring verify, has 7: its cycle, and
             prepare+step / prepare alone at three positions: h = 0, the middle, the fold)
    device = per timed variant: do_bench's warmup_ms + rep_ms + 5 estimate cycles (or steps), a cycle being
             steps x layers x batch x (state read + write) / copy bandwidth (the baseline's bytes: an upper
             bound for the replay methods), plus filling the layer stack once (bytes / bandwidth)
The host constants are measured on the machine that runs --calibrate (experiments/budget_estimate.json
records which, with the commit and date): the cost of one method call at tiny shapes with the torch backend
(an upper-bound proxy for one Triton launch's host path, which cannot run without a GPU driver), the gate
and the build of a layer at tiny shapes, and a hybrid model's build per layer. The device bandwidth is the
target's measured device copy (h200: 4.3 TB/s, given in the GPU box's description), never a timing.
Launch tuning (experiments/tune.py, run first when the GPU has no launch table): per tuning job (kernel, key,
state dtype of the claims' points) its candidates + the default, each one Triton build (TUNE_BUILD_S, an
ASSUMPTION: compiling needs a GPU toolchain run) + its check call + do_bench's warm-up and repetitions
(replayssm/tuning.py WARMUP_MS + REP_MS); then the sweep times every tuned baseline point a second time under
its default configs (the "default rows" line: those points' kernel estimate again). A GPU model with a
committed table skips the tuning line; the default rows stay.
Whole-model points (e2e_decode, serving) count their model builds (3 per gated point: the gate's two small
models and the timed one) and their timing windows; the accuracy study counts its steps x calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments import accuracy as acc
from experiments.harness.check import gate
from experiments.harness.entry import config_dict, load_config
from experiments.harness.env import short_sha
from experiments.harness.memory import stack_layers
from experiments.harness.methods import REGISTRY
from experiments.harness.points import expand
from experiments.harness.serving_shape import cursor_period
from experiments.harness.workload import Workload, state_storage
from experiments.hybrid import run as hybrid_run
from experiments.hybrid.footprint import footprint
from experiments.hybrid.sweep import expand as hybrid_expand
from experiments.kernel.run import Stack
from replayssm.traffic import gdn_state_bytes, mamba2_state_bytes

CALIBRATION = Path(__file__).with_name("budget_estimate.json")
TARGETS = {"h200": {"copy_TBps": 4.3, "l2_bytes": 52428800, "hbm_bytes": 141e9},
           "h100": {"copy_TBps": 3.0, "l2_bytes": 52428800, "hbm_bytes": 80e9}}
PAPER_MODELS = ("[nemotron3_nano_4b,nemotron3_super_120b,nemotron3_ultra_550b@tp2,qwen35_4b,qwen35_122b_a10b,"
                "kimi_linear_48b_a3b]")      # scripts/reproduce.sh's default
CALLS_PER_STEP = {"ar": 1, "spec": 2}                 # AR: step; spec: verify + commit
# Triton's own launch path (argument binding, cache lookup, cuLaunchKernel) cannot run without a GPU driver,
# so it is not measured here: an ASSUMPTION, stated in every printed estimate, to replace by a GPU calibration.
LAUNCH_US = 20.0
TORCH_LAUNCH_US = 5.0          # a torch op's CUDA launch, on top of its dispatch (measured here): also assumed
LAUNCH_SOURCE = "assumed (Triton's launch path needs a GPU driver; not measured)"
TUNE_BUILD_S = 1.5             # one Triton build of one candidate config: ASSUMED (not measured without a GPU)


# ------------------------------------------------------------------------------------------- estimate

@dataclass
class Line:
    experiment: str
    points: int
    host_s: float
    device_s: float
    note: str = ""

    @property
    def total_s(self) -> float:
        return self.host_s + self.device_s


def _state_bytes(spec, dtype_bytes: int) -> int:
    f = mamba2_state_bytes if spec.family == "mamba2" else gdn_state_bytes
    return f(spec.geometry, dtype_bytes)


def call_us(cal: dict, method: str) -> float:
    """Host microseconds of one call of `method`: our wrapper (measured) + its launches x LAUNCH_US; a peer or
    a method not calibrated costs what the most expensive calibrated one does."""
    wrapper = cal["wrapper_us"].get(method, max(cal["wrapper_us"].values()))
    launches = cal["launches_per_call"].get(method, max(cal["launches_per_call"].values()))
    return wrapper + launches * cal["launch_us"]


def kernel_line(plan, cal: dict, target: dict) -> Line:
    t, bw = plan.timing, target["copy_TBps"] * 1e12
    host = device = 0.0
    for p in plan.points:
        m = REGISTRY[p.method]
        spec = plan.models[p.model_key]
        layer = _state_bytes(spec, state_storage(p.state_dtype).itemsize) * p.batch
        layers, _ = stack_layers(layer, l2=p.l2, l2_bytes=target["l2_bytes"], l2_factor=float(t["l2_factor"]),
                                 max_layers=int(t["max_layers"]), budget_bytes=int(target["hbm_bytes"] / 2))
        if m.kind == "ar":
            steps = p.buffer_len if m.uses_buffer and p.buffer_len else 1
        else:
            steps = int(t["spec_steps"])
            if m.uses_history and p.history_len:
                steps = max(steps, 3 * (p.history_len - p.spec_T + 2))
        # kernel/run.py: the cycle, then for a method with a cursor one step at each of 3 positions (h = 0, the
        # middle, the fold), each timed as prepare+step and prepare alone over one step of the stack
        positions = 3 if cursor_period(m, p) else 0
        calls = steps * layers * CALLS_PER_STEP[m.kind]
        one = layers * CALLS_PER_STEP[m.kind]
        host += (cal["gate_s"] + layers * cal["build_layer_s"]
                 + 3 * (calls + positions * 2 * one) * call_us(cal, p.method) * 1e-6)
        cycle = steps * layers * 2 * layer / bw
        window = (float(t["warmup_ms"]) + float(t["rep_ms"])) / 1e3
        device += layers * layer / bw + window + 5 * cycle + positions * 2 * (window + 5 * cycle / steps)
    return Line(plan.experiment, len(plan.points), host, device)


def tuning_lines(cal: dict, target: dict, overrides: list[str]) -> list[Line]:
    """The launch tuning of the claims' points (experiments/tune.py: jobs x (candidates + default) trials) and
    the default-config rows the sweep adds for every baseline point whose kernels have a tuning job."""
    from experiments import tune
    from replayssm import tuning

    base = ["sweep=paper", f"sweep.models={PAPER_MODELS}", "device=cuda"]
    todo = tune.jobs(tune.plan_points(tune.EXPERIMENTS, base + overrides, claims_only=True))
    trials = sum(n + 1 for n, _ in todo.values())
    host = trials * (TUNE_BUILD_S + 3 * max(cal["wrapper_us"].values()) * 1e-6)
    device = trials * (tuning.WARMUP_MS + tuning.REP_MS) / 1e3
    lines = [Line("tune (claims)", len(todo), host, device,
                  note=f"{trials} trials; {TUNE_BUILD_S:g} s build each, assumed; only without a launch table")]
    tuned = {kernel_key for kernel_key in todo}
    extra = []
    for exp in tune.EXPERIMENTS:
        plan = expand(config_dict(load_config(exp, base + overrides)))
        pts = [p for p in plan.points if p.backend == "triton" and p.method in ("baseline_ar", "baseline_spec",
                                                                                 "commit_replay_spec")
               and any((k, _entry(tune, k, p, plan)) in tuned for k in tune.kernels_of(p))]
        extra.append(kernel_line(dataclasses.replace(plan, points=pts), cal, target))
    lines.append(Line("default rows", sum(x.points for x in extra), sum(x.host_s for x in extra),
                      sum(x.device_s for x in extra), note="tuned baselines timed again under their default configs"))
    return lines


def _entry(tune, kernel: str, p, plan) -> str:
    from replayssm import launch_table

    return launch_table.entry_key(tune.static_key(kernel, p, plan.models[p.model_key].geometry), p.state_dtype)


def hybrid_line(plan, cal: dict, target: dict) -> Line:
    """e2e_decode / serving: per point, its model builds (host per built layer + weights / bandwidth) and its
    timing window (warmup_ms + rep_ms) plus one profiled cycle."""
    bw = target["copy_TBps"] * 1e12
    host = device = cpu_draws = 0.0
    weights: dict[str, int] = {}
    layer_step = cal["hybrid_ops_per_layer"] * (cal["torch_op_host_us"] + cal["torch_launch_us"]) * 1e-6
    for p in plan.points:
        spec = plan.specs[p.model_key]
        builds = 1 if p.method == "baseline_ar" and p.experiment == "e2e_decode" else 3
        layers = len(spec.block()) if p.build == "block" else len(spec.pattern)
        if p.model_key not in weights:                       # bf16 bytes -> elements
            weights[p.model_key] = footprint(spec, "ar", act_dtype=torch.bfloat16, state_dtype=torch.float32,
                                             max_model_len=1).weights // 2
        # weights are drawn on the device (experiments/hybrid/layers.randn): fp32 draw + bf16 cast, in bytes
        host += builds * layers * cal["hybrid_build_layer_s"]
        device += builds * (4 + 4 + 2) * weights[p.model_key] / bw
        cpu_draws += builds * weights[p.model_key] / cal["cpu_randn_per_s"]
        device += (float(plan.timing["warmup_ms"]) + float(plan.timing["rep_ms"])) / 1e3
        # eager cycles are host-bound: per decode step, every built layer's ops (measured per layer at tiny
        # shapes); a cycle is buffer_len steps (e2e) or spec steps of T-1 drafts + a verify (serving); timed:
        # 1 + 5 estimate + >= 1 warm-up + >= 1 timed + 1 profiled cycle; the e2e gate: 2 x (L+1) small steps
        if p.experiment == "e2e_decode":
            L = p.buffer_len or spec.buffer_len
            host += (9 * L + 2 * (L + 1)) * layers * layer_step
        else:
            T = p.spec_T or 2
            steps = max(int(plan.sweep["spec_steps"]), 3 * (spec.history_len - T + 2))
            host += 9 * steps * (layers + (T - 1) * 2) * layer_step
    return Line(plan.experiment, len(plan.points), host, device, note=f"weights drawn on one host core instead: "
                f"+{cpu_draws / 60:.0f} min")


def accuracy_line(series: list, sweep: dict, cal: dict) -> Line:
    """The accuracy study: steps x method calls per series, host-bound at its few heads."""
    host = sum(int(sweep["steps"]) * CALLS_PER_STEP["spec" if "spec" in s.method else "ar"] * call_us(cal, s.method)
               * 1e-6 for s in series)
    return Line("accuracy", len(series), host, 0.0)


def estimate(overrides: dict[str, list[str]] | None = None, target: str = "h200",
             cal: dict | None = None) -> list[Line]:
    """The GPU paper sweep of `make reproduce` (its experiments and overrides), estimated on any machine:
    CUDA is only pretended while the configs expand (nothing is allocated or launched)."""
    cal = cal or json.loads(CALIBRATION.read_text())
    tgt = TARGETS[target]
    over = overrides or {}
    lines = []
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        paper_hashes, production = set(), []
        for exp in ("kernel_decode", "kernel_spec"):
            cfg = load_config(exp, ["sweep=paper", f"sweep.models={PAPER_MODELS}", "device=cuda",
                                    *over.get(exp, [])])
            plan = expand(config_dict(cfg))
            paper_hashes |= {p.config_hash() for p in plan.points}
            lines.append(kernel_line(plan, cal, tgt))
            production.append(expand(config_dict(load_config(exp, ["sweep=production", "device=cuda"]))))
        # the production-shape stage (conf/sweep/production.yaml) resumes the run: paper points are skipped
        prod = [kernel_line(dataclasses.replace(plan, points=[p for p in plan.points
                                                              if p.config_hash() not in paper_hashes]), cal, tgt)
                for plan in production]
        lines.append(Line("production", sum(x.points for x in prod), sum(x.host_s for x in prod),
                          sum(x.device_s for x in prod)))
        # the state-format stage (conf/sweep/state_formats.yaml) resumes the run too: float32 points already run
        fmt = expand(config_dict(load_config("kernel_decode", ["sweep=state_formats", "device=cuda",
                                                               "method.names=[baseline_ar,replay_ar]"])))
        done = paper_hashes | {p.config_hash() for plan in production for p in plan.points}
        lines.append(kernel_line(dataclasses.replace(fmt, points=[p for p in fmt.points
                                                                  if p.config_hash() not in done]), cal, tgt))
        lines[-1] = dataclasses.replace(lines[-1], experiment="state_formats")
        lines += tuning_lines(cal, tgt, over.get("tune", []))
        for exp, sweep in (("e2e_decode", "paper_e2e"), ("serving", "paper_serving")):
            data = config_dict(load_config(exp, [f"sweep={sweep}", "device=cuda", "hardware=" + target,
                                                 *over.get(exp, [])]))
            hardware = dict(data["hardware"], hbm_bytes=data["hardware"].get("hbm_bytes") or tgt["hbm_bytes"])
            lines.append(hybrid_line(hybrid_expand(data, exp, hardware), cal, tgt))
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
                   f"{ln.total_s / 60:>10.1f}" + (f"   ({ln.note})" if ln.note else ""))
    total = sum(ln.total_s for ln in lines)
    out.append(f"  {'total':<14} {sum(ln.points for ln in lines):>7} {sum(ln.host_s for ln in lines) / 60:>9.1f} "
               f"{sum(ln.device_s for ln in lines) / 60:>11.1f} {total / 60:>10.1f}")
    calls = ", ".join(f"{m} {us:.0f}" for m, us in cal["wrapper_us"].items())
    out.append(f"  host, measured: wrapper us/call ({calls}); gate {cal['gate_s'] * 1e3:.1f} ms; build "
               f"{cal['build_layer_s'] * 1e3:.2f} ms/layer; hybrid build {cal['hybrid_build_layer_s'] * 1e3:.1f} "
               f"ms/layer; eager step {cal['hybrid_ops_per_layer']:.0f} aten ops/layer x {cal['torch_op_host_us']:.1f} "
               "us/op")
    out.append(f"  host CPU normal draws: {cal['cpu_randn_per_s'] / 1e6:.0f} M fp32 values/s (1 thread, measured "
               "here); the hybrid weights are now drawn on the device")
    out.append(f"  launch {cal['launch_us']:g} us per Triton launch, {cal['torch_launch_us']:g} us per torch op "
               f"launch: {cal['launch_us_source']}")
    out.append("  device: byte model / "
               f"{TARGETS[target]['copy_TBps']} TB/s device copy + do_bench windows")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- calibration

class _OpCounter:
    """Counts the aten ops dispatched inside the with-block."""

    def __enter__(self):
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.count += 1
                return func(*args, **(kwargs or {}))

        self.count, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _stub_launches() -> list[int]:
    """Replace every Triton launch by a counter (REPLAYSSM_AOT_CAPTURE lets the wrappers take CPU tensors):
    what is left of a call is the host work of our Python wrappers."""
    import triton.runtime.jit as jit  # deferred: only a calibration stubs Triton

    count = [0]

    def getitem(self, grid):
        def launch(*args, **kwargs):
            count[0] += 1
        return launch

    jit.JITFunction.__getitem__ = getitem
    return count


def calibrate() -> dict:
    """Measure the host constants here (tiny shapes, one thread): run in a fresh process, it stubs Triton's
    launches for the rest of the process."""
    os.environ["REPLAYSSM_AOT_CAPTURE"] = "1"
    torch.set_num_threads(1)
    launches = _stub_launches()
    per_call, per_launch, gates, builds = {}, {}, [], []
    for exp, method in (("kernel_decode", "baseline_ar"), ("kernel_decode", "replay_ar"),
                        ("kernel_spec", "baseline_spec"), ("kernel_spec", "replay_spec"),
                        ("kernel_spec", "commit_replay_spec")):
        cfg = load_config(exp, ["sweep=cpu", "sweep.models=[tiny_mamba2]", "sweep.batch=[1]", "sweep.buffer_len=[8]",
                                f"method.names=[{method}]", "device=cpu", "sweep.backend=torch"])
        plan = expand(config_dict(cfg))
        p = dataclasses.replace(plan.points[-1], backend="triton")
        m = REGISTRY[p.method]
        wl = Workload(plan.models[p.model_key], p, "cpu", torch.Generator().manual_seed(0))
        acc = plan.acceptances.get(p.acceptance) if p.acceptance else None
        t0 = time.perf_counter()
        stack = Stack(m, wl, p, acc, dict(plan.timing, max_layers=8), {"l2_bytes": None})
        builds.append((time.perf_counter() - t0) / stack.layers)
        cycle = stack.cycle(m.api(p.family))
        cycle()                                   # first call: lazy imports and caches, not per-call cost
        samples = []
        for _ in range(5):
            launches[0] = 0
            t0 = time.perf_counter()
            cycle()
            samples.append((time.perf_counter() - t0) * 1e6 / (stack.steps * stack.layers))
        per_call[method] = statistics.median(samples)
        per_launch[method] = launches[0] / (stack.steps * stack.layers)
        t0 = time.perf_counter()
        gate(m, m.api(p.family), wl, dataclasses.replace(p, backend="torch"), max_batch=8, ar_steps=3,
             acceptance=acc)
        gates.append(time.perf_counter() - t0)
    data = config_dict(load_config("e2e_decode", ["sweep=e2e_cpu", "device=cpu"]))
    hplan = hybrid_expand(data, "e2e_decode", {"name": "cpu"})
    hp = min((q for q in hplan.points if q.method == "baseline_ar"),     # the torch replay is no launch proxy
             key=lambda q: q.batch * len(hplan.specs[q.model_key].pattern))
    hp = dataclasses.replace(hp, backend="torch")
    hspec = hplan.specs[hp.model_key]
    hbuilds, hsteps = [], []
    built = len(hspec.block()) if hp.build == "block" else len(hspec.pattern)
    for _ in range(3):
        t0 = time.perf_counter()
        model = hybrid_run.build(hp, hspec, hp.context_len + 16, 0)
        hbuilds.append((time.perf_counter() - t0) / built)
        tok = torch.zeros(hp.batch, dtype=torch.long)
        model.decode(tok)
        with _OpCounter() as ops:                 # aten ops of one decode step: each is a launch on a GPU
            model.decode(tok)
        hsteps.append(ops.count / built)
    a, b = torch.ones(1), torch.ones(1)
    torch.add(a, b)
    t0 = time.perf_counter()
    for _ in range(10_000):
        torch.add(a, b)
    op_us = (time.perf_counter() - t0) * 1e6 / 10_000
    gen = torch.Generator().manual_seed(0)
    draws = []
    for _ in range(3):                             # the hybrid models draw their weights on the CPU, fp32
        t0 = time.perf_counter()
        torch.randn(1 << 24, generator=gen)
        draws.append((1 << 24) / (time.perf_counter() - t0))
    return {"wrapper_us": per_call, "cpu_randn_per_s": statistics.median(draws), "launches_per_call": per_launch,
            "gate_s": statistics.median(gates),
            "build_layer_s": statistics.median(builds), "hybrid_build_layer_s": statistics.median(hbuilds),
            "hybrid_ops_per_layer": statistics.median(hsteps),
            "torch_op_host_us": op_us,
            "launch_us": LAUNCH_US, "torch_launch_us": TORCH_LAUNCH_US, "launch_us_source": LAUNCH_SOURCE,
            "measured_on": f"{platform.machine()} CPU ({os.cpu_count()} cores), torch {torch.__version__}, 1 thread, "
                           f"tiny shapes ({p.model}, {hp.model}), Triton launches stubbed",
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": short_sha()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="re-measure the host constants -> budget_estimate.json")
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
