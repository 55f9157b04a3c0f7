"""The e2e_decode and serving timing cores (plain functions; experiments/e2e_decode.py and serving.py are
the Hydra entries). Per point: build the model (random weights, same seed for every method of a point's
model so the methods see the same weights and inputs), check it, time whole cycles with the harness
timers, profile one cycle per sub-layer kind, write one row; any exception becomes the row's status.

e2e_decode: a cycle is `buffer_len` decode steps from a reset KV cursor (whole ReplaySSM flush cycles, the
baseline the same number of steps); ms/step = cycle / steps. The gate: a replay point's logits over
buffer_len + 1 steps (a flush included) against the baseline model with the same weights and tokens.
serving: a cycle is `steps` speculative steps of draft (T-1 MTP steps) + verify (the whole model on T
tokens) + commit (the acceptance model's counts), or `steps` AR decodes for mode `ar`.

Composed (build=block): the step is built from one sub-layer per kind; its time is the block's measured
step split by the profiled per-kind shares and re-weighted by the pattern's counts
(other + sum_k count_k x t_k). The SSM share is ssm_us / step_us of the same composition.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from experiments.harness import memory, timing
from experiments.harness.acceptance import parse_acceptance
from experiments.harness.budget import Budget
from experiments.harness.entry import exit_if_nothing_measured
from experiments.harness.env import collect_env, resolve_hardware
from experiments.harness.methods import MethodUnavailable
from experiments.harness.points import CONF_DIR, DTYPES
from experiments.harness.store import failure, parse_shard, run_pending, shard_of
from experiments.harness.sweeps import check_sweep
from experiments.hybrid.footprint import footprint, max_concurrency, step_bytes
from experiments.hybrid.layers import ATTENTION_IMPL, KV_LAYOUT, SSMCall
from experiments.hybrid.model import HybridModel, MTPDrafter
from experiments.hybrid.spec import KIND_GROUP, HybridSpec
from experiments.hybrid.sweep import HybridPlan, HybridPoint, HybridStore, expand, serving_steps
from experiments.published import CLAIMS
from replayssm.testing import rel_err, tolerance

COMMON = ["experiment", "model", "tp", "family", "method", "batch", "context_len", "buffer_len", "route",
          "state_dtype", "act_dtype", "backend", "weights", "weight_format", "timed_weights", "composed", "composition",
          "built_layers", "ssm_copies", "cache_resident", "attn_impl", "kv_layout", "moe_impl", "vocab_per_rank",
          "threads", "median_us", "p20_us", "p80_us", "ms_per_step", "tokens_per_s", "verify_us", "commit_us",
          "ssm_us", "attention_us", "mlp_us", "other_us", "ssm_share", "bytes_weights", "bytes_kv", "bytes_ssm",
          "bytes_step", "ssm_byte_share", "peak_mem_bytes", "weight_bytes", "kv_bytes", "ssm_cache_bytes", "assumed",
          "rel_err"]
E2E_COLUMNS = COMMON + ["status", "message", "config_hash", "run_id"]
SERVING_COLUMNS = COMMON + ["mode", "spec_T", "history_len", "acceptance", "mean_accepted", "draft_us", "max_model_len",
                            "footprint_weights_bytes", "footprint_per_seq_bytes", "hbm_budget_bytes", "hbm_source",
                            "max_concurrency", "at_max_concurrency", "status", "message", "config_hash", "run_id"]


def _call(p: HybridPoint, spec: HybridSpec) -> SSMCall:
    return SSMCall(family=spec.family, backend=p.backend, geometry=spec.geometry, state_dtype=DTYPES[p.state_dtype],
                   act_dtype=DTYPES[p.act_dtype], route=p.route, buffer_len=p.buffer_len or spec.buffer_len,
                   spec_T=p.spec_T, history_len=p.history_len or spec.history_len)


def _pattern(p: HybridPoint, spec: HybridSpec) -> tuple[str, ...]:
    return spec.block(p.ssm_copies) if p.build == "block" else spec.pattern


def build(p: HybridPoint, spec: HybridSpec, capacity: int, seed: int, moe_impl: str = "auto") -> HybridModel:
    """The point's model: weights from `seed` only (identical across the methods of one model)."""
    gen = torch.Generator().manual_seed(seed)
    model = HybridModel(spec, ssm_method=p.method, call=_call(p, spec), num_slots=p.batch, capacity=capacity, gen=gen,
                        device=p.device, build=p.build, moe_impl=moe_impl, pattern=_pattern(p, spec))
    model.reset(p.context_len, torch.Generator().manual_seed(seed + 1))
    return model


