"""What a new user meets in the first hour (issue 17): a bad timing value, an override on a sweep with an
`on_cpu` block, a sweep of another experiment, a run in which every point failed, a CPU allocation failure,
the console table's window column and the geometry of a row. No timing runs here: plain functions only."""

from __future__ import annotations

import pytest
from harness_doubles import compose
from omegaconf import OmegaConf

from experiments.harness import entry, store
from experiments.harness.points import expand, validate_timing
from experiments.harness.sweeps import check_sweep, sweep_experiments, sweeps_of
from experiments.kernel import run as runner


@pytest.mark.parametrize("key, value, allowed", [
    ("cpu_repeats", "abc", "an int >= 1"), ("cpu_repeats", 0, "an int >= 1"), ("rep_ms", 0, "a number > 0"),
    ("hbm_budget_frac", 1.5, "a number > 0 and <= 1"), ("cpu_warmup", -1, "an int >= 0"),
    ("max_layers", True, "an int >= 1"),
])
def test_every_timing_key_is_checked_before_any_work(tmp_path, key, value, allowed):
    cfg = OmegaConf.to_container(compose(tmp_path, "kernel_decode"), resolve=True)
    cfg["timing"][key] = value
    with pytest.raises(ValueError, match=rf"^timing\.{key}: expected {allowed}.*got {value!r}"):
        expand(cfg)
    with pytest.raises(ValueError, match=r"timing.cpu_clock: unknown value 'gpu'"):
        validate_timing({"cpu_clock": "gpu"})
    with pytest.raises(ValueError, match=r"timing.repeats: unknown timing key"):
        validate_timing({"repeats": 3})


def test_a_typed_sweep_key_wins_over_on_cpu():
    cfg = OmegaConf.create({"sweep": {"batch": [1, 64], "backend": "triton",
                                      "on_cpu": {"batch": [1, 8], "backend": "torch", "models": ["tiny_gdn"]}}})
    taken = entry.keep_user_overrides(cfg, ["sweep.batch=[0]", "+seed=3", "model=tiny_gdn"])
    assert taken == ["batch"] and list(cfg.sweep.on_cpu) == ["backend", "models"]
    assert entry.keep_user_overrides(OmegaConf.create({"sweep": {"batch": [2]}}), ["sweep.batch=[3]"]) == []


def test_a_sweep_of_another_experiment_is_refused_by_name():
    assert sweep_experiments("e2e_cpu") == ("e2e_decode", "serving")
    assert sweep_experiments("smoke") == ("kernel_decode", "kernel_spec")
    assert sweep_experiments("accuracy_cpu") == ("accuracy",)
    assert "cpu" in sweeps_of("kernel_decode") and "e2e_cpu" not in sweeps_of("kernel_decode")
    with pytest.raises(ValueError, match=r"^sweep=e2e_cpu: a sweep of e2e_decode, serving .*not of kernel_decode"):
        check_sweep("kernel_decode", "e2e_cpu")
    with pytest.raises(ValueError, match=r"^sweep=cpu: a sweep of kernel_decode, kernel_spec.*not of accuracy"):
        check_sweep("accuracy", "cpu")
    check_sweep("kernel_spec", "smoke")
    check_sweep("serving", "e2e_cpu")


def test_a_run_where_every_point_failed_exits_non_zero(tmp_path):
    failed = [{"status": "error", "message": "ValueError: x"}, {"status": "oom", "message": "MemoryError"}]
    with pytest.raises(SystemExit, match=r"every one of the 2 points failed \(error=1, oom=1\); first: ValueError"):
        entry.exit_if_nothing_measured(failed, "kernel_decode", tmp_path)
    entry.exit_if_nothing_measured(failed + [{"status": "ok"}], "kernel_decode", tmp_path)
    entry.exit_if_nothing_measured([{"status": "skipped"}], "kernel_decode", tmp_path)
    entry.exit_if_nothing_measured([], "kernel_decode", tmp_path)


def test_a_cpu_allocation_failure_is_oom_not_error():
    import torch

    try:
        torch.empty(1 << 62, dtype=torch.uint8)
    except RuntimeError as exc:
        status, message = store.failure(exc)
        assert status == "oom" and "allocate" in message
    else:  # pragma: no cover - a machine with 4 EiB of memory
        pytest.skip("the allocation succeeded")
    assert store.failure(RuntimeError("shape mismatch"))[0] == "error"


def test_console_table_shows_T_and_B_and_rows_carry_their_geometry(tmp_path):
    plan = expand(compose(tmp_path, "kernel_spec"))
    ring = next(p for p in plan.points if p.method == "replay_spec")
    row = dict(runner.blank_row(ring, "r"), status="ok")
    assert f"T={ring.spec_T} B={ring.history_len}" in runner.summarize([row])
    geometry = row["geometry"]
    assert geometry.startswith("headdim=") or "=" in geometry
    spec = plan.models[ring.model_key].geometry
    assert geometry == runner.geometry_label(spec)
    ar = next(p for p in expand(compose(tmp_path, "kernel_decode")).points if p.method == "replay_ar")
    assert f"L={ar.buffer_len}" in runner.summarize([dict(runner.blank_row(ar, "r"), status="ok")])
