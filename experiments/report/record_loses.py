"""REPORT.md's "Where ReplaySSM loses": the published losses, the model's reading of them, and this run.

Seven parts, each from the cells (published_vs_run rows), the per-step time model (replayssm/step_time.py,
experiments/report/record_model.py), the byte model (replayssm/traffic.py), the hybrid footprint
(experiments/hybrid/footprint.py) and this run's own rows:

    small batch        break-even batch per hardware and family: published, modelled, measured (any run)
    half-precision     the byte model's fp32 and fp16 ratios beside the published fp32 / fp16 values
    memory             AR buffer bytes per sequence against the state's, max concurrency at max length 2048
    low precision      what a 16- or 8-bit state buys in capacity per the footprint model, beside the published
                       capacity ratios (the accuracy of each format: the numerics part)
    recomputation      FLOPs per byte of each method per L against each hardware's ridge point
    numerics           the run's accuracy rows with half-precision and fp8 state
    capacity           the published out-of-memory cells
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from experiments.hybrid import footprint as fpm
from experiments.report import record_model as rm
from experiments.report.accuracy import load_accuracy, ok_rows
from experiments.report.record_cells import describe, run_ratios
from experiments.report.runs import Run
from experiments.report.tables import markdown_table
from replayssm import step_time as st
from replayssm import traffic

HEADLINE = {"mamba2": "nemotron3_super_120b", "gdn": "qwen35_122b_a10b"}
MODELS = ("nemotron3_nano_4b", "nemotron3_super_120b", "nemotron3_ultra_550b", "qwen35_4b", "qwen35_122b_a10b")
HOME_HW = {"nemotron3_nano_4b": "h100", "qwen35_4b": "h100"}        # the blog's pairing; the others on b300
LOSS_OK = 1.1                      # a published loss the model reproduces: modelled below this
MAX_LEN = 2048
HALF_DTYPES = ("float16", "bfloat16", "float8_e4m3fn", "int8", "float16_sr", "bfloat16_sr")
LOW_STATES = ("float32", "bfloat16", "int8")      # int8 and fp8 e4m3 have the same footprint (1 byte + scales)
LOW_MODELS = ("nemotron3_nano_30b_a3b", "nemotron3_super_120b", "qwen35_122b_a10b", "kimi_linear_48b_a3b")


def _published_break_even(g: pd.DataFrame) -> str:
    g = g.assign(_b=pd.to_numeric(g["batch"], errors="coerce"), _v=pd.to_numeric(g["value"], errors="coerce"))
    g = g.dropna(subset=["_b", "_v"]).sort_values("_b")
    if g.empty:
        return "-"
    wins = g[g["_v"] >= 1.0]
    if wins.empty:
        return f"> {int(g['_b'].max())}"
    first = int(wins["_b"].iloc[0])
    below = g[g["_b"] < first]
    return f"<= {first}" if below.empty else f"{int(below['_b'].iloc[-1])} < b <= {first}"


def measured_break_even(run: Run | None) -> pd.DataFrame:
    """Per family and model of this run's kernel_decode rows: the smallest batch whose best ar_speedup reaches 1."""
    if run is None:
        return pd.DataFrame()
    r = run_ratios(run)
    if r.empty or "metric" not in r:
        return pd.DataFrame()
    r = r[(r["metric"] == "ar_speedup") & (r["experiment"] == "kernel_decode")]
    rows = []
    for (family, model), g in r.groupby(["family", "model"], sort=True):
        best = g.assign(v=pd.to_numeric(g["value"], errors="coerce")).groupby("batch")["v"].max().sort_index()
        wins = best[best >= 1.0]
        rows.append({"family": family, "model": model, "batches": ", ".join(f"{int(b)}: {v:.2f}x"
                                                                             for b, v in best.items()),
                     "break-even (measured)": int(wins.index[0]) if len(wins) else f"> {int(best.index.max())}"})
    return pd.DataFrame(rows)


