"""Speedups beside their byte-model bounds (issue 10), on SYNTHETIC runs: aggregate's measured / byte model
and verdict; tables and REPORT.md never show a not-bandwidth-bound or cache-resident pair as a speedup."""

from __future__ import annotations

import pandas as pd
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.published import CLAIMS
from experiments.report import claims, tables
from experiments.report import runs as aggregate


def _summary(tmp_path, rows):
    return aggregate.summarize(aggregate.load_run(syn.write_run(tmp_path, rows)).rows).ratios


def test_every_synthetic_speedup_is_within_its_byte_model(tmp_path):
    r = _summary(tmp_path, syn.ar_rows() + syn.spec_rows())
    speedups = r[r["metric"].isin(aggregate.SPEEDUP_METRICS)]
    assert not speedups.empty and speedups["bytes_ratio"].notna().all()
    assert ((speedups["measured_over_model"] - speedups["value"] / speedups["bytes_ratio"]).abs() < 1e-12).all()
    assert (speedups["verdict"] == aggregate.WITHIN_MODEL).all()
    # the footprint ratio has no byte model and no speedup verdict
    conc = r[r["metric"] == "concurrency"]
    assert not conc.empty and conc["bytes_ratio"].isna().all() and (conc["verdict"].fillna("") == "").all()


def test_above_bound_and_cache_resident_pairs_are_flagged(tmp_path):
    r = _summary(tmp_path, syn.ar_rows() + syn.above_bound_rows())
    big = r[(r["metric"] == "ar_speedup") & (r["batch"] == 256)].set_index("buffer_len")
    assert abs(big.loc[4, "value"] - syn.ABOVE_BOUND_SPEEDUP) < 1e-9
    assert abs(big.loc[4, "bytes_ratio"] - 1.25) < 1e-9
    assert abs(big.loc[4, "measured_over_model"] - syn.ABOVE_BOUND_SPEEDUP / 1.25) < 1e-9
    assert big.loc[4, "verdict"] == aggregate.NOT_BANDWIDTH_BOUND
    assert big.loc[8, "verdict"] == aggregate.CACHE_RESIDENT and bool(big.loc[8, "cache_resident"])
    # the 10% slack: exactly at 1.1x the bound is still bandwidth-bound, just above is not
    rows = syn.above_bound_rows()
    for factor, verdict in ((1.099, aggregate.WITHIN_MODEL), (1.101, aggregate.NOT_BANDWIDTH_BOUND)):
        rows[1]["median_us"] = 300.0 / (1.25 * factor)
        again = _summary(tmp_path / str(factor), rows)
        assert again[again["buffer_len"] == 4]["verdict"].iloc[0] == verdict


def test_row_byte_model_ratio_stands_in_for_a_missing_bytes_model(tmp_path):
    rows = syn.above_bound_rows()[:2]
    rows[0]["bytes_model"] = None
    r = _summary(tmp_path, rows)
    assert abs(r["bytes_ratio"].iloc[0] - 1.25) < 1e-9 and r["verdict"].iloc[0] == aggregate.NOT_BANDWIDTH_BOUND


def test_tables_show_the_bound_and_never_a_flagged_speedup(tmp_path):
    run = aggregate.load_run(syn.write_run(tmp_path, syn.ar_rows() + syn.above_bound_rows()))
    text = tables.render(run)
    bounds = text.split("### Speedups vs their byte-model bounds")[1].split("\n### ")[0]
    assert "measured / model" in bounds and aggregate.NOT_BANDWIDTH_BOUND in bounds and "2.40" in bounds
    speedup = text.split("### AR decode speedup")[1].split("\n### ")[0]
    assert "3.00x [" not in speedup and f"{aggregate.NOT_BANDWIDTH_BOUND} (3.00x vs byte model 1.25x)" in speedup
    assert f"{aggregate.CACHE_RESIDENT} (1.20x" in speedup


def test_claims_never_quote_a_flagged_speedup(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows() + syn.above_bound_rows())
    report = claims.render([aggregate.load_run(run_dir)])
    headline = next(line for line in report.splitlines() if CLAIMS[0].text in line and line.startswith("|"))
    cells = [c.strip() for c in headline.split("|")]
    # "up to 1.8x" at bs 256: the 3.0x pair is nearest but flagged, so the best within-bound pair answers
    assert cells[5].startswith("1.50x") and "3.00x" not in cells[5]
    assert "vs byte model" in cells[6]
    assert "nearer pairs left out" in report and aggregate.NOT_BANDWIDTH_BOUND in report
    # with only flagged pairs the claim is not measured, and says why
    only = syn.write_run(tmp_path / "only", syn.above_bound_rows())
    report = claims.render([aggregate.load_run(only)])
    headline = next(line for line in report.splitlines() if CLAIMS[0].text in line and line.startswith("|"))
    assert claims.NOT_MEASURED in headline and "not reported as a speedup" in headline


def test_rows_without_verdict_columns_still_aggregate(tmp_path):
    """An older rows.csv (no cache_resident / byte_model_ratio columns) reads as not resident."""
    run_dir = syn.write_run(tmp_path, syn.ar_rows())
    rows = pd.read_csv(run_dir / "rows.csv").drop(columns=["cache_resident", "byte_model_ratio"], errors="ignore")
    rows.to_csv(run_dir / "rows.csv", index=False)
    r = aggregate.summarize(aggregate.load_run(run_dir).rows).ratios
    assert (r[r["metric"] == "ar_speedup"]["verdict"] == aggregate.WITHIN_MODEL).all()
