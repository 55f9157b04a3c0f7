"""The published record beside a run (experiments/report/record*.py): published_vs_run.csv on a copy of the
committed CPU reference run with the fixture cells (tests/report/fixtures/published_cells.csv, cells taken
from vLLM PRs #48018, #48792, #47576, #49887 and the third-party FP8 study), REPORT.md's two new sections,
a GPU run's measured and own-hardware columns, and an honest report for a run with no rows."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments import published
from experiments.report import claims, record, record_cells, record_model
from experiments.report.runs import load_run

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "published_cells.csv"
REFERENCE = sorted(p for p in (ROOT / "results" / "cpu").glob("reproduce-*") if not p.name.endswith("-vllm"))[-1]
REGIMES = {"bandwidth-bound", "compute-bound", "latency-bound", "issue-bound", "other-layers-bound", "capacity",
           "not-modelled"}
KEEP = ("rows.csv", "env.json", "config.yaml", "e2e_rows.csv", "serving_rows.csv", "accuracy.csv", "summary.csv",
        "bench_cpu.json", "bench_cpu.txt", "hybrid_summary.csv", "counts.csv")


@pytest.fixture(scope="module")
def reference_copy(tmp_path_factory) -> Path:
    """The committed CPU reference run's row files, copied: a test never writes into results/."""
    dst = tmp_path_factory.mktemp("ref") / "cpu" / REFERENCE.name
    dst.mkdir(parents=True)
    for name in KEEP:
        if (REFERENCE / name).is_file():
            shutil.copy(REFERENCE / name, dst / name)
    for p in REFERENCE.glob("config.*.yaml"):
        shutil.copy(p, dst / p.name)
    for p in REFERENCE.glob("env.*.json"):
        shutil.copy(p, dst / p.name)
    return dst


@pytest.fixture(scope="module")
def reference_report(reference_copy) -> tuple[str, pd.DataFrame]:
    claims.main([str(reference_copy), "--cells", str(FIXTURE)])
    return (reference_copy / "REPORT.md").read_text(), pd.read_csv(reference_copy / record.OUT_NAME)


def test_read_cells_schema_and_absent_file(tmp_path):
    cells = record.read_cells(FIXTURE)
    assert tuple(cells.columns) == record_cells.CELL_COLUMNS
    assert len(cells) >= 90 and cells["source"].nunique() >= 5
    empty = record.read_cells(tmp_path / "absent.csv")
    assert empty.empty and tuple(empty.columns) == record_cells.CELL_COLUMNS


def test_published_vs_run_on_the_cpu_reference_run(reference_report):
    _, df = reference_report
    cells = record.read_cells(FIXTURE)
    assert list(df.columns) == list(record_cells.OUT_COLUMNS)
    assert len(df) == len(cells)
    assert (df["value_published"] == cells["value"]).all()
    # a CPU run measures no published cell: each says why
    assert df["value_measured"].isna().all()
    assert df["measured_note"].str.startswith("run hardware cpu is not").all()
    assert set(df["regime"].dropna()) <= REGIMES and df["regime"].notna().all()
    # the terms are seconds per step, and total is the largest work term (bytes, FLOPs, instruction issue) plus the
    # launches (+ other layers); the blog's Fig 7 / Fig 9 kernel cells have the issue floor, and it binds there
    k = df[(df["level"] == "kernel") & df["value_model"].notna() & df["bytes_s"].notna()]
    assert len(k)
    work = k[["bytes_s", "flops_s", "issue_s"]].fillna(0.0).max(axis=1)
    assert list(k["total_s"]) == pytest.approx(list(work + k["launch_s"]))
    fig9 = df[(df["source"] == "blog Fig 9")]
    assert len(fig9) == 3 and (fig9["issue_s"] > fig9["bytes_s"]).all() and (fig9["regime"] == "issue-bound").all()
    # where model and cell are more than 1.25x apart the row names the missing term, and only there
    r = df["model_over_published"]
    apart = (r > record_model.DISAGREE) | (r < 1 / record_model.DISAGREE)
    assert (df.loc[apart, "missing_term"].fillna("") != "").all()
    assert (df.loc[~apart & r.notna(), "missing_term"].fillna("") == "").all()
    # no GPU run: no own-hardware column
    assert df["value_model_run_hw"].isna().all()


