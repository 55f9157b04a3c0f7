"""Load benchmark runs (results/<hardware>/<run-id>/rows.csv + env.json) and compute speedups within a run.

Every ratio pairs two rows of the SAME run (same run directory and run_id) at the same point keys; a ratio
never mixes runs, and rows whose status is not "ok" never enter one (they are counted in counts.csv).

Metrics (summary.csv, one tidy row per pair; value > 1 means the numerator method is better unless noted):
    ar_speedup        baseline_ar median_us / replay_ar median_us, per replay point (buffer_len, route)
    ar_vs_peer        peer median_us / replay_ar median_us (peer:mamba_ssm, peer:fla); baseline_vs_peer likewise
    spec_vs_native    replay_spec tokens/s / baseline_spec tokens/s (same T, acceptance)
    spec_vs_commit    replay_spec tokens/s / commit_replay_spec tokens/s
    commit_vs_native  commit_replay_spec tokens/s / baseline_spec tokens/s
    spec_vs_ar        replay_spec tokens/s / baseline_ar tokens/s (standard decode: batch / step time)
    native_spec_vs_ar baseline_spec tokens/s / baseline_ar tokens/s
    step_cost_vs_ar   spec method median_us / baseline_ar median_us (lower is better)
    concurrency       baseline_spec footprint_bytes / replay_spec footprint_bytes (slots under one budget)
lo/hi bound each ratio from the p20/p80 times of both rows (the pessimistic and optimistic pairing);
bytes_ratio is the byte model's ratio for the same pair (bytes_model columns; per token for spec; the rows'
byte_model_ratio where a row lacks bytes_model), measured_over_model = value / bytes_ratio.
verdict (speedup metrics): "within byte model" when the measured speedup is at most BANDWIDTH_SLACK (10%)
above its byte-model bound; "not bandwidth-bound" above that (the time is not set by the bytes the model counts:
cache hits, overheads; such a value is no evidence for the bandwidth argument and is not reported as a
speedup); "cache-resident" when either row's stack sat in the last-level cache (warm policy, or a cold stack
capped below l2_factor x L2). Ratios of other kinds get "cache-resident" or "".
Launch configs (rows' launch_source, replayssm/launch_table.py): a ratio is taken against the tuned partner
row first (launch_source tuned / mixed) and, beside it, value_default against the same partner timed under
its default configs (the runner's extra launch_source=default row), like `tuned (default)` in vLLM PR
#48018; num_launch_source / den_launch_source say what each side ran and launch_note says when a tuned
method is paired with an untuned partner ("partner untuned"), or the reverse. A numerator method with a tuned
and a default row at one point enters with its tuned row.

CLI: python scripts/report/aggregate.py RUN_DIR [RUN_DIR ...]   (writes summary.csv and counts.csv into each run dir)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.harness.store import COLUMNS
from experiments.report.engine import engine_ratios

# rows.csv's columns are the store's own (experiments/harness/store.py COLUMNS): writer and reader share one
# definition, so a column added there is loaded here (NA where an older run lacks it).
ROW_COLUMNS = tuple(COLUMNS)
# The measures and numeric keys of ROW_COLUMNS, parsed as numbers (empty cell -> NaN).
NUMERIC_COLUMNS = (
    "tp", "batch", "buffer_len", "spec_T", "history_len", "mean_accepted", "context_len", "threads", "median_us",
    "p20_us", "p80_us", "flush_us", "bytes_model", "byte_model_ratio", "achieved_GBps", "pct_peak_measured",
    "pct_peak_datasheet", "peak_mem_bytes", "footprint_bytes", "tokens_per_s", "rel_err", "num_slots",
    "step_h0_us", "step_hmid_us",
)
# The point keys: everything that says *what* was measured (not the measures, not the method).
POINT_KEYS = (
    "experiment", "family", "model", "tp", "geometry", "route", "backend", "batch", "buffer_len", "spec_T",
    "history_len", "acceptance", "state_dtype", "act_dtype", "context_len", "timing_mode", "l2", "compiled", "threads",
    "cursors", "num_slots",
)
RUN_KEYS = ["_source", "run_id"]
# Strict keys must be equal; "wild" keys must be equal unless one side does not have them (NA): the
# baseline has no buffer_len/route/history_len, so one baseline row serves every replay setting.
# The pool (num_slots) is strict: both sides gather from the same pool. The cursor layout is wild: a baseline
# has no cursor, so its row serves every layout of the replay rows.
AR_STRICT = RUN_KEYS + ["experiment", "family", "model", "tp", "geometry", "batch", "state_dtype", "act_dtype",
                        "timing_mode", "l2", "backend", "threads", "num_slots"]
AR_WILD = ["buffer_len", "route", "context_len", "cursors"]
SPEC_STRICT = AR_STRICT + ["spec_T", "acceptance"]
SPEC_WILD = ["history_len", "buffer_len", "route", "context_len", "cursors"]
# Spec rows vs standard-decode rows: kernel_spec times baseline_ar itself (its reference method); rows of
# another experiment in the same run serve only when it did not.
CROSS_STRICT = [k for k in AR_STRICT if k != "experiment"]
CROSS_WILD = ["context_len"]
CROSS_PREFER = ["experiment"]

AR_METHODS = ("baseline_ar", "replay_ar")
SPEC_METHODS = ("baseline_spec", "commit_replay_spec", "replay_spec")
NA_KEY = "<na>"

SUMMARY_COLUMNS = (
    "run_id", "hardware", "metric", "experiment", "family", "model", "tp", "geometry", "batch", "buffer_len", "route",
    "spec_T", "history_len", "acceptance", "mean_accepted", "state_dtype", "act_dtype", "context_len", "timing_mode",
    "l2", "backend", "threads", "cursors", "num_slots", "num_method", "den_method", "value", "lo", "hi", "num_value",
    "den_value", "value_unit", "bytes_ratio", "num_backend", "den_backend", "num_compiled", "den_compiled",
    "measured_over_model", "cache_resident", "verdict", "num_launch_source", "den_launch_source", "value_default",
    "launch_note",
)
TUNED_SOURCES = ("tuned", "mixed")
BANDWIDTH_SLACK = 1.10          # a speedup more than 10% above its byte-model bound is not bandwidth-bound
NOT_BANDWIDTH_BOUND = "not bandwidth-bound"
CACHE_RESIDENT = "cache-resident"
WITHIN_MODEL = "within byte model"
EXCLUDED_VERDICTS = (NOT_BANDWIDTH_BOUND, CACHE_RESIDENT)   # never reported as a speedup (tables, claims)
SPEEDUP_KINDS = ("time", "tps_spec", "tps_ar")
SPEEDUP_METRICS = ("ar_speedup", "ar_vs_peer", "baseline_vs_peer", "spec_vs_native", "spec_vs_commit",
                   "commit_vs_native", "spec_vs_ar", "native_spec_vs_ar", "spec_vs_peer")


@dataclass
class Run:
    """One run directory: its rows (with `_source` and `hardware` columns added), env.json and config."""

    path: Path
    rows: pd.DataFrame
    env: dict
    config_text: str

    @property
    def run_id(self) -> str:
        ids = self.rows["run_id"].dropna().astype(str).unique()
        return ids[0] if len(ids) == 1 else self.path.name

    @property
    def hardware(self) -> str:
        return describe_env(self.env, self.path)["hardware"]


def _find_key(obj, names: tuple[str, ...]):
    """First non-empty value under any of `names` (case-insensitive), searched breadth-first in nested dicts."""
    wanted = {n.lower() for n in names}
    queue = [obj]
    while queue:
        cur = queue.pop(0)
        if isinstance(cur, dict):
            for key, value in cur.items():
                if str(key).lower() in wanted and value not in (None, "", [], {}):
                    return value
            queue.extend(v for v in cur.values() if isinstance(v, dict))
    return None


def describe_env(env: dict, run_dir: Path | str | None = None) -> dict:
    """Hardware name, device kind (gpu/cpu), versions and commit from env.json, tolerant of its key names.

    The name is the device's ("NVIDIA H200 (h200)", "<cpu model> (cpu)"), with the harness's hardware profile
    in brackets; the results/<hardware>/<run-id> directory name stands in when env.json lacks both.
    """
    run_dir = Path(run_dir) if run_dir is not None else None
    gpu = _find_key(env, ("gpu_name", "gpu", "device_name", "cuda_device_name"))
    cpu = _find_key(env, ("cpu_name", "cpu_model", "cpu", "processor"))
    profile = _find_key(env, ("hardware", "hardware_name"))     # the harness stores its profile dict here
    profile = profile.get("name") if isinstance(profile, dict) else profile
    kind = str(_find_key(env, ("device_type", "device_kind", "device")) or "").lower()
    if kind not in ("cuda", "gpu", "cpu"):
        cuda_ok = _find_key(env, ("cuda_available",))
        kind = "gpu" if (gpu or cuda_ok is True) else ("cpu" if cpu or cuda_ok is False else "")
    kind = "gpu" if kind == "cuda" else kind
    if not profile and run_dir is not None:
        profile = run_dir.parent.name or run_dir.name
    device_name = gpu if kind == "gpu" else cpu if kind == "cpu" else None
    if device_name and profile and str(profile).lower() not in str(device_name).lower():
        hardware = f"{device_name} ({profile})"
    else:
        hardware = device_name or profile or "unknown hardware"
    hardware = str(hardware)
    if not kind:
        kind = "cpu" if "cpu" in hardware.lower() else "unknown"
    dirty = _find_key(env, ("git_dirty", "dirty"))
    return {
        "hardware": hardware,
        "kind": kind,
        "gpu": gpu,
        "cpu": cpu,
        "torch": _find_key(env, ("torch", "torch_version")),
        "triton": _find_key(env, ("triton", "triton_version")),
        "cuda": _find_key(env, ("cuda", "cuda_version", "torch_cuda")),
        "driver": _find_key(env, ("driver", "driver_version", "nvidia_driver")),
        "python": _find_key(env, ("python", "python_version")),
        "commit": _find_key(env, ("git_sha", "git_commit", "commit", "sha")),
        "dirty": dirty,
        "threads": _find_key(env, ("threads", "num_threads", "torch_threads")),
    }


def load_run(run_dir: Path | str) -> Run:
    """Read rows.csv (required), env.json and config.yaml (optional) of one run directory."""
    path = Path(run_dir)
    rows_path = path / "rows.csv"
    if not rows_path.is_file():
        raise FileNotFoundError(f"{rows_path} not found: is {path} a run directory (results/<hardware>/<run-id>)?")
    rows = pd.read_csv(rows_path, keep_default_na=True)
    for col in ROW_COLUMNS:
        if col not in rows.columns:
            rows[col] = pd.NA
    for col in NUMERIC_COLUMNS:
        rows[col] = pd.to_numeric(rows[col], errors="coerce")
    # a row without a status is not known to be ok: it is counted and kept out of every ratio
    rows["status"] = rows["status"].fillna("unknown").astype(str).str.strip().str.lower()
    rows["run_id"] = rows["run_id"].where(rows["run_id"].notna(), path.name).astype(str)
    env_path = path / "env.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    config_path = path / "config.yaml"
    config_text = config_path.read_text() if config_path.is_file() else ""
    rows["_source"] = str(path.resolve())
    rows["hardware"] = describe_env(env, path)["hardware"]
    return Run(path=path, rows=rows, env=env, config_text=config_text)


def load_runs(run_dirs) -> list[Run]:
    return [load_run(d) for d in run_dirs]


def concat_rows(runs: list[Run]) -> pd.DataFrame:
    """All rows of several runs in one frame; `_source` and `run_id` keep them apart in every ratio."""
    return pd.concat([r.rows for r in runs], ignore_index=True) if runs else pd.DataFrame(columns=ROW_COLUMNS)


def _norm(value) -> str:
    """A merge-safe key: NA -> NA_KEY, 256.0 -> "256", everything else its stripped string."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return NA_KEY
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return str(value).strip()


