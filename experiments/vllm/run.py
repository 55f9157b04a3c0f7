"""run_engine_bench(cfg): engine points -> rows (level=engine) in results/<hardware>/<run-id>/rows.csv.

Per point: build the exact commands for the installed engine's dialect; skip (status=skipped, reason and
commands in the row) when there is no engine, no GPU, or the dialect cannot express the mode; otherwise run
`vllm bench throughput`, or start `vllm serve` on a free loopback port and run `vllm bench serve` against
it. Every process runs in its own process group and is killed on timeout, failure or Ctrl-C. A failing point
is a row (error / oom) and the sweep goes on; KeyboardInterrupt stops the sweep after cleaning up.
Each point keeps its logs and result JSON under <run dir>/engine/<point>/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from experiments.harness.entry import config_dict
from experiments.harness.env import collect_env, resolve_hardware
from experiments.harness.points import CONF_DIR
from experiments.harness.store import COLUMNS, RunStore
from experiments.vllm import results
from experiments.vllm.commands import (
    EnginePoint,
    Unsupported,
    bench_serve_command,
    engine_args,
    serve_command,
    shell_line,
    throughput_command,
)
from experiments.vllm.dialect import ASSUMED, Dialect, detect_dialect, parse_version
from experiments.vllm.plan import EnginePlan, expand, point_hash
from experiments.vllm.server import EngineServer, ServerError, free_port, tail

LEVEL = "engine"
EXPERIMENT = "vllm_bench"
ENGINE_COLUMNS = COLUMNS + [
    "level", "engine", "engine_version", "dialect", "mode", "bench", "max_num_seqs", "dataset", "temperature",
    "input_len", "output_len", "num_prompts", "completed", "failed", "duration_s", "requests_per_s",
    "output_tokens_per_s", "total_tokens_per_s", "ttft_mean_ms", "ttft_median_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_mean_ms", "tpot_median_ms", "tpot_p90_ms", "tpot_p99_ms", "itl_median_ms", "itl_p99_ms",
    "e2el_median_ms", "e2el_p99_ms", "acceptance_length", "acceptance_rate_pct", "max_concurrency",
    "max_concurrency_tokens", "peak_concurrent_requests", "engine_flags", "server_command", "bench_command",
    "point_dir",
]
_OOM = ("CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError")


class EngineStore(RunStore):
    columns = ENGINE_COLUMNS


@dataclass
class Engine:
    """What was found on this machine: the executable, its version and dialect, or why it cannot run."""

    executable: str | None
    version: str | None
    dialect: Dialect
    help_source: str | None      # the command whose output the dialect was read from
    reason: str | None           # None: points can run

    def describe(self) -> dict:
        return {"executable": self.executable, "version": self.version, "dialect": self.dialect.name,
                "help_source": self.help_source, "skip_reason": self.reason}


def _capture(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def gpu_reason() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU visible (torch.cuda.is_available() is False)"


def probe_engine(engine_cfg: dict) -> Engine:
    """Find the engine and read its dialect from `serve --help=all` (newer vLLM hides groups behind
    --help=all), falling back to `serve --help`."""
    exe = shutil.which(str(engine_cfg["executable"]))
    reasons = []
    gpu = gpu_reason() if engine_cfg.get("require_gpu", True) else None
    if exe is None:
        reasons.append(f"engine executable {engine_cfg['executable']!r} not found on PATH (vLLM not installed)")
        if gpu:
            reasons.append(gpu)
        return Engine(None, None, ASSUMED, None, "; ".join(reasons) + "; commands shown for the fork's flags")
    timeout = float(engine_cfg["probe_timeout_s"])
    rc, out = _capture([exe, "--version"], timeout)
    version = parse_version(out) if rc == 0 else None
    dialect, source, last = None, None, ""
    for help_arg in ("--help=all", "--help"):
        rc, text = _capture([exe, "serve", help_arg], timeout)
        last = text
        if rc == 0:
            try:
                dialect, source = detect_dialect(text), f"{Path(exe).name} serve {help_arg}"
                break
            except ValueError:
                continue
    if dialect is None:
        reasons.append(f"could not read the engine's flags from `{exe} serve --help`: {last.strip()[-200:]}")
        dialect = ASSUMED
    if gpu:
        reasons.append(gpu)
    return Engine(exe, version, dialect, source, "; ".join(reasons) or None)


@dataclass
class EngineRun:
    run_dir: Path
    run_id: str
    rows: list[dict] = field(default_factory=list)
    resumed_skipped: int = 0
    engine: dict = field(default_factory=dict)


def run_engine_bench(cfg, *, progress: bool | None = None) -> EngineRun:
    """Validate, probe the engine, then run (or skip with the reason) every point."""
    data = config_dict(cfg)
    plan = expand(data)                                  # every ValueError happens here, before any process
    engine = probe_engine(plan.engine)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hardware = resolve_hardware(data.get("hardware") or {}, device, CONF_DIR)
    store = EngineStore.open(data, hardware["name"])
    env = collect_env(device=device, hardware=hardware, timing={}, sweep={})
    env.update(run_id=store.run_id, points=len(plan.points), level=LEVEL, engine=engine.describe())
    done = store.done_hashes()
    if any(point_hash(p) not in done for p in plan.points):     # a resume with nothing left adds no file
        store.write_provenance(EXPERIMENT, env, OmegaConf.to_yaml(data))
    run = EngineRun(run_dir=store.run_dir, run_id=store.run_id, engine=engine.describe())
    show = data.get("progress", True) if progress is None else progress
    for i, p in enumerate(tqdm(plan.points, desc=EXPERIMENT, unit="pt", disable=not show)):
        if point_hash(p) in done:
            run.resumed_skipped += 1
            continue
        row = run_point(p, engine, plan, store.run_dir / "engine" / f"{i:03d}-{p.model}-{p.mode}-{p.bench}-"
                        f"n{p.max_num_seqs}", store.run_id)
        store.append(row)
        run.rows.append(row)
    return run


def blank_row(p: EnginePoint, engine: Engine, run_id: str) -> dict:
    row = {c: None for c in ENGINE_COLUMNS}
    row.update(experiment=EXPERIMENT, level=LEVEL, family=p.family, model=p.model, tp=p.tp, method=f"vllm:{p.mode}",
               mode=p.mode, bench=p.bench, backend="vllm", batch=p.max_num_seqs, max_num_seqs=p.max_num_seqs,
               spec_T=p.spec_T, route=p.route, dataset=p.dataset, temperature=p.temperature, input_len=p.input_len
               if p.dataset == "random" else None, output_len=p.output_len, num_prompts=p.num_prompts,
               engine=Path(engine.executable).name if engine.executable else "vllm", engine_version=engine.version,
               dialect=engine.dialect.name, config_hash=point_hash(p), run_id=run_id, message="")
    if p.mode == "replayssm_ar":
        row["buffer_len"] = p.buffer_len
    elif p.mode == "replayssm_spec":
        row["history_len"] = p.buffer_len
    return row


def commands(p: EnginePoint, engine: Engine, point_dir: Path, port: int) -> tuple[list[str] | None, list[str]]:
    """(server argv or None, bench argv) for one point; Unsupported propagates."""
    exe = engine.executable or "vllm"
    if p.bench == "throughput":
        return None, throughput_command(exe, p, engine.dialect, str(point_dir / "throughput.json"))
    return (serve_command(exe, p, engine.dialect, port),
            bench_serve_command(exe, p, port, str(point_dir), "serve.json"))


def run_point(p: EnginePoint, engine: Engine, plan: EnginePlan, point_dir: Path, run_id: str) -> dict:
    """One row; never raises except KeyboardInterrupt (after every process it started is stopped)."""
    row = blank_row(p, engine, run_id)
    port = free_port() if engine.reason is None and p.bench == "serve" else 8000
    try:
        flags = [a for a in engine_args(p, engine.dialect) if "replayssm" in a or "speculative" in a]
        row["engine_flags"] = " ".join(flags)
        server_argv, bench = commands(p, engine, point_dir, port)
    except Unsupported as exc:
        row.update(status="skipped", message=str(exc))
        return row
    row["server_command"] = shell_line(server_argv) if server_argv else None
    row["bench_command"] = shell_line(bench)
    if p.temperature is None:
        row["message"] = "sampling fixed by vllm bench throughput itself; "
    if engine.reason is not None:
        row.update(status="skipped", message=row["message"] + engine.reason)
        return row
    point_dir.mkdir(parents=True, exist_ok=True)
    row["point_dir"] = str(point_dir)
    cfg = plan.engine
    try:
        if p.bench == "throughput":
            log = point_dir / "throughput.log"
            _run_logged(bench, log, float(cfg["bench_timeout_s"]))
            metrics = results.parse_throughput(point_dir / "throughput.json", log.read_text(errors="replace"))
            engine_log = log
        else:
            engine_log = point_dir / "server.log"
            with EngineServer(server_argv, port=port, log_path=engine_log,
                              ready_timeout_s=float(cfg["ready_timeout_s"]), stop_grace_s=float(cfg["stop_grace_s"])):
                _run_logged(bench, point_dir / "bench.log", float(cfg["bench_timeout_s"]))
            metrics = results.parse_serve(point_dir / "serve.json")
        row.update(metrics)
        row["tokens_per_s"] = metrics.get("output_tokens_per_s")
        row["mean_accepted"] = metrics.get("acceptance_length")
        row["max_concurrency"], row["max_concurrency_tokens"] = results.parse_max_concurrency(
            engine_log.read_text(errors="replace"))
        notes = []
        if row["tokens_per_s"] is None:
            notes.append("output tokens/s not printed by the benchmark")
        if p.spec_T and row["acceptance_length"] is None and p.bench == "serve":
            notes.append("no spec_decode_* metrics in the result (server metrics endpoint?)")
        if row["max_concurrency"] is None:
            notes.append("no 'Maximum concurrency' line in the engine log")
        row.update(status="ok", message=row["message"] + "; ".join(notes))
    except (ServerError, BenchError, results.ResultError, subprocess.TimeoutExpired) as exc:
        text = str(exc)
        oom = any(s in text for s in _OOM) or any(
            s in tail(f, 200) for f in point_dir.glob("*.log") for s in _OOM)
        row.update(status="oom" if oom else "error", message=row["message"] + f"{type(exc).__name__}: {text[:600]}")
    except OSError as exc:
        row.update(status="error", message=row["message"] + f"{type(exc).__name__}: {exc}")
    return row


class BenchError(RuntimeError):
    """The benchmark command exited non-zero or ran past its timeout."""


def _run_logged(argv: list[str], log_path: Path, timeout_s: float) -> None:
    """Run argv in its own process group with stdout+stderr into log_path; kill the group on timeout,
    failure or KeyboardInterrupt."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{Path(argv[0]).name} {' '.join(argv[1:3])} ran past {timeout_s:g} s; killed; log "
                         f"{log_path}:\n{tail(log_path)}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if rc != 0:
        raise BenchError(f"{Path(argv[0]).name} {' '.join(argv[1:3])} exited with code {rc}; log {log_path}:\n"
                         f"{tail(log_path)}")


