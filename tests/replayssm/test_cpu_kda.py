"""The C AR kernels in KDA mode (replayssm/cpu: gdn_step / gdn_replay with pc = 1, a decay per key channel),
called directly through replayssm.cpu.ops against the float64 references: replayssm.gdn.decode_ref on a clone
of the cache (ReplaySSM AR) and replayssm.kda.ref.kda_step_ref on a float64 state (the baseline step).

The decays come from replayssm.kda.inputs.random_gate: the channels of one head span 0.1..0.999, so a kernel
that decays a head by one scalar, or a column by a neighbour's decay, is off by O(1). Every step maps rows to
permuted slots of a larger pool with NULL_SLOT rows among them and starts from desynchronised cursors;
outputs are poisoned with NaN so a row the kernel forgets fails.
"""

from __future__ import annotations

import pytest
import torch

from replayssm.checks import NULL_SLOT
from replayssm.cpu import ops
from replayssm.gdn import ReplayCache as GDNCache
from replayssm.gdn import decode_ref
from replayssm.gdn.ref import l2norm
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.kda import ReplayCache
from replayssm.kda.inputs import random_gate, random_state, random_step
from replayssm.kda.ref import kda_step_ref
from replayssm.testing import assert_rel_close, poison_, tolerance

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# 64-wide and 16-wide rebuild tiles and 8-lane exps (K 80); the plain loops and scalar exp tails (K 20)
GRID = KDAGeometry(H=2, HV=4, K=80, V=16)
ODD = KDAGeometry(H=1, HV=2, K=20, V=12)
ACT_STATE = [(F32, F32), (F32, BF16), (BF16, BF16), (F16, F32), (F16, F16)]


def _skip_without_fp16(*dtypes):
    if F16 in dtypes and not ops.has_fp16():
        pytest.skip("this C compiler has no _Float16: no fp16 kernels")


def _pools(gm, num_slots, L, act, state, gen):
    """A KDA cache with random checkpoints and a random number of valid buffered entries per slot (the cursors
    desynchronised, slot 0 one step from its flush), and its clone for the reference."""
    cache = ReplayCache.allocate(gm, num_slots, L, state_dtype=state, act_dtype=act)
    cache.state.copy_(random_state(gm, num_slots, generator=gen))
    cache.u.copy_(torch.randn(num_slots, gm.HV, L, gm.V, generator=gen) * 0.3)
    cache.k.copy_(l2norm(torch.randn(num_slots, gm.H, L, gm.K, generator=gen)))
    cache.g.copy_(random_gate((num_slots,), gm.HV * L, gm.K, gen).view(num_slots, gm.HV, L, gm.K))
    cache.write_pos.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
    cache.write_pos[0] = L - 1
    return cache, cache.clone()


def _slots(num_slots, batch, step, gen):
    """Rows -> a random choice of slots, about a quarter NULL_SLOT; slot 0 is live on every step (row step %
    batch), so from write_pos L - 1 it flushes at steps 0, L, 2L, ...: a run of L + 1 steps crosses two flushes
    by construction (the other slots step at random)."""
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    live = torch.rand(batch, generator=gen) < 0.75
    row = step % batch
    live[row] = True
    slots[slots == 0] = slots[row].clone()
    slots[row] = 0
    slots[~live] = NULL_SLOT
    return slots, live


def run_replay(gm, L, act, state, steps, gen, l2norm_qk=True, batch=3, extra=2):
    tol = tolerance(act, state)
    num_slots = batch + extra
    cache, ref = _pools(gm, num_slots, L, act, state, gen)
    scale = gm.K ** -0.5
    flushes = 0
    for step in range(steps):
        slots, live = _slots(num_slots, batch, step, gen)
        inp = random_step(gm, batch, act, use_qk_l2norm=l2norm_qk, generator=gen)
        out = poison_(torch.empty(batch, gm.HV, gm.V, dtype=act))
        out_ref = torch.zeros(batch, gm.HV, gm.V, dtype=torch.float64)
        before = cache.clone()
        ops.gdn_replay(cache, *inp.values(), scale, l2norm_qk, out, slots)
        decode_ref.replay_step_ref(ref, *inp.values(), scale, l2norm_qk, slots, out_ref)
        rows = live.nonzero().flatten()
        assert_rel_close(f"step {step} output", out[rows], out_ref[rows], tol, row_dims=2)
        assert torch.isnan(out[~live].float()).all(), "a NULL_SLOT row's output was written"
        idle = torch.ones(num_slots, dtype=torch.bool)
        idle[slots[live].long()] = False
        for name in ("state", "u", "k", "g", "write_pos"):
            assert torch.equal(getattr(cache, name)[idle], getattr(before, name)[idle]), \
                f"step {step}: {name} of a slot not in the batch changed"
        assert torch.equal(cache.write_pos, ref.write_pos), f"step {step}: cursors differ from the reference"
        flushes += int((before.write_pos[slots[live].long()] == L - 1).sum())
    assert flushes >= 2, "the run did not cross flushes"
    every = torch.arange(num_slots, dtype=torch.int32)
    got, want = (torch.empty(num_slots, gm.HV, gm.V, gm.K, dtype=torch.float64) for _ in range(2))
    decode_ref.materialize_ref(cache, every, got)
    decode_ref.materialize_ref(ref, every, want)
    assert_rel_close("materialized state", got, want, tol, row_dims=2)


