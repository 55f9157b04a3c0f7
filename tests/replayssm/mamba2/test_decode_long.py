"""Long ReplaySSM AR decode runs (replayssm/mamba2/decode.py) against the float64 plain recurrence.

Errors must not accumulate: outputs every step, and at every flush the stored checkpoint equals the
ground-truth state of that slot. The slots' cursors drift apart (null rows, permuted rows), so the slots
flush on different steps. torch: 1000+ steps; triton (interpreter): 100+ steps at a tiny shape, alternating
the two routes step by step (the cache protocol is the same for both).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.checks import NULL_SLOT
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2.cache import ReplayCache
from replayssm.mamba2.decode import materialize, replay_step
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.ref import ssm_step_ref
from replayssm.testing import assert_rel_close, poison_, tolerance

ROUTES = ("output_only", "state_and_output")


def long_run(gen, device, backend: str, geometry: Mamba2Geometry, num_slots: int, L: int, steps: int) -> int:
    """Returns the number of flushes checked."""
    cache = ReplayCache.allocate(geometry, num_slots, L, device=device)
    cache.state.copy_(random_state(geometry, num_slots, device=device, generator=gen))
    truth = cache.state.double()
    p = random_params(geometry, device, gen)
    tol = tolerance(torch.float32)
    flushes = 0
    for step in range(steps):
        slots = torch.randperm(num_slots, generator=gen).to(torch.int32)
        if step % 3 == 0:
            slots[int(torch.randint(num_slots, (1,), generator=gen))] = NULL_SLOT
        slots = slots.to(device)
        live = slots != NULL_SLOT
        live_slots = slots[live].long()
        inp = random_step(geometry, num_slots, device=device, generator=gen)
        flushing = live_slots[cache.write_pos[live_slots] == L - 1]
        out = poison_(torch.empty_like(inp["x"]))
        replay_step(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias,
                    slots=slots, route=ROUTES[step % 2], out=out, backend=backend)
        new, y_ref = ssm_step_ref(truth[live_slots], inp["x"][live], inp["dt"][live], p.A, inp["B"][live],
                                  inp["C"][live], p.D, inp["z"][live], p.dt_bias)
        truth[live_slots] = new
        assert_rel_close(f"y at step {step}", out[live], y_ref, tol)
        assert torch.isnan(out[~live]).all()
        if flushing.numel():
            flushes += flushing.numel()
            assert_rel_close(f"checkpoint at the flush of step {step}", cache.state[flushing], truth[flushing], tol)
    assert_rel_close("materialize at the end", materialize(cache, backend=backend), truth, tol)
    return flushes


@pytest.mark.slow
def test_torch_1000_steps(gen, device):
    flushes = long_run(gen, device, "torch", Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2), 3, 8, 1000)
    assert flushes > 200


@pytest.mark.slow
def test_triton_100_steps(gen, device):
    flushes = long_run(gen, device, "triton", Mamba2Geometry(nheads=2, headdim=16, dstate=16, ngroups=1), 2, 4, 100)
    assert flushes > 20
