"""End to end: the Hydra entry point drives a fake engine (real-schema outputs) and records level=engine rows;
without an engine every point is skipped with the reason and the exact commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import pid_alive

from experiments.harness.entry import load_config
from experiments.harness.env import REPO_ROOT
from experiments.vllm.run import ENGINE_COLUMNS, run_engine_bench


def _overrides(exe, out, run_id, extra=()):
    return [f"engine.executable={exe}", "engine.require_gpu=false", "engine.ready_timeout_s=60",
            "engine.stop_grace_s=5", "engine_sweep=vllm_smoke", "engine_sweep.max_num_seqs=[2]",
            "engine_sweep.output_len=16", f"out_dir={out}", f"run_id={run_id}", "progress=false", *extra]


def test_hydra_entry_point_with_the_fake_engine(fake_vllm, tmp_path):
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "experiments.vllm_bench", "model=nemotron3_nano_4b",
           *_overrides(fake_vllm, out, "e2e"), f"hydra.run.dir={tmp_path / 'hydra'}"]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = out / "cpu" / "e2e"
    rows = pd.read_csv(run_dir / "rows.csv")
    assert list(rows.columns) == ENGINE_COLUMNS and len(rows) == 8
    assert (rows["status"] == "ok").all(), rows[["mode", "bench", "message"]].to_string()
    assert (rows["level"] == "engine").all() and (rows["dialect"] == "fork").all()
    assert (rows["engine_version"] == "0.31.0+fake").all()
    serve = rows[rows["bench"] == "serve"].set_index("mode")
    # the fake reports 1000 x factor x concurrency output tok/s; rows carry what the engine reported
    assert serve.loc["standard", "tokens_per_s"] == pytest.approx(2000.0)
    assert serve.loc["replayssm_ar", "tokens_per_s"] == pytest.approx(2500.0)
    assert serve.loc["replayssm_spec", "acceptance_length"] == pytest.approx(3.1405)
    assert pd.isna(serve.loc["standard", "acceptance_length"])
    assert (serve["max_concurrency"] == 12.5).all() and (serve["max_concurrency_tokens"] == 2048).all()
    assert "--use-replayssm-spec" in serve.loc["replayssm_spec", "server_command"]
    assert "--replayssm-route output_only" in serve.loc["replayssm_ar", "server_command"]     # Mamba-2 model
    thr = rows[rows["bench"] == "throughput"]
    assert (thr["tokens_per_s"] == 1565.10).all() and (thr["max_concurrency"] == 87.31).all()
    assert "temperature" not in " ".join(thr["bench_command"])
    env = json.loads((run_dir / "env.json").read_text())
    assert env["engine"]["dialect"] == "fork" and env["level"] == "engine"
    pids = [json.loads(line)["pid"] for line in (tmp_path / "state" / "pids").read_text().splitlines()]
    assert len(pids) == 4 and not any(pid_alive(p) for p in pids)          # every server stopped
    assert "status: ok=8" in done.stdout


def test_upstream_dialect_and_failing_points_are_rows(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_HELP", "serve_help_upstream.txt")
    monkeypatch.setenv("FAKE_VLLM_BENCH", "no_requests")
    cfg = load_config("vllm_bench", _overrides(fake_vllm, tmp_path / "r", "up", ["engine_sweep.benches=[serve]"]))
    run = run_engine_bench(cfg, progress=False)
    by_mode = {r["mode"]: r for r in run.rows}
    assert by_mode["replayssm_spec"]["status"] == "skipped"
    assert "--use-replayssm-spec" in by_mode["replayssm_spec"]["message"]
    for mode in ("standard", "native_spec", "replayssm_ar"):       # the sweep went on past each failure
        assert by_mode[mode]["status"] == "error" and "no request completed" in by_mode[mode]["message"]
    assert by_mode["replayssm_ar"]["dialect"] == "upstream"


def test_no_engine_records_skipped_rows_with_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                          # nothing called vllm here
    cfg = load_config("vllm_bench", ["model=qwen35_4b", f"out_dir={tmp_path}", "run_id=none", "progress=false"])
    run = run_engine_bench(cfg, progress=False)
    assert len(run.rows) == 4 * 2 * 10                                  # modes x benches x max_num_seqs up to 512
    assert {r["status"] for r in run.rows} == {"skipped"}
    assert all("not found on PATH" in r["message"] for r in run.rows)
    assert max(r["max_num_seqs"] for r in run.rows) == 512
    spec = [r for r in run.rows if r["mode"] == "replayssm_spec" and r["bench"] == "serve"][0]
    assert spec["server_command"].startswith("vllm serve Qwen/Qwen3.5-4B --host 127.0.0.1")
    assert '"method":"qwen3_next_mtp","num_speculative_tokens":3' in spec["server_command"]
    assert "--temperature 0" in spec["bench_command"] and spec["dataset"] == "random"


def test_bad_config_fails_before_any_process(tmp_path):
    with pytest.raises(ValueError, match="history_len"):
        run_engine_bench(load_config("vllm_bench", [f"out_dir={tmp_path}", "engine_sweep.history_len=2"]))
    with pytest.raises(ValueError, match="dataset_path"):
        run_engine_bench(load_config("vllm_bench", [f"out_dir={tmp_path}", "engine.dataset_path=/no/such.jsonl"]))
    with pytest.raises(ValueError, match="modes"):
        run_engine_bench(load_config("vllm_bench", [f"out_dir={tmp_path}", "engine_sweep.modes=[turbo]"]))
    assert not list(tmp_path.iterdir())                                  # no run directory was created
