"""experiments/report/runs.py on SYNTHETIC run directories (tests/report/synthetic_runs.py, written to tmp_path):
ratios only within one run and matching point keys; non-ok rows excluded from ratios but counted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.report import runs as aggregate


def _ratios(rows: list[dict], tmp_path: Path, **kw) -> aggregate.Summary:
    return aggregate.summarize(aggregate.load_run(syn.write_run(tmp_path, rows, **kw)).rows)


def test_ar_speedup_is_baseline_over_replay_per_buffer_len(tmp_path):
    s = _ratios(syn.ar_rows(), tmp_path)
    ar = s.ratios[s.ratios["metric"] == "ar_speedup"]
    assert len(ar) == len(syn.MODELS) * len(syn.BATCHES) * len(syn.AR_SPEEDUP)
    expected = ar["buffer_len"].map(syn.AR_SPEEDUP)
    assert (ar["value"] - expected).abs().max() < 1e-9
    assert ((ar["lo"] < ar["value"]) & (ar["value"] < ar["hi"])).all()
    assert (ar["num_method"] == "replay_ar").all() and (ar["den_method"] == "baseline_ar").all()
    assert (ar["bytes_ratio"] - 1e6 / 0.55e6).abs().max() < 1e-9


def test_spec_ratios_follow_the_step_times(tmp_path):
    s = _ratios(syn.ar_rows() + syn.spec_rows(), tmp_path)
    r = s.ratios
    T = r["spec_T"]
    acc = r["mean_accepted"]

    def check(metric, expected):
        got = r[r["metric"] == metric]
        assert len(got) == len(syn.MODELS) * len(syn.BATCHES) * len(syn.SPEC_T) * len(syn.ACCEPTANCE), metric
        assert (got["value"] - expected[got.index]).abs().max() < 1e-9, metric

    check("spec_vs_native", T / (1 + T / 4))
    check("spec_vs_commit", (1 + T / 2) / (1 + T / 4))
    check("commit_vs_native", T / (1 + T / 2))
    # standard decode: baseline_ar tokens/s = batch / (10 + batch) us; replay_spec = batch * acc / its step
    check("spec_vs_ar", acc / (1 + T / 4))
    check("native_spec_vs_ar", acc / T)
    check("concurrency", (1 + T) * 4e6 / 4.2e6)
    cost = r[(r["metric"] == "step_cost_vs_ar") & (r["num_method"] == "baseline_spec")]
    assert (cost["value"] - cost["spec_T"]).abs().max() < 1e-9


def test_ratios_never_cross_runs(tmp_path):
    """A baseline in one run and a replay in another never form a ratio, even with the same run_id."""
    base = [r for r in syn.ar_rows() if r["method"] == "baseline_ar"]
    replay = [r for r in syn.ar_rows() if r["method"] == "replay_ar"]
    runs = [aggregate.load_run(syn.write_run(tmp_path / "a", base)),
            aggregate.load_run(syn.write_run(tmp_path / "b", replay))]
    s = aggregate.summarize(aggregate.concat_rows(runs))
    assert s.ratios.empty
    assert (s.counts["in_ratios"] == 0).all()

    # Two complete runs with different speeds: each ratio is its own run's, never a mix.
    slow = [dict(r, median_us=r["median_us"] * 3, p20_us=r["p20_us"] * 3, p80_us=r["p80_us"] * 3, run_id="slow")
            if r["method"] == "baseline_ar" else dict(r, run_id="slow") for r in syn.ar_rows()]
    runs = [aggregate.load_run(syn.write_run(tmp_path / "c", syn.ar_rows())),
            aggregate.load_run(syn.write_run(tmp_path / "d", slow, run_id="slow"))]
    ar = aggregate.summarize(aggregate.concat_rows(runs)).ratios
    ar = ar[ar["metric"] == "ar_speedup"]
    for run_id, factor in (("synthetic-run", 1), ("slow", 3)):
        mine = ar[ar["run_id"] == run_id]
        assert len(mine) == 18
        assert (mine["value"] - factor * mine["buffer_len"].map(syn.AR_SPEEDUP)).abs().max() < 1e-9


@pytest.mark.parametrize("key, value", [("batch", 999), ("state_dtype", "float16"), ("backend", "triton"),
                                        ("timing_mode", "graph"), ("model", "nemotron3_nano_4b"), ("tp", 8)])
def test_mismatched_point_keys_do_not_pair(tmp_path, key, value):
    rows = [r for r in syn.ar_rows() if r["model"] == "qwen35_122b_a10b" and r["batch"] == 8]
    rows = [dict(r, **{key: value}) if r["method"] == "replay_ar" else r for r in rows]
    assert _ratios(rows, tmp_path).ratios.empty


def test_baseline_without_buffer_serves_every_buffer_but_a_set_one_must_match(tmp_path):
    rows = [r for r in syn.ar_rows() if r["model"] == "qwen35_122b_a10b" and r["batch"] == 8]
    assert len(_ratios(rows, tmp_path / "x").ratios) == 3
    rows = [dict(r, buffer_len=16) if r["method"] == "baseline_ar" else r for r in rows]
    got = _ratios(rows, tmp_path / "y").ratios
    assert got["buffer_len"].tolist() == [16]


def test_non_ok_rows_are_excluded_and_counted(tmp_path):
    rows = [r for r in syn.ar_rows() if r["model"] == "nemotron3_super_120b"]
    for r in rows:
        if r["method"] == "baseline_ar" and r["batch"] == 1:
            r.update(status="oom", median_us=None, p20_us=None, p80_us=None, message="CUDA out of memory")
        if r["method"] == "replay_ar" and r["batch"] == 8 and r["buffer_len"] == 4:
            r.update(status="wrong", message="rel_err 3e-2 > tol")     # keeps a time: must still be ignored
    s = _ratios(rows, tmp_path)
    ar = s.ratios[s.ratios["metric"] == "ar_speedup"]
    assert len(ar) == 9 - 3 - 1
    assert not ((ar["batch"] == 1).any() or ((ar["batch"] == 8) & (ar["buffer_len"] == 4)).any())
    counts = s.counts.set_index(["method", "status"])
    assert counts.loc[("baseline_ar", "oom"), "count"] == 1 and counts.loc[("baseline_ar", "oom"), "in_ratios"] == 0
    assert counts.loc[("replay_ar", "wrong"), "count"] == 1 and counts.loc[("replay_ar", "wrong"), "in_ratios"] == 0
    # the replay rows at batch 1 are ok but have no baseline partner: counted, not used
    assert counts.loc[("replay_ar", "ok"), "count"] == 8 and counts.loc[("replay_ar", "ok"), "in_ratios"] == 5


def test_each_method_in_its_fastest_form(tmp_path):
    rows = [r for r in syn.ar_rows() if r["model"] == "qwen35_122b_a10b" and r["batch"] == 32]
    base = next(r for r in rows if r["method"] == "baseline_ar")
    rows.append(dict(base, compiled=True, median_us=base["median_us"] / 2, p20_us=base["p20_us"] / 2,
                     p80_us=base["p80_us"] / 2, config_hash="compiled"))
    ar = _ratios(rows, tmp_path).ratios
    assert len(ar) == 3
    assert (ar["value"] - ar["buffer_len"].map(syn.AR_SPEEDUP) / 2).abs().max() < 1e-9
    assert ar["den_compiled"].astype(str).eq("True").all()


def test_peer_rows_are_compared_across_backends(tmp_path):
    rows = [r for r in syn.ar_rows() if r["model"] == "qwen35_122b_a10b" and r["batch"] == 8]
    base = next(r for r in rows if r["method"] == "baseline_ar")
    rows.append(dict(base, method="peer:fla", backend="triton", median_us=base["median_us"] * 1.1,
                     p20_us=base["p20_us"] * 1.1, p80_us=base["p80_us"] * 1.1, config_hash="peer"))
    r = _ratios(rows, tmp_path).ratios
    assert len(r[r["metric"] == "ar_vs_peer"]) == 3
    assert abs(r[r["metric"] == "baseline_vs_peer"]["value"].iloc[0] - 1.1) < 1e-9


def test_cli_writes_summary_and_counts(tmp_path, capsys):
    run_dir = syn.write_run(tmp_path, syn.ar_rows() + syn.spec_rows())
    assert aggregate.main([str(run_dir)]) == 0
    summary = pd.read_csv(run_dir / "summary.csv")
    assert set(aggregate.SUMMARY_COLUMNS) <= set(summary.columns)
    assert {"ar_speedup", "spec_vs_native", "spec_vs_ar"} <= set(summary["metric"])
    assert (run_dir / "counts.csv").is_file()
    assert "non-ok rows" in capsys.readouterr().out


def test_missing_rows_csv_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="rows.csv"):
        aggregate.load_run(tmp_path)


def test_describe_env_tolerates_key_names_and_falls_back_to_the_directory(tmp_path):
    env = aggregate.describe_env({"device": {"gpu_name": "NVIDIA H200", "sm_count": 132},
                                  "versions": {"torch": "2.11.0", "triton": "3.6.0"}, "git": {"sha": "abc"}})
    assert (env["hardware"], env["kind"], env["torch"], env["triton"], env["commit"]) == \
        ("NVIDIA H200", "gpu", "2.11.0", "3.6.0", "abc")
    run_dir = syn.write_run(tmp_path, syn.ar_rows(), hardware="h100", env={})
    assert aggregate.load_run(run_dir).hardware == "h100"


def test_the_reader_uses_the_writers_columns():
    """rows.csv is read with the store's own column list; every numeric, key and summary column the report
    names is one of them (a renamed column in the store fails here, not in a report)."""
    from experiments.harness.store import COLUMNS

    assert aggregate.ROW_COLUMNS == tuple(COLUMNS)
    for names in (aggregate.NUMERIC_COLUMNS, aggregate.POINT_KEYS, aggregate.AR_STRICT[2:], aggregate.SPEC_WILD):
        assert set(names) <= set(COLUMNS), set(names) - set(COLUMNS)
