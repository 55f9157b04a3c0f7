"""experiments.launch_floor on a CPU: its entries cover every registered method, the launch counter counts
interpreted launches, and a run writes the CSV / JSON a per-step time model reads (host mode only: graph and
eager need CUDA). The GPU run is scripts/gpu/gpu_check.sh's `launch` stage."""

from __future__ import annotations

import csv
import json

import pytest

from experiments import launch_floor as lf
from experiments.harness.methods import REGISTRY
from replayssm.checks import interpreter_active

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="CPU tensors need TRITON_INTERPRET=1")


def test_entries_cover_the_minimal_kernel_and_every_method_family_and_route():
    entries = lf.entries()
    assert entries[0].name == "minimal" and entries[0].method is None
    expected = {(f, m.name, None if r == "fused" else r) for m in REGISTRY.values() for f in lf.MODELS
                if f in m.families for r in m.routes(f)}        # a ring's default form keeps route None
    assert {(e.family, e.method, e.route) for e in entries[1:]} == expected
    assert len({e.name for e in entries}) == len(entries)
    assert {e.model for e in entries[1:]} == set(lf.MODELS.values())


def test_the_launch_counter_counts_each_interpreted_launch():
    step = lf._minimal("cpu")
    with lf.launch_counter() as count:
        step()
        step()
    assert count[0] == 2
    step()
    assert count[0] == 2                                   # the patch is undone on exit


def test_a_cpu_run_writes_the_csv_and_json_a_time_model_reads(tmp_path):
    rc = lf.main(["--device", "cpu", "--jobs", "1", "--out", str(tmp_path), "--only", "minimal",
                  "--only", "mamba2/replay_spec"])
    assert rc == 0
    with open(tmp_path / "launch_floor.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == lf.COLUMNS
    assert [(r["name"], r["mode"], r["status"], r["batch"]) for r in rows] == [
        ("minimal", "host", "ok", "1"), ("mamba2/replay_spec", "host", "ok", "1")]
    assert rows[0]["launches"] == "1" and int(rows[1]["launches"]) >= 2          # verify + commit kernels
    assert all(0 < float(r["ms_min"]) <= float(r["ms_median"]) for r in rows)
    meta = json.loads((tmp_path / "launch_floor.json").read_text())
    assert meta["device"] == "cpu" and meta["launcher_builds"] == 0 and len(meta["rows"]) == 2


def test_an_unavailable_method_is_one_skipped_row(monkeypatch):
    monkeypatch.setattr(REGISTRY["baseline_ar"], "unavailable", lambda *a: "not here")
    rows = lf.measure(lf.Entry("gdn/baseline_ar", "gdn", "tiny_gdn", "baseline_ar"), "cpu", rep_ms=1)
    assert rows == [{"name": "gdn/baseline_ar", "family": "gdn", "model": "tiny_gdn", "method": "baseline_ar",
                     "route": "", "batch": 1, "mode": "-", "status": "skipped: not here"}]