def small_batch(df: pd.DataFrame, run: Run | None, floor: float) -> list[str]:
    lines = ["### Small batch", "",
             f"The byte model has no batch in it (~1.8x at every batch); the time model adds {floor * 1e6:.2f} us per "
             "kernel launch, and ReplaySSM launches more kernels per step (Mamba-2's output-only route: the B.C "
             "precompute, the step and the cursor advance against one selective-state-update kernel), so at batch 1 "
             "the launches decide and it loses; the bytes take over from a few sequences on.", ""]
    sp = df[(df["metric"] == "speedup") & (df["mode"] == "ar")]
    rows = []
    for (src, model, hw, level, dtype, base), g in sp.groupby(["source", "model", "hardware", "level", "state_dtype",
                                                               "baseline"], sort=True, dropna=False):
        cell = g.iloc[0].to_dict()
        rows.append({"source": src, "model": model, "hardware": hw, "level": level, "state": dtype, "baseline": base,
                     "published break-even": _published_break_even(g),
                     "modelled break-even": rm.break_even(cell, floor=floor) or "-"})
    if rows:
        lines += ["Published and modelled break-even batch, per published series:", "",
                  markdown_table(pd.DataFrame(rows)), ""]
    grid = []
    for hw in st.HARDWARE:
        for fam, model in HEADLINE.items():
            row = {"hardware": hw, "family": fam, "model": model}
            for dtype in ("fp32", "fp16"):
                for level in ("kernel", "e2e"):
                    cell = {"model": model, "hardware": hw, "level": level, "mode": "ar", "state_dtype": dtype,
                            "buffer_len": 16, "baseline": "tuned"}
                    row[f"{level} {dtype}"] = rm.break_even(cell, floor=floor) or "-"
            grid.append(row)
    lines += ["Modelled break-even batch per hardware and family (the headline models, buffer 16, TP1):", "",
              markdown_table(pd.DataFrame(grid)), ""]
    meas = measured_break_even(run)
    if not meas.empty:
        lines += ["Measured by this run (kernel_decode, best route and buffer per batch; on a CPU these are CPU "
                  "kernels, whose launch costs nothing and whose caches differ: not GPU numbers):", "",
                  markdown_table(meas), ""]
    losses = df[(df["metric"] == "speedup") & (pd.to_numeric(df["value_published"], errors="coerce") < 1.0)]
    if len(losses):
        ok = pd.to_numeric(losses["value_model"], errors="coerce") < LOSS_OK
        tab = pd.DataFrame({"source": losses["source"], "cell": [describe(r) for r in losses.to_dict("records")],
                            "level": losses["level"], "published": losses["value_published"],
                            "model": losses["value_model"], "regime": losses["regime"],
                            "modelled below 1.1x": np.where(ok, "yes", np.where(losses["value_model"].isna(),
                                                                                "not modelled", "NO"))})
        lines += [f"Every published loss ({len(tab)}; {int(ok.sum())} modelled below {LOSS_OK}x, the rest carry "
                  "their regime):", "", markdown_table(tab, {"published": ".2f", "model": ".2f"}), ""]
    return lines


def byte_ratio(model: str, state_bytes: int, L: int = 16) -> float:
    spec = rm.spec_of(model)
    base = st.layer_traffic(spec.geometry, "baseline_ar", state_bytes=state_bytes)
    ours = st.layer_traffic(spec.geometry, "replay_ar", L=L, state_bytes=state_bytes)
    return base.total / ours.total


def half_precision(df: pd.DataFrame) -> list[str]:
    lines = ["### Half-precision state", "",
             "Halving the state halves the term ReplaySSM saves on, but the byte model's own ratio barely moves "
             "(the entries are half precision either way). Where a published fp16 value sits well below its fp32 "
             "twin, the kernel does not reach the byte bound at half precision (a reached-bandwidth term the model "
             "lacks; e.g. PR #48792's note on B300's Triton fp16 kernel).", ""]
    rows = [{"model": m, "byte ratio fp32": byte_ratio(m, 4), "byte ratio fp16/bf16": byte_ratio(m, 2)}
            for m in MODELS]
    sp = df[(df["metric"] == "speedup") & (df["mode"] == "ar") & (df["baseline"].astype(str) != "default")].copy()
    sp["_b"] = pd.to_numeric(sp["batch"], errors="coerce")
    for r in rows:
        for dtype in ("fp32", "fp16"):
            g = sp[(sp["model"] == r["model"]) & (sp["state_dtype"].astype(str).str.lower() == dtype)]
            if len(g):
                top = g.sort_values("_b").groupby(["source", "level", "hardware"]).tail(1)
                r[f"published {dtype} (largest batch)"] = "; ".join(
                    f"{v['value_published']:.2f} ({v['level']} {v['hardware']} bs{int(v['_b'])})"
                    for v in top.to_dict("records"))
    lines += [markdown_table(pd.DataFrame(rows).fillna("-"), {"byte ratio fp32": ".3f",
                                                             "byte ratio fp16/bf16": ".3f"}), ""]
    return lines


