"""experiments/report/hybrid.py, claims.py and figures/ on SYNTHETIC whole-model rows: the e2e and serving
claims are answered from e2e_rows.csv / serving_rows.csv (labelled whole model), ratios pair rows of one
run, and without those files the SSM-layer proxy (or "not measured") answers as before."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments import published
from experiments.hybrid.run import E2E_COLUMNS, SERVING_COLUMNS
from experiments.report import claims, tables
from experiments.report import hybrid as hybrid_summary
from experiments.report import runs as aggregate
from experiments.report.figures import hybrid as hybrid_plots
from experiments.report.figures import plots

COMMON = dict(model="qwen35_122b_a10b", tp=1, family="gdn", context_len=1024, state_dtype="float32",
              act_dtype="bfloat16", backend="triton", status="ok", run_id="synthetic-run", composed=False)


def _row(columns, **kw) -> dict:
    row = {c: None for c in columns}
    row.update(COMMON, **kw)
    row.update(p20_us=row["median_us"] * 0.95, p80_us=row["median_us"] * 1.05)
    return row


def _write(run_dir: Path) -> None:
    e2e = [_row(E2E_COLUMNS, method=m, batch=512, median_us=us, buffer_len=16 if m == "replay_ar" else None,
                ssm_us=us / 2, attention_us=us / 4, mlp_us=us / 8, other_us=us / 8)
           for m, us in (("baseline_ar", 3000.0), ("replay_ar", 2000.0))]
    serving = []
    for mode, method, us, acc, conc in (("ar", "baseline_ar", 1000.0, 1.0, 900),
                                        ("native", "baseline_spec", 2500.0, 3.0, 233),
                                        ("replayssm", "replay_spec", 1250.0, 3.0, 702)):
        serving.append(_row(SERVING_COLUMNS, mode=mode, method=method, batch=512, median_us=us, mean_accepted=acc,
                            spec_T=None if mode == "ar" else 4, acceptance=None if mode == "ar" else "rate:0.8",
                            history_len=16 if mode == "replayssm" else None, max_concurrency=conc,
                            tokens_per_s=512 * acc / (us * 1e-6), hbm_budget_bytes=1e11, hbm_source="test"))
    pd.DataFrame(e2e, columns=E2E_COLUMNS).to_csv(run_dir / "e2e_rows.csv", index=False)
    pd.DataFrame(serving, columns=SERVING_COLUMNS).to_csv(run_dir / "serving_rows.csv", index=False)


def test_whole_model_ratios_and_claims(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows() + syn.spec_rows())
    before = claims.render([aggregate.load_run(run_dir)])
    assert "e2e_ar" not in before and "not measured in this run" in before
    _write(run_dir)
    ratios = hybrid_summary.hybrid_ratios(run_dir).set_index("metric")["value"]
    assert abs(ratios["ar_speedup"] - 1.5) < 1e-9
    assert abs(ratios["spec_vs_native"] - 2.0) < 1e-9          # same accepted length, half the step time
    assert abs(ratios["spec_vs_ar"] - 2.4) < 1e-9              # 3 tokens per 1.25 ms vs 1 per 1 ms
    assert abs(ratios["concurrency"] - 702 / 233) < 1e-9
    measured = syn.measured_by_claim(claims.render([aggregate.load_run(run_dir)]))
    e2e = next(v for k, v in measured.items() if k.startswith("standard decode end-to-end"))
    assert e2e.startswith("1.50x") and "whole model" in e2e
    native = next(v for k, v in measured.items() if k.startswith("GDN spec: 2.10x over native"))
    assert native.startswith("2.00x") and "whole model" in native
    conc = next(v for k, v in measured.items() if k.startswith("3.0x-3.3x more concurrent"))
    want = hybrid_summary.concurrency_claim_rows(next(c for c in published.CLAIMS if c.key == "concurrency"))
    lo, hi = want["value"].min(), want["value"].max()
    assert conc.startswith(f"{lo:.2f}x-{hi:.2f}x") and "analytic" in conc   # the claim's own models, on B300
    # a cache-resident pair is never quoted as a speedup
    e2e_rows = pd.read_csv(run_dir / "e2e_rows.csv")
    e2e_rows["cache_resident"] = True
    e2e_rows.to_csv(run_dir / "e2e_rows.csv", index=False)
    assert (hybrid_summary.hybrid_ratios(run_dir).query("metric == 'ar_speedup'")["verdict"] == "cache-resident").all()
    measured = syn.measured_by_claim(claims.render([aggregate.load_run(run_dir)]))
    e2e = next(v for k, v in measured.items() if k.startswith("standard decode end-to-end"))
    assert not e2e.startswith("1.50x")
    kernel = next(v for k, v in measured.items() if k.startswith("spec SSM kernel"))
    assert "whole model" not in kernel                         # kernel claims stay on the kernel rows
    names = [p.name for p in plots.plot_run(run_dir)]
    assert any(n.startswith("serving_throughput_") for n in names)
    assert any(n.startswith("serving_concurrency_") for n in names)
    assert any(n.startswith("e2e_breakdown_") for n in names)


def test_hybrid_plots_main_draws_alone_and_shares_the_figures_index(tmp_path, capsys):
    run_dir = syn.write_run(tmp_path, syn.ar_rows())
    assert hybrid_plots.main([str(run_dir)]) == 1                # no whole-model rows: says so, exit 1
    assert "nothing to draw" in capsys.readouterr().err
    _write(run_dir)
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "kept.png").write_bytes(b"x")           # another script's figure stays in the index
    (run_dir / "plots" / "figures.json").write_text('{"kept": {"title": "K", "caption": "kept caption"}}')
    assert hybrid_plots.main([str(run_dir)]) == 0
    index = (run_dir / "plots" / "FIGURES.md").read_text()
    stems = [p.stem for p in (run_dir / "plots").glob("*.pdf")]
    assert {s.split("_")[0] for s in stems} == {"serving", "e2e"} and len(stems) == 3
    assert "kept caption" in index and all(f"## {s}" in index for s in stems)
    assert "T = 4" in index and "4.0" not in index                # integer window in captions
    assert "Speculative serving: Qwen3.5-122B-A10B" in index and "qwen35" not in index.split("## ")[0]


def _md_rows(section: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|-")]


def test_whole_model_tables(tmp_path):
    """TABLES.md gets the e2e and serving sections, each ratio beside ReplaySSM's row and nowhere else."""
    run_dir = syn.write_run(tmp_path, syn.ar_rows() + syn.spec_rows())
    assert "Whole model" not in tables.render(aggregate.load_run(run_dir))
    _write(run_dir)
    text = tables.render(aggregate.load_run(run_dir))
    e2e = _md_rows(text.split("### Whole model: decode step")[1].split("###")[0])
    serving = _md_rows(text.split("### Whole model: speculative serving")[1].split("###")[0])
    by_method = {r[e2e[0].index("method")]: r for r in e2e[1:]}
    assert by_method["replay_ar"][-1] == "1.50" and by_method["baseline_ar"][-1] == ""
    by_mode = {r[serving[0].index("mode")]: r for r in serving[1:]}
    assert by_mode["replayssm"][-3:] == ["2.00", "2.40", "3.01"]     # vs native, vs ar, concurrency vs native
    assert by_mode["native"][-3:] == ["", "", ""] and by_mode["ar"][-3:] == ["", "", ""]