def test_every_published_loss_is_modelled_below_1_1_or_carries_a_regime(reference_report):
    _, df = reference_report
    loss = df[(df["metric"] == "speedup") & (df["value_published"] < 1.0)]
    assert len(loss) >= 10
    for row in loss.to_dict("records"):
        assert (row["value_model"] < 1.1) or row["regime"] in ("not-modelled", "capacity"), row


def test_model_agrees_with_the_fixture_cells(reference_report):
    _, df = reference_report
    table = record.agreement_table(df)
    overall = table[table["source"] == "**all**"].iloc[0]
    assert overall["modelled"] >= 70
    assert overall["median abs(log(model/pub))"] < 0.1
    e2e = table[(table["source"] == "vLLM PR #48018") & (table["table"] == "End-to-end speedup")].iloc[0]
    assert e2e["median abs(log(model/pub))"] < 0.05


def test_report_has_both_sections_after_the_claims(reference_report):
    report, _ = reference_report
    assert report.startswith("# ReplaySSM Bench: published claims vs this run")
    claims_at = report.index("## Conditions, sources and the rows behind each value")
    record_at, loses_at = report.index("## Published record"), report.index("## Where ReplaySSM loses")
    assert claims_at < record_at < loses_at
    for part in ("### Small batch", "### Half-precision state", "### Memory", "### Recomputation", "### Numerics",
                 "### Capacity failures"):
        assert part in report[loses_at:], part
    assert "Modelled break-even batch per hardware and family" in report
    assert "Measured by this run" in report                      # the CPU run's own break-even
    assert "This run's CPU ridge:" in report                     # bench_cpu's measured roofline
    assert "| vLLM PR #48018" in report[record_at:loses_at]
    assert "cuda.juliagpu.org" in report[record_at:loses_at] and "NVIDIA H100 SXM datasheet" in report


def test_a_gpu_run_measures_its_own_hardwares_cells_and_models_at_its_hardware(tmp_path):
    env = {"device_type": "cuda", "gpu_name": "NVIDIA B300", "hardware": {"name": "b300"}, "torch": "2.11.0",
           "triton": "3.6.0", "git_sha": "feedbeef"}
    run_dir = syn.write_run(tmp_path / "results", syn.ar_rows(), hardware="b300", env=env)
    # scripts/gpu/gpu_check.sh leaves launch_floor.csv in its work directory, above results/<hw>/<run-id>
    (tmp_path / "launch_floor.csv").write_text("name,family,model,method,route,batch,mode,ms_median,ms_mean,ms_min,"
                                               "samples,launches,compile_s,status\n"
                                               "minimal,,,,,1,graph,0.003,0.003,0.003,100,1,0.1,ok\n")
    cells = record.read_cells(FIXTURE)
    df = record.published_vs_run(load_run(run_dir), cells)
    kernel = df[(df["level"] == "kernel") & (df["model"] == "nemotron3_nano_4b")]
    # 4 launches (B.C precompute, readout, fold, cursor advance: step_time.LAUNCHES) x the run's floor
    assert list(kernel["launch_s"]) == pytest.approx([4 * 3e-6] * len(kernel))
    mine = df[(df["hardware"] == "b300") & (df["level"] == "kernel") & (df["model"] == "nemotron3_super_120b")
              & (df["state_dtype"] == "fp32")]
    # the synthetic run's AR speedup at L=16 is 1.4x at every batch (synthetic_runs.AR_SPEEDUP)
    assert len(mine) == 4
    assert list(mine["value_measured"]) == pytest.approx([syn.AR_SPEEDUP[16]] * 4)
    fp16 = df[(df["hardware"] == "b300") & (df["state_dtype"] == "fp16") & (df["level"] == "kernel")]
    assert fp16["value_measured"].isna().all() and fp16["measured_note"].str.contains("float16").all()
    other = df[(df["hardware"] == "h100") & (df["level"] == "kernel")]
    assert other["value_measured"].isna().all() and other["measured_note"].str.contains("is not h100").all()
    assert other["value_model_run_hw"].notna().all()
    assert not math.isclose(other["value_model_run_hw"].iloc[0], other["value_model"].iloc[0])