@pytest.mark.parametrize("act, state", ACT_STATE)
@pytest.mark.parametrize("L", [1, 4, 16])
def test_kda_replay_matches_reference(L, act, state, gen):
    """Several buffer cycles (3L + 4 steps) from desynchronised cursors; every output, the untouched slots, the
    cursors and, at the end, checkpoint + buffer replayed."""
    _skip_without_fp16(act, state)
    run_replay(GRID, L, act, state, 3 * L + 4, gen, l2norm_qk=L != 4)


@pytest.mark.parametrize("act, state", [(F32, F32), (BF16, F32)])
def test_kda_replay_odd_widths(act, state, gen):
    """K, V not multiples of 8 or 16: the plain row loops and the scalar tails of the vector exps."""
    run_replay(ODD, 4, act, state, 14, gen, batch=2, extra=1)


def test_kda_replay_refuses_a_buffer_past_the_stack_arrays():
    cache = ReplayCache.allocate(ODD, 1, 128)
    inp = random_step(ODD, 1)
    before = cache.write_pos.clone()
    with pytest.raises(ValueError, match="buffer_len=128 exceeds 64"):
        ops.gdn_replay(cache, *inp.values(), 1.0, False, torch.empty(1, 2, 12), torch.zeros(1, dtype=torch.int32))
    assert torch.equal(cache.write_pos, before)


@pytest.mark.parametrize("act, state", ACT_STATE)
@pytest.mark.parametrize("gm", [GRID, ODD], ids=["K80", "K20"])
def test_kda_step_matches_reference(gm, act, state, gen):
    """The baseline step (read + write the state) over a strided pool: outputs and the states after 5 steps."""
    _skip_without_fp16(act, state)
    tol = tolerance(act, state)
    batch, num_slots = 3, 5
    pool = torch.zeros(2 * num_slots, gm.HV, gm.V, gm.K, dtype=state)[::2]     # padded outer stride
    pool.copy_(random_state(gm, num_slots, generator=gen))
    truth = pool.double()
    scale = gm.K ** -0.5
    for step in range(5):
        slots, live = _slots(num_slots, batch, step, gen)
        inp = random_step(gm, batch, act, use_qk_l2norm=step % 2 == 0, generator=gen)
        out = poison_(torch.empty(batch, gm.HV, gm.V, dtype=act))
        before = pool.clone()
        ops.gdn_step(pool, *inp.values(), scale, step % 2 == 0, out, slots)
        rows, sl = live.nonzero().flatten(), slots[live].long()
        S, o, _ = kda_step_ref(truth[sl], *(t[rows] for t in inp.values()), scale, step % 2 == 0)
        truth[sl] = S
        assert_rel_close(f"step {step} output", out[rows], o, tol, row_dims=2)
        assert torch.isnan(out[~live].float()).all(), "a NULL_SLOT row's output was written"
        idle = torch.ones(num_slots, dtype=torch.bool)
        idle[sl] = False
        assert torch.equal(pool[idle], before[idle]), f"step {step}: a slot not in the batch changed"
    assert_rel_close("states", pool, truth, tol, row_dims=2)


def test_gdn_and_kda_kernels_agree_on_channel_constant_decays(gen):
    """g constant across the K channels: the per-channel mode must give GDN's scalar mode's outputs, checkpoint
    and buffer (to fp32 rounding: the exps differ by an ulp), over flushes, for both kernels."""
    H, HV, K, V, L, batch = 2, 4, 64, 16, 4, 3
    gcache = GDNCache.allocate(GDNGeometry(H=H, HV=HV, K=K, V=V), batch, L)
    kcache = ReplayCache.allocate(KDAGeometry(H=H, HV=HV, K=K, V=V), batch, L)
    gcache.state.copy_(random_state(kcache.geometry, batch, generator=gen))
    kcache.state.copy_(gcache.state)
    gcache.write_pos.copy_(torch.tensor([L - 1, 0, 2], dtype=torch.int32))
    kcache.write_pos.copy_(gcache.write_pos)
    gstate, kstate = gcache.state.clone(), kcache.state.clone()
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    tol = tolerance(F32)
    for step in range(2 * L + 3):
        inp = random_step(kcache.geometry, batch, generator=gen)
        g_head = inp["g"][..., 0].contiguous()                    # [batch, HV]
        inp["g"] = g_head[..., None].expand(batch, HV, K).contiguous()
        ginp = dict(inp, g=g_head)
        for fn, a, b in ((ops.gdn_replay, gcache, kcache), (ops.gdn_step, gstate, kstate)):
            og, ok = (poison_(torch.empty(batch, HV, V)) for _ in range(2))
            fn(a, *ginp.values(), K ** -0.5, True, og, slots)
            fn(b, *inp.values(), K ** -0.5, True, ok, slots)
            assert_rel_close(f"step {step} {fn.__name__} output", ok[[0, 2]], og[[0, 2]], tol, row_dims=2)
            assert torch.isnan(ok[1]).all()
        assert_rel_close(f"step {step} checkpoint", kcache.state, gcache.state, tol, row_dims=2)
        assert_rel_close(f"step {step} buffer u", kcache.u, gcache.u, tol)
        assert torch.equal(kcache.g[..., 0], gcache.g) and torch.equal(kcache.write_pos, gcache.write_pos)
        assert_rel_close(f"step {step} step state", kstate, gstate, tol, row_dims=2)
