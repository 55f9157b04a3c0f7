"""The per-step time model (replayssm/step_time.py) evaluated at one published cell's own conditions.

Kernel cells: one SSM layer's step, ReplaySSM method over its baseline (step_time.speedup). Whole-model cells
(level e2e / serving): every layer of the model's pattern (conf/model, experiments/hybrid/spec.py):

    t_model = t_other + n_ssm * t_layer(method) + cursor launch (once per step: vLLM shares it across layers)
    t_other = max(weight + KV bytes / bandwidth, 2 * active params * tokens / tensor peak) + launches * floor

weights in the served checkpoint's format (experiments/hybrid/footprint.py weight_bytes: NVFP4 where conf/model
says so), routed experts as far as the step's tokens touch them (footprint.experts_touched), the KV cache read at
CONTEXT_LEN. Concurrency cells: footprint.concurrency_table (vLLM's allocator model) at the cell's (B, T).

`model_cell(cell)` returns value_model, the terms (seconds of the ReplaySSM side; the baseline's beside them),
the regime and, where the model does not claim to cover a cell, regime "not-modelled" with the reason.
"""

from __future__ import annotations

import math
from functools import cache

from experiments.harness.points import load_model_config
from experiments.hybrid import footprint as fpm
from experiments.hybrid.spec import HybridSpec, hybrid_spec
from replayssm import step_time as st

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