def _ok(rows: pd.DataFrame, methods) -> pd.DataFrame:
    ok = rows[(rows["status"] == "ok") & rows["method"].isin(list(methods)) & (rows["median_us"] > 0)]
    return _fastest_form(ok)


def _fastest_form(rows: pd.DataFrame) -> pd.DataFrame:
    """Each method in its fastest form: of rows differing only in `compiled` (eager vs torch.compile), keep
    the fastest. The fairness rule gives the baseline the same choice as ReplaySSM. Tuned and default-launch
    rows stay apart (launch_source is a key)."""
    if rows.empty:
        return rows
    keys = RUN_KEYS + ["method", "launch_source"] + [k for k in POINT_KEYS if k != "compiled"]
    norm = rows[keys].map(_norm)
    order = rows["median_us"].to_numpy().argsort(kind="stable")
    first = ~norm.iloc[order].duplicated(keep="first")
    return rows.iloc[order][first.to_numpy()].sort_index()


def _is_tuned(rows: pd.DataFrame) -> pd.Series:
    return rows["launch_source"].isin(TUNED_SOURCES) if "launch_source" in rows else pd.Series(False, rows.index)


def _prefer_tuned(rows: pd.DataFrame) -> pd.DataFrame:
    """Drop a row that ran the default configs where the same method has a tuned row at the same point (the
    default one is the partner of value_default, never a numerator of its own)."""
    if rows.empty or "launch_source" not in rows:
        return rows
    keys = RUN_KEYS + ["method"] + [k for k in POINT_KEYS if k != "compiled"]
    norm = rows[keys].map(_norm).apply(tuple, axis=1)
    tuned = set(norm[_is_tuned(rows)])
    return rows[_is_tuned(rows) | ~norm.isin(tuned)]