# ------------------------------------------------------------------------------------------------ summary

def summarize(rows: list[dict]) -> str:
    """One line per row (model, mode, bench, batch, status, output tok/s, message) and the exact commands of
    the first row of each (mode, bench) (every row's are in rows.csv: server_command, bench_command)."""
    if not rows:
        return "(no rows)"
    messages = {r["message"] for r in rows}
    common = messages.pop() if len(messages) == 1 else None
    lines = []
    for r in rows:
        tps = f"{r['tokens_per_s']:.1f} tok/s" if isinstance(r.get("tokens_per_s"), float) else "-"
        lines.append(f"{r['model']:<22} {r['mode']:<15} {r['bench']:<10} n={r['max_num_seqs']:<4} "
                     f"{r['status']:<8} {tps:<14} {'' if common is not None else r['message'] or ''}")
    if common:
        lines.append(f"every row: {common}")
    seen = set()
    for r in rows:
        if not r.get("bench_command") or (r["mode"], r["bench"]) in seen:
            continue
        seen.add((r["mode"], r["bench"]))
        lines.append(f"\n[{r['mode']} / {r['bench']} / max_num_seqs={r['max_num_seqs']}]")
        if r.get("server_command"):
            lines.append(f"  server: {r['server_command']}")
        lines.append(f"  bench:  {r['bench_command']}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("\nstatus: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)
