"""Harness pieces on their own: statistics, layer stacks, footprints, hardware profiles, NVML, the row store."""

from __future__ import annotations

import pytest
import torch
from harness_doubles import compose

from experiments.harness import env, memory, timing
from experiments.harness.methods import REGISTRY
from experiments.harness.points import CONF_DIR, expand
from experiments.harness.store import COLUMNS, RunStore
from experiments.harness.workload import Workload
from replayssm import get_geometry, traffic


def test_quantiles_are_median_p20_p80():
    t = timing.quantiles([float(v) for v in range(1, 12)])                  # 1..11
    assert (t.median_us, t.p20_us, t.p80_us) == (6.0, 3.0, 9.0)
    assert timing.quantiles([4.0]) == timing.Timing(4.0, 4.0, 4.0)
    with pytest.raises(ValueError):
        timing.quantiles([])


def test_cpu_timer_divides_by_the_work_per_cycle():
    t = timing.time_cpu(lambda: sum(range(2000)), 4, warmup=1, repeats=5, min_sample_us=50)
    assert 0 < t.p20_us <= t.median_us <= t.p80_us


def test_layer_stack_reaches_cold_l2_within_the_budget():
    assert memory.stack_layers(10, l2="warm", l2_bytes=100, l2_factor=4, max_layers=64, budget_bytes=None) == (1, "")
    layers, note = memory.stack_layers(10, l2="cold", l2_bytes=100, l2_factor=4, max_layers=64, budget_bytes=None)
    assert layers == 40 and note == ""
    layers, note = memory.stack_layers(10, l2="cold", l2_bytes=100, l2_factor=4, max_layers=64, budget_bytes=200)
    assert layers == 20 and "cold L2 not reached" in note
    with pytest.raises(MemoryError):
        memory.stack_layers(300, l2="cold", l2_bytes=100, l2_factor=4, max_layers=64, budget_bytes=200)


def test_max_concurrency_matches_the_traffic_model():
    fp = traffic.cache_footprint("replay_spec", get_geometry("qwen35_122b_a10b"), B_hist=16, T=4)
    budget = 80 * 2**30
    assert memory.max_concurrency(budget, fp.total, 36) == traffic.max_concurrency(budget, fp, 36)
    with pytest.raises(ValueError):
        memory.max_concurrency(budget, 0, 36)


@pytest.mark.parametrize("model", ["tiny_mamba2", "tiny_gdn"])
@pytest.mark.parametrize("method", ["baseline_ar", "replay_ar", "baseline_spec", "replay_spec", "commit_replay_spec"])
def test_allocated_footprint_matches_the_analytic_one(tmp_path, method, model):
    plan = expand(compose(tmp_path, "kernel_spec" if method.endswith("_spec") else "kernel_decode",
                          [f"sweep.models=[{model}]", "sweep.act_dtype=[float16]"]))
    p = next(p for p in plan.points if p.method == method)
    m = REGISTRY[method]
    if m.unavailable(p.family, "cpu", "torch"):
        pytest.skip(f"{method} has not landed for {p.family}")
    wl = Workload(plan.models[p.model_key], p, "cpu", torch.Generator().manual_seed(0))
    cache = m.allocate(p, wl, 3, "cpu")
    fp = traffic.cache_footprint(method, wl.geometry, L=p.buffer_len, B_hist=p.history_len, T=p.spec_T,
                                 state_bytes=4, act_bytes=2)
    assert memory.footprint_per_sequence(m.footprint(cache), 3) == fp.total


def test_nvml_is_absent_on_a_cpu_box_without_raising():
    assert memory.nvml_used_bytes() is None or torch.cuda.is_available()
    info = env.nvml_info()
    assert info["nvml"].startswith("absent") or torch.cuda.is_available()
    assert memory.peak_bytes("cpu") != memory.peak_bytes("cpu")                # NaN on CPU


def test_hardware_profiles_resolve_and_refuse_a_mismatch():
    assert env.resolve_hardware({"name": "auto"}, "cpu", CONF_DIR)["name"] == "cpu"
    with pytest.raises(ValueError, match="hardware=h100"):
        env.resolve_hardware({"name": "h100"}, "cpu", CONF_DIR)
    profiles = env._profiles(CONF_DIR)
    assert env._matches(profiles["h100"], "NVIDIA H100 80GB HBM3")
    assert not env._matches(profiles["h100"], "NVIDIA H100 PCIe")            # 2.0 TB/s part: not this datasheet
    assert env._matches(profiles["h200"], "NVIDIA H200") and env._matches(profiles["b200"], "NVIDIA B200")


def test_store_refuses_malformed_rows_and_foreign_directories(tmp_path):
    store = RunStore.create(tmp_path, "cpu", "r1")
    with pytest.raises(ValueError, match="lacks columns"):
        store.append({"status": "ok"})
    row = {c: None for c in COLUMNS}
    with pytest.raises(ValueError, match="status"):
        store.append(dict(row, status="fine"))
    store.append(dict(row, status="ok", config_hash="abc", median_us=float("nan")))
    assert store.done_hashes() == {"abc"} and store.read_rows()[0]["median_us"] == ""
    assert RunStore.create(tmp_path, "cpu", "r1").run_id == "r1-2"            # automatic ids never collide
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "rows.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="different columns"):
        RunStore.resume(tmp_path / "other")


def test_run_id_is_utc_timestamp_and_short_sha():
    run_id = env.new_run_id()
    stamp, sha = run_id.split("-", 1)
    assert len(stamp) == 16 and stamp.endswith("Z") and (len(sha) == env.SHORT_SHA_LEN == 7 or sha == "nogit")