def memory(df: pd.DataFrame) -> list[str]:
    lines = ["### Memory", "",
             f"Per sequence over all SSM layers (fp32 state, bf16 entries, buffer L = 16), and the maximum "
             f"concurrency at max length {MAX_LEN} (plain bytes model: 0.9 x HBM minus the checkpoint's weights, "
             "over KV + SSM bytes per sequence; experiments/hybrid/footprint.py) on the model's published hardware. "
             "The AR buffer costs concurrency; spec's ring replaces T state snapshots and wins it back.", ""]
    rows = []
    for m in MODELS:
        spec = rm.spec_of(m)
        hw = st.HARDWARE[HOME_HW.get(m, "b300")]
        state = traffic.cache_footprint("baseline_ar", spec.geometry).states * spec.ssm_layers
        buf = traffic.cache_footprint("replay_ar", spec.geometry, L=spec.buffer_len).buffers * spec.ssm_layers
        caps = {}
        for mode in ("ar", "ar_replay", "native", "replayssm"):
            fp = fpm.footprint(spec, mode, act_dtype=torch.bfloat16, state_dtype=torch.float32, max_model_len=MAX_LEN,
                               spec_T=4, weight_format="checkpoint")
            caps[mode] = fpm.max_concurrency(hw.hbm_bytes * 0.9, fp)
        rows.append({"model": m, "hardware": hw.name, "state MB/seq": state / 1e6, "AR buffer MB/seq": buf / 1e6,
                     "buffer/state": buf / state, "max conc. AR base": caps["ar"],
                     "max conc. AR ReplaySSM": caps["ar_replay"], "max conc. native spec T4": caps["native"],
                     "max conc. ReplaySSM spec T4": caps["replayssm"]})
    lines += [markdown_table(pd.DataFrame(rows), {"state MB/seq": ".1f", "AR buffer MB/seq": ".1f",
                                                  "buffer/state": ".3f"}), ""]
    conc = df[df["metric"] == "max_concurrency"]
    if len(conc):
        lines += ["Published concurrency cells beside the vLLM-allocator model:", "",
                  markdown_table(pd.DataFrame({"source": conc["source"], "cell": [describe(r) for r in
                                                                                  conc.to_dict("records")],
                                               "note": conc["note"], "published": conc["value_published"],
                                               "model": conc["value_model"]}), {"model": ".0f"}), ""]
    return lines


