"""The KDA float64 oracle against FLA's naive recurrence (fla.ops.kda.naive.naive_recurrent_kda, grouped value
heads, state [K, V] per head), and the sensitivity of the tests to the per-channel decay."""

import pytest
import torch

from replayssm.gdn.ref import gdn_step_ref
from replayssm.geometry import KDAGeometry
from replayssm.kda import ReplayCache, SpecRing, replay_step, spec_verify
from replayssm.kda.inputs import random_state, random_step
from replayssm.kda.ref import kda_step_ref, window_ref
from replayssm.testing import rel_err

naive = pytest.importorskip("fla.ops.kda.naive", reason="FLA (flash-linear-attention) is not installed")

GROUPED = KDAGeometry(H=2, HV=4, K=16, V=24)
# FLA's naive recurrence runs in float32 (it casts its inputs): its error against float64 is ~1e-7 here
FLA_TOL = 1e-5


def _sequence(gm, batch, T, gen):
    S0 = random_state(gm, batch, generator=gen)
    steps = [random_step(gm, batch, generator=gen) for _ in range(T)]
    seq = {n: torch.stack([s[n] for s in steps], 1) for n in ("q", "k", "v", "g", "beta")}
    return S0, steps, seq


def test_step_ref_matches_fla_naive(gen):
    S0, steps, seq = _sequence(GROUPED, 3, 9, gen)
    o_fla, S_fla = naive.naive_recurrent_kda(*(seq[n].double() for n in ("q", "k", "v", "g", "beta")),
                                             initial_state=S0.double().transpose(-1, -2), output_final_state=True)
    S, outs = S0.double(), []
    for s in steps:
        S, o, _ = kda_step_ref(S, s["q"], s["k"], s["v"], s["g"], s["beta"])
        outs.append(o)
    assert rel_err(torch.stack(outs, 1), o_fla) <= FLA_TOL
    assert rel_err(S, S_fla.transpose(-1, -2)) <= FLA_TOL


def test_window_ref_matches_fla_naive(gen):
    S0, _, seq = _sequence(GROUPED, 2, 5, gen)
    states, o = window_ref(S0, seq["q"], seq["k"], seq["v"], seq["g"], seq["beta"], scale=0.4)
    o_fla, S_fla = naive.naive_recurrent_kda(seq["q"], seq["k"], seq["v"], seq["g"], seq["beta"], scale=0.4,
                                             initial_state=S0.transpose(-1, -2), output_final_state=True)
    assert rel_err(o, o_fla) <= FLA_TOL and rel_err(states[:, -1], S_fla.transpose(-1, -2)) <= FLA_TOL


def test_uniform_channels_reduce_to_gdn(gen):
    """A decay equal on every channel is GDN's scalar decay: the shared oracle gives GDN's step."""
    S0, steps, _ = _sequence(GROUPED, 2, 1, gen)
    s = steps[0]
    g_head = s["g"][..., 0]
    S_k, o_k, u_k = kda_step_ref(S0, s["q"], s["k"], s["v"], g_head[..., None].expand_as(s["g"]), s["beta"])
    S_g, o_g, u_g = gdn_step_ref(S0, s["q"], s["k"], s["v"], g_head, s["beta"])
    assert rel_err(o_k, o_g) <= 1e-14 and rel_err(S_k, S_g) <= 1e-14


@pytest.mark.parametrize("backend", ["ref", "torch", "triton", "cpu"])
def test_a_scalar_decay_is_detected(backend, gen):
    """The test inputs spread every head's channel decays widely: replacing g by its per-head mean (what a
    kernel that read one decay per head would do) moves the outputs by orders of magnitude above every
    tolerance, in AR decode and in a spec window, so the backend tests would catch such a kernel."""
    gm = GROUPED
    cache = ReplayCache.allocate(gm, 2, 4)
    cache.state.copy_(random_state(gm, 2, generator=gen))
    twin = cache.clone()
    for _ in range(3):
        s = random_step(gm, 2, generator=gen)
        o = replay_step(cache, **s, backend=backend)
        o_scalar = replay_step(twin, **{**s, "g": s["g"].mean(-1, keepdim=True).expand_as(s["g"]).contiguous()},
                               backend=backend)
        assert rel_err(o_scalar, o) > 1e-2
    ring = SpecRing.allocate(gm, 2, 4, 4)
    w = random_step(gm, 2, window=4, generator=gen)
    o = spec_verify(ring.clone(), **w, backend=backend)
    o_scalar = spec_verify(ring, **{**w, "g": w["g"].mean(-1, keepdim=True).expand_as(w["g"]).contiguous()},
                           backend=backend)
    assert rel_err(o_scalar, o) > 1e-2


def test_ref_refuses_a_scalar_gate():
    gm = GROUPED
    s = random_step(gm, 1)
    with pytest.raises(ValueError):
        kda_step_ref(torch.zeros(1, gm.HV, gm.V, gm.K), s["q"], s["k"], s["v"], s["g"][..., 0], s["beta"])
