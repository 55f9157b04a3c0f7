"""The experimental fp8 state in the accuracy study: planned for every method (torch / ref), rows marked
experimental,
errors within the fp8 tolerance on a short run (and far above fp32's, so the rounding is really there), bad
sweeps refused before any work; experiments/report/accuracy.py's drift verdict follows the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from experiments import accuracy
from experiments.harness.entry import load_config
from experiments.report import accuracy as accuracy_report
from replayssm.testing import tolerance

SHORT = ["sweep.models=[tiny_mamba2,tiny_gdn]", "sweep.heads=2", "sweep.rows=2", "sweep.steps=24",
         "sweep.checkpoints=4", "sweep.buffer_len=[4]", "sweep.spec_T=2", "sweep.history_len=4",
         "sweep.act_dtype=[float32]", "sweep.workloads=[realistic]", "progress=false"]


def test_fp8_rows_for_every_checkpoint_method_within_fp8_tolerance(tmp_path, gen):
    seed = int(torch.randint(0, 2**30, (1,), generator=gen))
    cfg = load_config("accuracy", [f"out_dir={tmp_path}", *SHORT, f"seed={seed}",
                                   "sweep.methods=[baseline_ar,replay_ar,baseline_spec,commit_replay_spec,replay_spec]",
                                   "sweep.state_dtype=[float32,float8_e4m3fn]"])
    df = pd.DataFrame(accuracy.run_accuracy(cfg).rows)
    assert (df.status == "ok").all(), df[df.status != "ok"].message.tolist()
    fp8 = df[df.state_dtype == "float8_e4m3fn"]
    assert set(fp8.method) == {"baseline_ar", "replay_ar", "baseline_spec", "commit_replay_spec", "replay_spec"}
    assert set(fp8.family) == {"mamba2", "gdn"}
    assert fp8.experimental.all() and not df[df.state_dtype == "float32"].experimental.any()
    tol = tolerance(torch.float32, torch.float8_e4m3fn)
    assert (fp8[["out_err_median", "state_err_median"]] <= tol).all().all()
    assert (fp8.state_err_median > 100 * tolerance(torch.float32)).all()     # quantised, not a float copy
    on_disk = pd.read_csv(next(Path(tmp_path).glob("*/*/accuracy.csv")))
    assert "experimental" in on_disk.columns


@pytest.mark.parametrize("overrides, match", [
    (["sweep.backend=triton"], "no Triton"),
])
def test_bad_fp8_sweeps_fail_before_work(tmp_path, overrides, match):
    cfg = load_config("accuracy", [f"out_dir={tmp_path}", *SHORT, "sweep.state_dtype=[float8_e4m3fn]", *overrides])
    with pytest.raises(ValueError, match=match):
        accuracy.run_accuracy(cfg)
    assert not any(Path(tmp_path).rglob("accuracy.csv"))


def _fp8_rows(law) -> pd.DataFrame:
    rows = []
    for family in ("gdn", "mamba2"):
        for L in (4, 16):
            for step in (16, 64, 256, 1024, 4096):
                err = law(step // L)
                rows.append(dict(family=family, model="m", workload="realistic", method="replay_ar", buffer_len=L,
                                 spec_T=None, history_len=None, state_dtype="float8_e4m3fn", act_dtype="float32",
                                 step=step, status="ok", out_err_median=err, state_err_median=err))
    return pd.DataFrame(rows)


def test_fp8_drift_verdict_follows_the_rows():
    assert accuracy_report.fp8_claim_verdict(None)["verdict"] == accuracy_report.NOT_MEASURED
    sqrt_law = accuracy_report.fp8_claim_verdict(_fp8_rows(lambda f: 0.01 * np.sqrt(f)))
    assert sqrt_law["verdict"] == "consistent" and "e 0.50..0.50" in sqrt_law["value"]
    flat = accuracy_report.fp8_claim_verdict(_fp8_rows(lambda f: 0.03 + 0 * f))
    assert flat["verdict"] == "not consistent"
    drift = accuracy_report.fp8_drift(_fp8_rows(lambda f: 0.002 * f ** 0.8))
    assert np.allclose(drift.drift_exponent, 0.8) and set(drift.flushes) == {1024, 256}
