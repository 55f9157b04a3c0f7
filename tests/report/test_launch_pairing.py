"""Ratios against tuned and default baselines (aggregate's launch columns, the tables' cells, the claims
report): SYNTHETIC rows in tmp_path, never results. A baseline_ar row tuned (launch_source=tuned) and the same
point under its default configs (launch_source=default, 2x slower), a replay_ar row tuned: the AR speedup is
taken against the tuned baseline, with the default one beside it; a tuned method against an untuned partner
says so."""

from __future__ import annotations

import pandas as pd
import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.report import runs as aggregate
from experiments.report.tables import _ratio_cell


def _rows(with_tuned_baseline: bool) -> pd.DataFrame:
    common = dict(experiment="kernel_decode", family="mamba2", model="nemotron3_super_120b", batch=32)
    rows = [syn._base(**common, method="baseline_ar", median_us=20.0, launch_source="default",
                  launch_config="mamba2_ssu_ar[block_m=4,block_n=128,num_warps=4]"),
            syn._base(**common, method="replay_ar", buffer_len=16, route="output_only", median_us=12.5,
                  bytes_model=0.55e6, launch_source="tuned", launch_config="mamba2_replay_ar[block_m=32]")]
    if with_tuned_baseline:
        rows.append(syn._base(**common, method="baseline_ar", median_us=10.0, launch_source="tuned",
                          launch_config="mamba2_ssu_ar[block_m=8,block_n=128,num_warps=4]"))
    df = pd.DataFrame(rows).assign(_source="synthetic")
    return df.reindex(columns=list(aggregate.ROW_COLUMNS) + ["_source"])


def _ar(rows: pd.DataFrame) -> pd.Series:
    for c in aggregate.NUMERIC_COLUMNS:
        rows[c] = pd.to_numeric(rows[c], errors="coerce")
    ratios = aggregate.summarize(rows).ratios
    (row,) = [r for _, r in ratios[ratios["metric"] == "ar_speedup"].iterrows()]
    return row


def test_tuned_baseline_first_default_beside_it():
    row = _ar(_rows(with_tuned_baseline=True))
    assert row["value"] == pytest.approx(10.0 / 12.5) and row["value_default"] == pytest.approx(20.0 / 12.5)
    assert (row["num_launch_source"], row["den_launch_source"], row["launch_note"]) == ("tuned", "tuned", "")
    assert _ratio_cell(row).startswith("0.80x") and "(default 1.60x)" in _ratio_cell(row)


def test_a_tuned_method_against_an_untuned_partner_says_so():
    row = _ar(_rows(with_tuned_baseline=False))
    assert row["value"] == pytest.approx(20.0 / 12.5) and pd.isna(row["value_default"])
    assert row["den_launch_source"] == "default" and row["launch_note"] == "partner untuned"
    assert "[partner untuned]" in _ratio_cell(row)


def test_claims_label_tuned_and_default_values():
    from experiments.published import CLAIMS
    from experiments.report.claims import launch_labels

    claim = next(c for c in CLAIMS if c.metric == "ar_speedup")
    tuned = _ar(_rows(with_tuned_baseline=True)).to_frame().T
    assert launch_labels(tuned, claim) == ["vs tuned baseline", "vs default baseline 1.60x"]
    untuned = _ar(_rows(with_tuned_baseline=False)).to_frame().T
    assert launch_labels(untuned, claim) == ["partner untuned: a tuned method against a default-config partner"]
