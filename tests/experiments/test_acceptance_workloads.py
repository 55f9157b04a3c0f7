"""Published acceptance as a workload (issue 24, part 6): the named per-position profiles of MTP drafters on
GSM8K in experiments.harness.acceptance equal the cells of results/published/cells.csv, and sampling them on a
fixed seed reproduces each position's published acceptance within binomial error."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.harness.acceptance import WORKLOADS, parse_acceptance
from experiments.published import load_cells

# workload -> (cells.csv source, spec_T of the profile's cells, unit of its acceptance_rate_pos_<k> cells)
CELLS_OF = {"mtp_gsm8k_qwen3next": ("vLLM speculators PR #366", 4, "conditional"),
            "mtp8_gsm8k_inkling": ("vLLM PR #48892", 9, "%_of_drafts")}
SIGMAS = 5.0              # a binomial z-score bound: fixed seed, so the test is deterministic either way
STEPS, BATCH = 1000, 64   # 64,000 sampled verify windows


def _cells_profile(name: str) -> list[float]:
    src, T, unit = CELLS_OF[name]
    cells = load_cells()
    sel = cells[(cells["source"] == src) & (cells["spec_T"] == T) & (cells["unit"] == unit)
                & cells["metric"].str.startswith("acceptance_rate_pos_")]
    pos = sel["metric"].str.removeprefix("acceptance_rate_pos_").astype(int)
    values = sel["value"].to_numpy() / (100.0 if unit.startswith("%") else 1.0)
    assert sorted(pos) == list(range(len(pos))), f"{name}: positions {sorted(pos)}"
    return [float(v) for _, v in sorted(zip(pos, values))]


def test_every_workload_has_cells():
    assert set(WORKLOADS) == set(CELLS_OF)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_numbers_are_the_published_cells(name):
    assert list(WORKLOADS[name].published) == pytest.approx(_cells_profile(name), abs=1e-12)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_sampled_per_position_acceptance_matches_the_profile(name):
    """On a fixed seed, each position's sampled acceptance (in the source's own definition) lies within
    SIGMAS binomial standard errors of the published value, and the mean accepted count within its error."""
    w = WORKLOADS[name]
    acc = parse_acceptance(f"workload:{name}")
    T = len(w.published) + 1
    counts = acc.sample(T, BATCH, STEPS, torch.Generator().manual_seed(0))       # [steps, batch], 1..T
    drafts = (counts - 1).flatten().double()                                      # accepted drafts per window
    n = drafts.numel()
    for k, published in enumerate(w.published):
        if w.definition == "share_of_drafts":                   # P(at least k+1 drafts accepted)
            trials, hits = n, int((drafts >= k + 1).sum())
        else:                                                   # P(k accepted | 0..k-1 accepted)
            trials, hits = int((drafts >= k).sum()), int((drafts >= k + 1).sum())
        se = math.sqrt(published * (1 - published) / trials)
        assert abs(hits / trials - published) <= SIGMAS * se, f"{name} position {k}: {hits / trials} vs {published}"
    expected = acc.expected(T)
    se_mean = drafts.std().item() / math.sqrt(n)
    assert abs(drafts.mean().item() + 1 - expected) <= SIGMAS * se_mean


def test_profile_totals_match_the_published_summaries():
    """The sources' own summaries: Qwen3-Next's MeanAccepted 2.01, Inkling MTP 8's acceptance length 4.40."""
    cells = load_cells()

    def cell(name, metric):
        src, T, _ = CELLS_OF[name]
        return float(cells[(cells["source"] == src) & (cells["metric"] == metric)
                           & (cells["spec_T"] == T)]["value"].iloc[0])

    assert parse_acceptance("workload:mtp_gsm8k_qwen3next").expected(4) - 1 == pytest.approx(
        cell("mtp_gsm8k_qwen3next", "mean_accepted_drafts"), abs=0.005)
    assert parse_acceptance("workload:mtp8_gsm8k_inkling").expected(9) == pytest.approx(
        cell("mtp8_gsm8k_inkling", "acceptance_length"), abs=0.005)

def test_workload_labels_round_trip_and_bad_ones_are_named():
    acc = parse_acceptance({"kind": "workload", "name": "mtp_gsm8k_qwen3next"})
    assert acc.label == "workload:mtp_gsm8k_qwen3next" and parse_acceptance(acc.label) == acc
    with pytest.raises(ValueError, match=r"sweep.acceptance\[1\].name: unknown acceptance workload 'gsm9k'"):
        parse_acceptance({"kind": "workload", "name": "gsm9k"}, "sweep.acceptance[1]")
    with pytest.raises(ValueError, match="publishes 3 draft positions"):
        acc.sample(5, 2, 2, torch.Generator().manual_seed(0))
    acc.check_window(4)                                         # the profile's own window is fine
