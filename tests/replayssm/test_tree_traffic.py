"""The byte model of tree speculation (replayssm.traffic.tree_traffic): a chain-shaped tree is the chain's
model plus the commit's moves; the native tree writes N states; STree writes one state a step."""

from __future__ import annotations

import pytest

from replayssm import traffic as tr
from replayssm.geometry import get_geometry


@pytest.mark.parametrize("model", ["nemotron3_super_120b", "qwen35_122b_a10b"])
@pytest.mark.parametrize("accepted", [1, 3, 4])
def test_chain_tree_is_the_chain_model(model, accepted):
    geom = get_geometry(model, tp=8)
    mamba = hasattr(geom, "dstate")
    chain = (tr.mamba2_replay_spec if mamba else tr.gdn_replay_spec)(geom, 16, 4, accepted)
    tree = tr.tree_traffic(geom, "replay_tree", 4, 4, accepted, 16)
    entry = (tr.mamba2_entry_bytes if mamba else tr.gdn_entry_bytes)(geom)
    assert tree.read == pytest.approx(chain.read + (accepted - 1) * entry)
    assert tree.write == pytest.approx(chain.write + (accepted - 1) * entry)
    assert tr.tree_cycle(16, 4, 4, accepted) == tr.spec_cycle(16, 4, accepted)


@pytest.mark.parametrize("model", ["nemotron3_super_120b", "qwen35_122b_a10b"])
def test_tree_methods_order(model):
    geom = get_geometry(model, tp=8)
    mamba = hasattr(geom, "dstate")
    state = (tr.mamba2_state_bytes if mamba else tr.gdn_state_bytes)(geom)
    native = tr.tree_traffic(geom, "native_tree", 15, 4, 3, 16)
    ring = tr.tree_traffic(geom, "replay_tree", 15, 4, 3, 16)
    stree = tr.tree_traffic(geom, "stree", 15, 4, 3, 16)
    crt = tr.tree_traffic(geom, "commit_replay_tree", 15, 4, 3, 16)
    assert native.write >= 15 * state
    assert state <= stree.write < 2 * state
    assert crt.read - stree.read == pytest.approx(state)
    assert ring.total < stree.total < native.total
    with pytest.raises(ValueError, match="method="):
        tr.tree_traffic(geom, "magic", 15, 4, 3, 16)
    with pytest.raises(ValueError):
        tr.tree_traffic(geom, "replay_tree", 15, 4, 5, 16)          # accepted > depth