def test_a_run_with_no_rows_still_gets_an_honest_report(tmp_path):
    empty = syn.write_run(tmp_path / "empty", syn.ar_rows())
    header = (empty / "rows.csv").read_text().splitlines()[0]
    (empty / "rows.csv").write_text(header + "\n")
    assert claims.main([str(empty), "--cells", str(FIXTURE)]) == 1
    report = (empty / "REPORT.md").read_text()
    assert "NOTHING WAS MEASURED" in report
    assert "## Published record" in report and "## Where ReplaySSM loses" in report
    df = pd.read_csv(empty / record.OUT_NAME)
    assert len(df) == len(record.read_cells(FIXTURE)) and df["value_measured"].isna().all()
    # and without any cells: the sections say so instead of inventing a table
    none = syn.write_run(tmp_path / "none", syn.ar_rows())
    assert claims.main([str(none), "--cells", str(tmp_path / "absent.csv")]) == 0
    report = (none / "REPORT.md").read_text()
    assert "No published cells were found" in report and "## Where ReplaySSM loses" in report


def test_figures_of_the_record(tmp_path, reference_copy):
    from experiments.report.figures import record as record_figures
    from experiments.report.figures import style as fs
    figs = fs.FigureSet(tmp_path / "plots", header="test")
    cells = record.read_cells(FIXTURE)
    paths = record_figures.figures(load_run(reference_copy), figs, cells)
    # every source table with a batch axis or concurrency caps: PR #48018 kernel + e2e, #48792 e2e, #47576 B=32 vs
    # B=16 and max concurrency, #49887 throughput vs batch
    assert len(paths) == 6
    for p in paths:
        assert p.is_file() and p.with_suffix(".pdf").is_file()
    index = figs.write_index().read_text()
    assert "per-step time model" in index and "vLLM PR #48018" in index
    assert record_figures.figures(None, fs.FigureSet(tmp_path / "none"), cells.iloc[0:0]) == []


def _cell(**kw) -> dict:
    return {c: kw.get(c) for c in record_cells.CELL_COLUMNS}


def test_the_model_at_cells_of_every_kind():
    from replayssm import step_time as st
    from replayssm.geometry import Mamba2Geometry
    # the byte model itself, across the five models (median; no hardware needed)
    br = record_model.model_cell(_cell(model="all five models", level="kernel", mode="ar", state_dtype="fp32",
                                       buffer_len=16, metric="byte_ratio"))
    assert 1.78 < br["value_model"] < 1.82
    # a family range: min <= max, each a member's own value at its published hardware
    rng = dict(model="Nemotron-3 family", hardware="h100|b300", level="kernel", mode="ar", state_dtype="fp32",
               batch=256, buffer_len=8, baseline="standard")
    lo = record_model.model_cell(_cell(**rng, metric="speedup_min"))["value_model"]
    hi = record_model.model_cell(_cell(**rng, metric="speedup_max"))["value_model"]
    nano = Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8)
    assert lo <= hi
    assert min(lo, hi) <= st.speedup(nano, "replay_ar", "baseline_ar", "h100", 256, L=8) <= max(lo, hi)
    # a spec step's cost over a standard decode step: all-accept flushes more often than all-reject
    fig9 = dict(model="qwen35_122b_a10b", hardware="b300", level="kernel", mode="spec", state_dtype="fp32",
                batch=128, buffer_len=16, spec_T=6, baseline="standard")
    lo = record_model.model_cell(_cell(**fig9, metric="replay_spec_step_cost_vs_ar_min"))
    hi = record_model.model_cell(_cell(**fig9, metric="replay_spec_step_cost_vs_ar_max"))
    native = record_model.model_cell(_cell(**fig9, metric="native_spec_step_cost_vs_ar"))
    assert lo["value_model"] <= hi["value_model"] < native["value_model"]
    assert native["value_model"] == pytest.approx(native["total_s"] / native["baseline_total_s"])
    # concurrency: the ratio is the two caps' ratio
    conc = dict(model="qwen35_122b_a10b", hardware="b300", level="concurrency", mode="spec", state_dtype="fp32",
                spec_T=4, history_len=16, unit="requests")
    ours = record_model.model_cell(_cell(**conc, metric="max_concurrency"))["value_model"]
    theirs = record_model.model_cell(_cell(**conc, baseline="native_spec", metric="max_concurrency"))["value_model"]
    ratio = record_model.model_cell(_cell(**{**conc, "unit": "x"}, baseline="native_spec",
                                          metric="concurrency_ratio"))["value_model"]
    assert ratio == pytest.approx(ours / theirs) and ratio > 2
    # the best buffer of blog Fig 7's sweep, and a break-even batch
    best = record_model.model_cell(_cell(model="qwen35_122b_a10b", hardware="b300", level="kernel", mode="ar",
                                         state_dtype="fp32", metric="best_buffer_len"))
    assert best["value_model"] in record_model.BUFFER_LENS
    be = record_model.model_cell(_cell(model="nemotron3_nano_4b", hardware="h100", level="kernel", mode="ar",
                                       state_dtype="fp32", buffer_len=16, metric="break_even_batch"))
    assert be["value_model"] == st.break_even_batch(nano, "replay_ar", "baseline_ar", "h100")
    # what the model does not cover says so
    for kw in (dict(metric="oom", model="qwen35_122b_a10b", hardware="b300"),
               dict(metric="acceptance_length", model="x"),
               dict(metric="speedup", model="qwen35_4b", hardware="rtx4090", level="kernel", mode="ar",
                    state_dtype="nvfp4", batch=8),
               dict(metric="speedup", model="qwen35_122b_a10b", hardware="b300", level="serving", mode="spec",
                    state_dtype="fp32", batch=8, spec_T=12, baseline="no_spec")):     # past every acceptance profile
        out = record_model.model_cell(_cell(**kw))
        assert out["value_model"] is None and out["regime"] in ("capacity", "not-modelled") and out["model_note"]


