"""experiments/published.py and report/claims.py on SYNTHETIC runs: every claim row is reported, headline rows
first; "not measured in this run" where the run has no matching rows; CPU runs labelled as such."""

from __future__ import annotations

import re
import sys

import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.published import CLAIMS, HEADLINE_KEYS
from experiments.report import claims
from experiments.report import runs as aggregate

GPU_ENV = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
           "git_sha": "feedbeef"}


def _table_rows(report: str) -> list[str]:
    """The claim column of the summary table, in order."""
    rows = [line for line in report.splitlines() if re.match(r"^\|\s+\d+ \|", line)]
    return [line.split("|")[2].strip().strip("*") for line in rows]


def test_published_claims_are_complete_data():
    assert HEADLINE_KEYS == ("headline_decode", "headline_spec")
    assert [c.key for c in CLAIMS[:2]] == list(HEADLINE_KEYS)
    assert "1.8x faster decoding" in CLAIMS[0].text and "2.1x higher speculative" in CLAIMS[1].text
    keys = [c.key for c in CLAIMS]
    assert len(set(keys)) == len(keys)
    for c in CLAIMS:
        assert c.source and c.conditions and c.hardware, c.key
        assert c.kind in ("up_to", "range", "point", "argmax"), c.key
        assert c.lo is None or c.lo <= c.hi, c.key
    published = {(c.lo, c.hi) for c in CLAIMS}
    # the numbers of the published numbers, experiments/published.py
    for pair in [(1.43, 1.84), (1.43, 1.64), (None, 1.48), (1.87, 1.96), (None, 2.14), (None, 2.10),
                 (3.0, 3.3), (None, 1.8), (None, 2.1)]:
        assert pair in published, pair


def test_report_has_every_claim_headlines_first_and_cpu_label(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows() + syn.spec_rows())
    assert claims.main([str(run_dir)]) == 0
    report = (run_dir / "REPORT.md").read_text()
    assert _table_rows(report) == [c.text for c in CLAIMS]
    assert "**CPU run.**" in report and "NOT comparable" in report
    measured = syn.measured_by_claim(report)
    # the synthetic run has no e2e experiment: that claim has no number
    e2e = next(c for c in CLAIMS if c.key == "e2e_ar")
    assert measured[e2e.text] == claims.NOT_MEASURED
    # the AR headline is the best synthetic AR speedup (1.5x at L=8), labelled as a CPU number
    assert measured[CLAIMS[0].text].startswith("1.50x") and "CPU" in measured[CLAIMS[0].text]
    assert "Synthetic CPU (test fixture)" in report


def test_claims_without_rows_say_not_measured_and_invent_nothing(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows())             # no spec experiment in this run
    report = claims.render([aggregate.load_run(run_dir)])
    measured = syn.measured_by_claim(report)
    for c in CLAIMS:
        value = measured[c.text]
        if c.metric in ("ar_speedup", "best_buffer_len") and c.experiment == "kernel_decode":
            assert value != claims.NOT_MEASURED, c.key
        elif c.metric in ("byte_model", "concurrency"):    # analytic: the byte model, vLLM's allocator on B300
            assert "analytic" in value
        else:
            assert value == claims.NOT_MEASURED, c.key


def test_failed_rows_leave_claims_unmeasured(tmp_path):
    rows = [dict(r, status="error", message="synthetic failure") for r in syn.ar_rows() + syn.spec_rows()]
    measured = syn.measured_by_claim(claims.render([aggregate.load_run(syn.write_run(tmp_path, rows))]))
    for c in CLAIMS:
        if c.metric not in ("byte_model", "concurrency"):
            assert measured[c.text] == claims.NOT_MEASURED, c.key


def test_nearest_rows_prefer_the_claims_model_then_its_batch(tmp_path):
    ratios = aggregate.summarize(aggregate.load_run(syn.write_run(tmp_path, syn.ar_rows())).rows).ratios
    qwen = next(c for c in CLAIMS if c.key == "kernel_ar_qwen35")
    near = claims.nearest_rows(ratios, qwen)
    assert set(near["model"]) == {"qwen35_122b_a10b"}
    assert set(near["batch"]) == {32} and set(near["buffer_len"]) == {16}      # nearest to bs256, L=16
    text = claims.rows_text(near, qwen)
    assert "differs from the claim's batch 256" in text
    lo, hi = claims.measured_value(near, qwen)
    assert lo == hi == pytest.approx(syn.AR_SPEEDUP[16])
    assert claims.gap_text(lo, hi, qwen).startswith("below the range")


