"""The KDA byte model (replayssm/traffic_kda.py): sizes against the caches' allocations, GDN's structure with
the per-channel g, and what the per-channel decay costs the ReplaySSM ratio."""

import pytest
import torch

from replayssm import traffic as tr
from replayssm.geometry import KDA_MODELS, GDNGeometry, KDAGeometry
from replayssm.kda import ReplayCache, SpecRing

KIMI = KDA_MODELS["kimi_linear_48b_a3b"]
SAME_HEADS = GDNGeometry(KIMI.H, KIMI.HV, KIMI.K, KIMI.V)


def test_entry_holds_a_k_vector_of_g():
    assert tr.kda_entry_bytes(KIMI) == 32 * 128 * 2 + 32 * 128 * 2 + 32 * 128 * 4 == 32_768
    assert tr.kda_entry_bytes(KIMI) - tr.gdn_entry_bytes(SAME_HEADS) == KIMI.HV * (KIMI.K - 1) * 4
    assert tr.kda_input_bytes(KIMI) - tr.gdn_input_bytes(SAME_HEADS) == KIMI.HV * (KIMI.K - 1) * 4
    assert tr.kda_state_bytes(KIMI) == tr.gdn_state_bytes(SAME_HEADS)


@pytest.mark.parametrize("L", [1, 4, 16])
def test_uniform_structure_matches_gdn(L):
    """Same reads and writes as GDN up to the g bytes (a flush step writes the state, others one entry)."""
    dg = KIMI.HV * (KIMI.K - 1) * 4
    for h in range(L):
        k, g = tr.kda_replay_ar(KIMI, L, h), tr.gdn_replay_ar(SAME_HEADS, L, h)
        assert k.read - g.read == (h + 1) * dg
        assert k.write - g.write == (0 if h == L - 1 else dg)
        assert k.flops > g.flops
    assert tr.kda_replay_ar(KIMI, L, L - 1).write == tr.kda_state_bytes(KIMI) + tr.kda_output_bytes(KIMI)


@pytest.mark.parametrize("L", [4, 8, 16, 32])
def test_ratio_below_gdn_at_the_same_head_shape(L):
    """The per-channel g makes every buffered entry dearer: the ReplaySSM bound is lower than GDN's, still > 1."""
    kda = tr.kda_baseline_ar(KIMI).total / tr.kda_replay_ar_cycle(KIMI, L).total
    gdn = tr.gdn_baseline_ar(SAME_HEADS).total / tr.gdn_replay_ar_cycle(SAME_HEADS, L).total
    assert 1.0 < kda < gdn


def test_spec_and_commit_replay():
    sp = tr.kda_replay_spec(KIMI, 16, 4, 3)
    assert tr.kda_baseline_spec(KIMI, 4).total > sp.total
    cr = tr.kda_commit_replay_spec(KIMI, 4, 3)
    assert cr.read == 2 * tr.kda_state_bytes(KIMI) + 4 * tr.kda_input_bytes(KIMI) + 3 * tr.kda_stash_bytes(KIMI)
    assert tr.tree_traffic(KIMI, "native_tree", 4, 4, 3).total == tr.kda_baseline_spec(KIMI, 4).total
    assert tr.tree_traffic(KIMI, "replay_tree", 7, 3, 2).total > 0
    with pytest.raises(ValueError):
        tr.kda_replay_ar(SAME_HEADS, 4, 0)                  # a GDN geometry is not a KDA one
    with pytest.raises(ValueError):
        tr.kda_replay_spec(KIMI, 16, 4, 3, state_bytes=3)
    with pytest.raises(AttributeError):
        tr.kda_nonexistent   # noqa: B018


@pytest.mark.parametrize("state_dtype,state_bytes", [(torch.float32, 4), (torch.float16, 2)])
def test_footprint_matches_the_caches(state_dtype, state_bytes):
    gm = KDAGeometry(H=2, HV=4, K=32, V=16)
    cache = ReplayCache.allocate(gm, 3, 8, state_dtype=state_dtype, act_dtype=torch.float16)
    fp = tr.cache_footprint("replay_ar", gm, L=8, state_bytes=state_bytes)
    assert fp.total == cache.nbytes() // 3
    ring = SpecRing.allocate(gm, 3, 12, 4, state_dtype=state_dtype, act_dtype=torch.float16)
    fp = tr.cache_footprint("replay_spec", gm, B_hist=12, T=4, state_bytes=state_bytes)
    assert fp.total == ring.nbytes() // 3
