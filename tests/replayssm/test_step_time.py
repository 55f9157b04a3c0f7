"""replayssm/step_time.py: the per-step time model's terms on hand-computed cases, its regimes, the batch-1 loss
and the bandwidth-bound ratio at large batch, and the hooks that read a GPU run's launch_floor.csv."""

from __future__ import annotations

import pytest

from replayssm import step_time as st
from replayssm import traffic
from replayssm.geometry import GDNGeometry, Mamba2Geometry

SMALL = Mamba2Geometry(nheads=2, headdim=4, dstate=8, ngroups=1)
NANO = Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8)        # conf/model/nemotron3_nano_4b.yaml
QWEN = GDNGeometry(H=16, HV=64, K=128, V=128)                              # conf/model/qwen35_122b_a10b.yaml


def test_every_parameter_names_its_source():
    for hw in st.HARDWARE.values():
        assert hw.hbm_Bps > 0 and hw.simt_fp32_flops > 0 and hw.tensor_flops > 0 and hw.hbm_bytes > 0
        assert "nvidia" in hw.source.lower() or "whitepaper" in hw.source.lower(), hw.name
    assert set(st.HARDWARE) == {"h100", "h200", "b200", "b300", "rtx4090"}
    assert st.HARDWARE["h100"].hbm_Bps == 3.35e12 and st.HARDWARE["h100"].simt_fp32_flops == 67e12
    assert "cuda.juliagpu.org" in st.LAUNCH_FLOOR_SOURCE and st.LAUNCH_FLOOR_S == 2e-6


def test_baseline_terms_by_hand():
    # state [2, 4, 8] fp32 = 256 B read + 256 B written; x [2, 4] bf16 16 B, B and C [1, 8] bf16 32 B, dt [2] fp32
    # 8 B; y [2, 4] bf16 16 B: 584 B per sequence. FLOPs 6dn per head: 2 * 6 * 4 * 8 = 384.
    t = st.step_time(SMALL, "baseline_ar", "h100", 3)
    assert t.bytes == 3 * 584 and t.flops == 3 * 384 and t.launches == 1
    assert t.bytes_s == pytest.approx(3 * 584 / 3.35e12)
    assert t.flops_s == pytest.approx(3 * 384 / 67e12)
    assert t.launch_s == pytest.approx(2e-6)
    assert t.total == pytest.approx(max(t.bytes_s, t.flops_s) + 2e-6)
    assert t.regime == "latency-bound"                       # 0.5 ns of bytes against a 2 us launch


def test_replay_terms_are_the_cycle_mean_and_its_launches():
    L = 4
    cyc = traffic.mamba2_replay_ar_cycle(SMALL, L, "output_only")
    t = st.step_time(SMALL, "replay_ar", "b300", 5, L=L, route="output_only")
    assert t.bytes == pytest.approx(5 * cyc.total) and t.flops == pytest.approx(5 * cyc.flops)
    assert t.launches == 4                                   # B.C precompute + readout + fold + cursor advance
    assert st.step_time(SMALL, "replay_ar", "b300", 5, L=L, route="state_and_output").launches == 2
    assert st.step_time(SMALL, "replay_ar", "b300", 5, L=L, shared_cursor=True).launches == 3
    assert st.launches("gdn", "replay_ar") == 2 and st.launches("gdn", "replay_ar", shared_cursor=True) == 1
    assert st.launches("gdn", "replay_ar", "output_only_fold") == 4 == st.launches("kda", "replay_ar",
                                                                                   "output_only_fold")
    assert st.launches("mamba2", "replay_spec", "verify_fold") == 4 and st.launches("mamba2", "replay_spec") == 3
    assert st.launches("gdn", "baseline_ar") == 1
    assert st.step_time(SMALL, "replay_ar", "b300", 5, L=L, n_launches=7).launch_s == pytest.approx(7 * 2e-6)


def test_regimes():
    slow_simt = st.Hardware("slow", 3.35e12, 1e9, 1e12, 80e9, "test double")
    big = 1 << 14
    # the roofline's own regimes (issue=False); with the issue table, Nano's AR baseline on an H100 is issue-bound
    assert st.step_time(NANO, "baseline_ar", "h100", big, issue=False).regime == "bandwidth-bound"
    assert st.step_time(NANO, "baseline_ar", "h100", big).regime == "issue-bound"
    assert st.step_time(NANO, "baseline_ar", slow_simt, big).regime == "compute-bound"
    assert st.step_time(NANO, "baseline_ar", "h100", 1, launch_floor_s=1e-3).regime == "latency-bound"
    assert st.HARDWARE["h100"].ridge == pytest.approx(67e12 / 3.35e12)


