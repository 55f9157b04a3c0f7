"""experiments/accuracy.py on short runs with known answers (tiny geometries, torch backend, tens of steps):
fp32 state stays within the oracles' fp32 tolerance for every method and workload, a bf16 state shows its
rounding, a method that drops the D term is caught on its outputs (its state stays right), bad sweeps fail
before any work, resume skips what is done; experiments/report/accuracy.py recovers a known growth exponent and the
claim verdict follows the rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from experiments import accuracy, accuracy_series
from experiments.harness import methods
from experiments.harness.entry import load_config
from experiments.report import accuracy as accuracy_report
from replayssm.testing import tolerance

SHORT = ["sweep.models=[tiny_mamba2,tiny_gdn]", "sweep.heads=2", "sweep.rows=2", "sweep.steps=24",
         "sweep.checkpoints=4", "sweep.buffer_len=[4]", "sweep.spec_T=2", "sweep.history_len=4",
         "sweep.act_dtype=[float32]", "progress=false"]


def run(tmp_path, overrides=(), seed=None):
    extra = [] if seed is None else [f"seed={seed}"]
    cfg = load_config("accuracy", [f"out_dir={tmp_path}", *SHORT, *extra, *overrides])
    return accuracy.run_accuracy(cfg)


def frame(result) -> pd.DataFrame:
    return pd.DataFrame(result.rows)


def test_fp32_state_within_oracle_tolerance_and_resume(tmp_path, gen):
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))
    result = run(tmp_path, ["sweep.state_dtype=[float32]"], seed=seed)
    df = frame(result)
    assert (df.status == "ok").all(), df[df.status != "ok"].message.tolist()
    # every method of both families and both workloads, each with its checkpoints ending at the last step
    assert set(df.method) == set(accuracy_series.METHODS)
    assert set(df.workload) == {"realistic", "long_memory"} and set(df.family) == {"mamba2", "gdn"}
    ar = df[df.window.isna()]
    assert (ar.groupby("series_hash").step.max() == 24).all()
    tol = tolerance(torch.float32)
    for col in ("out_err_max", "state_err_max"):
        assert (df[col] <= tol).all(), df.loc[df[col] > tol, ["family", "method", "workload", col]]
    assert (df.state_err_max > 0).any()                  # fp32 rounding is visible, not a copy of the truth
    # the run directory carries the provenance; a resume skips every series already recorded
    assert (result.run_dir / "env.json").is_file() and (result.run_dir / "accuracy.csv").is_file()
    cfg = load_config("accuracy", [f"resume={result.run_dir}", *SHORT, f"seed={seed}", "sweep.state_dtype=[float32]"])
    again = accuracy.run_accuracy(cfg)
    assert again.rows == [] and again.resumed_skipped == df.series_hash.nunique()


def test_bf16_state_shows_its_rounding(tmp_path):
    df = frame(run(tmp_path, ["sweep.state_dtype=[bfloat16]", "sweep.methods=[baseline_ar,replay_ar]",
                              "sweep.workloads=[realistic]"]))
    assert (df.status == "ok").all(), df.message.tolist()
    base = df[df.method == "baseline_ar"]
    # the baseline rounds its bf16 state every step: well above fp32 rounding, below a broken state
    assert (base.state_err_median > 1e-4).all() and (base.state_err_max < 5e-2).all()


class NoDBaseline(methods.BaselineAR):
    """A deliberately wrong Mamba-2 baseline: the skip term D x is dropped."""

    name, families = "test:no_D", ("mamba2",)

    def step(self, fns, cache, p, kw, slots, out):
        return super().step(fns, cache, p, {**kw, "D": None}, slots, out)


@pytest.fixture
def no_d_method():
    methods.register(NoDBaseline())
    accuracy_series.METHODS["test:no_D"] = accuracy_series.AccuracyMethod("test:no_D", accuracy_series._tensor_state)
    yield "test:no_D"
    accuracy_series.METHODS.pop("test:no_D")
    methods.unregister("test:no_D")


def test_dropped_D_is_detected(tmp_path, no_d_method):
    df = frame(run(tmp_path, ["sweep.state_dtype=[float32]", f"sweep.methods=[baseline_ar,{no_d_method}]",
                              "sweep.workloads=[realistic]", "sweep.models=[tiny_mamba2]"]))
    assert (df.status == "ok").all(), df.message.tolist()
    wrong, right = df[df.method == no_d_method], df[df.method == "baseline_ar"]
    assert (wrong.out_err_median > 1e-2).all()           # the outputs are off by D x
    assert (wrong.state_err_max <= tolerance(torch.float32)).all()   # D never touches the state
    assert (right.out_err_max <= tolerance(torch.float32)).all()


@pytest.mark.parametrize("override, key", [
    ("sweep.steps=0", "sweep.steps"),
    ("sweep.methods=[baseline_ar,warp_drive]", "sweep.methods[1]"),
    ("sweep.state_dtype=[float8]", "sweep.state_dtype[0]"),
    ("sweep.workloads=[chaotic]", "sweep.workloads[0]"),
    ("sweep.history_len=1", "sweep.history_len"),
    ("sweep.backend=cuda_graphs", "sweep.backend"),
])
def test_bad_sweep_fails_before_work(tmp_path, override, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        run(tmp_path / "out", [override])
    assert not (tmp_path / "out").exists()


def test_the_sweep_schema_defaults_are_the_experiments_vocabulary():
    """The accuracy and hybrid schemas live in the harness (registering them imports no experiment): their
    default names must stay the experiments' own."""
    from experiments.harness.sweeps import AccuracySweepSchema, HybridSweepSchema
    from experiments.hybrid import sweep as hybrid_sweep

    assert AccuracySweepSchema().methods == list(accuracy_series.METHODS)
    assert AccuracySweepSchema().workloads == list(accuracy_series.WORKLOADS)
    assert HybridSweepSchema().modes == list(hybrid_sweep.MODES)
    assert HybridSweepSchema().methods == list(hybrid_sweep.E2E_METHODS)