def low_precision(df: pd.DataFrame) -> list[str]:
    """Capacity of a 16- and 8-bit state over fp32 per the footprint model, beside the published capacity ratios."""
    lines = ["### Low-precision state", "",
             "What a narrower state buys is capacity. The footprint model (experiments/hybrid/footprint.py, "
             "vLLM's allocator model at (B = 16, T = 4), max length 2048) counts an 8-bit checkpoint (int8 or fp8 "
             "e4m3) as one byte per element plus one fp32 scale per (slot, head); the buffers, rings and conv states "
             "stay bf16 (native spec's T state snapshots all shrink). The rows below are that model's caps over the "
             "fp32 state's, and ReplaySSM's over native spec's. What a format costs in accuracy is not in "
             "this model: the accuracy experiment (experiments/accuracy.py) measures each format's state and "
             "output error (see Numerics), and the step-time model counts the 8-bit bytes but not the "
             "(de)quantisation work.", ""]
    rows = []
    for m in LOW_MODELS:
        hw = st.HARDWARE[HOME_HW.get(m, "h100" if m == "nemotron3_nano_30b_a3b" else "b300")]
        got = fpm.concurrency_table([m], {"name": hw.name, "hbm_bytes": hw.hbm_bytes},
                                    {"B": "16", "T": "4", "max_model_len": str(MAX_LEN),
                                     "gpu_memory_utilization": "0.9", "max_num_batched_tokens": "8192",
                                     "activation_reserve_gb": "", "tp": "", "weights": "checkpoint",
                                     "states": ",".join(LOW_STATES)})
        by = {(r["mode"], r["state"]): r for r in got}
        row = {"model": m, "hardware": hw.name}
        for state in LOW_STATES:
            row[f"SSM MB/seq ReplaySSM {state}"] = by["replayssm", state]["ssm_per_seq_MB"]
        for mode in ("replayssm", "native"):
            for state in LOW_STATES[1:]:
                row[f"{mode} {state}/fp32"] = by[mode, state]["vllm/fp32"]
        for state in ("float32", "int8"):
            row[f"ReplaySSM/native {state}"] = by["replayssm", state]["ratio_vllm"]
        rows.append(row)
    tab = pd.DataFrame(rows)
    less = [r["model"] for r in rows if r["replayssm int8/fp32"] < r["native int8/fp32"]]
    narrower = [r["model"] for r in rows if r["ReplaySSM/native int8"] < r["ReplaySSM/native float32"]]
    lines += [markdown_table(tab, {c: (".1f" if c.startswith("SSM") else ".3f") for c in tab.columns
                                   if c not in ("model", "hardware")}), "",
              f"An 8-bit state gains ReplaySSM less capacity than native spec at {len(less)} of {len(rows)} models "
              f"({', '.join(less) or 'none'}), and ReplaySSM's lead over native spec narrows at {len(narrower)} of "
              f"{len(rows)} ({', '.join(narrower) or 'none'}); ReplaySSM's own gain over its fp32 state is the "
              "replayssm int8/fp32 column.", ""]
    cap = df[df["metric"] == "capacity_ratio"]
    if len(cap):
        lines += ["Published capacity ratios beside the footprint model (model_note in the CSV names the stand-in "
                  "model where the published one has no config here):", "",
                  markdown_table(pd.DataFrame({"source": cap["source"], "cell": [describe(r) for r in
                                                                                 cap.to_dict("records")],
                                               "published": cap["value_published"],
                                               "model": cap["value_model"]}), {"model": ".3f"}), ""]
    return lines


def cpu_ridge(run: Run | None) -> tuple[float, str] | None:
    """(FLOPs per byte, what) of this run's CPU roofline: bench_cpu.json's measured rates at the most threads."""
    path = run.path / "bench_cpu.json" if run is not None else None
    if path is None or not path.is_file():
        return None
    benches = json.loads(path.read_text()).get("benchmarks", [])
    rates = [b.get("extra_info", {}).get("roof_rates") or {} for b in benches]
    rates = [r for r in rates if r.get("flop_GFLOPs") and r.get("read_GBps")]
    if not rates:
        return None
    r = max(rates, key=lambda x: x.get("threads", 0))
    ridge = r["flop_GFLOPs"] / r["read_GBps"]
    return ridge, (f"{r['flop_GFLOPs']:.0f} GFLOP/s over {r['read_GBps']:.1f} GB/s read at {r.get('threads')} "
                   "threads, measured by bench_cpu")