def primary_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows figures and per-method tables draw: at a point where a method has a tuned row, its
    default-config row (the partner of value_default) is left out; it stays in rows.csv and the medians table."""
    return _prefer_tuned(rows)


def _launch_columns(frame: pd.DataFrame, m: pd.DataFrame) -> pd.DataFrame:
    """num/den_launch_source and launch_note of ratio rows `frame` (index aligned with the pairs `m`)."""
    src = m.get("launch_source", pd.Series(pd.NA, m.index)).reindex(frame.index)
    den = m.get("launch_source_den", pd.Series(pd.NA, m.index)).reindex(frame.index)
    num_t, den_t = src.isin(TUNED_SOURCES), den.isin(TUNED_SOURCES)
    note = np.where(num_t & ~den_t, "partner untuned", np.where(~num_t & den_t & src.notna(), "method untuned", ""))
    return frame.assign(num_launch_source=src, den_launch_source=den, launch_note=note)


def throughput(rows: pd.DataFrame, per_token: bool) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(tokens/s, at p80 time, at p20 time). AR (per_token=False): batch / step time. Spec: the row's
    tokens_per_s, else batch * mean_accepted / step time."""
    step_tps = rows["batch"] * 1e6 / rows["median_us"]
    if per_token:
        tps = step_tps
    else:
        tps = rows["tokens_per_s"].where(rows["tokens_per_s"] > 0, step_tps * rows["mean_accepted"].fillna(1.0))
    return tps, tps * rows["median_us"] / rows["p80_us"], tps * rows["median_us"] / rows["p20_us"]