def _tokens(p: HybridPoint, spec: HybridSpec, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randint(0, spec.vocab, (p.batch, T), generator=g).to(p.device)


def _time(cycle, work: int, p: HybridPoint, sweep: dict, settings: dict) -> timing.Timing:
    if p.device == "cuda":
        return timing.time_gpu(cycle, work, timing_mode="eager", l2="warm", warmup_ms=float(settings["warmup_ms"]),
                               rep_ms=float(settings["rep_ms"]))
    return timing.time_cpu(cycle, work, warmup=int(sweep.get("cpu_warmup", 1)),
                           repeats=int(sweep.get("cpu_repeats", 5)),
                           min_sample_us=0, clock=timing.cpu_clock(settings.get("cpu_clock", "auto")))


class Phases:
    """Runs a step's phases (verify, commit) through `model`; in the profiled pass each phase is timed with a
    device sync around it and the model attributes its sub-layer times to it (HybridModel.phase_kind_us), so
    a phase's time outside the sub-layers (cursor updates, Python) is its own "other"."""

    def __init__(self, model: HybridModel):
        self.model, self.on = model, False
        self.wall: dict[str, float] = {}

    def __call__(self, name: str, fn, *args):
        if not self.on:
            return fn(*args)
        _sync(self.model.device)
        self.model.phase = name
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            _sync(self.model.device)
            self.wall[name] = self.wall.get(name, 0.0) + (time.perf_counter() - t0) * 1e6
            self.model.phase = ""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _profile(model: HybridModel, phases: Phases, cycle, steps: int) -> dict[tuple[str, str], float]:
    """Per (phase, sub-layer kind) microseconds per step of one profiled cycle; (phase, "other") is the phase's
    time outside its sub-layers."""
    model.kind_us.clear()
    model.phase_kind_us.clear()
    phases.wall.clear()
    model.profile, phases.on = True, True
    try:
        cycle()
    finally:
        model.profile, phases.on = False, False
    prof = dict(model.phase_kind_us)
    for ph, wall in phases.wall.items():
        inside = sum(us for (q, _), us in prof.items() if q == ph)
        prof[(ph, "other")] = prof.get((ph, "other"), 0.0) + max(0.0, wall - inside)
    return {k: v / steps for k, v in prof.items()}


def compose(spec: HybridSpec, p: HybridPoint, step_us: float, prof: dict[tuple[str, str], float]) -> dict:
    """Per-group (ssm / attention / mlp / other) and per-phase (verify / commit) times per step, and the step.

    The profiled shares split the measured step; a composed block's kinds are then re-weighted by the
    pattern's counts over the built counts (an SSM stack of n pools counts as the mean of its n mixers)."""
    total = sum(prof.values()) or 1.0
    scale = step_us / total                                       # profiled shares of the measured step
    built = Counter(_pattern(p, spec))
    groups = {"ssm": 0.0, "attention": 0.0, "mlp": 0.0, "other": 0.0}
    phases = {"verify": 0.0, "commit": 0.0}
    for (ph, ch), us in prof.items():
        weight = spec.counts[ch] / built[ch] if ch in built and p.build == "block" else 1.0
        value = us * scale * weight
        groups[KIND_GROUP.get(ch, "other")] += value
        phases[ph if ph in phases else "verify"] += value
    step = sum(groups.values())
    return {"ssm_us": groups["ssm"], "attention_us": groups["attention"], "mlp_us": groups["mlp"],
            "other_us": groups["other"], "median_us": step, "ssm_share": groups["ssm"] / step if step else None,
            "verify_us": phases["verify"], "commit_us": phases["commit"]}


def _base_row(p: HybridPoint, spec: HybridSpec, run_id: str) -> dict:
    row = {k: getattr(p, k, None) for k in ("experiment", "model", "tp", "family", "method", "batch", "context_len",
                                             "buffer_len", "route", "state_dtype", "act_dtype", "backend", "mode",
                                             "spec_T", "history_len", "acceptance", "at_max_concurrency",
                                             "ssm_copies", "cache_resident")}
    fmt = spec.weight_format or p.act_dtype
    timed = p.act_dtype + (" (no NVFP4 kernel installed: timed with these weights)" if fmt == "nvfp4" else "")
    row.update(weights="random", weight_format=fmt, timed_weights=timed, composed=p.build == "block",
               composition=spec.composition(p.ssm_copies) if p.build == "block"
               else "full pattern " + "".join(spec.pattern),
               built_layers=len(_pattern(p, spec)), attn_impl=ATTENTION_IMPL,
               kv_layout=KV_LAYOUT, vocab_per_rank=spec.vocab, threads=torch.get_num_threads(),
               assumed=";".join(spec.assumed), config_hash=p.config_hash(), run_id=run_id, message="")
    return row


def _finish(row: dict, model: HybridModel, t: timing.Timing, groups: dict, tokens_per_step: float, batch: int) -> None:
    k = groups["median_us"] / t.median_us if t.median_us else 1.0      # composed / measured block step
    row.update(groups, p20_us=t.p20_us * k, p80_us=t.p80_us * k, ms_per_step=groups["median_us"] / 1e3,
               tokens_per_s=batch * tokens_per_step / (groups["median_us"] * 1e-6), moe_impl=model.moe_impl,
               weight_bytes=model.weight_bytes() + model.embed_head_bytes())
    caches = model.cache_bytes()
    row.update(kv_bytes=caches["kv"], ssm_cache_bytes=caches["ssm"])


def _bytes(row: dict, plan: HybridPlan, p: HybridPoint, spec: HybridSpec, T: int, counts, with_mtp: bool) -> None:
    """The step's analytic bytes for the whole model (uncapped vocabulary / experts) and the SSM share."""
    full = plan.full_specs.get(p.model_key, spec)
    row.update(step_bytes(full, p.method, _call(p, full), batch=p.batch, context_len=p.context_len, T=T,
                          counts=counts, with_mtp=with_mtp))
    if p.cache_resident:
        row["message"] = "cache-resident: the timed SSM states fit the last-level cache (never a speedup)"


def _ar_cycle(model: HybridModel, phases: Phases, p: HybridPoint, tok: torch.Tensor, steps: int):
    ones = model._ones(p.batch)

    def cycle():
        model.set_lengths(p.context_len)
        for _ in range(steps):
            phases("verify", model.forward, tok[:, None])
            phases("commit", model.advance, ones, 1)
    return cycle


# ------------------------------------------------------------------------------------------------ e2e

def e2e_point(p: HybridPoint, spec: HybridSpec, plan: HybridPlan, row: dict, notes: list[str]) -> str:
    steps = spec.buffer_len
    seed = p.seed * 1_000_003 + zlib.crc32(p.model_key.encode()) % 100_003
    capacity = p.context_len + 2 * (steps + 1) + 1
    moe = plan.sweep.get("moe_impl", "auto")
    if p.method != "baseline_ar":       # the gate, on a few rows: same weights and tokens, baseline SSM method
        small = HybridPoint(**{**p.__dict__, "batch": min(p.batch, int(plan.timing.get("check_max_batch", 4))),
                               "ssm_copies": 1})
        ref_point = HybridPoint(**{**small.__dict__, "method": "baseline_ar", "buffer_len": None, "route": None})
        got_model, ref = build(small, spec, capacity, seed, moe), build(ref_point, spec, capacity, seed, moe)
        tok = _tokens(small, spec, 1, seed)[:, 0]
        got = torch.stack([got_model.decode(tok)[0] for _ in range(steps + 1)])
        want = torch.stack([ref.decode(tok)[0] for _ in range(steps + 1)])
        del got_model, ref
        err = rel_err(got, want)
        row["rel_err"] = err
        tol = 20 * tolerance(DTYPES[p.act_dtype], DTYPES[p.state_dtype])
        if not err <= tol:
            notes.append(f"gate: logits rel_err {err:.2e} > {tol:.1e} vs baseline_ar over {steps + 1} steps")
            return "wrong"
        notes.append(f"gate ok: logits vs baseline_ar, {small.batch} rows, {steps + 1} steps, rel_err {err:.1e}")
    model = build(p, spec, capacity, seed, moe)
    tok = _tokens(p, spec, 1, seed)[:, 0]
    phases = Phases(model)
    cycle = _ar_cycle(model, phases, p, tok, steps)
    t = _time(cycle, steps, p, plan.sweep, plan.timing)
    groups = compose(spec, p, t.median_us, _profile(model, phases, cycle, steps))
    _finish(row, model, t, groups, 1.0, p.batch)
    _bytes(row, plan, p, spec, 1, None, with_mtp=False)
    return "ok"


# -------------------------------------------------------------------------------------------- serving

def serving_point(p: HybridPoint, spec: HybridSpec, plan: HybridPlan, row: dict, notes: list[str]) -> str:
    sweep = plan.sweep
    T = p.spec_T or 1
    steps = serving_steps(spec, p.spec_T or 2, int(sweep["spec_steps"])) if p.mode != "ar" else \
        serving_steps(spec, min(int(v) for v in sweep["spec_T"]), int(sweep["spec_steps"]))
    seed = p.seed * 1_000_003 + zlib.crc32(p.model_key.encode()) % 100_003
    capacity = p.context_len + (steps + 2) * T + 1
    model = build(p, spec, capacity, seed, sweep.get("moe_impl", "auto"))
    fp = footprint(plan.full_specs.get(p.model_key, spec), p.mode, act_dtype=DTYPES[p.act_dtype],
                   state_dtype=DTYPES[p.state_dtype], max_model_len=int(sweep["max_model_len"]), spec_T=p.spec_T,
                   weight_format="checkpoint")
    budget, source = plan.budget[p.model_key]
    row.update(max_model_len=int(sweep["max_model_len"]), footprint_weights_bytes=fp.weights,
               footprint_per_seq_bytes=fp.per_seq, hbm_budget_bytes=budget, hbm_source=source,
               max_concurrency=max_concurrency(budget, fp))
    tok = _tokens(p, spec, 1, seed)[:, 0]
    hidden = torch.randn(p.batch, spec.hidden, generator=torch.Generator().manual_seed(seed + 3)).to(
        device=p.device, dtype=DTYPES[p.act_dtype])
    phases = Phases(model)
    if p.mode == "ar":
        cycle = _ar_cycle(model, phases, p, tok, steps)
        t = _time(cycle, steps, p, sweep, plan.timing)
        groups = compose(spec, p, t.median_us, _profile(model, phases, cycle, steps))
        _finish(row, model, t, groups, 1.0, p.batch)
        row.update(mean_accepted=1.0, draft_us=0.0)
        _bytes(row, plan, p, spec, 1, None, with_mtp=False)
        return "ok"
    acc = parse_acceptance(p.acceptance)
    counts = acc.sample(T, p.batch, steps, torch.Generator().manual_seed(seed + 4)).to(p.device)
    counts32 = counts.to(torch.int32)           # the commit's dtype, converted once outside the timed cycle
    maxes = counts.max(dim=1).values.tolist()
    drafter = MTPDrafter(model, torch.Generator().manual_seed(seed + 5), capacity)
    drafter.reset(p.context_len, torch.Generator().manual_seed(seed + 6))

    def draft():
        return drafter.draft(tok, hidden, T - 1)

    def commit(i):
        model.advance(counts32[i], maxes[i])
        drafter.sync_lengths()

    def cycle():
        model.set_lengths(p.context_len)
        drafter.sync_lengths()
        for i in range(steps):
            window = torch.cat([tok[:, None], draft()], dim=1)
            phases("verify", model.forward, window)
            phases("commit", commit, i)
    t = _time(cycle, steps, p, sweep, plan.timing)
    d = _time(draft, 1, p, sweep, plan.timing)
    prof = _profile(model, phases, cycle, steps)
    groups = compose(spec, p, t.median_us - d.median_us, prof)         # the model's share; the drafter apart
    groups["median_us"] += d.median_us
    groups["other_us"] += d.median_us
    mean_acc = float(counts.float().mean())
    _finish(row, model, t, groups, mean_acc, p.batch)
    row.update(mean_accepted=mean_acc, draft_us=d.median_us,
               weight_bytes=row["weight_bytes"] + drafter.weight_bytes())
    row["kv_bytes"] += drafter.mtp.cache_bytes()["kv"]
    _bytes(row, plan, p, spec, T, counts, with_mtp=True)
    notes.append("other_us includes the MTP drafter (draft_us); step = draft_us + verify_us + commit_us")
    return "ok"


# ------------------------------------------------------------------------------------------------ run

def run_hybrid(cfg, experiment: str) -> tuple[Path, list[dict]]:
    data = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    data = {k: v for k, v in data.items() if k != "hydra"}
    device = "cuda" if data.get("device", "auto") in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    hardware = resolve_hardware(data.get("hardware") or {}, device, CONF_DIR)
    plan = expand(data, experiment, hardware)                     # every ValueError here, before any work
    columns = E2E_COLUMNS if experiment == "e2e_decode" else SERVING_COLUMNS
    store = HybridStore.open(data, hardware["name"], experiment, columns)
    shard, shards = parse_shard(data)
    done = store.done_hashes()
    budget = Budget.of(data)
    todo = budget.order([p for p in plan.points
                         if shard_of(p.config_hash(), shards) == shard and p.config_hash() not in done], CLAIMS)
    if not todo:                                  # a resume with nothing left writes no provenance file
        return store.run_dir, []
    if plan.device == "cuda" and shards > 1:      # one process per GPU: shard i on local GPU i mod count
        torch.cuda.set_device(shard % torch.cuda.device_count())
    env = collect_env(device=plan.device, hardware=hardware, timing=plan.timing, sweep=data["sweep"])
    env.update(run_id=store.run_id, points=len(plan.points), experiment=experiment,
               shard={"index": shard, "count": shards, "to_run": len(todo)})
    if plan.over_capacity:                        # sweep.over_capacity: skip (paper_serving on one GPU)
        env["over_capacity"] = plan.over_capacity
        print(f"{experiment}: {len(plan.over_capacity)} points above their mode's max concurrency left out "
              f"(sweep.over_capacity=skip; listed in env.json), e.g. {plan.over_capacity[0]}")
    store.store.write_provenance(experiment, env, OmegaConf.to_yaml(data))
    threads = torch.get_num_threads()
    if data["sweep"].get("threads"):
        torch.set_num_threads(int(data["sweep"]["threads"]))
    rows = []

    def keep(row: dict) -> bool:
        if store.append(row):
            rows.append(row)
            return True
        return False

    try:
        run_pending(todo, HybridPoint.config_hash, lambda p: _run_point(p, plan, store.run_id), keep,
                    lambda key: store.store.claim(key, store.done_hashes), experiment=experiment,
                    run_dir=store.run_dir, desc=experiment, show=data.get("progress", True), stop=budget.expired)
    finally:
        torch.set_num_threads(threads)
    return store.run_dir, rows


def _run_point(p: HybridPoint, plan: HybridPlan, run_id: str) -> dict:
    spec = plan.specs[p.model_key]
    row = _base_row(p, spec, run_id)
    notes: list[str] = []
    fn = e2e_point if p.experiment == "e2e_decode" else serving_point
    try:
        memory.reset_peak(p.device)
        status = fn(p, spec, plan, row, notes)
    except MethodUnavailable as exc:          # a family's method whose module has not landed: skipped, as kernels
        status = "skipped"
        notes.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - a failing point is recorded, the sweep goes on
        status, note = failure(exc)
        notes.append(note)
    finally:
        row["peak_mem_bytes"] = memory.peak_bytes(p.device)
        if p.device == "cuda":
            torch.cuda.empty_cache()
    row.update(status=status, message="; ".join(([row['message']] if row.get('message') else []) + notes))
    return row


def summarize(rows: list[dict]) -> str:
    head = ["model", "tp", "batch", "ctx", "method/mode", "T", "ms/step", "tok/s", "ssm%", "maxconc", "status"]
    lines = [head]
    for r in rows:
        share = r.get("ssm_share")
        lines.append([r["model"], r["tp"], r["batch"], r["context_len"], r.get("mode") or r["method"],
                      r.get("spec_T") or "", f"{r['ms_per_step']:.3f}" if r.get("ms_per_step") else "",
                      f"{r['tokens_per_s']:.1f}" if r.get("tokens_per_s") else "",
                      f"{100 * share:.0f}" if share else "", r.get("max_concurrency") or "", r["status"]])
    widths = [max(len(str(x)) for x in col) for col in zip(*lines)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines)


def model_override(data: dict, task_overrides: list[str]) -> dict:
    """`model=<name>` on the command line (and no sweep.models override) runs that one model: the sweep's own
    entries for it (their TP splits) when it lists any, else the model at the TP split the sweep's other
    entries use most (the CPU sweeps: TP8), else at its config's TP."""
    chosen = [o.split("=", 1)[1] for o in task_overrides if o.startswith("model=")]
    if not chosen or any(o.lstrip("+~").startswith("sweep.models") for o in task_overrides):
        return data
    name = chosen[-1]
    listed = [str(e) for e in data["sweep"].get("models") or []]
    entries = [e for e in listed if e.split("@")[0] == name]
    if not entries:
        splits = Counter(e.split("@")[1] for e in listed if "@" in e)
        entries = [f"{name}@{splits.most_common(1)[0][0]}" if splits else name]
    return {**data, "sweep": {**data["sweep"], "models": entries}}


def hydra_main(cfg, experiment: str) -> str:

    check_sweep(experiment)
    t0 = time.perf_counter()
    data = OmegaConf.to_container(cfg, resolve=True)
    data = model_override(data, list(HydraConfig.get().overrides.task))
    run_dir, rows = run_hybrid(data, experiment)
    print(summarize(rows))
    print(f"{experiment}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s -> {run_dir}")
    exit_if_nothing_measured(rows, experiment, run_dir)
    return str(run_dir)