def test_mamba2_ar_kernel_loses_at_batch_1_and_reaches_the_byte_ratio_at_large_batch():
    one = st.speedup(NANO, "replay_ar", "baseline_ar", "h100", 1)
    assert one < 1.1 and one < 1.0                           # the published 0.73x (vLLM PR #48018, H100 fp32)
    base = st.layer_traffic(NANO, "baseline_ar").total
    ours = st.layer_traffic(NANO, "replay_ar", L=16).total
    big = st.speedup(NANO, "replay_ar", "baseline_ar", "h100", 1 << 16, issue=False)
    assert big == pytest.approx(base / ours, rel=0.01)       # bandwidth-bound: the byte ratio (~1.8x)
    assert 1.75 < base / ours < 1.85
    # the speedup grows with the batch
    vals = [st.speedup(NANO, "replay_ar", "baseline_ar", "h100", b) for b in (1, 8, 32, 128, 512)]
    assert vals == sorted(vals)


def test_break_even_batch():
    b = st.break_even_batch(NANO, "replay_ar", "baseline_ar", "h100")
    assert b is not None and b > 1
    assert st.speedup(NANO, "replay_ar", "baseline_ar", "h100", b) >= 1.0
    assert st.speedup(NANO, "replay_ar", "baseline_ar", "h100", b - 1) < 1.0
    # a slower launch moves it up; an absurd floor never breaks even within the range
    assert st.break_even_batch(NANO, "replay_ar", "baseline_ar", "h100", launch_floor_s=4e-6) > b
    assert st.break_even_batch(NANO, "replay_ar", "baseline_ar", "h100", max_batch=64, launch_floor_s=1.0) is None


def test_spec_methods_and_gdn():
    t_native = st.step_time(QWEN, "baseline_spec", "b300", 512, T=4)
    t_ours = st.step_time(QWEN, "replay_spec", "b300", 512, T=4, B_hist=16, accepted=2)
    assert t_native.total > t_ours.total                    # T state snapshots against one checkpoint
    assert st.step_time(QWEN, "commit_replay_spec", "b300", 8, T=4, accepted=2).launches == 2
    with pytest.raises(ValueError):
        st.step_time(QWEN, "nonsense", "b300", 8)
    with pytest.raises(ValueError):
        st.step_time(QWEN, "baseline_ar", "mi300", 8)
    with pytest.raises(ValueError):
        st.step_time(QWEN, "baseline_ar", "h100", 0)


def test_a_gpu_runs_launch_floor_csv(tmp_path):
    path = tmp_path / "launch_floor.csv"
    path.write_text("name,family,model,method,route,batch,mode,ms_median,ms_mean,ms_min,samples,launches,"
                    "compile_s,status\n"
                    "minimal,,,,,1,graph,0.0031,0.0032,0.003,100,1,0.1,ok\n"
                    "minimal,,,,,1,host,0.009,0.01,0.008,100,1,0.1,ok\n"
                    "mamba2/replay_ar/output_only,mamba2,m,replay_ar,output_only,1,graph,0.01,0.01,0.01,9,3,1,ok\n")
    assert st.launch_floor_from_csv(path) == pytest.approx(3.1e-6)
    assert st.launch_floor_from_csv(path, mode="host") == pytest.approx(9e-6)
    assert st.launch_floor_from_csv(tmp_path / "absent.csv") is None
    assert st.launches_from_csv(path) == {("mamba2", "replay_ar", "output_only"): 3}


def test_an_8bit_state_with_its_scales():
    # at 1 byte the baseline moves 2 x state[HV, V, K] of one byte and its HV fp32 scales (read and written) less
    # than at 2 bytes, with the same inputs and outputs
    one, two = st.layer_traffic(QWEN, "baseline_ar", state_bytes=1), traffic.gdn_baseline_ar(QWEN, 2)
    assert one.total == two.total - 2 * traffic.gdn_state_bytes(QWEN, 1) + 2 * traffic.gdn_scale_bytes(QWEN, 1)
    assert one.flops == two.flops
    L = 8
    ours = st.layer_traffic(QWEN, "replay_ar", L=L, state_bytes=1)
    # the checkpoint (and its scales) is read every step and written once per cycle
    assert ours.total == pytest.approx(traffic.gdn_replay_ar_cycle(QWEN, L, 2).total
                                       - (1 + 1 / L) * (traffic.gdn_state_bytes(QWEN, 1)
                                                        - traffic.gdn_scale_bytes(QWEN, 1)))


# ------------------------------------------------------------------------------ the issue floor

def _fake_table(monkeypatch, warps_sm: int, path=(1000, 2000)):
    from replayssm import issue_table

    key = (90, st.geometry_key(QWEN), *st.issue_key("replay_ar", "output_only", 16, 4, 16, 4))
    monkeypatch.setattr(issue_table, "STEPS", {key: (("step", 4, warps_sm, 256, 3, *path),)})


