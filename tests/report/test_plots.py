"""experiments/report/figures/{plots,hybrid,paper}.py and tables.py on a SYNTHETIC run (tmp_path): a PNG and a
vector PDF per figure with its caption in the run's figures index, short one-line titles, legends below the
axes, flagged points hollow, coinciding series said; every table headed by the run's hardware, versions and
commit; the shell scripts parse (bash -n)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import synthetic_runs as syn  # tests/report/: pytest puts a test's folder (no __init__.py) on sys.path

from experiments.report import runs as aggregate
from experiments.report import tables
from experiments.report.figures import paper as paper_figures
from experiments.report.figures import plots
from experiments.report.figures import style as fs

ROOT = Path(__file__).resolve().parents[2]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def small_run(tmp_path) -> Path:
    """One model, both experiments: enough for every kind of plot, few figures (matplotlib is slow)."""
    rows = [r for r in syn.ar_rows() + syn.spec_rows() if r["model"] == "qwen35_122b_a10b"]
    rows = [r for r in rows if r["acceptance"] in (None, 1.0)]
    return syn.write_run(tmp_path, rows, hardware="h200", env={
        "device": "cuda", "gpu_name": "NVIDIA H200 (synthetic)", "hardware": {"name": "h200"},
        "torch": "2.11.0", "triton": "3.6.0", "cuda": "12.8", "driver_version": "570.00",
        "git_sha": "cafef00dcafef00d", "git_dirty": False})


def test_plots_are_pngs_and_pdfs_named_by_kind_with_captions(small_run):
    paths = plots.plot_run(small_run)
    names = sorted(p.name for p in paths)
    assert all(p.parent == small_run / "plots" for p in paths)
    assert sum(n.startswith("ar_speedup_") for n in names) == 1
    assert sum(n.startswith("spec_tokens_") for n in names) == 1
    assert sum(n.startswith("bandwidth_") for n in names) == 2            # kernel_decode and kernel_spec
    index = json.loads((small_run / "plots" / "figures.json").read_text())
    text = (small_run / "plots" / "FIGURES.md").read_text()
    assert "p20-p80" in text and "Hollow markers" in text and "byte-model bound" in text
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p
        assert p.with_suffix(".pdf").read_bytes().startswith(b"%PDF"), p
        entry = index[p.stem]
        assert "\n" not in entry["title"] and len(entry["title"]) <= 70, entry["title"]    # short, one line
        assert "synthetic-run" in entry["caption"] and "H200" in entry["caption"]
        assert f"## {p.stem}" in text
        assert ".0" not in p.stem.replace("0.", ""), p.stem                 # integer T, L, batch in names
        width = plt.imread(p).shape[1] / fs.DPI                             # one or two columns, nothing more
        wide = p.stem.startswith(("ar_speedup", "accuracy", "spec_tokens"))   # spec: one panel per T
        assert width <= (fs.TWO_COLUMN if wide else fs.ONE_COLUMN) + 0.05, p.stem
    ar = index[next(n[:-4] for n in names if n.startswith("ar_speedup_"))]
    assert ar["title"].startswith("AR decode speedup: Qwen3.5-122B-A10B")
    assert "baseline_ar" not in ar["title"] + ar["caption"]                   # human names, not internal ones


def test_legend_sits_below_the_axes_and_flagged_points_are_hollow():
    fs.apply_style()
    fig, ax = plt.subplots(figsize=fs.figsize(1))
    h = fs.series(ax, [1, 8, 64], [1.0, 1.5, 2.0], [0.9, 1.4, 1.9], [1.1, 1.6, 2.1], label="ReplaySSM",
                  color=fs.color("replay_ar"), flagged=[True, False, False])
    fs.legend_below(fig, [h, fs.hollow_handle(), fs.bound_handle()])
    fs.batch_axis(ax, [1, 8, 64])
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert legend.y1 <= ax.get_tightbbox().y0 + 1                            # never over the data
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8", "64"]  # the measured batches only
    hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert len(hollow) == 1 and list(hollow[0].get_xdata()) == [1.0]
    plt.close(fig)
    assert fs.coincide({"a": np.array([1.0, 2.0]), "b": np.array([1.0, 2.0]), "c": np.array([1.0, 3.0])}) == {"b": "a"}
    assert fs.integer(4.0) == "4" and fs.integer("rate:0.7") == "rate:0.7"
    assert fs.model_name("nemotron3_super_120b", 8.0) == "Nemotron-3-Super-120B (TP8)"


def test_hybrid_plots_does_not_import_plots():
    code = ("import sys; import experiments.report.figures.hybrid as hybrid_plots; "
            "assert 'experiments.report.figures.plots' not in sys.modules; print(hybrid_plots.main.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and "main" in result.stdout, result.stderr


def test_paper_figures_from_a_run_with_published_markers(small_run):
    paths = paper_figures.paper_figures(small_run)
    stems = {p.stem for p in paths}
    assert {"fig6_kernel_speedup", "fig7_buffer_length"} <= stems
    assert any(s.startswith("fig9_spec_cost_") for s in stems) and "fig10_levels" in stems
    index = json.loads((small_run / "plots" / "figures.json").read_text())
    assert "B300" in index["fig6_kernel_speedup"]["caption"] and "published" in index["fig6_kernel_speedup"]["caption"]
    for p in paths:
        assert p.with_suffix(".pdf").is_file()


def test_paper_figures_refuse_a_run_without_ok_rows(tmp_path, capsys):
    rows = [dict(r, status="error") for r in syn.ar_rows()]
    assert paper_figures.main([str(syn.write_run(tmp_path, rows))]) == 1
    assert "nothing drawn" in capsys.readouterr().err


def test_no_plot_for_a_run_without_ok_rows(tmp_path):
    rows = [dict(r, status="error") for r in syn.ar_rows()]
    assert plots.plot_run(syn.write_run(tmp_path, rows)) == []


def test_every_table_is_headed_by_hardware_versions_and_commit(small_run):
    run = aggregate.load_run(small_run)
    text = tables.render(run)
    header = tables.env_line(run)
    for needed in ("NVIDIA H200 (synthetic)", "torch 2.11.0", "triton 3.6.0", "cuda 12.8", "driver 570.00",
                   "commit cafef00dcafe", "run `synthetic-run`"):
        assert needed in header
    sections = text.split("\n### ")[1:]
    assert len(sections) == 6          # + "Speedups vs their byte-model bounds" (issue 10)
    for section in sections:
        assert section.splitlines()[2] == f"_{header}_"
    assert "CPU" not in header
    # the AR speedup table: one column per buffer length, in numeric order, with the p20/p80 band
    speedup = sections[2]
    assert "| L=4 " in speedup and speedup.index("L=4 ") < speedup.index("L=8 ") < speedup.index("L=16")
    assert "1.50x [" in speedup
    # the spec table carries the mean accepted length and the ratios
    assert "mean accepted" in sections[5] and "spec_vs_native" in sections[5]


def test_cpu_run_tables_say_so(tmp_path):
    run = aggregate.load_run(syn.write_run(tmp_path, syn.ar_rows()))
    text = tables.render(run)
    assert "CPU run" in text and "Synthetic CPU (test fixture)" in text and "(dirty)" in text


def test_cpu_micro_benchmarks_table_reads_bench_cpu_json(tmp_path):
    run_dir = syn.write_run(tmp_path, syn.ar_rows())
    bench = {"benchmarks": [
        {"name": "test_baseline_ar[gdn]", "param": "gdn", "stats": {"median": 0.020, "iqr": 0.001, "rounds": 5},
         "extra_info": {"model": "qwen35_122b_a10b", "batch": 32, "per": "step", "form": "eager"}},
        {"name": "test_replay_ar[gdn]", "param": "gdn", "stats": {"median": 0.160, "iqr": 0.008, "rounds": 5},
         "extra_info": {"model": "qwen35_122b_a10b", "batch": 32, "buffer_len": 16, "flush_ms": 30.0,
                        "per": "flush cycle of 16 steps", "form": "torch.compile"}}]}
    (run_dir / "bench_cpu.json").write_text(json.dumps(bench))
    text = tables.render(aggregate.load_run(run_dir))
    section = text.split("### CPU micro-benchmarks")[1]
    replay_line = next(line for line in section.splitlines() if line.startswith("| test_replay_ar[gdn]"))
    assert "10.00" in replay_line and "2.00 |" in replay_line     # 160 ms / 16 steps; 20 ms / 10 ms per step


def test_markdown_table_formats_and_aligns():
    df = pd.DataFrame({"model": ["a|b", "c"], "batch": [1, 256], "median_us": [1.234567, float("nan")]})
    out = tables.markdown_table(df, {"median_us": ".2f"}).splitlines()
    assert out[0].split("|")[1:4] == [" model ", " batch ", " median_us "]
    assert out[1].startswith("|---") and out[1].endswith(":|")           # numeric column right-aligned
    assert "a\\|b" in out[2] and "1.23" in out[2] and out[3].rstrip().endswith("|           |")
    assert tables.markdown_table(df.iloc[:0]) == "_(no rows)_\n"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", ["reproduce.sh", "gpu/gpu_check.sh", "gpu/gpu_bundle.sh"])
def test_shell_scripts_parse(script):
    path = ROOT / "scripts" / script
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert path.read_text().startswith("#!/usr/bin/env bash") and "set -" in path.read_text()


def test_gpu_check_requires_an_out_dir():
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "gpu_check.sh")], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr


def test_accuracy_plot_and_tables_from_accuracy_csv(small_run):
    syn.write_accuracy(small_run)
    acc = pd.read_csv(small_run / "accuracy.csv")
    twin = acc[acc["method"] == "replay_ar"].assign(method="commit_replay_spec", buffer_len=np.nan, spec_T=4,
                                                   series_hash=lambda d: d["series_hash"].astype(str) + "-twin")
    pd.concat([acc, twin]).to_csv(small_run / "accuracy.csv", index=False)   # identical values: not hidden
    figs = fs.FigureSet(small_run / "plots")
    paths = plots.plot_accuracy(aggregate.load_run(small_run), figs)
    assert [p.name for p in paths] == ["accuracy_nemotron3_super_120b_realistic_bfloat16_float32.png"]
    assert paths[0].read_bytes().startswith(PNG_MAGIC)
    caption = figs.entries[0][2]
    assert "Commit-replay spec T = 4 and ReplaySSM L = 16 have identical output errors" in caption
    pd.concat([acc]).to_csv(small_run / "accuracy.csv", index=False)
    text = tables.render(aggregate.load_run(small_run))
    bf16 = text.split("### bf16 state: ReplaySSM vs baseline error at 1k / 10k steps")[1].split("\n### ")[0]
    assert "**holds**" in bf16 and "10,000 steps" in bf16          # 10k not reached: said, not invented
    row = next(line for line in bf16.splitlines() if line.startswith("| mamba2"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:8] == ["0.0316", "0.00316", "10"]                 # 1e-3 sqrt(1000), 1e-4 sqrt(1000), ratio
    growth = text.split("### Accuracy: growth exponent")[1]
    # out and state exponents of both series, vs steps and vs state writes (the drift table repeats them)
    assert growth.count(" 0.5 |") == 8