def test_best_buffer_len_is_the_bell_curve_peak(tmp_path):
    ratios = aggregate.summarize(aggregate.load_run(syn.write_run(tmp_path, syn.ar_rows())).rows).ratios
    best = claims.best_buffer_rows(ratios)
    assert set(best["value"]) == {8}                                  # AR_SPEEDUP peaks at L=8
    nemotron = next(c for c in CLAIMS if c.key == "bell_nemotron3")
    assert claims.gap_text(8, 8, nemotron) == "same best setting"


def test_gpu_run_is_not_labelled_cpu(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows(), hardware="h200", env=GPU_ENV)
    report = claims.render([aggregate.load_run(run_dir)])
    assert "CPU run" not in report and "NVIDIA H200" in report
    assert "(CPU" not in syn.measured_by_claim(report)[CLAIMS[0].text]


def test_byte_model_row_is_analytic_or_not_measured(tmp_path, monkeypatch):
    byte_claim = next(c for c in CLAIMS if c.metric == "byte_model")
    text, detail, lo, hi = claims.byte_model_rows(byte_claim)
    assert "analytic" in text and 1.7 < lo <= hi < 1.9 and "qwen35_4b" in detail
    monkeypatch.setitem(sys.modules, "replayssm.traffic", None)        # import now fails
    text, _, lo, _ = claims.byte_model_rows(byte_claim)
    assert text.startswith(claims.NOT_MEASURED) and lo is None


def test_report_over_two_runs_names_each_run(tmp_path):
    """AR rows in one run and spec rows in another: each claim is answered from its own run, and says which."""
    ar_dir = syn.write_run(tmp_path / "a", syn.ar_rows(run_id="ar-run"), run_id="ar-run")
    spec_dir = syn.write_run(tmp_path / "b", syn.spec_rows(run_id="spec-run"), run_id="spec-run")
    out = tmp_path / "REPORT.md"
    assert claims.main([str(ar_dir), str(spec_dir), "--out", str(out)]) == 0
    report = out.read_text()
    assert "run `ar-run`" in report and "run `spec-run`" in report
    measured = syn.measured_by_claim(report)
    assert measured[CLAIMS[0].text] != claims.NOT_MEASURED and measured[CLAIMS[1].text] != claims.NOT_MEASURED
    # spec over standard decode needs baseline_ar in the SAME run: the spec run has none, so no number
    spec_vs_standard = next(c for c in CLAIMS if c.key == "spec_vs_standard")
    assert measured[spec_vs_standard.text] == claims.NOT_MEASURED


def test_bf16_state_claim_verdict_comes_from_accuracy_rows(tmp_path):
    claim = next(c for c in CLAIMS if c.metric == "bf16_state_accuracy")
    run_dir = syn.write_run(tmp_path / "a", syn.ar_rows())
    assert syn.measured_by_claim(claims.render([aggregate.load_run(run_dir)]))[claim.text] == claims.NOT_MEASURED
    syn.write_accuracy(run_dir, base_scale=1e-3, replay_scale=1e-4)
    report = claims.render([aggregate.load_run(run_dir)])
    assert "10.00x-10.00x" in syn.measured_by_claim(report)[claim.text] and "| holds" in report
    worse = syn.write_run(tmp_path / "b", syn.ar_rows())
    syn.write_accuracy(worse, base_scale=1e-4, replay_scale=1e-3)
    assert "does not hold" in claims.render([aggregate.load_run(worse)])


def test_a_run_that_measured_nothing_says_so_loudly_and_exits_non_zero(tmp_path, capsys):
    rows = [dict(r, status="error", message="synthetic failure") for r in syn.ar_rows()]
    run_dir = syn.write_run(tmp_path / "failed", rows)
    assert claims.main([str(run_dir)]) == 1
    report = (run_dir / "REPORT.md").read_text()
    assert f"NOTHING WAS MEASURED: none of the {len(rows)} rows is ok (error={len(rows)})" in report
    assert "synthetic failure" in report and "NOTHING WAS MEASURED" in capsys.readouterr().err
    empty = syn.write_run(tmp_path / "empty", syn.ar_rows())
    header = (empty / "rows.csv").read_text().splitlines()[0]
    (empty / "rows.csv").write_text(header + "\n")
    assert claims.main([str(empty)]) == 1
    assert "NOTHING WAS MEASURED: the run has no rows" in (empty / "REPORT.md").read_text()
    mixed = syn.write_run(tmp_path / "mixed", syn.ar_rows()[:-1] + [dict(syn.ar_rows()[-1], status="oom",
                                                                         message="MemoryError")])
    assert claims.main([str(mixed)]) == 0
    assert f"1 of {len(syn.ar_rows())} rows failed (ok=" in (mixed / "REPORT.md").read_text()
