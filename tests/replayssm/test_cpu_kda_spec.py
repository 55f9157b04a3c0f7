"""The fused CPU kernels of Kimi Delta Attention's speculative methods: the GDN C kernels with a per-key-channel
decay (pc = 1, replayssm/cpu/gdn_spec_body.h), called through replayssm/cpu/ops.py on the KDA caches.

Each kernel runs on a cache while the float64 oracle (replayssm/gdn/spec_ref.py for the ring and trees, the
baselines' ref backends for native and commit-replay) runs on a clone, over random accept / rollback runs:
outputs (NaN-poisoned first) and every cache entry held to the dtype's relative tolerance, NULL_SLOT rows and
unlisted slots untouched. Cursors move with the public commits on backend="torch" (cursor and ring-entry
work, no state). The decays come from kda.inputs.random_gate (channels spread over 0.1..0.999 per token) plus
channels at e^-30 per token, so a kernel that used one decay per head fails by O(1) (checked below on the
oracle itself), and a GDN-shaped decay broadcast to every channel must give GDN's kernel's result.
"""

from __future__ import annotations

import pytest
import torch

from baselines import gdn_commit_replay, gdn_recurrent_spec, kda_commit_replay, kda_recurrent_spec
from replayssm import gdn, kda
from replayssm.checks import NULL_SLOT
from replayssm.cpu import ops
from replayssm.gdn import spec_ref
from replayssm.geometry import GDNGeometry, KDAGeometry
from replayssm.kda.inputs import random_state, random_step
from replayssm.testing import assert_rel_close, rel_err, tolerance
from tests.replayssm.tree_cases import SHAPES, depth_of, random_commit

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SMALL = KDAGeometry(H=2, HV=4, K=32, V=16)
ODD = KDAGeometry(H=1, HV=2, K=20, V=12)        # K % 16 != 0: the kernels' plain-loop paths and the exp tail
DTYPES = [(F32, F32), (BF16, BF16), (F32, BF16)] + ([(F16, F16)] if torch.float16 in ops.supported_dtypes() else [])
FIELDS = {"ring": ("state", "u", "k", "g"), "native": ("state",), "cr": ("state", "k", "v", "g", "beta")}


def _window(gm, batch, T, act, gen, l2):
    x = random_step(gm, batch, act_dtype=act, window=T, use_qk_l2norm=l2, generator=gen)
    x["g"][:, :, :, ::3] = -30.0      # channels decayed to ~e^-120 over a window of 4: exp(G_s) exp(-G_c) overflows
    return x


def _ring(gm, num_slots, B, T, gen, act=F32, state=F32):
    ring = kda.SpecRing.allocate(gm, num_slots, B, T, state_dtype=state, act_dtype=act)
    ring.state.copy_(random_state(gm, num_slots, dtype=state, generator=gen))
    ring.origin.copy_(torch.randint(0, ring.ring_len, (num_slots,), generator=gen, dtype=torch.int32))
    return ring


def _slots(num_slots, batch, gen):
    """Desynchronised rows: shuffled slots, one NULL_SLOT row, one slot never listed."""
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    slots[1] = NULL_SLOT
    return slots


def _check_caches(cache, twin, fields, tol, what):
    for name in fields:
        assert_rel_close(f"{what}: {name}", getattr(cache, name), getattr(twin, name), tol)


def _untouched(cache, before, slots, fields):
    listed = set(slots[slots != NULL_SLOT].tolist())
    for s in range(cache.num_slots):
        if s not in listed:
            for name in fields:
                assert torch.equal(getattr(cache, name)[s], getattr(before, name)[s]), f"slot {s} {name} written"


def _verify(ring, x, out, slots, l2, parents=None):
    scale = ring.geometry.K ** -0.5
    if parents is None:
        ops.gdn_spec_replay(ring, x["q"], x["k"], x["v"], x["g"], x["beta"], scale, l2, out, slots)
    else:
        ops.gdn_tree_replay(ring, x["q"], x["k"], x["v"], x["g"], x["beta"], scale, l2, out, slots, parents)
    return out


@pytest.mark.parametrize("act,state", DTYPES)
@pytest.mark.parametrize("gm,T,B,l2", [(SMALL, 4, 8, True), (SMALL, 2, 4, False), (ODD, 3, 6, True)])
def test_ring_verify_matches_oracle(gm, T, B, l2, act, state, gen):
    """gdn_spec_replay on a KDA ring vs the float64 oracle on a clone: random accepted counts, early flushes,
    windows across the ring's end."""
    batch, num_slots = 4, 5
    ring = _ring(gm, num_slots, B, T, gen, act, state)
    twin, before = ring.clone(), ring.clone()
    slots = _slots(num_slots, batch, gen)
    live, tol = slots != NULL_SLOT, tolerance(act, state)
    folds = wraps = 0
    for step in range(16):
        sl = slots[live].long()
        folds += int(((ring.is_flush[sl] != 0) & (ring.write_pos[sl] > 0)).sum())
        wraps += int((ring.origin[sl] + ring.write_pos[sl] + T > ring.ring_len).sum())
        x = _window(gm, batch, T, act, gen, l2)
        out = _verify(ring, x, torch.full((batch, T, gm.HV, gm.V), float("nan"), dtype=act), slots, l2)
        ref = spec_ref.verify_ref(twin, **x, scale=gm.K ** -0.5, use_qk_l2norm=l2, slots=slots,
                                  out=torch.empty_like(out))
        assert_rel_close(f"step {step} output", out[live], ref[live], tol, row_dims=3)
        assert out[~live].isnan().all(), "a NULL_SLOT row's output was written"
        _check_caches(ring, twin, FIELDS["ring"], tol, f"step {step}")
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        for r in (ring, twin):
            kda.spec_commit(r, acc, slots=slots, backend="torch")
    assert folds > 0 and wraps > 0
    _untouched(ring, before, slots, (*FIELDS["ring"], "write_pos", "origin", "is_flush"))


