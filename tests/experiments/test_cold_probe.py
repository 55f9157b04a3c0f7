"""Cold CPU points from a measured bandwidth plateau (experiments/harness/bandwidth.py): the knee rule, the
per-machine cache, and a run on a machine whose sysfs LLC (480 MiB) is far larger than the cache it can use."""

from __future__ import annotations

import json

import pytest
from harness_doubles import compose

from experiments.harness import bandwidth
from experiments.harness import env as env_mod
from experiments.kernel.run import run_experiment

MIB = 1 << 20


def rows_from(gbps_by_mib: dict[int, float]) -> list[dict]:
    return [{"bytes": mib * MIB, "read_GBps": g * 1.1, "copy_GBps": g} for mib, g in sorted(gbps_by_mib.items())]


# The Xeon VM: 26 GiB/s up to 16 MiB, 13 GiB/s from 64 MiB on (sysfs: 480 MiB L3).
XEON = rows_from({1: 28, 2: 28, 4: 28, 8: 28, 16: 27, 32: 20, 64: 14, 128: 13.9, 256: 14.1, 512: 14})


def test_knee_is_the_first_size_on_the_plateau():
    k = bandwidth.knee(XEON)
    assert k["knee_bytes"] == 64 * MIB and k["cold_bytes"] == 128 * MIB and k["reached"]
    assert k["plateau_copy_GBps"] == pytest.approx(14.0)
    # still falling at the largest size: the plateau is not known to be reached
    falling = rows_from({1: 40, 2: 38, 4: 36, 8: 34, 16: 30, 32: 26, 64: 22, 128: 18})
    assert bandwidth.knee(falling)["reached"] is False
    with pytest.raises(ValueError, match="at least three"):
        bandwidth.knee(XEON[:2])


def test_probe_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYSSM_BW_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(bandwidth, "measure", lambda max_bytes: calls.append(max_bytes) or XEON)
    first = bandwidth.cold_point(1, llc_bytes=480 * MIB)
    assert first["source"] == "measured" and first["knee_bytes"] == 64 * MIB and len(calls) == 1
    again = bandwidth.cold_point(1, llc_bytes=480 * MIB)
    assert again["source"].startswith(str(tmp_path)) and len(calls) == 1 and again["rows"] == first["rows"]
    bandwidth.cold_point(2, llc_bytes=480 * MIB)                 # another thread count: its own entry
    bandwidth.cold_point(1, mode="fresh", llc_bytes=480 * MIB)   # fresh: measured again
    assert len(calls) == 3
    assert bandwidth.cold_point(1, mode="off") is None
    with pytest.raises(ValueError, match="cpu_cold_probe"):
        bandwidth.cold_point(1, mode="always")


def test_run_sizes_the_stack_past_the_measured_knee(tmp_path, monkeypatch):
    """sysfs says 480 MiB (4 x 480 MiB is out of reach); the probe's knee says 64 KiB on this fake machine, so
    tiny_mamba2 at batch 2 (8 KiB of state per layer) needs 16 layers to reach cold_bytes = 128 KiB."""
    monkeypatch.setenv("REPLAYSSM_BW_CACHE", str(tmp_path / "bw"))
    monkeypatch.setattr(env_mod, "cpu_llc", lambda *a: {"llc_bytes": 480 * MIB, "llc_level": 3, "llc_source": "t"})
    fake = [{"bytes": b << 10, "read_GBps": g, "copy_GBps": g} for b, g in ((16, 30), (32, 25), (64, 10), (128, 10),
                                                                           (256, 10))]
    monkeypatch.setattr(bandwidth, "measure", lambda max_bytes: fake)
    cfg = compose(tmp_path, overrides=["sweep.models=[tiny_mamba2]", "sweep.routes=[output_only]", "sweep.l2=cold",
                                       "method.names=[baseline_ar]", "timing.cpu_cold_probe=cached"])
    result = run_experiment(cfg)
    env = json.loads((result.run_dir / "env.json").read_text())
    assert env["cpu_llc_bytes"] == 480 * MIB                     # the sysfs value, recorded beside the probe
    assert env["cpu_cold_probe"]["knee_bytes"] == 64 << 10 and env["copy_GBps"] == 10
    assert env["hardware"]["l2_bytes"] == (128 << 10) // 4 and env["hardware"]["l2_source"].startswith("measured")
    (row,) = result.rows
    assert row["status"] == "ok" and row["cache_resident"] is False and "layers=16" in row["message"]