DTYPE_BYTES = {"fp32": 4, "float32": 4, "f32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "half": 2}
REPLAY_OF = {"ar": ("replay_ar", "baseline_ar"), "spec": ("replay_spec", "baseline_spec")}
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

def _weights_read(spec: HybridSpec, tokens: int) -> tuple[float, float]:
    """(bytes of weights one pass over `tokens` tokens reads in the checkpoint's format, active params per token)."""
    fmt = spec.weight_format or "bfloat16"
    touched: dict[str, float] = {"lm_head": spec.vocab * spec.hidden}
    active = float(spec.vocab * spec.hidden)
    for ch in spec.pattern:
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


def model_time(spec: HybridSpec, method: str, hw: st.Hardware, batch: int, *, state_bytes: int, L: int, T: int = 1,
               B_hist: int = 16, accepted: int | None = None, floor: float = st.LAUNCH_FLOOR_S) -> dict:
    """One whole-model step: the other layers plus n_ssm SSM layers of `method` (cursor shared by the layers)."""
    layer = st.step_time(spec.geometry, method, hw, batch, launch_floor_s=floor, shared_cursor=True, L=L,
                         T=T, B_hist=B_hist, accepted=accepted, state_bytes=state_bytes)
    n = spec.ssm_layers
    cursor = st.CURSOR_LAUNCHES.get(method, 0) * floor
    other = other_time(spec, hw, batch, T if method.endswith("spec") else 1, floor)
    ssm_s = n * layer.total + cursor
    return {**other, "ssm_s": ssm_s, "bytes_s": n * layer.bytes_s, "flops_s": n * layer.flops_s,
            "launch_s": n * layer.launch_s + cursor, "total_s": other["other_s"] + ssm_s,
            "ssm_regime": layer.regime}


# ------------------------------------------------------------------------------------------- one cell

def _empty(regime: str, why: str) -> dict:
    return {"value_model": None, "regime": regime, "model_note": why}


def _hw(cell: dict, hw_override: str | None):
    name = (hw_override or str(cell.get("hardware") or "")).lower()
    return st.HARDWARE.get(name)


def model_cell(cell: dict, hw_override: str | None = None, floor: float = st.LAUNCH_FLOOR_S) -> dict:
    """The model at the cell's model, hardware (or `hw_override`: the run's own GPU), dtype, batch, L, T, history."""
    metric, level, mode = str(cell.get("metric") or ""), str(cell.get("level") or ""), str(cell.get("mode") or "")
    model = str(cell.get("model") or "")
    if metric == "oom":
        return _empty("capacity", "a published out-of-memory: the step-time model has no memory term; see the "
                                  "concurrency model (max_concurrency cells)")
    if level in ("accuracy", "memory") or metric in ("accuracy", "logprob_delta"):
        return _empty("not-modelled", f"{level or metric}: numerics / memory are not a time")
    hw = _hw(cell, hw_override)
    if hw is None:
        return _empty("not-modelled", f"no datasheet for hardware {cell.get('hardware')!r}")
    try:
        spec = spec_of(model)
    except (ValueError, FileNotFoundError):
        return _empty("not-modelled", f"model {model!r} is not a conf/model config")
    T = _int(cell.get("spec_T"), 4)
    B_hist = _int(cell.get("history_len"), spec.history_len)
    if metric == "max_concurrency":
        return _concurrency(cell, spec, hw, T, B_hist)
    sb = state_bytes_of(cell.get("state_dtype"))
    if sb is None:
        return _empty("not-modelled", f"state dtype {cell.get('state_dtype')!r}: the byte model has fp32 and "
                                      "half-precision states only")
    batch = _int(cell.get("batch"))
    if batch is None or batch < 1:
        return _empty("not-modelled", "no batch size")
    L = _int(cell.get("buffer_len"), spec.buffer_len)
    baseline = str(cell.get("baseline") or "")
    if mode not in REPLAY_OF:
        return _empty("not-modelled", f"mode {mode!r}")
    if mode == "spec" and baseline in ("no_spec", "ar", "standard"):
        return _empty("not-modelled", "spec over standard decode needs the accepted tokens per step "
                                      "(an acceptance profile) and the drafter's cost")
    num, den = REPLAY_OF[mode]
    acc = default_accepted(T)
    kw = dict(L=L, T=T, B_hist=B_hist, accepted=acc, state_bytes=sb)
    if level == "kernel":
        ours = st.step_time(spec.geometry, num, hw, batch, launch_floor_s=floor, **kw)
        theirs = st.step_time(spec.geometry, den, hw, batch, launch_floor_s=floor, **kw)
        terms = {"bytes_s": ours.bytes_s, "flops_s": ours.flops_s, "launch_s": ours.launch_s, "other_s": 0.0,
                 "total_s": ours.total, "baseline_total_s": theirs.total}
        regime = ours.regime
    elif level in ("e2e", "serving", "concurrency"):
        ours = model_time(spec, num, hw, batch, floor=floor, **kw)
        theirs = model_time(spec, den, hw, batch, floor=floor, **kw)
        terms = {k: ours[k] for k in ("bytes_s", "flops_s", "launch_s", "other_s", "total_s")}
        terms["baseline_total_s"] = theirs["total_s"]
        regime = ours["ssm_regime"] if ours["ssm_s"] >= ours["other_s"] else "other-layers-bound"
    else:
        return _empty("not-modelled", f"level {level!r}")
    if metric == "speedup":
        value = terms["baseline_total_s"] / terms["total_s"]
    else:                               # absolute tokens/s: no serving overheads in the model, compare ratios
        return {**terms, **_empty("not-modelled", f"metric {metric!r} in mode {mode!r}")}
    note = "default baseline modelled as the tuned one (the model has no tuning)" if baseline == "default" else ""
    return {**terms, "value_model": value, "regime": regime, "model_note": note}


def _concurrency(cell: dict, spec: HybridSpec, hw: st.Hardware, T: int, B_hist: int) -> dict:
    """vLLM's allocator model (footprint.concurrency_table) at the cell's (B, T) on the cell's hardware. The cell
    is the native path's cap when its baseline or note says native, else ReplaySSM's."""
    rows = fpm.concurrency_table([spec.name], {"name": hw.name, "hbm_bytes": hw.hbm_bytes},
                                 {"B": str(B_hist), "T": str(T), "max_model_len": "2048",
                                  "gpu_memory_utilization": "0.9", "max_num_batched_tokens": "8192",
                                  "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"})
    which = "native" if "native" in (str(cell.get("baseline") or "") + str(cell.get("note") or "")).lower() \
        else "replayssm"
    by_mode = {r["mode"]: r for r in rows}
    unit = str(cell.get("unit") or "")
    value = (by_mode["replayssm"]["vllm"] / by_mode["native"]["vllm"]) if unit == "x" else by_mode[which]["vllm"]
    return {"value_model": value, "regime": "capacity", "model_note": f"vLLM allocator model, {which} path"}


def missing_term(cell: dict, row: dict) -> str:
    """Which term the model lacks where it and the cell are more than DISAGREE apart (empty when they agree)."""
    pub, mod = _num(cell.get("value")), _num(row.get("value_model"))
    if pub is None or mod is None or pub <= 0 or mod <= 0:
        return ""
    r = mod / pub
    if 1 / DISAGREE <= r <= DISAGREE:
        return ""
    regime = row.get("regime", "")
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

