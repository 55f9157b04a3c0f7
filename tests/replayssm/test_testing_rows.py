"""The per-row check of replayssm.testing: one bad head cannot hide under the pooled tolerance."""

import pytest
import torch

from replayssm.testing import ROW_SLACK, assert_rel_close, rel_err, row_rel_err, tolerance


def test_one_wrong_head_hides_in_the_pooled_error_but_not_in_its_row(gen):
    ref = torch.randn(4, 64, 16, 16, generator=gen, dtype=torch.float64)
    out = ref.clone()
    out[2, 17] *= 1.1                                 # one head of 256 is 10 % off
    tol = tolerance(torch.bfloat16)
    assert rel_err(out, ref) <= tol                   # pooled: 10 % / 16 = 0.6 %, under bf16's 1.6 %
    assert_rel_close("pooled only", out, ref, tol)
    rows = row_rel_err(out, ref, 2)
    assert rows.shape == (256,) and int(rows.argmax()) == 2 * 64 + 17
    with pytest.raises(AssertionError, match=r"row 145 of \(4, 64\)"):
        assert_rel_close("per row", out, ref, tol, row_dims=2)


def test_rounding_error_passes_and_near_zero_rows_use_the_floor(gen):
    ref = torch.randn(3, 8, 32, generator=gen, dtype=torch.float64)
    ref[1, 3] *= 1e-9                                 # a decayed head: its relative error would be noise
    out = ref.to(torch.bfloat16)
    assert_rel_close("bf16 rounding", out, ref, tolerance(torch.bfloat16), row_dims=2)
    assert row_rel_err(out, ref, 2).max() <= ROW_SLACK * tolerance(torch.bfloat16)
    out = out.double()
    out[0, 0, 0] = float("nan")
    assert row_rel_err(out, ref, 2)[0] == float("inf")
    with pytest.raises(ValueError, match="row_dims"):
        row_rel_err(out, ref, 4)
