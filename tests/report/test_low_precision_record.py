"""Low-precision state in the footprint, the concurrency table and the published record (issue 36 item 4): the
whole-model footprint counts an 8-bit checkpoint and its per-(slot, head) fp32 scales, the concurrency table has a
row per state format, vLLM PR #52962's capacity ratios get the footprint model's figure at the stand-in model,
low-precision cells are never compared with a run row of another format, and "Where ReplaySSM loses" says what an
8-bit checkpoint buys."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import yaml

from experiments.harness.points import CONF_DIR, load_model_config
from experiments.hybrid import footprint as fpm
from experiments.hybrid.spec import hybrid_spec
from experiments.report import record, record_cells, record_loses, record_model
from replayssm import traffic

OPTIONS = {"B": "16", "T": "4", "max_model_len": "2048", "gpu_memory_utilization": "0.9",
           "max_num_batched_tokens": "8192", "activation_reserve_gb": "", "tp": "", "weights": "checkpoint"}


def _hw(name: str) -> dict:
    return yaml.safe_load((CONF_DIR / "hardware" / f"{name}.yaml").read_text())


@pytest.fixture(scope="module")
def cells_52962() -> pd.DataFrame:
    cells = record.read_cells(None)
    return cells[cells["source"] == "vLLM PR #52962"]


def test_the_whole_model_footprint_counts_the_8bit_state_and_its_scales():
    spec = hybrid_spec(load_model_config("nemotron3_nano_30b_a3b"))
    g = spec.geometry
    conv = (spec.conv_kernel - 1) * fpm.conv_dim(spec) * 2
    for state, nbytes in ((torch.int8, 1), (torch.float8_e4m3fn, 1), (torch.bfloat16, 2)):
        fp = fpm.footprint(spec, "replayssm", act_dtype=torch.bfloat16, state_dtype=state, max_model_len=2048,
                           spec_T=4)
        layer = traffic.cache_footprint("replay_spec", g, B_hist=spec.history_len, T=4, state_bytes=nbytes)
        assert layer.scales == (g.nheads * 4 if nbytes == 1 else 0)
        assert fp.ssm_per_seq == spec.ssm_layers * (layer.total + conv)
    native8 = traffic.cache_footprint("baseline_spec", g, T=4, state_bytes=1)
    assert native8.states == 4 * g.nheads * g.headdim * g.dstate and native8.scales == 4 * g.nheads * 4


def test_the_concurrency_table_has_a_row_per_state_format():
    every = {**OPTIONS, "states": ",".join(fpm.STATE_DTYPES)}
    rows = fpm.concurrency_table(["nemotron3_super_120b"], _hw("b300"), every)
    assert {(r["state"], r["mode"]) for r in rows} == {(s, m) for s in fpm.STATE_DTYPES
                                                       for m in ("native", "replayssm")}
    by = {(r["state"], r["mode"]): r for r in rows}
    for mode in ("native", "replayssm"):
        assert by["float32", mode]["vllm/fp32"] == 1.0 and by["float32", mode]["published"] is not None
        assert by["int8", mode]["published"] is None                        # PR #47576 is at fp32 state only
        assert by["int8", mode]["ssm_per_seq_MB"] == by["float8_e4m3fn", mode]["ssm_per_seq_MB"]
        assert by["int8", mode]["ssm_per_seq_MB"] < by["bfloat16", mode]["ssm_per_seq_MB"] \
            < by["float32", mode]["ssm_per_seq_MB"]
        assert by["int8", mode]["vllm/fp32"] > by["bfloat16", mode]["vllm/fp32"] > 1.0
    # the default (no `states`) is the fp32 table as before
    plain = fpm.concurrency_table(["nemotron3_super_120b"], _hw("b300"), OPTIONS)
    assert [r["state"] for r in plain] == ["float32", "float32"]
    assert [r["vllm"] for r in plain] == [by["float32", "native"]["vllm"], by["float32", "replayssm"]["vllm"]]
    with pytest.raises(ValueError, match="states"):
        fpm.concurrency_table(["nemotron3_super_120b"], _hw("b300"), {**OPTIONS, "states": "int4"})


def test_52962_capacity_ratio_beside_the_footprint_model(cells_52962):
    df = record.published_vs_run(None, cells_52962)
    cap = df[df["metric"] == "capacity_ratio"]
    assert len(cap) == 3
    rows = fpm.concurrency_table(["nemotron3_nano_30b_a3b"], _hw("h100"), {**OPTIONS, "states": "float32,int8"})
    by = {(r["state"], r["mode"]): r["vllm"] for r in rows}
    want = by["int8", "replayssm"] / by["float32", "replayssm"]
    for r in cap.to_dict("records"):
        assert r["regime"] == "capacity" and "stand-in nemotron3_nano_30b_a3b" in r["model_note"]
        assert "30B-A3B" in r["model_note"] and "#52506" in r["model_note"]
        expected = 1.0 if r["state_dtype"] == "fp32" else want
        assert r["value_model"] == pytest.approx(expected)
        assert r["measured_note"] == "no run"
    eight = cap[cap["state_dtype"] != "fp32"]
    assert (eight["value_published"] == 2.109).all()
    assert list(eight["model_over_published"]) == pytest.approx([want / 2.109] * 2)
    tokens = df[df["metric"] == "admitted_cache_tokens"]
    assert tokens["value_model"].isna().all() and tokens["model_note"].str.contains("capacity_ratio").all()


def test_low_precision_cells_never_meet_a_run_row_of_another_format():
    ratios = pd.DataFrame([{"metric": "ar_speedup", "experiment": "kernel_decode", "model": "qwen35_4b",
                            "state_dtype": "float32", "value": 1.5, "batch": 1, "buffer_len": 4}])
    cell = {"level": "kernel", "mode": "ar", "metric": "speedup", "model": "qwen35_4b", "state_dtype": "fp8_e4m3",
            "batch": 1, "buffer_len": 4}
    value, note = record_cells.nearest_measured(cell, ratios)
    assert value is None and note.startswith("no run") and "float8_e4m3fn" in note
    assert record_cells.nearest_measured({**cell, "state_dtype": "fp32"}, ratios)[0] == 1.5
    value, note = record_cells.nearest_measured({**cell, "state_dtype": "nvfp4"}, ratios)
    assert value is None and note.startswith("no run")


def test_third_party_fp8_and_48018_fp16_cells_are_modelled():
    cells = record.read_cells(None)
    fp8 = cells[(cells["state_dtype"] == "fp8_e4m3") & (cells["level"] == "kernel")
                & (cells["metric"] == "speedup")].head(3)
    df = record.published_vs_run(None, fp8)
    assert len(df) and df["value_model"].notna().all() and (df["model_note"] == record_model.EIGHT_BIT).all()
    fp16 = cells[(cells["source"] == "vLLM PR #48018") & (cells["state_dtype"] == "fp16")].head(4)
    assert record.published_vs_run(None, fp16)["value_model"].notna().all()


def test_where_replayssm_loses_has_the_low_precision_part(cells_52962):
    df = record.published_vs_run(None, cells_52962)
    lines = record_loses.low_precision(df)
    text = "\n".join(lines)
    assert lines[0] == "### Low-precision state"
    assert "one fp32 scale per (slot, head)" in text and "experiments/accuracy.py" in text
    assert "Nemotron-3.5 Lightning h100 int8" in text and "2.109" in text
    assert "### Low-precision state" in record_loses.section(df, None, 3e-6)
