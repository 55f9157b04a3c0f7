"""results/published/cells.csv: the committed record validates, is as large and as broad as issue 24 asks,
keeps the published losses and OOMs, and every claim of experiments/published.py is a view over its cells."""

from __future__ import annotations

import csv
import math

import pytest

from experiments import published
from experiments.published import CELL_COLUMNS, CLAIM_CELLS, CLAIMS, claim_cells, claim_value, load_cells

# The values the 19 claims carried as literals before they became views over the cells (issue 24): the cells
# must reproduce them exactly, so moving the numbers into cells.csv changed no claim.
FORMER_VALUES = {
    "headline_decode": (None, 1.8), "headline_spec": (None, 2.1), "kernel_ar_nemotron3": (1.43, 1.84),
    "kernel_ar_qwen35": (1.43, 1.64), "bell_nemotron3": (None, 8), "bell_qwen35": (None, 16),
    "e2e_ar": (None, 1.48), "spec_vs_standard": (1.87, 1.96), "spec_vs_native": (None, 2.14),
    "spec_gdn_bs512_native": (None, 2.10), "spec_gdn_bs512_ar": (None, 1.90),
    "spec_kernel_vs_native": (2.28, 3.33), "spec_cost_baseline_T6": (None, 4.85),
    "spec_cost_replay_T6": (1.27, 1.72), "concurrency": (3.0, 3.3), "byte_model": (None, 1.8),
    "bf16_state_accuracy": (None, 1.0), "fp8_checkpoint_drift": (None, 0.01),
    "fp8_checkpoint_logprob": (0.155, 0.267),
}


@pytest.fixture(scope="module")
def cells():
    return load_cells()


def test_committed_cells_validate_with_the_exact_columns(cells):
    assert tuple(cells.columns) == CELL_COLUMNS
    assert cells["value"].dtype == float and cells["batch"].dtype == "Int64"
    assert set(cells["level"]) <= set(published.LEVELS) and set(cells["mode"]) <= set(published.MODES)
    assert set(cells["provenance"]) <= set(published.PROVENANCE)


def test_at_least_120_cells_from_at_least_five_sources(cells):
    assert len(cells) >= 120
    assert cells["source"].nunique() >= 5
    # the primary sources issue 24 names are all present
    for src in ("vLLM PR #48018", "vLLM PR #48792", "vLLM PR #49887", "vLLM PR #47576", "vLLM RFC #47572",
                "vLLM PR #52962", "zz774ever/fp8-replayssm-gdn-kernel"):
        assert (cells["source"] == src).any(), src
    assert cells["source"].str.startswith("blog ").any()


def test_losses_and_ooms_are_kept(cells):
    speedups = cells[cells["metric"] == "speedup"]
    losses = speedups[speedups["value"] < 1]
    assert len(losses) >= 20
    # batch 1 loses at kernel level on both H100 and B300 (PR #48018), and end to end (PR #48792, RFC #47572)
    k1 = losses[(losses["source"] == "vLLM PR #48018") & (losses["level"] == "kernel") & (losses["batch"] == 1)]
    assert set(k1["hardware"]) == {"h100", "b300"}
    assert ((losses["level"] == "e2e") & (losses["batch"] == 1)).sum() >= 8
    ooms = cells[cells["metric"] == "oom"]
    assert len(ooms) >= 6 and (ooms["value"] == 1).all() and (ooms["unit"] == "flag").all()
    assert set(ooms["batch"]) == {512}
    # no OOM cell also carries a speedup at the same point of the same table
    key = ["source", "table", "model", "batch", "spec_T", "history_len", "baseline"]
    both = ooms[key].merge(speedups[key], on=key)
    assert both.empty


def test_inferred_and_derived_cells_say_why(cells):
    soft = cells[cells["provenance"] != "verbatim"]
    assert len(soft) > 0 and (soft["note"].str.len() > 10).all()


def _write(tmp_path, rows):
    path = tmp_path / "cells.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CELL_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def _good():
    return {c: "" for c in CELL_COLUMNS} | {
        "source": "vLLM PR #1", "table": "t", "model": "qwen35_4b", "hardware": "h100", "level": "e2e",
        "mode": "ar", "state_dtype": "fp32", "batch": "8", "baseline": "standard", "metric": "speedup",
        "value": "1.03", "unit": "x", "provenance": "verbatim"}


@pytest.mark.parametrize("change, message", [
    ({"level": "cluster"}, "level 'cluster'"),
    ({"mode": ""}, "empty mode"),
    ({"provenance": "guessed"}, "provenance 'guessed'"),
    ({"baseline": "vanilla"}, "baseline 'vanilla'"),
    ({"hardware": "H100"}, "hardware 'H100'"),
    ({"batch": "0"}, "batch '0'"),
    ({"metric": "speed"}, "metric 'speed'"),
    ({"value": "1.2x"}, "value '1.2x'"),
    ({"metric": "oom", "value": "0", "unit": "flag"}, "failure cell"),
    ({"provenance": "inferred"}, "needs a note"),
])
def test_a_bad_row_is_named(tmp_path, change, message):
    path = _write(tmp_path, [_good(), _good() | change])
    with pytest.raises(ValueError, match="row 3") as err:
        load_cells(path)
    assert message in str(err.value) and "vLLM PR #1" in str(err.value)


def test_wrong_columns_are_refused(tmp_path):
    path = tmp_path / "cells.csv"
    path.write_text("source,table,value\nx,y,1\n")
    with pytest.raises(ValueError, match="columns"):
        load_cells(path)


def test_vocabulary_accepts_ranges_and_acceptance_positions(tmp_path):
    rows = [_good() | {"metric": "speedup_max"}, _good() | {"metric": "acceptance_rate_pos_3", "unit": "conditional"},
            _good() | {"hardware": "h100|b300"}]
    assert len(load_cells(_write(tmp_path, rows))) == 3


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.key)
def test_each_claim_is_a_view_over_its_cells(claim):
    """Every claim finds its cell(s), and its published value is theirs (and equals its former literal)."""
    assert claim.key in CLAIM_CELLS
    found = claim_cells(claim.key)
    assert found, claim.key
    assert len(found) >= (2 if claim.kind == "range" else 1)
    derived = claim_value(claim.kind, claim.key)
    assert derived["hi"] == claim.hi and derived["lo"] == claim.lo
    lo, hi = FORMER_VALUES[claim.key]
    assert math.isclose(claim.hi, hi) and (claim.lo is None if lo is None else math.isclose(claim.lo, lo))


def test_claim_cells_cover_all_19_claims():
    assert len(CLAIMS) == 19 and set(CLAIM_CELLS) == {c.key for c in CLAIMS} == set(FORMER_VALUES)


def test_a_claim_without_its_cells_fails_loudly():
    rows = [r for r in published.read_cells() if r["source"] != "blog Fig 11"]
    with pytest.raises(ValueError, match="concurrency"):
        claim_value("range", "concurrency", rows)
