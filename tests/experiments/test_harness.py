"""The plain-function harness on tiny CPU models: rows, gate, failures, resume, provenance, run directories."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch
from harness_doubles import compose

from experiments.harness.methods import REGISTRY
from experiments.harness.store import COLUMNS
from experiments.kernel.run import run_experiment, summarize


def _importable(method: str, family: str) -> bool:
    m = REGISTRY[method]
    mods = [m.modules[family]]
    if getattr(m, "cache_modules", {}).get(family):
        mods.append(m.cache_modules[family][0])
    return all(importlib.util.find_spec(mod) is not None for mod in mods)


def _rows_on_disk(run_dir) -> list[dict]:
    with open(run_dir / "rows.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


@pytest.mark.parametrize("experiment", ["kernel_decode", "kernel_spec"])
def test_every_available_method_is_ok_with_speedup_ready_pairs(tmp_path, experiment):
    result = run_experiment(compose(tmp_path, experiment, ["method=ours"]))
    rows = result.rows
    on_disk = _rows_on_disk(result.run_dir)
    assert rows and [(r["config_hash"], r["status"]) for r in on_disk] == [(r["config_hash"], r["status"])
                                                                          for r in rows]
    for r in rows:
        if r["status"] == "skipped":           # only a method whose module has not landed may be skipped
            assert not _importable(r["method"], r["family"]), r
            assert "not importable" in r["message"]
            continue
        assert r["status"] == "ok", (r["method"], r["model"], r["message"])
        assert r["rel_err"] < 1e-5 and r["median_us"] > 0 and r["p20_us"] <= r["median_us"] <= r["p80_us"]
        assert r["tokens_per_s"] > 0 and r["footprint_bytes"] > 0 and r["threads"] == 1
        assert r["bytes_model"] > 0 and r["achieved_GBps"] > 0 and r["pct_peak_measured"] > 0
        assert r["pct_peak_datasheet"] is None                        # no datasheet peak for a CPU
        assert "gate passed" in r["message"] and r["run_id"] == result.run_id
    ok = {(r["model"], r["method"]) for r in rows if r["status"] == "ok"}
    for model in ("tiny_mamba2", "tiny_gdn"):
        assert (model, "baseline_ar") in ok
        assert (model, "replay_ar" if experiment == "kernel_decode" else "replay_spec") in ok
    if experiment == "kernel_decode":
        replay = [r for r in rows if r["method"] == "replay_ar"]
        assert all(r["flush_us"] > 0 and r["buffer_len"] == 3 for r in replay)
        assert {r["route"] for r in replay if r["family"] == "mamba2"} == {"output_only", "state_and_output"}
    else:
        spec = [r for r in rows if r["spec_T"] == 2 and r["status"] == "ok"]
        assert all(1 <= r["mean_accepted"] <= 2 and r["acceptance"] == "rate:0.7" for r in spec)
        assert all(r["tokens_per_s"] == pytest.approx(2 * r["mean_accepted"] / (r["median_us"] * 1e-6))
                   for r in spec)
    assert "status: ok=" in summarize(rows)


def test_wrong_raising_and_oom_methods_are_recorded_and_the_sweep_goes_on(tmp_path, doubles):
    cfg = compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]",
                                       "method.names=[test:wrong,test:raises,test:oom,baseline_ar]"])
    rows = {r["method"]: r for r in run_experiment(cfg).rows}
    wrong = rows["test:wrong"]
    assert wrong["status"] == "wrong" and wrong["rel_err"] > 1e-3 and "FAILED" in wrong["message"]
    assert wrong["median_us"] is None and wrong["tokens_per_s"] is None          # never timed
    assert rows["test:raises"]["status"] == "error" and "boom" in rows["test:raises"]["message"]
    assert rows["test:oom"]["status"] == "oom" and "out of memory" in rows["test:oom"]["message"]
    assert rows["baseline_ar"]["status"] == "ok"                                  # after the failures


def test_resume_skips_recorded_points_and_completes_the_rest(tmp_path):
    first = run_experiment(compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "method.names=[baseline_ar]"]))
    assert len(first.rows) == 1
    resumed = run_experiment(compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "sweep.batch=[2,3]",
                                                          "method.names=[baseline_ar]", f"resume={first.run_dir}"]))
    assert resumed.run_dir == first.run_dir and resumed.resumed_skipped == 1
    assert [r["batch"] for r in resumed.rows] == [3]
    on_disk = _rows_on_disk(first.run_dir)
    assert [r["batch"] for r in on_disk] == ["2", "3"] and len({r["config_hash"] for r in on_disk}) == 2
    assert (first.run_dir / "env.json").exists() and (first.run_dir / "env.kernel_decode.json").exists()
    assert (first.run_dir / "config.kernel_decode.yaml").exists()          # named by experiment, not resume-N
    files = sorted(p.name for p in first.run_dir.iterdir())
    again = run_experiment(compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "sweep.batch=[2,3]",
                                                        "method.names=[baseline_ar]", f"resume={first.run_dir}"]))
    assert again.rows == [] and again.resumed_skipped == 2
    assert sorted(p.name for p in first.run_dir.iterdir()) == files          # ran nothing: wrote no config file


def test_runs_never_overwrite_each_other(tmp_path):
    overrides = ["sweep.models=[tiny_mamba2]", "method.names=[baseline_ar]", "run_id=fixed-id"]
    a = run_experiment(compose(tmp_path, overrides=overrides[:2]))
    b = run_experiment(compose(tmp_path, overrides=overrides[:2]))
    assert a.run_dir != b.run_dir and a.run_dir.parent == b.run_dir.parent == tmp_path / "cpu"
    assert len(_rows_on_disk(a.run_dir)) == len(_rows_on_disk(b.run_dir)) == 1
    run_experiment(compose(tmp_path, overrides=overrides))
    with pytest.raises(ValueError, match="already exists"):
        run_experiment(compose(tmp_path, overrides=overrides))                 # an explicit id is never reused
    with pytest.raises(ValueError, match="resume"):
        run_experiment(compose(tmp_path, overrides=overrides[:2] + [f"resume={tmp_path}"]))


def test_env_json_records_provenance(tmp_path):
    result = run_experiment(compose(tmp_path, overrides=["sweep.models=[tiny_gdn]", "method.names=[baseline_ar]"]))
    env = json.loads((result.run_dir / "env.json").read_text())
    for key in ("hostname", "python", "cpu_name", "threads", "torch", "triton", "cuda", "peers", "git_sha",
                "git_dirty", "device", "gpu_name", "hardware", "timing_mode", "l2_policy", "copy_GBps", "nvml",
                "run_id", "created_utc"):
        assert key in env, key
    assert env["device"] == "cpu" and env["hardware"]["name"] == "cpu" and env["copy_GBps"] > 0
    assert env["cpu_clock"] == "thread_time" and env["threads"] == 1          # sweep=cpu pins one torch thread
    assert env["nvml"].startswith("absent") and set(env["peers"]) == {"mamba_ssm", "fla", "flashinfer"}
    assert result.run_dir.name == env["run_id"] and env["run_id"].endswith(env["git_sha"][:7] if env["git_sha"]
                                                                           else "nogit")
    assert "sweep:" in (result.run_dir / "config.yaml").read_text()


def test_interpreter_backend_checks_but_never_times(tmp_path):
    cfg = compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "sweep.backend=triton", "sweep.batch=[1]",
                                       "sweep.buffer_len=[2]", "sweep.routes=[output_only]",
                                       "method.names=[baseline_ar,replay_ar]"])
    rows = run_experiment(cfg).rows
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(r["median_us"] is None and "never timed" in r["message"] and r["rel_err"] < 1e-5 for r in rows)


def test_torch_compile_auto_keeps_the_faster_variant(tmp_path):
    cfg = compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "method.names=[baseline_ar]",
                                       "sweep.backend=torch", "sweep.torch_compile=auto",
                                       "timing.compile_backend=eager"])
    (row,) = run_experiment(cfg).rows
    assert row["status"] == "ok" and isinstance(row["compiled"], bool)
    assert "compiled" in row["message"]                  # both variants were timed (or the drop is noted)


def test_a_bad_config_fails_before_any_run_directory(tmp_path):
    with pytest.raises(ValueError, match=r"sweep.batch\[0\]"):
        run_experiment(compose(tmp_path, overrides=["sweep.batch=[0]"]))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_graph_timing_on_tiny_models(tmp_path):
    """On a GPU box: graph-captured, cold-L2 timing of every method through the real Triton kernels."""
    for experiment in ("kernel_decode", "kernel_spec"):
        cfg = compose(tmp_path, experiment, ["sweep.backend=triton", "sweep.timing_mode=graph", "sweep.l2=cold",
                                             "sweep.act_dtype=[bfloat16]", "sweep.slot_layout=permuted",
                                             "method=ours", "timing.rep_ms=20", "timing.warmup_ms=5"])
        for r in run_experiment(cfg).rows:
            assert r["status"] == "ok", (r["method"], r["message"])
            assert r["median_us"] > 0 and r["peak_mem_bytes"] > 0 and r["pct_peak_measured"] > 0
            assert "layers=" in r["message"]