def pair(num: pd.DataFrame, den: pd.DataFrame, strict: list[str], wild: list[str],
         prefer: list[str] = ()) -> pd.DataFrame:
    """Match each numerator row to one denominator row of the same run and point.

    Strict keys must be equal; wild keys must be equal where both rows have them; `prefer` keys only rank
    candidates. Of several candidates, the one matching most wild and preferred keys wins, then the
    fastest (the denominator gets its best showing).
    Returns the numerator's columns as they are and the denominator's with a `_den` suffix, plus `_nid`
    (the numerator's position in `num`).
    """
    if num.empty or den.empty:
        return pd.DataFrame()
    a, b = num.reset_index(drop=True).copy(), den.reset_index(drop=True).copy()
    prefer = [k for k in prefer if k not in strict]
    for k in strict + wild + prefer:
        a[f"__{k}"] = a[k].map(_norm)
        b[f"__{k}"] = b[k].map(_norm)
    a["_nid"] = np.arange(len(a))
    on = [f"__{k}" for k in strict]
    b = b.rename(columns={c: f"{c}_den" for c in b.columns if c not in on})
    m = a.merge(b, on=on, how="inner")
    if m.empty:
        return m
    keep = pd.Series(True, index=m.index)
    score = pd.Series(0, index=m.index)
    for k in wild:
        x, y = m[f"__{k}"], m[f"__{k}_den"]
        equal = x == y
        keep &= equal | (x == NA_KEY) | (y == NA_KEY)
        score += equal.astype(int)
    for k in prefer:
        score += (m[f"__{k}"] == m[f"__{k}_den"]).astype(int)
    m = m[keep].assign(_score=score[keep])
    m = m.sort_values(["_nid", "_score", "median_us_den"], ascending=[True, False, True], kind="stable")
    return m.drop_duplicates("_nid", keep="first").reset_index(drop=True)