def test_spec_over_standard_decode_uses_the_published_acceptance_profile():
    # speculators PR #366's Qwen3-Next MTP head: MeanAccepted 2.01 drafts at 3 drafts (T = 4)
    assert record_model.mean_tokens_per_step(4) == pytest.approx(1 + 0.873 + 0.873 * 0.778 + 0.873 * 0.778 * 0.675)
    assert record_model.mean_tokens_per_step(1) == 1.0
    assert record_model.mean_tokens_per_step(6) == pytest.approx(1 + sum(record_model.ACCEPT_UNCONDITIONAL[:5]))
    assert record_model.mean_tokens_per_step(10) is None
    cell = _cell(model="qwen35_122b_a10b", hardware="b300", level="serving", mode="spec", state_dtype="fp32",
                 batch=32, spec_T=4, history_len=16, baseline="no_spec", metric="speedup")
    out = record_model.model_cell(cell)
    tokens = record_model.mean_tokens_per_step(4)
    assert out["value_model"] == pytest.approx(tokens * out["baseline_total_s"] / out["total_s"])
    assert "speculators PR #366" in out["model_note"]
    # the drafter's T - 1 passes are part of every spec step
    spec = record_model.spec_of("qwen35_122b_a10b")
    hw = record_model.st.HARDWARE["b300"]
    t = record_model.model_time(spec, "replay_spec", hw, 32, state_bytes=4, L=16, T=4, B_hist=16, accepted=3)
    assert t["drafter_s"] == pytest.approx(record_model.drafter_time(spec, hw, 32, 4)) and t["drafter_s"] > 0
    assert record_model.drafter_time(spec, hw, 32, 1) == 0.0


@pytest.mark.skipif(not published.CELLS_PATH.is_file(), reason="results/published/cells.csv not in this checkout")
def test_every_loss_of_the_committed_record_is_modelled_or_out_of_scope():
    df = record.published_vs_run(None, record.read_cells(published.CELLS_PATH))
    loss = df[(df["metric"] == "speedup") & (pd.to_numeric(df["value_published"], errors="coerce") < 1.0)]
    for row in loss.to_dict("records"):
        assert (row["value_model"] < 1.1) or row["regime"] in ("not-modelled", "capacity"), row
    assert set(df["regime"].dropna()) <= REGIMES
