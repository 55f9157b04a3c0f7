"""The claims report's rows for the third-party fp8-checkpoint claims: the drift verdict comes from the run's
experimental fp8 rows in accuracy.csv ("not measured" without them); the logprob claim is never measured."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.published import CLAIMS
from experiments.report import claims
from experiments.report import runs as aggregate


def _write_fp8(run_dir: Path, coef: float) -> None:
    """GDN replay_ar L=4 fp8-checkpoint rows with state error coef * sqrt(flushes)."""
    rows = [{c: None for c in syn.ACCURACY_COLUMNS} | dict(
        experiment="accuracy", family="gdn", model="qwen35_122b_a10b", workload="realistic", method="replay_ar",
        buffer_len=4, state_dtype="float8_e4m3fn", act_dtype="float32", step=step, status="ok",
        out_err_median=coef * (step // 4) ** 0.5, state_err_median=coef * (step // 4) ** 0.5,
        series_hash="fp8", run_id="synthetic-run") for step in (16, 64, 256, 1024)]
    pd.DataFrame(rows).to_csv(run_dir / "accuracy.csv", index=False)


def test_fp8_claims_rows(tmp_path):
    drift = next(c for c in CLAIMS if c.metric == "fp8_checkpoint_drift")
    logprob = next(c for c in CLAIMS if c.metric == "fp8_checkpoint_logprob")
    run_dir = syn.write_run(tmp_path / "a", syn.ar_rows())
    measured = syn.measured_by_claim(claims.render([aggregate.load_run(run_dir)]))
    assert measured[drift.text] == claims.NOT_MEASURED and measured[logprob.text] == claims.NOT_MEASURED
    _write_fp8(run_dir, 0.01)
    report = claims.render([aggregate.load_run(run_dir)])
    assert "e 0.50..0.50" in syn.measured_by_claim(report)[drift.text] and "| consistent" in report
    far = syn.write_run(tmp_path / "b", syn.ar_rows())
    _write_fp8(far, 0.1)                                   # the right exponent, ten times the coefficient
    assert "not consistent" in claims.render([aggregate.load_run(far)])


def test_tables_have_the_fp8_section_only_with_fp8_rows(tmp_path):
    from experiments.report import tables

    run_dir = syn.write_run(tmp_path / "a", syn.ar_rows())
    syn.write_accuracy(run_dir)
    title = "Experimental fp8 checkpoint"
    assert title not in tables.render(aggregate.load_run(run_dir))
    _write_fp8(run_dir, 0.01)
    text = tables.render(aggregate.load_run(run_dir))
    assert title in text and "**consistent**" in text