def _ratio_frame(m: pd.DataFrame, metric: str, how: str) -> pd.DataFrame:
    """Turn matched pairs into summary rows. how: "time" (den time / num time), "cost" (num time / den
    time), "tps_spec"/"tps_ar" (num tokens/s over den tokens/s; den is spec or AR), "footprint"."""
    if m.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    out = m[[c for c in SUMMARY_COLUMNS if c in m.columns]].copy()
    out["metric"] = metric
    out["num_method"], out["den_method"] = m["method"], m["method_den"]
    out["num_backend"], out["den_backend"] = m["backend"], m["backend_den"]
    out["num_compiled"], out["den_compiled"] = m["compiled"], m["compiled_den"]
    nt, nt20, nt80 = m["median_us"], m["p20_us"], m["p80_us"]
    dt, dt20, dt80 = m["median_us_den"], m["p20_us_den"], m["p80_us_den"]
    if how == "time":
        out["value"], out["lo"], out["hi"] = dt / nt, dt20 / nt80, dt80 / nt20
        out["num_value"], out["den_value"], out["value_unit"] = nt, dt, "x (time ratio)"
    elif how == "cost":
        out["value"], out["lo"], out["hi"] = nt / dt, nt20 / dt80, nt80 / dt20
        out["num_value"], out["den_value"], out["value_unit"] = nt, dt, "x (cost, lower is better)"
    elif how in ("tps_spec", "tps_ar"):
        num_tps, num_lo, num_hi = throughput(m, per_token=False)
        den = pd.DataFrame({c: m[f"{c}_den"] for c in ("batch", "median_us", "p20_us", "p80_us", "tokens_per_s",
                                                       "mean_accepted")})
        den_tps, den_lo, den_hi = throughput(den, per_token=how == "tps_ar")
        out["value"], out["lo"], out["hi"] = num_tps / den_tps, num_lo / den_hi, num_hi / den_lo
        out["num_value"], out["den_value"], out["value_unit"] = num_tps, den_tps, "x (tokens/s ratio)"
    elif how == "footprint":
        out["value"] = m["footprint_bytes_den"] / m["footprint_bytes"]
        out["lo"] = out["hi"] = out["value"]
        out["num_value"], out["den_value"] = m["footprint_bytes"], m["footprint_bytes_den"]
        out["value_unit"] = "x (footprint ratio)"
    else:
        raise ValueError(f"unknown ratio kind {how!r}")
    # The byte model's ratio for the same pair (per token for throughput ratios): the ceiling a purely
    # bandwidth-bound method would reach, printed beside the measured value.
    num_tok = m["mean_accepted"].fillna(1.0) if how in ("tps_spec", "tps_ar") else 1.0
    den_tok = m["mean_accepted_den"].fillna(1.0) if how == "tps_spec" else 1.0
    if how in ("time", "tps_spec", "tps_ar"):
        out["bytes_ratio"] = (m["bytes_model_den"] / den_tok) / (m["bytes_model"] / num_tok)
    elif how == "cost":
        out["bytes_ratio"] = m["bytes_model"] / m["bytes_model_den"]
    if how in ("time", "tps_spec") and "byte_model_ratio" in m:
        # the row's own partner ratio (runner) where the pair's bytes_model is missing; equal otherwise
        out["bytes_ratio"] = out["bytes_ratio"].fillna(pd.to_numeric(m["byte_model_ratio"], errors="coerce"))
    if "bytes_ratio" not in out:
        out["bytes_ratio"] = np.nan                            # footprint: no byte model
    out["measured_over_model"] = out["value"] / out["bytes_ratio"]
    resident = _truthy(m.get("cache_resident")) | _truthy(m.get("cache_resident_den"))
    out["cache_resident"] = resident
    above = (out["measured_over_model"] > BANDWIDTH_SLACK) if how in SPEEDUP_KINDS else False
    within = np.isfinite(out["measured_over_model"].astype(float)) if how in SPEEDUP_KINDS else False
    out["verdict"] = np.where(above, NOT_BANDWIDTH_BOUND, np.where(resident, CACHE_RESIDENT,
                                                                   np.where(within, WITHIN_MODEL, "")))
    out = out[np.isfinite(out["value"].astype(float)) & (out["value"] > 0)]
    return out.reindex(columns=list(SUMMARY_COLUMNS))


