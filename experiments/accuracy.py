"""Accuracy study: how far each method and precision drifts from the float64 recurrence over long decodes.

    python -m experiments.accuracy                                    # CPU default (sweep=accuracy_cpu)
    python -m experiments.accuracy sweep=accuracy_paper               # 10,000 steps, Triton, on a GPU
    python -m experiments.accuracy resume=results/cpu/<run-id>        # join a kernel-sweep run directory

For every model (a few heads of its real geometry), workload (realistic, long_memory: see
experiments/accuracy_series.py), activation dtype, method (baseline_ar, replay_ar at each buffer_len,
baseline_spec, commit_replay_spec, replay_spec under a random accept / rollback schedule) and state dtype,
decode `steps` tokens from the same inputs as the float64 truth and, at log-spaced checkpoints, record the
relative L2 error per (row, head) of
    out_err_*    the outputs of the steps since the previous checkpoint (spec: every window token), pooled;
    state_err_*  the committed state at the checkpoint (materialised for the replay caches);
as median, p99 and max. `step` is tokens committed (AR: the step; spec: the median over rows at that
window, `window` = verify steps). The growth exponent of error vs steps is fitted from these rows by
experiments/report/accuracy.py (log-log least squares), not here.

Rows: <run dir>/accuracy.csv (experiments/harness/store.RunTable), beside the kernel sweeps' rows.csv in the
same run directory, with the same env.json / config.yaml provenance. A failing series is one row with
status=error and the sweep goes on; `resume=` skips series already recorded.

state_dtype is a state format of replayssm/state_format.py: float32, float16, bfloat16 for every method and
backend; float16_sr, bfloat16_sr (stochastic rounding), int8 and float8_e4m3fn (per-(slot, head) scale) for
every method on the torch / ref backends only (a sweep asking another backend for them is refused before any work,
naming what the backend stores; a method without them would skip them at planning).
Their rows are marked experimental=True (no kernel writes them yet). The harness's set_state writes the initial
state through the format's writer (experiments/harness/methods.py), so it is quantised like any write (int8 / fp8:
the error includes the prefill state's rounding; S0 is bf16-exact, so the half formats round nothing there) and the
SR write counter restarts; the SR seed is the sweep's seed. Where the state is rounded: replay_ar's checkpoint once
per flush (every L steps), replay_spec's once per ring flush with history, commit_replay_spec's once per commit,
baseline_spec's T snapshots once per verify, baseline_ar's state once per step; experiments/report/accuracy.py
fits the state error against both steps and state writes.
sweep.formats_steps / formats_workloads (a CPU budget) run the non-plain formats over fewer tokens (a spec series:
the windows whose expected accepted tokens cover them) / workloads (rows carry their own `steps`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import OmegaConf

from experiments import accuracy_series as acs
from experiments.harness.acceptance import parse_acceptance
from experiments.harness.budget import Budget
from experiments.harness.entry import config_dict, exit_if_nothing_measured
from experiments.harness.env import collect_env, resolve_hardware
from experiments.harness.fixture import PointFixture
from experiments.harness.methods import MethodUnavailable
from experiments.harness.points import CONF_DIR, DTYPES, Point, _models, resolve_device
from experiments.harness.store import RunStore, RunTable, failure, run_pending
from experiments.harness.sweeps import AccuracySweepSchema, check_sweep, register_schemas
from replayssm import state_format as sf
from replayssm.checks import interpreter_active

COLUMNS = [
    "experiment", "family", "model", "heads", "workload", "method", "route", "backend", "buffer_len", "spec_T",
    "history_len", "acceptance", "state_dtype", "act_dtype", "rows", "steps", "step", "window",
    "out_err_median", "out_err_p99", "out_err_max", "state_err_median", "state_err_p99", "state_err_max",
    "status", "message", "series_hash", "run_id", "experimental",
]
BACKENDS = ("torch", "ref", "triton")
FP8_NAME = "float8_e4m3fn"
# state format names (replayssm/state_format.py) and the dtype aliases of the harness (fp32, bf16, ...)
STATE_DTYPES = {**{k: str(v).removeprefix("torch.") for k, v in DTYPES.items()}, **{n: n for n in sf.FORMAT_NAMES}}


@dataclass(frozen=True)
class Series:
    model_key: str
    workload: str
    act_dtype: str
    method: str
    state_dtype: str
    buffer_len: int | None
    route: str | None

    def key(self, sweep: dict, seed: int) -> str:
        """Identifies the series across resumes: its own fields plus everything that shapes its inputs."""
        shared = {k: sweep[k] for k in ("heads", "rows", "steps", "checkpoints", "spec_T", "history_len",
                                        "acceptance", "backend")}
        if self.steps(sweep) != sweep["steps"]:
            shared["series_steps"] = self.steps(sweep)      # only then: older runs' keys stay valid
        blob = json.dumps({**self.__dict__, **shared, "seed": seed}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def steps(self, sweep: dict) -> int:
        """Tokens this series decodes: sweep.formats_steps for a non-plain format when set, else sweep.steps (a
        spec series: the windows whose expected accepted tokens cover them, Group.spec_windows)."""
        if sweep.get("formats_steps") and not sf.state_format(self.state_dtype).plain:
            return min(sweep["formats_steps"], sweep["steps"])
        return sweep["steps"]


# ------------------------------------------------------------------------------------------- validation

def _positive(key: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"sweep.{key}: expected an int >= 1, got {v!r}")
    return v


def _subset(key: str, values, allowed) -> list:
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"sweep.{key}: expected a non-empty list, got {values!r}")
    for i, v in enumerate(values):
        if v not in allowed:
            raise ValueError(f"sweep.{key}[{i}]: unknown value {v!r}; expected one of {list(allowed)}")
    return list(values)


def validate(data: dict) -> dict:
    """Check the sweep before any work; returns the normalised sweep (dtype names canonical)."""
    sweep = dict(data["sweep"])
    unknown = sorted(set(sweep) - set(AccuracySweepSchema.__dataclass_fields__))
    if unknown:
        raise ValueError(f"sweep.{unknown[0]}: unknown accuracy sweep key")
    for key in ("heads", "rows", "steps", "checkpoints", "spec_T", "history_len"):
        _positive(key, sweep.get(key))
    if sweep["history_len"] < sweep["spec_T"]:
        raise ValueError(f"sweep.history_len: B={sweep['history_len']} < T={sweep['spec_T']}; the ring needs B >= T")
    _subset("methods", sweep.get("methods"), acs.METHODS)
    _subset("workloads", sweep.get("workloads"), acs.WORKLOADS)
    for i, L in enumerate(sweep.get("buffer_len") or []):
        _positive(f"buffer_len[{i}]", L)
    if sweep.get("route") not in ("output_only", "state_and_output"):
        raise ValueError(f"sweep.route: expected output_only or state_and_output, got {sweep.get('route')!r}")
    parse_acceptance(sweep.get("acceptance"), "sweep.acceptance")
    for key, allowed in (("state_dtype", STATE_DTYPES), ("act_dtype", DTYPES)):
        names = _subset(key, sweep.get(key), allowed)
        sweep[key] = list(dict.fromkeys(str(allowed[n]).removeprefix("torch.") for n in names))
    backend = sweep.get("backend")
    if backend not in BACKENDS:
        raise ValueError(f"sweep.backend: unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    _check_formats(sweep, backend)
    if sweep.get("formats_steps") is not None:
        _positive("formats_steps", sweep["formats_steps"])
    if sweep.get("formats_workloads") is not None:
        _subset("formats_workloads", sweep["formats_workloads"], acs.WORKLOADS)
    device = resolve_device(data.get("device", "auto"))
    if backend == "triton" and device == "cpu":
        if not interpreter_active():
            raise ValueError("sweep.backend=triton on CPU needs TRITON_INTERPRET=1; use backend=torch on CPU")
        if "bfloat16" in sweep["state_dtype"] + sweep["act_dtype"]:
            raise ValueError("sweep.backend=triton under the interpreter: bfloat16 is computed on raw bits; "
                             "use backend=torch for bf16 on CPU")
    if "replay_ar" in sweep["methods"] and not sweep.get("buffer_len"):
        raise ValueError("sweep.buffer_len: replay_ar needs at least one buffer length")
    sweep["device"] = device
    return sweep


def _check_formats(sweep: dict, backend: str) -> None:
    """Refuse a state format the backend cannot store (naming those it can), or one no swept method runs."""
    allowed = sf.BACKEND_FORMATS[backend]
    lacking = [n for n in sweep["state_dtype"] if n not in allowed]
    if lacking:
        raise ValueError(f"sweep.state_dtype: {', '.join(lacking)} has no {backend.capitalize()} kernels "
                         f"(backend={backend} stores {', '.join(allowed)}); use backend=torch or ref, or drop it "
                         "from state_dtype")
    for name in sweep["state_dtype"]:
        runners = [m for m, am in acs.METHODS.items() if name in am.formats]
        if not set(runners) & set(sweep["methods"]):
            raise ValueError(f"sweep.state_dtype: {name} is a state format of {', '.join(runners)} only; "
                             f"sweep.methods has none of them")


def format_workloads(sweep: dict) -> list[str]:
    """The workloads the non-plain formats run: those of sweep.formats_workloads the sweep has, or every workload
    of the sweep when it has none of them (a narrowed sweep, e.g. workloads=[realistic]) or the key is null."""
    return [w for w in sweep["workloads"] if w in (sweep.get("formats_workloads") or ())] or sweep["workloads"]


def plan_series(sweep: dict, specs) -> list[Series]:
    out = []
    for spec in specs:
        for workload in sweep["workloads"]:
            for ad in sweep["act_dtype"]:
                for name in sweep["methods"]:
                    entry = acs.METHODS[name].entry
                    if spec.family not in entry.families:
                        continue
                    lens = sweep["buffer_len"] if entry.uses_buffer else [None]
                    route = entry.route_for(spec.family, sweep["backend"], sweep["route"])
                    for sd in sweep["state_dtype"]:
                        if sd not in acs.METHODS[name].formats:
                            continue            # a format this method's cache does not store
                        if not sf.state_format(sd).plain and workload not in format_workloads(sweep):
                            continue
                        out += [Series(spec.key, workload, ad, name, sd, L, route) for L in lens]
    return out


# ------------------------------------------------------------------------------------------------ running

def _point(spec, s: Series, sweep: dict, seed: int) -> Point:
    """The harness point a series allocates and steps with (timing fields are unused here)."""
    entry = acs.METHODS[s.method].entry
    spec_kind = entry.kind == "spec"
    return Point(experiment="accuracy", family=spec.family, model=spec.name, tp=spec.tp, method=entry.name,
                 route=s.route, backend=sweep["backend"], batch=sweep["rows"], buffer_len=s.buffer_len,
                 spec_T=sweep["spec_T"] if spec_kind else None,
                 history_len=sweep["history_len"] if spec_kind and entry.uses_history else None,
                 acceptance=sweep["acceptance"] if spec_kind else None, state_dtype=s.state_dtype,
                 act_dtype=s.act_dtype, context_len=None, timing_mode="eager", l2="warm", torch_compile="false",
                 slot_layout="identity", device=sweep["device"], seed=seed)


class Group:
    """The inputs and float64 truth of one (model, workload, act dtype), built lazily and shared by its series."""

    def __init__(self, spec, workload: str, act_dtype: str, sweep: dict, seed: int):
        self.spec, self.workload, self.sweep = spec, workload, sweep
        tag = f"{spec.key}/{workload}"          # not the act dtype: fp32 and bf16 runs see the same draws
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16))
        probe = Series(spec.key, workload, act_dtype, "baseline_ar", "float32", None, None)
        self.wl = acs.make_workload(spec, _point(spec, probe, sweep, seed), workload, gen)
        self.S0 = self.wl.random_state(sweep["rows"]).to(torch.bfloat16).float()   # exact in every state dtype
        self.steps, self.T = sweep["steps"], sweep["spec_T"]
        self.acc = parse_acceptance(sweep["acceptance"])
        self.windows = math.ceil(self.steps / self.acc.expected(self.T))
        self.counts = self.acc.sample(self.T, sweep["rows"], self.windows, gen)
        # + formats_steps: the last step of the non-plain formats' shorter series is a checkpoint too
        extra = {min(sweep["formats_steps"], self.steps)} if sweep.get("formats_steps") else set()
        self.ar_ckpts = sorted(set(acs.checkpoints(self.steps, sweep["checkpoints"])) | extra)
        # the non-plain formats' spec series stop at their last window (a checkpoint too)
        spec_extra = {self.spec_windows(min(sweep["formats_steps"], self.steps))} if sweep.get("formats_steps") \
            else set()
        self.spec_ckpts = sorted(set(acs.checkpoints(self.windows, sweep["checkpoints"])) | spec_extra)
        self._ar = self._spec = None

    def spec_windows(self, steps: int) -> int:
        """The verify windows a spec series of `steps` tokens runs (as many as their expected accepted counts)."""
        return min(self.windows, math.ceil(steps / self.acc.expected(self.T)))

    @property
    def ar(self) -> acs.ARTrajectory:
        if self._ar is None:
            self._ar = acs.ar_trajectory(self.wl, self.workload, self.S0, self.steps, self.ar_ckpts)
        return self._ar

    @property
    def spec_traj(self) -> acs.SpecTrajectory:
        if self._spec is None:
            self._spec = acs.spec_trajectory(self.wl, self.workload, self.S0, self.windows, self.T, self.counts,
                                             self.spec_ckpts)
        return self._spec


def _stats(prefix: str, errs: np.ndarray) -> dict:
    return {f"{prefix}_median": float(np.median(errs)), f"{prefix}_p99": float(np.quantile(errs, 0.99)),
            f"{prefix}_max": float(np.max(errs))}


def run_series(s: Series, group: Group, sweep: dict, seed: int) -> list[dict]:
    """The checkpoint rows of one series (raises on failure; the caller records it)."""
    am = acs.METHODS[s.method]
    method, spec, wl = am.entry, group.spec, acs.with_state_dtype(group.wl, STATE_DTYPES[s.state_dtype])
    p = _point(spec, s, sweep, seed)
    rows, device, backend = sweep["rows"], sweep["device"], sweep["backend"]
    fns = method.api(spec.family)
    # int8 / fp8 / SR: set_state writes the float32 state by the format's rule (a cast would drop the scale)
    S0_dtype = wl.state_dtype if sf.state_format(s.state_dtype).plain else torch.float32
    # the harness's fixture builds the cache (the series' own trajectory brings the inputs: none drawn here)
    cache = PointFixture.build(method, fns, wl, p, rows, state=group.S0.to(device=device, dtype=S0_dtype),
                               with_inputs=False).caches[0]
    A = wl.params.get("A")
    out_rows, pending = [], []
    if method.kind == "ar":
        traj = group.ar
        for t in range(1, s.steps(sweep) + 1):
            y = method.step(fns, cache, p, traj.kwargs[t - 1], None, wl.out(rows))
            pending.append(acs.per_head_err(y, traj.y[t - 1]))
            if t in traj.states:
                state = am.committed_state(cache, spec.family, backend, A)
                out_rows.append(dict(step=t, window=None, **_stats("out_err", np.concatenate(pending)),
                                     **_stats("state_err", acs.per_head_err(state, traj.states[t]))))
                pending = []
    else:
        traj = group.spec_traj
        counts = traj.counts.to(device)
        for w in range(1, group.spec_windows(s.steps(sweep)) + 1):
            y = method.verify(fns, cache, p, traj.kwargs[w - 1], None, wl.out(rows, window=group.T))
            method.commit(fns, cache, p, counts[w - 1], None, A)
            pending.append(acs.per_head_err(y.transpose(1, 2), traj.y[w - 1].transpose(1, 2)))
            if w in traj.states:
                state = am.committed_state(cache, spec.family, backend, A)
                out_rows.append(dict(step=int(np.median(traj.committed[w - 1])), window=w,
                                     **_stats("out_err", np.concatenate(pending)),
                                     **_stats("state_err", acs.per_head_err(state, traj.states[w]))))
                pending = []
    return out_rows


def _base_row(s: Series, spec, sweep: dict, key: str, run_id: str) -> dict:
    entry = acs.METHODS[s.method].entry
    spec_kind = entry.kind == "spec"
    row = {c: None for c in COLUMNS}
    row.update(experiment="accuracy", family=spec.family, model=spec.name, heads=sweep["heads"], workload=s.workload,
               method=s.method, route=s.route, backend=sweep["backend"], buffer_len=s.buffer_len,
               spec_T=sweep["spec_T"] if spec_kind else None,
               history_len=sweep["history_len"] if spec_kind and entry.uses_history else None,
               acceptance=sweep["acceptance"] if spec_kind else None, state_dtype=s.state_dtype,
               act_dtype=s.act_dtype, rows=sweep["rows"], steps=s.steps(sweep), status="ok", message="",
               series_hash=key, run_id=run_id,
               experimental=s.state_dtype not in sf.BACKEND_FORMATS["triton"])
    return row


@dataclass
class AccuracyResult:
    run_dir: Path
    run_id: str
    rows: list[dict]
    resumed_skipped: int = 0


def run_accuracy(cfg, *, progress: bool | None = None) -> AccuracyResult:
    """Validate, then run every series of `cfg`, appending its checkpoint rows to <run dir>/accuracy.csv.
    On CPU torch runs one thread: these tensors are tiny, and a second thread on a shared box only spins."""
    threads_before = torch.get_num_threads()
    try:
        return _run(cfg, progress)
    finally:
        torch.set_num_threads(threads_before)


def _run(cfg, progress: bool | None) -> AccuracyResult:

    data = config_dict(cfg)
    sweep = validate(data)
    seed = data.get("seed", 0)
    specs = {s.key: acs.few_heads(s, sweep["heads"]) for s in _models(data)}
    series = plan_series(sweep, specs.values())
    hardware = resolve_hardware(data.get("hardware") or {}, sweep["device"], CONF_DIR)
    if sweep["device"] == "cpu":
        torch.set_num_threads(1)
    store = RunStore.open(data, hardware["name"])
    table = RunTable(store, "accuracy.csv", COLUMNS, key="series_hash")
    env = collect_env(device=sweep["device"], hardware=hardware, timing=data.get("timing") or {}, sweep=sweep)
    env.update(run_id=store.run_id, experiment="accuracy", series=len(series), threads=torch.get_num_threads())
    done = table.done_keys()
    todo = [s for s in series if s.key(sweep, seed) not in done]
    skipped = len(series) - len(todo)
    if not todo:                                  # a resume with nothing left writes no provenance file
        return AccuracyResult(store.run_dir, store.run_id, [], skipped)
    store.write_provenance("accuracy", env, OmegaConf.to_yaml(data))
    groups, written = {}, []

    def work(s) -> list[dict]:
        nonlocal groups
        key = s.key(sweep, seed)
        spec = specs[s.model_key]
        base = _base_row(s, spec, sweep, key, store.run_id)
        try:
            gkey = (s.model_key, s.workload, s.act_dtype)
            if gkey not in groups:
                groups = {gkey: Group(spec, s.workload, s.act_dtype, sweep, seed)}   # one group's truth at a time
            return [{**base, **r} for r in run_series(s, groups[gkey], sweep, seed)]
        except MethodUnavailable as exc:          # a family's method whose module has not landed
            return [{**base, "status": "skipped", "message": str(exc)}]
        except Exception as exc:  # noqa: BLE001 - a failing series is recorded, the sweep goes on
            status, message = failure(exc)
            return [{**base, "status": status, "message": message}]

    def keep(rows: list[dict]) -> bool:
        if table.append_many(rows):                # 0: another process wrote this series meanwhile
            written.extend(rows)
            return True
        return False

    show = data.get("progress", True) if progress is None else progress
    run_pending(todo, lambda s: s.key(sweep, seed), work, keep, lambda key: store.claim(key, table.done_keys),
                experiment="accuracy", run_dir=store.run_dir, desc="accuracy", show=show,
                stop=Budget.of(data).expired)
    return AccuracyResult(store.run_dir, store.run_id, written, skipped)


def summary(rows: list[dict]) -> str:
    """The last checkpoint of every series: method, precision, workload, errors."""
    import pandas as pd  # deferred: only the console summary needs pandas

    if not rows:
        return "(no rows)"
    df = pd.DataFrame(rows)
    last = df[df.status != "ok"] if (df.status == "ok").sum() == 0 else \
        df[df.status == "ok"].sort_values("step").groupby("series_hash").tail(1)
    cols = ["family", "workload", "method", "buffer_len", "state_dtype", "act_dtype", "step", "out_err_median",
            "state_err_median", "state_err_max"]
    errors = df[~df.status.isin(["ok", "skipped"])]
    text = last[cols].sort_values(cols[:6]).to_string(index=False, float_format=lambda v: f"{v:.3g}", na_rep="-")
    if len(errors):
        text += "\nerrors:\n" + errors[["family", "method", "state_dtype", "message"]].to_string(index=False)
    return text


register_schemas()   # any sweep composes; a sweep of another experiment is refused by name before any work


@hydra.main(version_base="1.3", config_path="../conf", config_name="accuracy")
def main(cfg) -> str:
    check_sweep("accuracy")
    t0 = time.perf_counter()
    result = run_accuracy(cfg)
    print(summary(result.rows))
    extra = f" ({result.resumed_skipped} series already done)" if result.resumed_skipped else ""
    print(f"accuracy: {len(result.rows)} rows in {time.perf_counter() - t0:.1f} s{extra} -> {result.run_dir}")
    exit_if_nothing_measured(result.rows, "accuracy", result.run_dir)
    return str(result.run_dir)


if __name__ == "__main__":
    main()
