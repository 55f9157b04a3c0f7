"""Issue 10 on the CPU: the layer stack sized from the last-level cache (read from sysfs, recorded in
env.json), rows marked cache_resident when it cannot get past l2_factor x LLC, every speedup row carrying
byte_model_ratio; sweep=smoke picks its points by device; NVML absence handled."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from harness_doubles import FAST, compose

from experiments.harness import env as env_mod
from experiments.harness import memory, points
from experiments.harness.entry import load_config
from experiments.kernel.run import run_experiment
from replayssm import traffic
from replayssm.geometry import Mamba2Geometry


def _cache_dir(tmp_path, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = tmp_path / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return tmp_path


def test_llc_is_the_highest_data_cache_level(tmp_path):
    d = _cache_dir(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                              (3, "Unified", "32768K")])
    assert env_mod.cpu_llc(d) == {"llc_bytes": 32 << 20, "llc_level": 3, "llc_source": str(d)}
    # an instruction cache never counts, even at the highest level
    d2 = _cache_dir(tmp_path / "b", [(2, "Data", "2M"), (3, "Instruction", "8M")])
    assert env_mod.cpu_llc(d2)["llc_bytes"] == 2 << 20


def test_llc_falls_back_to_sysconf_then_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(env_mod.os, "sysconf", lambda name: 16 << 20 if name == "SC_LEVEL3_CACHE_SIZE" else 0)
    assert env_mod.cpu_llc(tmp_path)["llc_bytes"] == 16 << 20
    monkeypatch.setattr(env_mod.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert env_mod.cpu_llc(tmp_path) == {"llc_bytes": None, "llc_level": None, "llc_source": None}


def test_stack_rule_and_cache_residency():
    kw = dict(l2="cold", l2_bytes=100, l2_factor=4, max_layers=64, budget_bytes=None)
    assert memory.stack_layers(10, **kw) == (40, "")
    assert memory.cache_resident(40, 10, l2="cold", l2_bytes=100, l2_factor=4) is False
    # capped below 4 x L2: the GPU path keeps the capped stack, the CPU path times one layer; both resident
    layers, note = memory.stack_layers(1, **kw)
    assert layers == 64 and "not reached" in note
    layers, note = memory.stack_layers(1, **kw, unreachable_one=True)
    assert layers == 1 and "cache-resident" in note
    assert memory.cache_resident(64, 1, l2="cold", l2_bytes=100, l2_factor=4) is True
    assert memory.cache_resident(1, 10**9, l2="warm", l2_bytes=100, l2_factor=4) is True
    assert memory.cache_resident(1, 10, l2="cold", l2_bytes=None, l2_factor=4) is None


def test_cold_cpu_rows_stream_past_the_llc_and_carry_byte_model_ratio(tmp_path, monkeypatch):
    """A fake 16 KiB LLC: tiny_mamba2 at batch 2 (8 KiB of state per layer) needs 8 layers to pass 4 x LLC."""
    monkeypatch.setattr(env_mod, "cpu_llc", lambda *a: {"llc_bytes": 16 << 10, "llc_level": 3, "llc_source": "test"})
    cfg = compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "sweep.routes=[output_only]", "sweep.l2=cold",
                                       "method.names=[baseline_ar,replay_ar]"])
    result = run_experiment(cfg)
    env = json.loads((result.run_dir / "env.json").read_text())
    assert env["cpu_llc_bytes"] == 16 << 10 and env["hardware"]["l2_bytes"] == 16 << 10
    assert env["hardware"]["l2_source"].startswith("cpu llc")
    rows = {r["method"]: r for r in result.rows}
    base, replay = rows["baseline_ar"], rows["replay_ar"]
    assert base["status"] == replay["status"] == "ok" and base["l2"] == "cold"
    assert "layers=8" in base["message"] and base["cache_resident"] is False
    assert replay["cache_resident"] is False
    geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)
    want = (traffic.mamba2_baseline_ar(geom, state_bytes=4, act_bytes=4).total
            / traffic.mamba2_replay_ar_cycle(geom, 3, "output_only", state_bytes=4, act_bytes=4).total)
    assert replay["byte_model_ratio"] == pytest.approx(want, rel=1e-12)
    assert base["byte_model_ratio"] is None                  # a baseline has no partner


def test_tiny_cold_points_are_marked_cache_resident(tmp_path):
    result = run_experiment(compose(tmp_path, overrides=["sweep.models=[tiny_gdn]", "method.names=[baseline_ar]"]))
    (row,) = result.rows
    assert row["status"] == "ok" and row["l2"] == "cold" and row["cache_resident"] is True
    assert "timed as 1 layer, cache-resident" in row["message"]


def test_smoke_sweep_runs_on_cpu(tmp_path):
    """sweep=smoke on a CPU: on_cpu's tiny models, torch backend, eager timing (recorded), both experiments."""
    over = [f"out_dir={tmp_path}", "sweep=smoke", "sweep.on_cpu.batch=[2]", *FAST]
    decode = run_experiment(load_config("kernel_decode", over))
    spec = run_experiment(load_config("kernel_spec", over + [f"resume={decode.run_dir}"]))
    rows = decode.rows + spec.rows
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["model"] for r in rows} == {"tiny_mamba2", "tiny_gdn", "tiny_kda"}
    assert all(r["status"] in ("ok", "skipped") for r in rows), [r["message"] for r in rows if r["status"] != "ok"]
    assert {r["method"] for r in ok} >= {"baseline_ar", "replay_ar", "baseline_spec", "replay_spec"}
    assert all(r["timing_mode"] == "eager" for r in ok)
    # peers are Triton kernels: under the interpreter checked, never timed; every timed row is the torch backend
    timed = [r for r in ok if r["median_us"] is not None]
    assert timed and all(r["backend"] == "torch" and r["median_us"] > 0 for r in timed)
    assert all(r["backend"] == "triton" for r in ok if r["median_us"] is None)


def test_smoke_sweep_picks_graphs_and_the_large_models_on_a_gpu(monkeypatch):
    """The same config expanded for a CUDA device (no GPU needed: expansion only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(load_config("kernel_decode", ["sweep=smoke", "device=cuda"]), resolve=True)
    plan = points.expand(cfg)
    assert {p.model for p in plan.points} == {"nemotron3_super_120b", "qwen35_122b_a10b"}
    ours = [p for p in plan.points if not p.method.startswith("peer:")]
    assert all(p.timing_mode == "graph" and p.backend == "triton" and p.l2 == "cold" for p in ours)
    assert {p.act_dtype for p in plan.points} == {"bfloat16"}


def test_nvml_absent_or_failing_is_recorded_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)                 # import pynvml -> ImportError
    assert memory.nvml_used_bytes() is None
    assert env_mod.nvml_info() == {"nvml": "absent: pynvml not installed"}

    class NVMLError(Exception):
        pass

    def fail():
        raise NVMLError("Driver Not Loaded")

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=fail, nvmlShutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert memory.nvml_used_bytes() is None
    assert env_mod.nvml_info() == {"nvml": "absent: Driver Not Loaded"}


def test_unknown_on_cpu_key_is_refused_before_any_work(tmp_path):
    cfg = compose(tmp_path)
    cfg.sweep.on_cpu = {"models": ["tiny_gdn"], "warp": 9}      # (set after composing: the schema types it)
    with pytest.raises(ValueError, match=r"sweep\.on_cpu\.warp"):
        run_experiment(cfg)
    assert not any(tmp_path.rglob("rows.csv"))