def _truthy(col) -> pd.Series | bool:
    """A bool column read back from CSV ("True"/"true"/1) -> bool, NA -> False."""
    if col is None:
        return False
    return col.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))


# (metric, numerator methods, denominator methods, strict keys, wild keys, preferred keys, ratio kind)
PAIRINGS = (
    ("ar_speedup", ("replay_ar",), ("baseline_ar",), AR_STRICT, AR_WILD, (), "time"),
    ("spec_vs_native", ("replay_spec",), ("baseline_spec",), SPEC_STRICT, SPEC_WILD, (), "tps_spec"),
    ("spec_vs_commit", ("replay_spec",), ("commit_replay_spec",), SPEC_STRICT, SPEC_WILD, (), "tps_spec"),
    ("commit_vs_native", ("commit_replay_spec",), ("baseline_spec",), SPEC_STRICT, SPEC_WILD, (), "tps_spec"),
    ("spec_vs_ar", ("replay_spec",), ("baseline_ar",), CROSS_STRICT, CROSS_WILD, CROSS_PREFER, "tps_ar"),
    ("native_spec_vs_ar", ("baseline_spec",), ("baseline_ar",), CROSS_STRICT, CROSS_WILD, CROSS_PREFER, "tps_ar"),
    ("step_cost_vs_ar", SPEC_METHODS, ("baseline_ar",), CROSS_STRICT, CROSS_WILD, CROSS_PREFER, "cost"),
    ("concurrency", ("replay_spec",), ("baseline_spec",), SPEC_STRICT, SPEC_WILD, (), "footprint"),
)


def _peer_pairings(rows: pd.DataFrame):
    """Peers (method "peer:<name>") against our replay and baseline rows of the same experiment; the peer's
    backend differs from ours by construction, so backend is not a key."""
    peers = sorted(m for m in rows["method"].dropna().unique() if str(m).startswith("peer:"))
    for peer in peers:
        peer_rows = rows[rows["method"] == peer]
        spec = peer_rows["spec_T"].notna().any() and peer_rows["experiment"].astype(str).str.contains("spec").any()
        strict = [k for k in (SPEC_STRICT if spec else AR_STRICT) if k != "backend"]
        wild = SPEC_WILD if spec else AR_WILD
        if spec:
            yield "spec_vs_peer", ("replay_spec",), (peer,), strict, wild, (), "tps_spec"
        else:
            yield "ar_vs_peer", ("replay_ar",), (peer,), strict, wild, (), "time"
            yield "baseline_vs_peer", ("baseline_ar",), (peer,), strict, wild, (), "time"


