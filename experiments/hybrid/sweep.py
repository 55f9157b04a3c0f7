"""Validation and points of the e2e_decode and serving experiments, and their row store.

Everything is checked here, before any allocation (ValueError naming the key): models (pattern, dims),
methods / modes, dtypes, devices, window T vs the ring (T > history_len is refused), context + decoded tokens
vs max_model_len (the KV budget), and a batch that cannot fit the HBM budget (analytic footprint).

Rows go to <run dir>/e2e_rows.csv or serving_rows.csv beside the kernel experiments' rows.csv (their columns
differ); the run directory, env.json and resume work as in experiments/harness/store.py.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from experiments.harness import memory
from experiments.harness.acceptance import parse_acceptance
from experiments.harness.methods import REGISTRY
from experiments.harness.points import (
    DTYPES,
    _choice,
    _int,
    _int_list,
    load_model_config,
    resolve_device,
    validate_timing,
)
from experiments.harness.store import KeyIndex, RunStore, append_unique, locked
from experiments.harness.sweeps import E2E_METHODS, HybridSweepSchema
from experiments.harness.sweeps import SERVING_MODES as MODES
from experiments.hybrid import footprint as fpm
from experiments.hybrid.spec import HybridSpec, hybrid_spec
from replayssm.checks import SPEC_ROUTES

_MODEL_ENTRY = re.compile(r"^([A-Za-z0-9_]+)(?:@tp(\d+))?$")


@dataclass(frozen=True)
class HybridPoint:
    experiment: str
    model: str
    tp: int
    family: str
    method: str                     # SSM method (registry name)
    mode: str | None                # serving mode
    batch: int
    context_len: int
    buffer_len: int | None
    history_len: int | None
    spec_T: int | None
    acceptance: str | None
    route: str | None
    state_dtype: str
    act_dtype: str
    backend: str
    build: str
    device: str
    seed: int
    at_max_concurrency: bool = False
    ssm_copies: int = 1             # SSM mixers built in a composed block (GPU: a stack of state pools)
    cache_resident: bool | None = None   # the timed SSM states fit l2_factor x last-level cache (None: unknown)

    @property
    def model_key(self) -> str:
        return f"{self.model}@tp{self.tp}"

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class HybridPlan:
    experiment: str
    device: str
    points: list[HybridPoint]
    specs: dict[str, HybridSpec]
    sweep: dict
    timing: dict
    budget: dict = field(default_factory=dict)     # model_key -> (bytes, source)
    full_specs: dict[str, HybridSpec] = field(default_factory=dict)   # model_key -> spec before the CPU caps
    over_capacity: list[str] = field(default_factory=list)   # serving points left out (sweep.over_capacity: skip)


def _models(sweep: dict) -> list[tuple[str, dict, int | None]]:
    entries = sweep.get("models")
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"sweep.models: expected a non-empty list of model names, got {entries!r}")
    out = []
    for i, entry in enumerate(entries):
        match = _MODEL_ENTRY.match(entry) if isinstance(entry, str) else None
        if match is None:
            raise ValueError(f"sweep.models[{i}]: expected 'name' or 'name@tpN', got {entry!r}")
        tp = int(match.group(2)) if match.group(2) else None
        out.append((f"sweep.models[{i}]", load_model_config(match.group(1)), tp))
    return out


def _spec(key: str, cfg: dict, tp: int | None, sweep: dict) -> HybridSpec:
    spec = hybrid_spec(cfg, tp, key)
    if sweep.get("buffer_len") is not None:
        spec = replace(spec, buffer_len=_int("sweep.buffer_len", sweep["buffer_len"]))
    if sweep.get("history_len") is not None:
        spec = replace(spec, history_len=_int("sweep.history_len", sweep["history_len"]))
    cap = sweep.get("vocab_cap")
    if cap is not None and spec.vocab > _int("sweep.vocab_cap", cap):
        note = f"vocab truncated to {cap} per rank (sweep.vocab_cap)"
        spec = replace(spec, vocab=cap, assumed=spec.assumed + (note,))
    cap = sweep.get("expert_cap")
    if cap is not None and spec.mlp is not None and spec.mlp.num_experts and spec.mlp.num_experts > _int(
            "sweep.expert_cap", cap):
        if cap < spec.mlp.top_k:
            raise ValueError(f"sweep.expert_cap={cap}: below {key}'s top-k {spec.mlp.top_k} (experts per token)")
        note = (f"{cap} of {spec.mlp.num_experts} routed experts built (sweep.expert_cap; the analytic bytes count "
                "all of them)")
        spec = replace(spec, mlp=replace(spec.mlp, num_experts=cap), assumed=spec.assumed + (note,))
    return spec


def _names(sweep: dict, key: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """sweep.<key>: a non-empty list, each entry one of `allowed` (the ValueError names the bad index)."""
    names = sweep.get(key) or []
    for i, name in enumerate(names):
        _choice(f"sweep.{key}[{i}]", name, allowed)
    if not names:
        raise ValueError(f"sweep.{key}: expected a non-empty list of {what}")
    return list(names)


def expand(cfg: dict, experiment: str, hardware: dict | None = None) -> HybridPlan:
    """Validate `cfg` (plain dict) and expand the points of `experiment` (e2e_decode | serving)."""
    sweep = cfg.get("sweep")
    if not isinstance(sweep, dict):
        raise ValueError("sweep: missing config section")
    unknown = sorted(set(sweep) - set(HybridSweepSchema.__dataclass_fields__))
    if unknown:
        raise ValueError(f"sweep.{unknown[0]}: unknown key for {experiment}; expected one of "
                         f"{list(HybridSweepSchema.__dataclass_fields__)}")
    device = resolve_device(cfg.get("device", "auto"))
    seed = _int("seed", cfg.get("seed", 0), minimum=0)
    validate_timing(cfg.get("timing") or {})
    _int("sweep.cpu_repeats", sweep.get("cpu_repeats", 5))
    _int("sweep.cpu_warmup", sweep.get("cpu_warmup", 1), minimum=0)
    backend = _choice("sweep.backend", sweep.get("backend"), ("torch", "triton", "cpu"))
    build = _choice("sweep.build", sweep.get("build", "auto"), ("auto", "full", "block"))
    _choice("sweep.moe_impl", sweep.get("moe_impl", "auto"), ("auto", "grouped_mm", "loop"))
    route = _choice("sweep.route", sweep.get("route"), ("output_only", "state_and_output"))
    spec_route = _choice("sweep.spec_route", sweep.get("spec_route", "fused"), SPEC_ROUTES)
    over_capacity = _choice("sweep.over_capacity", sweep.get("over_capacity", "refuse"), ("refuse", "skip"))
    skipped: list[str] = []
    for key, allowed in (("state_dtype", ("float32", "float16")), ("act_dtype", ("float32", "float16", "bfloat16"))):
        v = sweep.get(key)
        if v not in DTYPES or str(DTYPES[v]).removeprefix("torch.") not in allowed:
            raise ValueError(f"sweep.{key}: expected one of {list(allowed)}, got {v!r}")
    sd, ad = (str(DTYPES[sweep[k]]).removeprefix("torch.") for k in ("state_dtype", "act_dtype"))
    if device == "cpu":
        if ad == "bfloat16":
            raise ValueError("sweep.act_dtype: bfloat16 is not timed on CPU; use float32/float16")
        if backend == "triton":
            raise ValueError("sweep.backend=triton on CPU would time the Triton interpreter; use backend=torch")
    if backend == "cpu" and device != "cpu":
        raise ValueError("sweep.backend=cpu runs the C/OpenMP kernels on CPU tensors; on a GPU use backend=triton")
    batches = _int_list(sweep, "batch")
    contexts = _int_list(sweep, "context_len", minimum=0)
    max_len = _int("sweep.max_model_len", sweep.get("max_model_len"))
    loaded = _models(sweep)
    models = [(key, _spec(key, c, tp, sweep)) for key, c, tp in loaded]
    uncapped = {**sweep, "vocab_cap": None, "expert_cap": None}
    full = {key_of(s): _spec(key, c, tp, uncapped) for (key, c, tp), (_, s) in zip(loaded, models)}
    timing = dict(cfg.get("timing") or {})
    points: list[HybridPoint] = []
    common = dict(experiment=experiment, state_dtype=sd, act_dtype=ad, device=device, seed=seed)

    def on(spec):           # backend=cpu: a method without C kernels runs on torch, and its rows say so
        return dict(common, backend=REGISTRY["baseline_ar"].backend_for(backend, spec.family))
    budgets = {}
    if experiment == "e2e_decode":
        methods = _names(sweep, "methods", E2E_METHODS, "AR methods")
        for key, spec in models:
            steps = spec.buffer_len                    # one whole flush cycle per timed cycle
            for ctx in contexts:
                _check_context(ctx, steps, 1, max_len, key)
                for b in batches:
                    for m in methods:
                        points.append(HybridPoint(
                            **on(spec), model=spec.name, tp=spec.tp, family=spec.family, method=m, mode=None, batch=b,
                            context_len=ctx, buffer_len=spec.buffer_len if m == "replay_ar" else None, history_len=None,
                            spec_T=None, acceptance=None, route=_route(spec, m, route, on(spec)["backend"]),
                            build=_build(spec, build, sweep, ad),
                            **_residency(spec, _build(spec, build, sweep, ad), m, b, None, device, hardware, timing,
                                         sd, ad)))
    elif experiment == "serving":
        modes = _names(sweep, "modes", MODES, "serving modes")
        Ts = _int_list(sweep, "spec_T", minimum=2)
        accs = [parse_acceptance(a, f"sweep.acceptance[{i}]") for i, a in enumerate(sweep.get("acceptance") or [])]
        if not accs:
            raise ValueError("sweep.acceptance: serving needs at least one acceptance model")
        steps_req = _int("sweep.spec_steps", sweep.get("spec_steps"))
        for key, spec in models:
            budget = fpm.hbm_budget(hardware or {}, device, sweep)
            budgets[spec.name + f"@tp{spec.tp}"] = budget
            for T in Ts:
                for i, acc in enumerate(accs):                # a published workload covers its positions only
                    acc.check_window(T, f"sweep.acceptance[{i}]")
                if T > spec.history_len:
                    raise ValueError(f"{key}: spec_T={T} > history_len (ring buffer) B={spec.history_len}; the ring "
                                     "needs B >= T (raise sweep.history_len or lower sweep.spec_T)")
                steps = serving_steps(spec, T, steps_req)
                for ctx in contexts:
                    _check_context(ctx, steps, T, max_len, key)
                    for mode in modes:
                        method = fpm.MODE_METHOD[mode]
                        fp = fpm.footprint(full[key_of(spec)], mode, act_dtype=DTYPES[ad], state_dtype=DTYPES[sd],
                                           max_model_len=max_len, spec_T=T, weight_format="checkpoint")
                        cap = fpm.max_concurrency(budget[0], fp)
                        bs = list(batches)
                        if sweep.get("at_concurrency") and cap > 0:
                            bs.append(-min(cap, int(sweep.get("concurrency_batch_cap", 1024))))
                        for b in bs:
                            at_cap, b = b < 0, abs(b)
                            if b > cap and over_capacity == "skip":
                                skipped.append(f"{key} T={T} ctx={ctx} {mode}: batch {b} > max concurrency {cap}")
                                continue
                            if b > cap:
                                raise ValueError(
                                    f"{key}: batch {b} cannot fit the HBM budget in mode {mode!r} (max concurrency "
                                    f"{cap} at max_model_len={max_len}: weights {fp.weights / 1e9:.2f} GB + "
                                    f"{fp.per_seq / 1e6:.2f} MB per sequence, budget {budget[0] / 1e9:.1f} GB from "
                                    f"{budget[1]})")
                            for acc in (accs if mode != "ar" else accs[:1]):
                                points.append(HybridPoint(
                                    **on(spec), model=spec.name, tp=spec.tp, family=spec.family, method=method,
                                    mode=mode, batch=b, context_len=ctx,
                                    buffer_len=None, history_len=spec.history_len if mode == "replayssm" else None,
                                    spec_T=T if mode != "ar" else None, acceptance=acc.label if mode != "ar" else None,
                                    route=_route(spec, method, spec_route, on(spec)["backend"]),
                                    build=_build(spec, build, sweep, ad), at_max_concurrency=at_cap,
                                    **_residency(spec, _build(spec, build, sweep, ad), method, b, T, device,
                                                 hardware, timing, sd, ad)))
        points = list(dict.fromkeys(points))          # `ar` rows repeat across T: keep one
    else:
        raise ValueError(f"experiment.name: unknown hybrid experiment {experiment!r}")
    return HybridPlan(experiment=experiment, device=device, points=points,
                      specs={key_of(s): s for _, s in models}, sweep=sweep, timing=timing, budget=budgets,
                      full_specs=full, over_capacity=skipped)


def key_of(spec: HybridSpec) -> str:
    return f"{spec.name}@tp{spec.tp}"


def _residency(spec: HybridSpec, build: str, method: str, batch: int, T: int | None, device: str,
               hardware: dict | None, timing: dict, sd: str, ad: str) -> dict:
    """SSM mixers to build and whether their states sit in the last-level cache, by the kernel sweep's rule
    (experiments/harness/memory.py): a composed block on a GPU stacks enough mixers (own state pools) that
    their states exceed l2_factor x L2, so each step streams every mixer's state from HBM; on a CPU one mixer
    is built (more would only add Python dispatch) and the row says whether its state is cache-resident. A
    full build's mixers are the model's own."""
    fp, conv = fpm.ssm_layer_bytes(spec, fpm.MODE_BY_METHOD[method], act_dtype=DTYPES[ad], state_dtype=DTYPES[sd],
                                   spec_T=T)
    layer_bytes = batch * (fp.total + conv)
    l2 = (hardware or {}).get("l2_bytes")
    factor = float(timing.get("l2_factor", 4))
    copies = 1
    if build == "block" and device == "cuda":
        free = memory.free_bytes(device)            # the stack may use hbm_budget_frac of the free memory
        budget = int(free * float(timing.get("hbm_budget_frac", 0.5))) if free is not None else None
        copies, _ = memory.stack_layers(min(layer_bytes, budget or layer_bytes), l2="cold", l2_bytes=l2,
                                        l2_factor=factor, max_layers=int(timing.get("max_layers", 64)),
                                        budget_bytes=budget)
    built = copies if build == "block" else spec.ssm_layers
    return {"ssm_copies": copies,
            "cache_resident": memory.cache_resident(built, layer_bytes, l2="cold", l2_bytes=l2, l2_factor=factor)}


def serving_steps(spec: HybridSpec, T: int, requested: int) -> int:
    """Steps per timed cycle, shared by every mode: enough for 3 ring flushes at one accepted token per step."""
    return max(requested, 3 * (spec.history_len - T + 2))


def _check_context(ctx: int, steps: int, T: int, max_len: int, key: str) -> None:
    need = ctx + steps * T + T
    if need > max_len:
        raise ValueError(f"{key}: context_len={ctx} + {steps} timed steps x {T} tokens needs {need} KV entries per "
                         f"sequence, more than the KV budget sweep.max_model_len={max_len}")


def _route(spec: HybridSpec, method: str, route: str, backend: str) -> str | None:
    """The route a point runs (Method.route_for): GDN and KDA have the state-and-output form on Triton only, so
    elsewhere their rows say output_only, the algebra their torch and C forms compute."""
    return REGISTRY[method].route_for(spec.family, backend, route)


def _build(spec: HybridSpec, build: str, sweep: dict, act: str) -> str:
    if build != "auto":
        return build
    fp = fpm.footprint(spec, "ar", act_dtype=DTYPES[act], state_dtype=DTYPES[act], max_model_len=1)
    return "full" if fp.weights <= int(sweep.get("max_build_bytes", 2e9)) else "block"


# --------------------------------------------------------------------------------------------------- store

class HybridStore:
    """<run dir>/<experiment>_rows.csv in a run directory made (or resumed) by the harness's RunStore; rows are
    appended under the run's lock, never twice for one config_hash (experiments/harness/store.py)."""

    def __init__(self, store: RunStore, experiment: str, columns: list[str]):
        self.store, self.columns = store, columns
        self.run_dir, self.run_id = store.run_dir, store.run_id
        self.path = store.run_dir / f"{experiment.removesuffix('_decode')}_rows.csv"
        with locked(store.lock_path):
            if self.path.exists():
                with open(self.path, newline="") as f:
                    if next(csv.reader(f), []) != columns:
                        raise ValueError(f"resume: {self.path} has different columns than this harness writes")
            else:
                with open(self.path, "w", newline="") as f:
                    csv.DictWriter(f, fieldnames=columns).writeheader()
        self.index = KeyIndex(self.path, "config_hash")

    @classmethod
    def open(cls, data: dict, hardware: str, experiment: str, columns: list[str]) -> HybridStore:
        if data.get("resume"):
            run_dir = Path(data["resume"])
            if not run_dir.is_dir():
                raise ValueError(f"resume: {run_dir} is not a run directory")
            store = RunStore(run_dir, run_dir.name)
        else:                                        # a new run, or the shared one of a multirun
            store = RunStore.open(data, hardware)
        return cls(store, experiment, columns)

    def done_hashes(self) -> set[str]:
        return set(self.index.refresh())

    def append(self, row: dict) -> bool:
        return append_unique(self.path, self.columns, [row], self.index, self.store.lock_path) == 1
