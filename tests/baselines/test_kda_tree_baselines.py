"""The tree baselines on KDA (baselines/native_tree_spec.py, commit_replay_tree.py with g [batch, N, HV, K]):
verify outputs equal ReplaySSM's KDA tree on the float64 reference, commit leaves the accepted branch's state,
and a per-head decay broadcast over K is not what they compute (a scalar-decay bug must fail)."""

import pytest
import torch

from baselines import commit_replay_tree as crt
from baselines import native_tree_spec as nts
from replayssm import kda
from replayssm.geometry import KDAGeometry
from replayssm.kda.inputs import random_state, random_step

GEO = KDAGeometry(H=2, HV=4, K=16, V=8)
PARENTS = torch.tensor([-1, 0, 0, 1, 2, 2], dtype=torch.int32)        # a binary-ish tree of 6 nodes, depth 3


def _setup(gen, batch=3):
    state = random_state(GEO, batch, generator=gen)
    win = random_step(GEO, batch, window=len(PARENTS), use_qk_l2norm=True, generator=gen)
    ring = kda.SpecRing.allocate(GEO, batch, history_len=8, window=len(PARENTS))
    ring.state.copy_(state)
    want = kda.tree_verify(ring, **win, use_qk_l2norm=True, parents=PARENTS, backend="ref")
    return state, win, ring, want


@pytest.mark.parametrize("module", [nts, crt], ids=["native_tree", "commit_replay_tree"])
def test_kda_tree_baselines_match_the_replayssm_tree(module, gen):
    state, win, ring, want = _setup(gen)
    if module is nts:
        cache = nts.TreeSnapshots.allocate(GEO, 3, len(PARENTS))
        cache.snapshots[:, 0] = state
    else:
        cache = crt.TreeReplayCache.allocate(GEO, 3, len(PARENTS))
        cache.state.copy_(state)
    got = module.kda_tree_verify(cache, **win, use_qk_l2norm=True, parents=PARENTS, backend="torch")   # fp32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    path = torch.tensor([[0, 2, 5], [0, 1, 3], [0, 2, 4]], dtype=torch.int32)
    acc = torch.tensor([3, 2, 1], dtype=torch.int32)
    module.tree_commit(cache, path, acc, backend="torch")
    kda.tree_commit(ring, path, acc, backend="ref")
    committed = cache.committed(torch.arange(3)) if module is nts else crt.committed(cache, torch.arange(3))
    torch.testing.assert_close(committed, kda.spec_materialize(ring, backend="ref").to(committed.dtype),
                               rtol=1e-4, atol=1e-5)


def test_a_per_head_decay_is_not_the_kda_tree(gen):
    state, win, _, want = _setup(gen)
    scalar = dict(win, g=win["g"].mean(-1, keepdim=True).expand_as(win["g"]).contiguous())
    snap = nts.TreeSnapshots.allocate(GEO, 3, len(PARENTS))
    snap.snapshots[:, 0] = state
    got = nts.kda_tree_verify(snap, **scalar, use_qk_l2norm=True, parents=PARENTS, backend="ref")
    assert (got - want).abs().max() > 1e-2