@pytest.mark.parametrize("act,state", [(F32, F32), (BF16, BF16)])
@pytest.mark.parametrize("shape", ["random", "star", "binary"])
def test_tree_verify_matches_oracle(shape, act, state, gen):
    """gdn_tree_replay on a KDA ring vs the oracle's path recurrence; branches committed by tree_commit (its
    early-flush rule keeps write_pos + N <= L)."""
    gm, N, batch, num_slots = SMALL, 6, 3, 4
    trees = [SHAPES[shape](N, gen) for _ in range(batch)]
    parents = torch.tensor(trees, dtype=torch.int32)
    ring = _ring(gm, num_slots, 8, N, gen, act, state)
    twin, before = ring.clone(), ring.clone()
    slots = _slots(num_slots, batch, gen)
    live, tol = slots != NULL_SLOT, tolerance(act, state)
    folds = 0
    for step in range(10):
        sl = slots[live].long()
        folds += int(((ring.is_flush[sl] != 0) & (ring.write_pos[sl] > 0)).sum())
        x = _window(gm, batch, N, act, gen, True)
        out = _verify(ring, x, torch.full((batch, N, gm.HV, gm.V), float("nan"), dtype=act), slots, True, parents)
        ref = spec_ref.verify_ref(twin, **x, scale=gm.K ** -0.5, use_qk_l2norm=True, slots=slots,
                                  out=torch.empty_like(out), parents=parents)
        assert_rel_close(f"step {step} node outputs", out[live], ref[live], tol, row_dims=3)
        assert out[~live].isnan().all()
        _check_caches(ring, twin, FIELDS["ring"], tol, f"step {step}")
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        for r in (ring, twin):
            kda.tree_commit(r, path, acc, slots=slots, backend="torch", parents=parents)
    assert folds > 0
    _untouched(ring, before, slots, FIELDS["ring"])


@pytest.mark.parametrize("act,state", DTYPES)
@pytest.mark.parametrize("method", ["native", "cr"])
def test_serial_baselines_match_oracle(method, act, state, gen):
    """gdn_spec_native on KDA snapshots, gdn_cr_verify + gdn_cr_commit on a KDA commit-replay cache, vs the
    baselines' float64 ref backend on a clone, over random accepted counts."""
    gm, T, batch, num_slots = SMALL, 4, 4, 5
    if method == "native":
        mod = kda_recurrent_spec
        cache = mod.SpecStates.allocate(gm, num_slots, T, state_dtype=state)
        cache.state[:, 0] = random_state(gm, num_slots, dtype=state, generator=gen)
    else:
        mod = kda_commit_replay
        cache = mod.CommitReplayCache.allocate(gm, num_slots, T, state_dtype=state, act_dtype=act)
        cache.state.copy_(random_state(gm, num_slots, dtype=state, generator=gen))
    twin, before = cache.clone(), cache.clone()
    slots = _slots(num_slots, batch, gen)
    live, tol = slots != NULL_SLOT, tolerance(act, state)
    for step in range(8):
        x = _window(gm, batch, T, act, gen, True)
        out = torch.full((batch, T, gm.HV, gm.V), float("nan"), dtype=act)
        verify = ops.gdn_spec_native if method == "native" else ops.gdn_cr_verify
        verify(cache, x["q"], x["k"], x["v"], x["g"], x["beta"], gm.K ** -0.5, True, out, slots)
        ref = mod.spec_verify(twin, **x, use_qk_l2norm=True, slots=slots, backend="ref")
        assert_rel_close(f"step {step} output", out[live], ref[live], tol, row_dims=3)
        assert out[~live].isnan().all()
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        if method == "native":
            for c in (cache, twin):
                mod.spec_commit(c, acc, slots=slots, backend="torch")
        else:
            ops.gdn_cr_commit(cache, acc, slots)
            mod.spec_commit(twin, acc, slots=slots, backend="ref")
        _check_caches(cache, twin, FIELDS[method], tol, f"step {step}")
    _untouched(cache, before, slots, FIELDS[method])