def _synthetic(exponent_base: float, base_scale: float, replay_scale: float) -> pd.DataFrame:
    """bf16-state baseline_ar and replay_ar series with errors c * step^exponent at known checkpoints."""
    rows = []
    for method, L, scale, expo in (("baseline_ar", None, base_scale, exponent_base),
                                   ("replay_ar", 16, replay_scale, 0.25)):
        for step in (1, 10, 100, 300, 1000, 2000):
            err = scale * step ** expo
            rows.append({c: None for c in accuracy.COLUMNS} | dict(
                family="mamba2", model="m", workload="realistic", method=method, buffer_len=L,
                state_dtype="bfloat16", act_dtype="float32", step=step, status="ok",
                out_err_median=err, state_err_median=err, series_hash=method))
    return pd.DataFrame(rows)


def test_report_growth_exponent_table_and_verdict():
    df = _synthetic(0.5, 1e-3, 1e-4)
    growth = accuracy_report.growth_exponents(df).set_index("label")
    assert math.isclose(growth.loc["baseline_ar", "state_exponent"], 0.5, rel_tol=1e-9)
    assert math.isclose(growth.loc["replay_ar L=16", "out_exponent"], 0.25, rel_tol=1e-9)
    table = accuracy_report.bf16_table(df)
    assert len(table) == 1 and math.isnan(table.iloc[0]["out base 10k"])    # 2,000 steps: no 10k column value
    assert math.isclose(table.iloc[0]["out base 1k"], 1e-3 * 1000 ** 0.5)
    assert accuracy_report.claim_verdict(df)["verdict"] == "holds"
    assert accuracy_report.claim_verdict(_synthetic(0.5, 1e-4, 1e-2))["verdict"] == "does not hold"
    assert accuracy_report.claim_verdict(None)["verdict"] == accuracy_report.NOT_MEASURED
    assert accuracy_report.claim_verdict(df[df.method == "baseline_ar"])["verdict"] == accuracy_report.NOT_MEASURED