def test_issue_term_by_hand(monkeypatch):
    _fake_table(monkeypatch, warps_sm=12)
    h200 = st.HARDWARE["h200"]
    # 12 resident warps per SM = 3 per scheduler, one issue every 6 cycles each: 0.5 per cycle per scheduler
    assert h200.issue_per_cycle(12) == pytest.approx(0.5) and h200.issue_per_cycle(48) == 1.0
    assert h200.issue_rate(12) == pytest.approx(0.5 * 4 * 132 * 1.5e9)
    b = 64
    # 4 warps x (256 b + 3) programs x the cycle mean (15 normal steps of 1000 instructions, one flush of 2000)
    inst = 4 * (256 * b + 3) * (15 / 16 * 1000 + 1 / 16 * 2000)
    t = st.step_time(QWEN, "replay_ar", "h200", b, L=16)
    assert t.instructions == pytest.approx(inst)
    assert t.issue_s == pytest.approx(inst / (0.5 * 4 * 132 * 1.5e9))
    assert t.issue_s > t.bytes_s and t.regime == "issue-bound"
    assert t.total == pytest.approx(t.issue_s + t.launch_s)
    off = st.step_time(QWEN, "replay_ar", "h200", b, L=16, issue=False)
    assert (off.issue_s, off.instructions, off.regime) == (0.0, 0.0, "bandwidth-bound")
    assert off.total == pytest.approx(off.bytes_s + off.launch_s)
    # no entry: another L, another GPU arch (b300: sm_100), a GPU without issue terms
    assert st.step_time(QWEN, "replay_ar", "h200", b, L=8).issue_s == 0.0
    assert st.step_time(QWEN, "replay_ar", "b300", b, L=16).issue_s == 0.0
    assert st.step_time(QWEN, "replay_ar", "rtx4090", b, L=16).issue_s == 0.0


def test_issue_rate_follows_occupancy(monkeypatch):
    _fake_table(monkeypatch, warps_sm=12)
    slow = st.step_time(QWEN, "replay_ar", "h200", 256, L=16).issue_s
    _fake_table(monkeypatch, warps_sm=24)           # 6 warps per scheduler: one issue per cycle
    assert st.step_time(QWEN, "replay_ar", "h200", 256, L=16).issue_s == pytest.approx(slow / 2)


def test_longest_path_share():
    assert st.longest_path_share("replay_ar", L=8) == 1 / 8
    assert st.longest_path_share("replay_spec", T=4, accepted=2, B_hist=16) == 2 / 16
    assert st.longest_path_share("replay_spec", T=4, accepted=None, B_hist=2) == 1.0
    assert st.longest_path_share("baseline_ar") == st.longest_path_share("baseline_spec") == 0.0
    assert st.issue_key("baseline_ar", "state_and_output", 8, 6, 32) == ("baseline_ar", "", 0, 0, 0, 4)
    assert st.issue_key("replay_spec", "x", 8, 6, 32, 2) == ("replay_spec", "", 0, 6, 32, 2)


def test_the_committed_table_predicts_the_h200_gdn_finding():
    """replayssm/issue_table.py (Triton 3.6.0, the H200's): GDN's replay step at Qwen3.5-122B b256 is issue-bound on
    the H200 and its AR baseline bandwidth-bound, as ncu found (results/h200/route-check-20261204T130226Z-feec103);
    the replay step is then no faster than the baseline, as measured (685 against 571 us)."""
    from replayssm import issue_table

    assert issue_table.TRITON == "3.6.0" and issue_table.COMMIT and "kernel_report.py" in issue_table.COMMAND
    ours = st.step_time(QWEN, "replay_ar", "h200", 256, L=16)
    base = st.step_time(QWEN, "baseline_ar", "h200", 256)
    assert ours.regime == "issue-bound" and base.regime == "bandwidth-bound"
    assert ours.total > base.total
    assert 0.8 < ours.total / 685e-6 < 1.2            # the measured step (CUDA graph, cycle mean)
    assert st.speedup(QWEN, "replay_ar", "baseline_ar", "h200", 256, L=16, issue=False) > 1.7   # bytes alone


def test_kda_layer_traffic():
    from replayssm.geometry import KDAGeometry

    kimi = KDAGeometry(H=32, HV=32, K=128, V=128)
    assert st.layer_traffic(kimi, "replay_ar", L=16).total == pytest.approx(traffic.kda_replay_ar_cycle(kimi, 16).total)
    assert st.launches("kda", "replay_ar") == st.launches("gdn", "replay_ar")