def test_inputs_tell_a_per_channel_decay_from_a_scalar(gen):
    """The oracle on these inputs and on the same decays averaged over the channels (what a kernel that kept
    one decay per head would compute) differ far beyond the fp32 tolerance. Breaking the C kernel's
    per-channel exps on purpose fails test_ring_verify_matches_oracle (replayssm/cpu/README.md)."""
    gm, T = SMALL, 4
    ring = _ring(gm, 2, 8, T, gen)
    ring.write_pos.fill_(3)
    ring.g.copy_(random_step(gm, 2 * ring.ring_len, window=1, generator=gen)["g"].reshape(ring.g.shape))
    x = _window(gm, 2, T, F32, gen, True)
    outs = []
    for g in (x["g"], x["g"].mean(-1, keepdim=True).expand_as(x["g"]).contiguous()):
        twin = ring.clone()
        outs.append(spec_ref.verify_ref(twin, **{**x, "g": g}, scale=gm.K ** -0.5, use_qk_l2norm=True,
                                        slots=torch.arange(2, dtype=torch.int32),
                                        out=torch.empty(2, T, gm.HV, gm.V)))
    assert rel_err(outs[1], outs[0]) > 1000 * tolerance(F32)


@pytest.mark.parametrize("method", ["ring", "tree", "native", "cr"])
def test_constant_channels_match_gdn(method, gen):
    """A KDA decay equal on every channel is GDN's scalar decay: the KDA (pc = 1) and GDN (pc = 0) paths of
    each kernel agree to fp32 rounding over verifies, flushes and commits."""
    kg, T, batch = SMALL, 4, 3
    gg = GDNGeometry(H=kg.H, HV=kg.HV, K=kg.K, V=kg.V)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]], dtype=torch.int32)
    path = torch.tensor([[0, 1, 3, -1], [0, 1, 2, 3], [0, 3, -1, -1]], dtype=torch.int32)    # a branch per tree
    S0 = random_state(kg, 3, generator=gen)
    if method in ("ring", "tree"):
        caches = [kda.SpecRing.allocate(kg, 3, 8, T), gdn.SpecRing.allocate(gg, 3, 8, T)]
    elif method == "native":
        caches = [kda_recurrent_spec.SpecStates.allocate(kg, 3, T), gdn_recurrent_spec.SpecStates.allocate(gg, 3, T)]
    else:
        caches = [kda_commit_replay.CommitReplayCache.allocate(kg, 3, T),
                  gdn_commit_replay.CommitReplayCache.allocate(gg, 3, T)]
    for c in caches:
        (c.state[:, 0] if method == "native" else c.state).copy_(S0)
    live = slots != NULL_SLOT
    for step in range(6):
        x = _window(kg, batch, T, F32, gen, True)
        g1 = x["g"][..., 0].contiguous()                         # [batch, T, HV]
        outs = []
        for c, g in zip(caches, (g1[..., None].expand_as(x["g"]).contiguous(), g1)):
            out = torch.full((batch, T, kg.HV, kg.V), float("nan"))
            args = (c, x["q"], x["k"], x["v"], g, x["beta"], kg.K ** -0.5, True, out, slots)
            {"ring": ops.gdn_spec_replay, "native": ops.gdn_spec_native, "cr": ops.gdn_cr_verify,
             "tree": lambda *a: ops.gdn_tree_replay(*a, parents)}[method](*args)
            outs.append(out)
        assert rel_err(outs[0][live], outs[1][live]) <= 1e-6, f"step {step}"
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        if method == "tree":
            acc = torch.minimum(acc, (path >= 0).sum(1).to(torch.int32))
        for c, fam in zip(caches, (kda, gdn)):
            if method == "ring":
                fam.spec_commit(c, acc, slots=slots, backend="torch")
            elif method == "tree":
                fam.tree_commit(c, path, acc, slots=slots, backend="torch", parents=parents)
            elif method == "native":
                c.last[slots[live].long()] = acc[live] - 1
            else:
                ops.gdn_cr_commit(c, acc, slots)
        assert rel_err(caches[0].state, caches[1].state) <= 1e-6


def test_wrong_decay_layout_is_refused_before_any_work(gen):
    gm, T = SMALL, 2
    ring = _ring(gm, 2, 4, T, gen)
    before = ring.clone()
    x = _window(gm, 2, T, F32, gen, True)
    out = torch.full((2, T, gm.HV, gm.V), float("nan"))
    slots = torch.arange(2, dtype=torch.int32)
    for g, match in ((x["g"][..., 0].contiguous(), "different families"),            # GDN's g on a KDA ring
                     (x["g"][..., :gm.K - 1].contiguous(), "KDA g must be"),
                     (x["g"][..., None], "must be \\[batch, T, HV\\]")):
        with pytest.raises(ValueError, match=match):
            ops.gdn_spec_replay(ring, x["q"], x["k"], x["v"], g, x["beta"], 1.0, True, out, slots)
    with pytest.raises(ValueError, match="different families"):
        ops.gdn_tree_replay(ring, x["q"], x["k"], x["v"], x["g"][..., 0].contiguous(), x["beta"], 1.0, True, out,
                            slots, torch.tensor([[-1, 0]] * 2, dtype=torch.int32))
    assert out.isnan().all()
    for name in ("state", "u", "k", "g", "write_pos"):
        assert torch.equal(getattr(ring, name), getattr(before, name))