@dataclass
class Summary:
    ratios: pd.DataFrame    # SUMMARY_COLUMNS, one row per matched pair
    counts: pd.DataFrame    # run_id, experiment, method, status, count, in_ratios


def summarize(rows: pd.DataFrame) -> Summary:
    """All ratios of the given rows (one or more runs; pairs never cross runs) and the status counts."""
    rows = rows.reset_index(drop=True).assign(_rid=lambda r: np.arange(len(r)))
    frames, used = [], set()
    for metric, num_methods, den_methods, strict, wild, prefer, how in (*PAIRINGS, *_peer_pairings(rows)):
        num, den = _prefer_tuned(_ok(rows, num_methods)), _ok(rows, den_methods)
        if how == "footprint":
            num, den = num[num["footprint_bytes"] > 0], den[den["footprint_bytes"] > 0]
        # the tuned partner first; a numerator row without one pairs with the default-config partner
        tuned = _is_tuned(den)
        m_t, m_d = pair(num, den[tuned], strict, wild, prefer), pair(num, den[~tuned], strict, wild, prefer)
        if m_t.empty or m_d.empty:
            m = m_d if m_t.empty else m_t
        else:
            m = pd.concat([m_t, m_d[~m_d["_nid"].isin(m_t["_nid"])]], ignore_index=True)
        if m.empty:
            continue
        frame = _launch_columns(_ratio_frame(m, metric, how), m)
        if not m_t.empty and not m_d.empty:           # beside a tuned partner: the ratio against its default row
            fd = _ratio_frame(m_d, metric, how)
            by_nid = pd.Series(fd["value"].to_numpy(), index=m_d.loc[fd.index, "_nid"].to_numpy())
            by_nid = by_nid[~by_nid.index.duplicated()]
            den_tuned = m.loc[frame.index, "launch_source_den"].isin(TUNED_SOURCES)
            frame["value_default"] = m.loc[frame.index, "_nid"].map(by_nid).where(den_tuned)
        frames.append(frame)
        used.update(m["_rid"].tolist() + m["_rid_den"].tolist())
    # real-engine rows (level=engine, experiments/vllm_bench.py) pair among themselves: experiments/report/engine.py
    engine, engine_used = engine_ratios(rows, SUMMARY_COLUMNS)
    if not engine.empty:
        frames.append(engine)
        used.update(engine_used)
    ratios = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    counted = rows.assign(_used=rows["_rid"].isin(list(used)))
    for col in ("experiment", "method"):
        counted[col] = counted[col].fillna(NA_KEY)
    counts = (counted.groupby(["run_id", "experiment", "method", "status"], dropna=False)
              .agg(count=("status", "size"), in_ratios=("_used", "sum")).reset_index())
    return Summary(ratios=ratios, counts=counts)


def summarize_run(run_dir: Path | str) -> Summary:
    """Aggregate one run directory and write summary.csv and counts.csv beside its rows.csv."""
    run = load_run(run_dir)
    summary = summarize(run.rows)
    summary.ratios.to_csv(run.path / "summary.csv", index=False)
    summary.counts.to_csv(run.path / "counts.csv", index=False)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="results/<hardware>/<run-id> directories")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        summary = summarize_run(run_dir)
        bad = summary.counts[summary.counts["status"] != "ok"]["count"].sum()
        print(f"{run_dir}: {len(summary.ratios)} ratios, {int(bad)} non-ok rows (excluded, see counts.csv) "
              f"-> {run_dir / 'summary.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
