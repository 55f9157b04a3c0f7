"""The KDA baselines (fused recurrent step, native spec, commit-replay) vs the float64 serial recurrence, every
backend, and the ReplaySSM ring against them: the same outputs and committed states over random accept runs."""

import pytest
import torch

from baselines import kda_commit_replay as cr
from baselines import kda_recurrent_spec as native
from replayssm.checks import NULL_SLOT
from replayssm.geometry import KDAGeometry
from replayssm.kda import SpecRing, spec_commit, spec_materialize, spec_verify
from replayssm.kda.inputs import random_state, random_step
from replayssm.kda.ref import window_ref
from replayssm.testing import assert_rel_close, nan_like, tolerance

GM = KDAGeometry(H=2, HV=4, K=16, V=32)
BACKENDS = ["ref", "torch", "triton", "cpu"]
F32 = torch.float32


def _committed(method, cache):
    return cache.committed() if method == "native" else cache.state


@pytest.mark.parametrize("act_dtype", [F32, torch.float16])
@pytest.mark.parametrize("method", ["native", "commit_replay"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_baseline_spec_matches_ground_truth(backend, method, act_dtype, gen):
    T, num_slots = 3, 4
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    live = slots != NULL_SLOT
    S0 = random_state(GM, num_slots, generator=gen)
    if method == "native":
        cache = native.SpecStates.allocate(GM, num_slots, T)
        cache.state[:, 0] = S0
        verify, commit = native.spec_verify, native.spec_commit
    else:
        cache = cr.CommitReplayCache.allocate(GM, num_slots, T, act_dtype=act_dtype)
        cache.state.copy_(S0)
        verify, commit = cr.spec_verify, cr.spec_commit
    ring = SpecRing.allocate(GM, num_slots, 6, T, act_dtype=act_dtype)
    ring.state.copy_(S0)
    truth = S0[slots[live].long()].double()
    tol = tolerance(act_dtype)
    for step in range(4 if backend == "triton" else 8):
        x = random_step(GM, 3, act_dtype=act_dtype, window=T, generator=gen)
        states, o_ref = window_ref(truth, *(x[n][live] for n in ("q", "k", "v", "g", "beta")))
        out = nan_like(torch.empty(3, T, GM.HV, GM.V, dtype=act_dtype))
        verify(cache, **x, slots=slots, out=out, backend=backend)
        assert_rel_close(f"{method} output", out[live], o_ref, tol, row_dims=3)
        assert out[~live].isnan().all()
        o_ring = spec_verify(ring, **x, slots=slots, backend=backend)
        assert_rel_close("replay ring output", o_ring[live], o_ref, tol, row_dims=3)
        acc = torch.randint(1, T + 1, (3,), generator=gen, dtype=torch.int32)
        if step == 0:                        # a rollback to 1 token and a full accept on the live rows, forced
            acc[0], acc[2] = 1, T
        commit(cache, acc, slots=slots, backend=backend)
        spec_commit(ring, acc, slots=slots, backend=backend)
        truth = states[torch.arange(int(live.sum())), acc[live].long() - 1]
        assert_rel_close(f"{method} committed", _committed(method, cache)[slots[live].long()], truth, tol)
        assert_rel_close("ring committed", spec_materialize(ring, slots=slots[live], backend=backend), truth, tol)


def test_baselines_refuse_bad_g(gen):
    T = 2
    x = random_step(GM, 2, window=T, generator=gen)
    for cache, verify in ((native.SpecStates.allocate(GM, 2, T), native.spec_verify),
                          (cr.CommitReplayCache.allocate(GM, 2, T), cr.spec_verify)):
        with pytest.raises(ValueError):
            verify(cache, **{**x, "g": x["g"][..., 0].contiguous()}, backend="torch")   # scalar g per head
        with pytest.raises(ValueError):
            verify(cache, **{**x, "g": x["g"][..., 0].contiguous()}, backend="cpu")    # refused before the C call
    from baselines import gdn_commit_replay, gdn_recurrent_spec
    with pytest.raises(ValueError):
        gdn_recurrent_spec.spec_verify(native.SpecStates.allocate(GM, 2, T), **x, backend="torch")
    with pytest.raises(ValueError):
        gdn_commit_replay.spec_verify(cr.CommitReplayCache.allocate(GM, 2, T), **x, backend="torch")
