"""The per-step time model (replayssm/step_time.py) evaluated at one published cell's own conditions.

Kernel cells: one SSM layer's step, ReplaySSM method over its baseline (step_time.speedup). Whole-model cells
(level e2e / serving): every layer of the model's pattern (conf/model, experiments/hybrid/spec.py):

    t_model = t_other + n_ssm * t_layer(method) + cursor launch (once per step: vLLM shares it across layers)
    t_other = max(weight + KV bytes / bandwidth, 2 * active params * tokens / tensor peak) + launches * floor

weights in the served checkpoint's format (experiments/hybrid/footprint.py weight_bytes: NVFP4 where conf/model
says so), routed experts as far as the step's tokens touch them (footprint.experts_touched), the KV cache read at
CONTEXT_LEN. Concurrency cells: footprint.concurrency_table (vLLM's allocator model) at the cell's (B, T).
Capacity-ratio cells (a state format's admitted capacity over another's, e.g. vLLM PR #52962's 8-bit state over
fp32): the same table's ReplaySSM caps at the two formats, at the cell's model or its STAND_IN.

`model_cell(cell)` returns value_model, the terms (seconds of the ReplaySSM side; the baseline's beside them),
the regime and, where the model does not claim to cover a cell, regime "not-modelled" with the reason.

A kernel cell's step includes the issue floor (step_time: the step kernels' warp-instructions from the committed
replayssm/issue_table.py over the issue rate at their occupancy) wherever the table has the cell's geometry,
point and GPU arch (the blog's Fig 7 and Fig 9 points); elsewhere, and in every whole-model cell, it is bytes,
FLOPs and launches as before. ISSUE_FLOOR = False turns it off (the
model the record used before it), which is how the change it makes to each cell is measured.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import torch

from experiments.harness.points import load_model_config
from experiments.hybrid import footprint as fpm
from experiments.hybrid.spec import HybridSpec, hybrid_spec
from replayssm import step_time as st

ISSUE_FLOOR = True                  # the step_time issue term (False: bytes, FLOPs and launches only)
# ASSUMED (no source states it): the context each decode step attends to in the published e2e tables.
CONTEXT_LEN = 1024
# ASSUMED kernels per non-SSM-kernel sub-layer in a CUDA-graph decode step (norm, projections, activation, the
# attention / expert kernels; vLLM fuses some): only the batch-1 absolute time depends on it, ratios barely.
KERNELS_PER_SUBLAYER = {"*": 6, "-": 4, "E": 8, "M": 4, "G": 4}
HEAD_KERNELS = 3                    # final norm, LM head GEMM, sampling


# ASSUMED accepted tokens per verify step where a kernel / native-spec cell does not state the acceptance
# (the native-over-ReplaySSM ratio barely depends on it: only the flush cadence does).
def default_accepted(T: int) -> int:
    return max(1, math.ceil(T / 2))


def mean_tokens_per_step(T: int) -> float | None:
    """Tokens one verify step of window T yields on average (1 + the expected accepted drafts) under the published
    acceptance profiles (ACCEPT_*); None past the longest profile."""
    drafts = T - 1
    if drafts <= len(ACCEPT_CONDITIONAL):
        total, p = 0.0, 1.0
        for rate in ACCEPT_CONDITIONAL[:drafts]:
            p *= rate
            total += p
        return 1 + total
    if drafts <= len(ACCEPT_UNCONDITIONAL):
        return 1 + sum(ACCEPT_UNCONDITIONAL[:drafts])
    return None


DTYPE_BYTES = {"fp32": 4, "float32": 4, "f32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "half": 2,
               "fp8_e4m3": 1, "float8_e4m3fn": 1, "fp8": 1, "int8": 1}
# A baseline that names its own state dtype (results/published/README.md): the third party's `production` kernel
# keeps a bf16 state; `fp32_state` / `bf16_state` the same engine with that state.
BASELINE_STATE_BYTES = {"production": 2, "bf16_state": 2, "fp32_state": 4}
REPLAY_OF = {"ar": ("replay_ar", "baseline_ar"), "spec": ("replay_spec", "baseline_spec")}
# Published per-position acceptance on GSM8K, ASSUMED for this repo's models' MTP drafters (none of theirs is
# published): up to 3 drafts the Qwen3-Next MTP head's conditional rates (vllm-project/speculators PR #366: 0.873,
# 0.778, 0.675; its MeanAccepted 2.01), beyond the multi-module MTP-8's unconditional rates (vLLM PR #48892).
ACCEPT_CONDITIONAL = (0.873, 0.778, 0.675)
ACCEPT_UNCONDITIONAL = (0.7568, 0.6011, 0.4976, 0.4113, 0.3538, 0.2980, 0.2608, 0.2229)
ACCEPT_SOURCE = "GSM8K acceptance: speculators PR #366 (<= 3 drafts), vLLM PR #48892 MTP-8 (more); assumed"
# An 8-bit state's bytes are counted (one byte per element, one fp32 scale per (slot, head) with every state read
# and write), but its time also holds the (de)quantisation work and the third party's own kernels (launches,
# conversions): the value is an indication only.
EIGHT_BIT = ("8-bit state: bytes counted (elements + per-head fp32 scales), but (de)quantisation work and the "
             "kernel's own launches are not (an indication, not a claim)")
# State formats of the cells, as footprint.STATE_DTYPES names them; a baseline that names its own state.
STATE_DTYPE_NAME = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
                    "bf16": "bfloat16", "bfloat16": "bfloat16", "int8": "int8", "fp8_e4m3": "float8_e4m3fn",
                    "fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "fp32_state": "float32",
                    "bf16_state": "bfloat16"}
# Published models without a conf/model config: the config whose capacity cells stand in for them, and why.
STAND_IN = {"nemotron-3.5 lightning": (
    "nemotron3_nano_30b_a3b", "stand-in nemotron3_nano_30b_a3b for Nemotron-3.5 Lightning (vLLM PR #52506 names "
    "Lightning a 30B-A3B Nemotron; the harness's 30B-A3B Mamba-2 hybrid is Nemotron-3-Nano-30B-A3B: its geometry, "
    "layer counts and BF16 weights, not Lightning's, which no source here gives)")}
DISAGREE = 1.25                     # model and cell further apart than this: the row names a missing term


def _num(v, default=None):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(x) else x


def _int(v, default=None):
    x = _num(v)
    return default if x is None else int(x)


@cache
def spec_of(model: str) -> HybridSpec:
    return hybrid_spec(load_model_config(model))


def state_bytes_of(dtype) -> int | None:
    if dtype is None or (isinstance(dtype, float) and math.isnan(dtype)) or str(dtype) == "":
        return 4                                        # the published tables' default: fp32 state
    return DTYPE_BYTES.get(str(dtype).lower())


# ----------------------------------------------------------------------------------------- whole model

def _weights_read(spec: HybridSpec, tokens: int, chars: tuple | None = None,
                  extra: dict | None = None) -> tuple[float, float]:
    """(bytes of weights one pass over `tokens` tokens reads in the checkpoint's format, active params per token):
    the sub-layers `chars` (default the model's pattern), the LM head and `extra` {kind: params}."""
    fmt = spec.weight_format or "bfloat16"
    touched: dict[str, float] = {"lm_head": spec.vocab * spec.hidden, **(extra or {})}
    active = float(sum(touched.values()))
    for ch in spec.pattern if chars is None else chars:
        for kind, n in fpm.layer_weights(spec, ch).items():
            if kind == "experts":
                m = spec.mlp
                touched[kind] = touched.get(kind, 0) + n * fpm.experts_touched(m.num_experts, m.top_k, tokens) \
                    / m.num_experts
                active += n * m.top_k / m.num_experts
            else:
                touched[kind] = touched.get(kind, 0) + n
                active += n
    return float(fpm.weight_bytes(spec, {k: int(v) for k, v in touched.items()}, fmt)), active


def other_time(spec: HybridSpec, hw: st.Hardware, batch: int, T: int = 1, floor: float = st.LAUNCH_FLOOR_S) -> dict:
    """Seconds of everything but the SSM kernels in one step of `batch` sequences x T tokens."""
    tokens = batch * T
    wbytes, active = _weights_read(spec, tokens)
    a = spec.attention
    kv = spec.attention_layers * batch * (CONTEXT_LEN + T) * 2 * a.num_kv_heads * a.head_dim * 2 if a else 0
    launches = sum(KERNELS_PER_SUBLAYER[ch] for ch in spec.pattern) + HEAD_KERNELS
    bytes_s = (wbytes + kv) / hw.hbm_Bps
    flops_s = 2 * active * tokens / hw.tensor_flops
    return {"other_bytes_s": bytes_s, "other_flops_s": flops_s, "other_launch_s": launches * floor,
            "other_s": max(bytes_s, flops_s) + launches * floor}


def drafter_time(spec: HybridSpec, hw: st.Hardware, batch: int, T: int, floor: float = st.LAUNCH_FLOOR_S) -> float:
    """Seconds of the MTP drafter's T - 1 passes (one token per sequence each): its sub-layers (conf/model
    mtp.pattern), eh_proj (2 hidden^2) and the shared LM head, weights over bandwidth or FLOPs over the tensor peak,
    its attention's KV at CONTEXT_LEN, and its launches."""
    if T <= 1:
        return 0.0
    chars = spec.mtp_pattern
    wbytes, active = _weights_read(spec, batch, chars, {"eh_proj": 2 * spec.hidden ** 2})
    a = spec.attention
    kv = chars.count("*") * batch * (CONTEXT_LEN + 1) * 2 * a.num_kv_heads * a.head_dim * 2 if a else 0
    launches = sum(KERNELS_PER_SUBLAYER[ch] for ch in chars) + HEAD_KERNELS + 1
    one = max((wbytes + kv) / hw.hbm_Bps, 2 * active * batch / hw.tensor_flops) + launches * floor
    return (T - 1) * one


def model_time(spec: HybridSpec, method: str, hw: st.Hardware, batch: int, *, state_bytes: int, L: int, T: int = 1,
               B_hist: int = 16, accepted: int | None = None, floor: float = st.LAUNCH_FLOOR_S) -> dict:
    """One whole-model step: the other layers plus n_ssm SSM layers of `method` (cursor shared by the layers)."""
    # No issue floor here: the table counts this harness's kernels at a few points, and a whole-model cell's
    # kernels are the publishing engine's (vLLM's fork), whose instruction counts nobody has measured.
    layer = st.step_time(spec.geometry, method, hw, batch, launch_floor_s=floor, shared_cursor=True,
                         issue=False, L=L, T=T, B_hist=B_hist, accepted=accepted, state_bytes=state_bytes)
    n = spec.ssm_layers
    cursor = st.CURSOR_LAUNCHES.get(method, 0) * floor
    is_spec = method.endswith("spec")
    other = other_time(spec, hw, batch, T if is_spec else 1, floor)
    if is_spec:                                   # a speculative step drafts first: the drafter is every method's
        draft = drafter_time(spec, hw, batch, T, floor)
        other = {**other, "drafter_s": draft, "other_s": other["other_s"] + draft}
    ssm_s = n * layer.total + cursor
    return {**other, "ssm_s": ssm_s, "bytes_s": n * layer.bytes_s, "flops_s": n * layer.flops_s,
            "launch_s": n * layer.launch_s + cursor, "total_s": other["other_s"] + ssm_s,
            "ssm_regime": layer.regime}


# ------------------------------------------------------------------------------------------- one cell

# Cells about a group of models (a range the source states across them, "_min" / "_max"): the members, each on its
# published hardware where the cell spans several (the blog's pairing: 4B models on H100, the NVFP4 ones on B300).
GROUPS = {"nemotron-3 family": ("nemotron3_nano_4b", "nemotron3_super_120b", "nemotron3_ultra_550b"),
          "qwen3.5 family": ("qwen35_4b", "qwen35_122b_a10b"),
          "nvfp4 moe models": ("nemotron3_super_120b", "nemotron3_ultra_550b", "qwen35_122b_a10b"),
          "nvfp4 models": ("nemotron3_super_120b", "nemotron3_ultra_550b", "qwen35_122b_a10b"),
          "all five models": ("nemotron3_nano_4b", "nemotron3_super_120b", "nemotron3_ultra_550b", "qwen35_4b",
                              "qwen35_122b_a10b")}
HOME_HW = {"nemotron3_nano_4b": "h100", "qwen35_4b": "h100", "nemotron3_super_120b": "b300",
           "nemotron3_ultra_550b": "b300", "qwen35_122b_a10b": "b300"}
BUFFER_LENS = (4, 8, 16, 32)          # blog Fig 7's sweep (best_buffer_len cells)
BEST_L_BATCH = 256                    # blog Fig 7: batch sizes 64 and 256
NOT_A_TIME = ("acceptance", "mean_accepted", "gsm8k", "invalid_answers", "p95_abs_dlogprob", "drift_per_flush",
              "error_ratio", "admitted_cache_tokens", "capacity_ratio", "resident_bytes_ratio")


def _empty(regime: str, why: str) -> dict:
    return {"value_model": None, "regime": regime, "model_note": why}


def _hw(cell: dict, hw_override: str | None):
    name = (hw_override or str(cell.get("hardware") or "")).lower()
    return st.HARDWARE.get(name)


def _split_metric(metric: str) -> tuple[str, str]:
    for agg in ("_min", "_max"):
        if metric.endswith(agg):
            return metric[: -len(agg)], agg[1:]
    return metric, ""


def model_cell(cell: dict, hw_override: str | None = None, floor: float = st.LAUNCH_FLOOR_S) -> dict:
    """The model at the cell's model, hardware (or `hw_override`: the run's own GPU), dtype, batch, L, T, history."""
    metric, agg = _split_metric(str(cell.get("metric") or ""))
    group = GROUPS.get(str(cell.get("model") or "").lower())
    if group:
        return _group(cell, group, metric, agg, hw_override, floor)
    return _one(cell, metric, agg, hw_override, floor)


def _group(cell: dict, members: tuple, metric: str, agg: str, hw_override, floor) -> dict:
    """A range across models: the model at each member (its published hardware where the cell spans several),
    then the min / max (the median for a single published value)."""
    results = []
    for m in members:
        hw = cell.get("hardware") if _hw(cell, None) is not None else HOME_HW[m]
        results.append(_one({**cell, "model": m, "hardware": hw}, metric, agg, hw_override, floor))
    ok = [r for r in results if _num(r.get("value_model")) is not None]
    if not ok:
        return results[0]
    values = [r["value_model"] for r in ok]
    pick = {"min": min, "max": max}.get(agg)
    value = pick(values) if pick else sorted(values)[len(values) // 2]
    chosen = ok[values.index(value)]
    return {**chosen, "value_model": value,
            "model_note": f"{agg or 'median'} over {', '.join(members)}" + (f"; {chosen['model_note']}"
                                                                           if chosen.get("model_note") else "")}


def _one(cell: dict, metric: str, agg: str, hw_override, floor) -> dict:
    level, mode = str(cell.get("level") or ""), str(cell.get("mode") or "")
    model = str(cell.get("model") or "")
    if metric == "capacity_ratio":
        return _capacity_ratio(cell, hw_override)
    if metric == "admitted_cache_tokens":
        return _empty("not-modelled", "an absolute token count of the publishing engine's allocator at its own model "
                                      "and memory; the footprint model's figure is the capacity_ratio cell beside it")
    if metric in ("oom", "error"):
        return _empty("capacity", "a published failure to run: the step-time model has no memory term; see the "
                                  "concurrency model (max_concurrency cells)")
    if metric.startswith(NOT_A_TIME) or level in ("accuracy", "memory"):
        return _empty("not-modelled", f"{metric}: numerics, acceptance and capacity are not a step time "
                                      "(acceptance is an input of the serving model)")
    try:
        spec = spec_of(model)
    except (ValueError, FileNotFoundError):
        return _empty("not-modelled", f"model {model!r} is not a conf/model config")
    sb = state_bytes_of(cell.get("state_dtype"))
    if sb is None:
        return _empty("not-modelled", f"state dtype {cell.get('state_dtype')!r}: not a dtype the byte model sizes")
    L = _int(cell.get("buffer_len"), spec.buffer_len)
    if metric == "byte_ratio":                      # the byte model itself: no hardware in it
        base = st.layer_traffic(spec.geometry, "baseline_ar",
                                state_bytes=BASELINE_STATE_BYTES.get(str(cell.get("baseline") or ""), sb))
        ours = st.layer_traffic(spec.geometry, "replay_ar", L=L, state_bytes=sb)
        return {"value_model": base.total / ours.total, "regime": "bandwidth-bound",
                "model_note": "replayssm.traffic bytes ratio (flush-cycle mean)"}
    hw = _hw(cell, hw_override)
    if hw is None:
        return _empty("not-modelled", f"no datasheet for hardware {cell.get('hardware')!r}")
    T = _int(cell.get("spec_T"), 4)
    B_hist = _int(cell.get("history_len"), spec.history_len)
    if "concurrency" in metric:
        return _concurrency(cell, metric, spec, hw, T, B_hist)
    if metric == "best_buffer_len":
        return _best_buffer(cell, hw_override, floor)
    if metric == "break_even_batch":
        b = break_even({**cell, "metric": "speedup"}, hw_override, floor)
        if b is None:
            return _empty("not-modelled", "the model never breaks even up to batch 4096")
        return {"value_model": b, "regime": "not-modelled" if sb < 2 else "latency-bound",
                "model_note": EIGHT_BIT if sb < 2 else "smallest batch modelled >= 1x"}
    batch = _int(cell.get("batch"))
    if batch is None or batch < 1:
        return _empty("not-modelled", "no batch size")
    if metric.endswith("_step_cost_vs_ar"):         # a spec kernel step over a standard decode kernel step
        method = "baseline_spec" if metric.startswith("native") else "replay_spec"
        acc = {"min": 1, "max": T}.get(agg, default_accepted(T))   # all-reject .. all-accept (blog Fig 9)
        kw = dict(L=L, T=T, B_hist=B_hist, accepted=acc, state_bytes=sb)
        ours = st.step_time(spec.geometry, method, hw, batch, launch_floor_s=floor, issue=ISSUE_FLOOR, **kw)
        ar = st.step_time(spec.geometry, "baseline_ar", hw, batch, launch_floor_s=floor, issue=ISSUE_FLOOR, **kw)
        return {"bytes_s": ours.bytes_s, "flops_s": ours.flops_s, "launch_s": ours.launch_s, "issue_s": ours.issue_s,
                "other_s": 0.0, "total_s": ours.total, "baseline_total_s": ar.total,
                "value_model": ours.total / ar.total, "regime": ours.regime,
                "model_note": f"accepted {acc} of T={T}" + _issue_note(ours, ar)}
    baseline = str(cell.get("baseline") or "")
    if mode not in REPLAY_OF:
        return _empty("not-modelled", f"mode {mode!r}")
    if mode == "spec" and baseline in ("no_spec", "ar", "standard") and level != "kernel":
        return _spec_over_ar(cell, spec, hw, batch, sb, L, T, B_hist, floor)
    if mode == "spec" and baseline in ("no_spec", "ar", "standard"):
        return _empty("not-modelled", "a spec kernel over a standard decode kernel per token needs the serving "
                                      "step (see the whole-model cells)")
    if metric != "speedup":               # absolute tokens/s, bandwidth: no serving overheads in the model
        return _empty("not-modelled", f"metric {metric!r}: the model compares methods, it gives no absolute rate")
    num, den = REPLAY_OF[mode]
    kw = dict(L=L, T=T, B_hist=B_hist, accepted=default_accepted(T), state_bytes=sb)
    kw_den = {**kw, "state_bytes": BASELINE_STATE_BYTES.get(baseline, sb)}
    if level == "kernel":
        ours = st.step_time(spec.geometry, num, hw, batch, launch_floor_s=floor, issue=ISSUE_FLOOR, **kw)
        theirs = st.step_time(spec.geometry, den, hw, batch, launch_floor_s=floor, issue=ISSUE_FLOOR, **kw_den)
        terms = {"bytes_s": ours.bytes_s, "flops_s": ours.flops_s, "launch_s": ours.launch_s, "issue_s": ours.issue_s,
                 "other_s": 0.0, "total_s": ours.total, "baseline_total_s": theirs.total}
        regime = ours.regime
        issue_note = _issue_note(ours, theirs)
    elif level in ("e2e", "serving", "concurrency"):
        ours = model_time(spec, num, hw, batch, floor=floor, **kw)
        theirs = model_time(spec, den, hw, batch, floor=floor, **kw_den)
        terms = {k: ours[k] for k in ("bytes_s", "flops_s", "launch_s", "other_s", "total_s")}
        terms["baseline_total_s"] = theirs["total_s"]
        regime = ours["ssm_regime"] if ours["ssm_s"] >= ours["other_s"] else "other-layers-bound"
        issue_note = ""
    else:
        return _empty("not-modelled", f"level {level!r}")
    note = "default baseline modelled as the tuned one (the model has no tuning)" if baseline == "default" else ""
    note = (note + issue_note).lstrip("; ")
    if sb < 2:                  # an indication only: the time of an 8-bit state is not just its bytes
        regime, note = "not-modelled", EIGHT_BIT
    return {**terms, "value_model": terms["baseline_total_s"] / terms["total_s"], "regime": regime,
            "model_note": note}


def _issue_note(ours: st.StepTime, theirs: st.StepTime) -> str:
    """"; issue floor in the model" where the step time model had instruction counts for both sides (one side
    alone would tilt the ratio), else a note that it is bytes, FLOPs and launches only."""
    if not ISSUE_FLOOR:
        return ""
    if ours.instructions and theirs.instructions:
        return f"; issue floor {ours.issue_s * 1e6:.0f} / {theirs.issue_s * 1e6:.0f} us (ours / the other)"
    return "; no issue-table entry for this point (bytes, FLOPs and launches only)"


def _spec_over_ar(cell, spec, hw, batch, sb, L, T, B_hist, floor) -> dict:
    """ReplaySSM spec over standard (no-spec) decode, whole model: tokens per step (the published acceptance
    profile, ACCEPT_*) x a standard step's time / a spec step's (verify of T tokens, drafter, commit)."""
    if str(cell.get("metric")) != "speedup":
        return _empty("not-modelled", f"metric {cell.get('metric')!r}: the model gives ratios, not rates")
    tokens = mean_tokens_per_step(T)
    if tokens is None:
        return _empty("not-modelled", f"no published acceptance profile for T={T}")
    acc = max(1, min(T, round(tokens)))
    ours = model_time(spec, "replay_spec", hw, batch, state_bytes=sb, L=L, T=T, B_hist=B_hist, accepted=acc,
                      floor=floor)
    ar = model_time(spec, "baseline_ar", hw, batch, state_bytes=sb, L=L, floor=floor)
    terms = {k: ours[k] for k in ("bytes_s", "flops_s", "launch_s", "other_s", "total_s")}
    regime = ours["ssm_regime"] if ours["ssm_s"] >= ours["other_s"] else "other-layers-bound"
    return {**terms, "baseline_total_s": ar["total_s"], "value_model": tokens * ar["total_s"] / ours["total_s"],
            "regime": regime, "model_note": f"{tokens:.2f} tokens per step ({ACCEPT_SOURCE})"}


def break_even(cell: dict, hw_override: str | None = None, floor: float = st.LAUNCH_FLOOR_S,
               max_batch: int = 4096) -> int | None:
    """Smallest batch at which the modelled speedup of the cell's setting reaches 1 (powers of two, refined)."""
    def sp(b):
        return model_cell({**cell, "batch": b, "metric": "speedup"}, hw_override, floor).get("value_model")
    b = 1
    while b <= max_batch:
        v = sp(b)
        if v is None:
            return None
        if v >= 1.0:
            break
        b *= 2
    if b > max_batch:
        return None
    return next((x for x in range(b // 2 + 1 if b > 1 else 1, b + 1) if sp(x) >= 1.0), b)


def _best_buffer(cell: dict, hw_override, floor) -> dict:
    """The buffer length of BUFFER_LENS with the highest modelled kernel speedup at BEST_L_BATCH."""
    batch = _int(cell.get("batch"), BEST_L_BATCH)
    cells = {L: model_cell({**cell, "metric": "speedup", "level": "kernel", "mode": "ar", "batch": batch,
                            "buffer_len": L, "baseline": "tuned"}, hw_override, floor) for L in BUFFER_LENS}
    sp = {L: m["value_model"] for L, m in cells.items() if m.get("value_model") is not None}
    if not sp:
        return _empty("not-modelled", "no modelled speedup")
    best = max(sp, key=sp.get)
    issue = [L for L in sp if cells[L].get("issue_s")]
    return {"value_model": float(best), "regime": cells[best].get("regime", "bandwidth-bound"),
            "model_note": "modelled speedup per L: " + ", ".join(f"{L}: {v:.2f}x" for L, v in sp.items())
            + (f"; issue floor at L = {', '.join(map(str, issue))}" if issue else "")}


@cache
def _caps(model: str, hw_name: str, B_hist: int, T: int) -> dict:
    """{mode: concurrency_table row} at PR #47576's conditions (max_model_len 2048, gpu_memory_utilization 0.9)."""
    hw = st.HARDWARE[hw_name]
    rows = fpm.concurrency_table([model], {"name": hw.name, "hbm_bytes": hw.hbm_bytes},
                                 {"B": str(B_hist), "T": str(T), "max_model_len": "2048",
                                  "gpu_memory_utilization": "0.9", "max_num_batched_tokens": "8192",
                                  "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"})
    return {r["mode"]: r for r in rows}


def _concurrency(cell: dict, metric: str, spec: HybridSpec, hw: st.Hardware, T: int, B_hist: int) -> dict:
    """vLLM's allocator model (footprint.concurrency_table) at the cell's (B, T) on the cell's hardware:
    max_concurrency is the native path's cap when the cell's baseline or note says native, else ReplaySSM's;
    concurrency_ratio ReplaySSM's over native's; native_spec_concurrency_cut standard decode's over native spec's
    (the plain bytes model: the allocator table has no AR mode)."""
    if metric == "native_spec_concurrency_cut":
        caps = {mode: fpm.max_concurrency(hw.hbm_bytes * 0.9, fpm.footprint(
            replace(spec, history_len=B_hist), mode, act_dtype=torch.bfloat16, state_dtype=torch.float32,
            max_model_len=2048, spec_T=T, weight_format="checkpoint")) for mode in ("ar", "native")}
        if not caps["native"]:
            return _empty("capacity", "the native path fits no sequence")
        return {"value_model": caps["ar"] / caps["native"], "regime": "capacity",
                "model_note": "plain bytes model at max_model_len 2048"}
    by_mode = _caps(spec.name, hw.name, B_hist, T)
    if metric.startswith("concurrency_ratio"):
        if not by_mode["native"]["vllm"]:
            return _empty("capacity", "the native path fits no sequence")
        return {"value_model": by_mode["replayssm"]["vllm"] / by_mode["native"]["vllm"], "regime": "capacity",
                "model_note": "vLLM allocator model, ReplaySSM / native caps"}
    which = "native" if "native" in (str(cell.get("baseline") or "") + str(cell.get("note") or "")).lower() \
        else "replayssm"
    return {"value_model": by_mode[which]["vllm"], "regime": "capacity",
            "model_note": f"vLLM allocator model, {which} path"}


@cache
def _state_caps(model: str, hw_name: str, B_hist: int, T: int, states: tuple) -> dict:
    """{state: concurrency_table replayssm row} at PR #47576's conditions for each of `states`."""
    hw = st.HARDWARE[hw_name]
    rows = fpm.concurrency_table([model], {"name": hw.name, "hbm_bytes": hw.hbm_bytes},
                                 {"B": str(B_hist), "T": str(T), "max_model_len": "2048",
                                  "gpu_memory_utilization": "0.9", "max_num_batched_tokens": "8192",
                                  "activation_reserve_gb": "", "tp": "", "weights": "checkpoint",
                                  "states": ",".join(states)})
    return {r["state"]: r for r in rows if r["mode"] == "replayssm"}


def _capacity_ratio(cell: dict, hw_override) -> dict:
    """The admitted capacity of the cell's state format over its baseline's (e.g. fp32_state): vLLM's allocator model
    (footprint.concurrency_table) of ReplaySSM spec at the cell's T and history, max_model_len 2048, on the cell's
    hardware, at the cell's model or its STAND_IN; the plain bytes model's ratio in the note."""
    model = str(cell.get("model") or "")
    stand_in, why = STAND_IN.get(model.lower(), (model, ""))
    try:
        spec = spec_of(stand_in)
    except (ValueError, FileNotFoundError):
        return _empty("not-modelled", f"model {model!r} is not a conf/model config and has no stand-in")
    if str(cell.get("mode") or "") != "spec":
        return _empty("not-modelled", "capacity ratio outside speculative decoding: the table has spec modes only")
    num = STATE_DTYPE_NAME.get(str(cell.get("state_dtype") or "fp32").lower())
    den = STATE_DTYPE_NAME.get(str(cell.get("baseline") or "fp32_state").lower())
    hw = _hw(cell, hw_override)
    if num is None or den is None or hw is None:
        return _empty("not-modelled", f"state {cell.get('state_dtype')!r} over {cell.get('baseline')!r} on "
                                      f"{cell.get('hardware')!r}: not a format pair / hardware the footprint sizes")
    T, B_hist = _int(cell.get("spec_T"), 4), _int(cell.get("history_len"), spec.history_len)
    caps = _state_caps(stand_in, hw.name, B_hist, T, tuple(sorted({num, den})))
    a, b = caps[num], caps[den]
    if not b["vllm"] or not b["plain"]:
        return _empty("capacity", f"the {den} state fits no sequence")
    note = (f"vLLM allocator model (experiments/hybrid/footprint.py), ReplaySSM spec T={T} B={B_hist}, "
            f"max_model_len 2048, {hw.name}: {num} state {a['vllm']:.1f} over {den} {b['vllm']:.1f} sequences; "
            f"plain bytes model {a['plain'] / b['plain']:.3f}x; SSM bytes per sequence {a['ssm_per_seq_MB']:.1f} "
            f"vs {b['ssm_per_seq_MB']:.1f} MB (8-bit: 1 byte per element + one fp32 scale per (slot, head); "
            "buffers and conv state bf16)")
    return {"value_model": a["vllm"] / b["vllm"], "regime": "capacity",
            "model_note": f"{why}; {note}" if why else note}


def missing_term(cell: dict, row: dict) -> str:
    """Which term the model lacks where it and the cell are more than DISAGREE apart (empty when they agree)."""
    pub, mod = _num(cell.get("value")), _num(row.get("value_model"))
    if pub is None or mod is None or pub <= 0 or mod <= 0:
        return ""
    r = mod / pub
    if 1 / DISAGREE <= r <= DISAGREE:
        return ""
    regime = row.get("regime", "")
    metric = _split_metric(str(cell.get("metric") or ""))[0]
    if metric == "best_buffer_len":
        return ("the cost per cached entry beyond its bytes and instructions (the history loop's latency), which "
                "favours shorter buffers than the modelled optimum" if "issue floor" in str(row.get("model_note"))
                else "the cost per cached entry beyond its bytes (the history loop's latency / compute), which "
                     "favours shorter buffers than the byte optimum")
    if metric.endswith("_step_cost_vs_ar"):       # lower is better: ours / a standard decode step
        return ("the spec kernel below its roofline (window solve and history rebuild: latency beyond the issue "
                "floor and the SIMT term)" if r < 1 else "the standard decode kernel below its byte bound")
    if metric == "break_even_batch":                # lower is better for ReplaySSM
        return ("fixed costs per step of the published kernel beyond this harness's launches (e.g. quantisation, "
                "scales, a slower launch path)" if r < 1 else "the published kernel's launches are cheaper than "
                "this harness's count")
    if "concurrency" in metric:
        return "memory the allocator reserves beyond the bytes model (activations, CUDA graphs, page padding)"
    if metric == "capacity_ratio":
        return ("the published model's own SSM / attention split and allocator (a stand-in's ratio where the note "
                "names one)")
    if str(cell.get("baseline")) == "default" and r < 1:
        return "the default baseline's own inefficiency (untuned launch configuration: below its byte bound)"
    if str(cell.get("level")) in ("e2e", "serving") and r > 1:
        return "serving overheads (scheduling, sampling, drafter) and the SSM kernels' reached bandwidth"
    if regime == "latency-bound":
        return ("small-grid latency (too few CTAs in flight to reach bandwidth at this batch)" if r > 1
                else "launch floor too high for this kernel / hardware")
    if r > 1:
        return "reached fraction of peak bandwidth (the kernel is not at the byte bound: e.g. a bandwidth cap)"
    return "the baseline's inefficiency (an untuned baseline below its byte bound)"


def with_hw(cell: dict, hw: str) -> dict:
    """The cell moved to another hardware (the run's own GPU)."""
    return {**cell, "hardware": hw}