def recomputation(run: Run | None = None) -> list[str]:
    Ls = (4, 8, 16, 32, 64, 128)
    ridge = {hw: h.ridge for hw, h in st.HARDWARE.items()}
    lines = ["### Recomputation", "",
             "FLOPs per byte of each method (replayssm/traffic.py, fp32 state) against each hardware's ridge point "
             "(SIMT FP32 peak / bandwidth: " + ", ".join(f"{k} {v:.1f}" for k, v in ridge.items()) + "). Above the "
             "ridge a step is compute-bound and longer buffers stop paying; on a CPU the ridge is far lower "
             "(the CPU roofline of bench_cpu.txt, replayssm/cpu/README.md).", ""]
    rows = []
    for fam, model in HEADLINE.items():
        g = rm.spec_of(model).geometry
        methods = [("baseline_ar", {}), ("replay_spec T4", {"T": 4})]
        for name, kw in methods:
            tr = st.layer_traffic(g, name.split()[0], **kw)
            rows.append({"family": fam, "method": name, **{f"L={L}": tr.intensity for L in Ls}})
        routes = ("output_only", "state_and_output") if fam == "mamba2" else ("",)
        for route in routes:
            vals = {f"L={L}": st.layer_traffic(g, "replay_ar", L=L, route=route or "output_only").intensity
                    for L in Ls}
            rows.append({"family": fam, "method": "replay_ar" + (f" {route}" if route else ""), **vals})
    tab = pd.DataFrame(rows)
    lo = min(ridge.values())
    over = [f"{r['family']} {r['method']} L={L}" for r in rows for L in Ls if r[f"L={L}"] > lo]
    lines += [markdown_table(tab, {f"L={L}": ".2f" for L in Ls}), "",
              ("Compute-bound on the lowest-ridge GPU: " + ", ".join(over) + ".") if over else
              f"No method crosses the lowest GPU ridge ({lo:.1f}) up to L = {Ls[-1]}.", ""]
    cpu = cpu_ridge(run)
    if cpu is not None:
        ridge, what = cpu
        on_cpu = [f"{r['family']} {r['method']} L={L}" for r in rows for L in Ls if r[f"L={L}"] > ridge]
        lines += [f"This run's CPU ridge: {ridge:.1f} FLOPs per byte ({what}); compute-bound here: "
                  + (", ".join(on_cpu) if on_cpu else "none") + ".", ""]
    return lines


def numerics(df: pd.DataFrame, run: Run | None) -> list[str]:
    lines = ["### Numerics", ""]
    acc = load_accuracy(run.path) if run is not None else None
    if acc is not None and "state_dtype" in acc:
        d = ok_rows(acc)
        d = d[d["state_dtype"].isin(HALF_DTYPES + ("float32",))]
        last = d[d["step"] == d.groupby(["family", "model", "label", "state_dtype"])["step"].transform("max")]
        tab = last.groupby(["family", "state_dtype", "method"])[["out_err_median", "state_err_median"]].median()
        lines += ["This run's accuracy study (experiments/accuracy.py), output and state error against float64 at "
                  "the last step, median over models and settings (fp8: the experimental e4m3 checkpoint):", "",
                  markdown_table(tab.reset_index(), {"out_err_median": ".2e", "state_err_median": ".2e"}), ""]
    else:
        lines += ["This run has no accuracy rows (experiments/accuracy.py).", ""]
    pub = df[df["level"] == "accuracy"]
    if len(pub):
        lines += ["Published accuracy cells:", "",
                  markdown_table(pd.DataFrame({"source": pub["source"], "cell": [describe(r) for r in
                                                                                 pub.to_dict("records")],
                                               "metric": pub["metric"], "value": pub["value_published"],
                                               "note": pub["note"]})), ""]
    return lines


def capacity(df: pd.DataFrame, floor: float) -> list[str]:
    lines = ["### Capacity failures", ""]
    oom = df[df["metric"] == "oom"]
    if oom.empty:
        return lines + ["No published out-of-memory cell in the record.", ""]
    rows = []
    for r in oom.to_dict("records"):
        cap = rm.model_cell({**r, "metric": "max_concurrency", "unit": "requests", "baseline": ""}, floor=floor)
        rows.append({"source": r["source"], "cell": describe(r), "note": r.get("note"),
                     "modelled ReplaySSM cap (max_model_len 2048)": cap.get("value_model")})
    lines += ["The step-time model has no memory term: these stay capacity failures. Beside each, the vLLM-allocator "
              "model's concurrency cap at its (B, T); a batch above the cap is split by vLLM, so an OOM says the "
              "activations or graphs at that batch did not fit, which the model does not count.", "",
              markdown_table(pd.DataFrame(rows), {"modelled ReplaySSM cap (max_model_len 2048)": ".0f"}), ""]
    return lines


def section(df: pd.DataFrame, run: Run | None, floor: float) -> list[str]:
    lines = ["## Where ReplaySSM loses", ""]
    if df.empty:
        lines += ["No published cells: only the model's and this run's parts follow.", ""]
    for part in (lambda: small_batch(df, run, floor), lambda: half_precision(df), lambda: memory(df),
                 lambda: low_precision(df), lambda: recomputation(run), lambda: numerics(df, run),
                 lambda: capacity(df, floor)):
        lines += part()
    return lines

