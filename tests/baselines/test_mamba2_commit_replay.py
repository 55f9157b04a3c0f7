"""Commit-time replay baseline (FlashInfer / TensorRT style): verify from a frozen checkpoint, replay the
accepted prefix at commit. Ground truth: replayssm.mamba2.ref.window_ref (float64) over the accepted stream,
rounded to the state dtype once per commit (the only place the method stores a state)."""

from __future__ import annotations

import pytest
import torch

from baselines.mamba2_commit_replay import CommitReplayCache, spec_commit, spec_reset, spec_verify
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.mamba2.ref import process_dt, window_ref
from replayssm.testing import nan_like, rel_err, tolerance

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
GEOM = Mamba2Geometry(nheads=4, headdim=20, dstate=16, ngroups=2)
GEOM_TINY = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=2)


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """Same values; batch and T axes swapped in memory and the last dim padded (unit stride kept)."""
    buf = torch.full((t.shape[1], t.shape[0], *t.shape[2:-1], t.shape[-1] + 3), float("nan"), dtype=t.dtype,
                     device=t.device)
    view = buf.transpose(0, 1)[..., :t.shape[-1]]
    view.copy_(t)
    return view


def window_inputs(geom, batch, T, act_dtype, device, gen, strided=False):
    inp = random_step(geom, batch, act_dtype=act_dtype, device=device, window=T, generator=gen)
    if strided:
        inp = {k: v if k == "dt" else strided_copy(v) for k, v in inp.items()}
        inp["dt"] = inp["dt"].transpose(0, 1).contiguous().transpose(0, 1)
    return inp


def run_commit_replay_stream(backend, T, state_dtype, act_dtype, steps, geom, batch, num_slots, gen, device):
    """`steps` verify+commit rounds, random accepted counts, rows remapped to random slots every step with one
    padded row. Checks: outputs, checkpoint frozen during verify, the stash, the checkpoint after commit."""
    params = random_params(geom, device=device, generator=gen)
    cache = CommitReplayCache.allocate(geom, num_slots, T, state_dtype=state_dtype, act_dtype=act_dtype,
                                       device=device)
    cache.state.copy_(random_state(geom, num_slots, dtype=state_dtype, device=device, generator=gen))
    spec_reset(cache, backend=backend)
    truth = cache.state.double().clone()
    tol = tolerance(state_dtype, act_dtype)
    committed_counts = set()
    for step in range(steps):
        if step % 3 == 0:                                    # default slots: row b -> slot b
            slots, rows = None, list(range(batch))
            live = rows
        else:
            slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
            slots[int(torch.randint(batch, (1,), generator=gen))] = NULL_SLOT
            slots = slots.to(device)
            rows = [r for r in range(batch) if int(slots[r]) != NULL_SLOT]
            live = [int(slots[r]) for r in rows]
        others = [s for s in range(num_slots) if s not in live]
        inp = window_inputs(geom, batch, T, act_dtype, device, gen, strided=step % 2 == 1)
        snaps, y_ref = window_ref(truth[live], inp["x"][rows], inp["dt"][rows], params.A, inp["B"][rows],
                                  inp["C"][rows], params.D, inp["z"][rows], params.dt_bias)
        checkpoint = cache.state.clone()
        stash_before = (cache.x.clone(), cache.B.clone(), cache.dt.clone())
        out = nan_like(torch.empty(batch, T, geom.nheads, geom.headdim, dtype=act_dtype, device=device))
        spec_verify(cache, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"], params.dt_bias,
                    slots=slots, out=out, backend=backend)
        assert rel_err(out[rows], y_ref) <= tol
        assert torch.isnan(out[[r for r in range(batch) if r not in rows]]).all()
        assert torch.equal(cache.state, checkpoint)                                # frozen during verify
        assert torch.equal(cache.x[live], inp["x"][rows].transpose(1, 2))          # stash: exact copies
        assert torch.equal(cache.B[live], inp["B"][rows].transpose(1, 2))
        dt_ref = process_dt(inp["dt"][rows], params.dt_bias, True).transpose(1, 2)
        assert rel_err(cache.dt[live], dt_ref) <= 1e-6
        for stash, old in zip((cache.x, cache.B, cache.dt), stash_before):
            assert torch.equal(stash[others], old[others])

        accepted = torch.randint(1, T + 1, (batch,), generator=gen)
        if step == 0:                        # every row live: a rollback to 1 token and a full accept, forced
            accepted[0], accepted[-1] = 1, T
        accepted = accepted.to(device)
        spec_commit(cache, accepted, params.A, slots=slots, backend=backend)
        acc_live = accepted[rows].long().cpu()
        committed_counts.update(acc_live.tolist())
        truth[live] = snaps[torch.arange(len(rows)), acc_live - 1].to(state_dtype).double()
        assert rel_err(cache.state[live], truth[live]) <= tol        # checkpoint = committed ground truth
        assert torch.equal(cache.state[others], checkpoint[others])
    assert {1, T} <= committed_counts, committed_counts


@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F16, F16), (F32, BF16), (BF16, F32)],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_commit_replay_rollback_stream(backend, T, state_dtype, act_dtype, gen, device):
    run_commit_replay_stream(backend, T, state_dtype, act_dtype, 40, GEOM, 3, 4, gen, device)


@pytest.mark.parametrize("state_dtype,act_dtype", [(F32, F32), (F16, F16), (BF16, F32)],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("T", [2, 4])
def test_commit_replay_rollback_stream_triton(T, state_dtype, act_dtype, gen, device):
    if state_dtype == BF16 and interpreter_active():
        pytest.skip("bf16 state: the Triton interpreter computes on raw bits (GPU-only case)")
    run_commit_replay_stream("triton", T, state_dtype, act_dtype, 3, GEOM_TINY, 2, 3, gen, device)


@pytest.mark.parametrize("backend", ["torch", "ref", "cpu"])
def test_commit_replay_production_geometry(backend, gen, device):
    """Super-120B full width, T = 4, every accepted count once (a row per count, dense slots)."""
    geom, T = get_geometry("nemotron3_super_120b"), 4
    params = random_params(geom, device=device, generator=gen)
    cache = CommitReplayCache.allocate(geom, T, T, device=device)
    cache.state.copy_(random_state(geom, T, device=device, generator=gen))
    inp = window_inputs(geom, T, T, F32, device, gen)
    snaps, y_ref = window_ref(cache.state, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"],
                              params.dt_bias)
    y = spec_verify(cache, inp["x"], inp["dt"], params.A, inp["B"], inp["C"], params.D, inp["z"], params.dt_bias,
                    backend=backend)
    assert rel_err(y, y_ref) <= tolerance(F32)
    accepted = torch.arange(1, T + 1, device=device)
    spec_commit(cache, accepted, params.A, backend=backend)
    assert rel_err(cache.state, snaps[torch.arange(T), accepted.cpu() - 1]) <= tolerance(F32)


def test_commit_replay_footprint():
    geom, T = get_geometry("nemotron3_super_120b"), 4
    cache = CommitReplayCache.allocate(geom, 2, T, act_dtype=BF16, device="meta")
    per_slot = geom.state_numel() * 4 + T * (geom.nheads * geom.headdim * 2 + geom.ngroups * geom.dstate * 2
                                             + geom.nheads * 4)
    assert cache.nbytes() == 2 * per_slot


def test_commit_replay_bad_input_raises_before_launch(gen):
    geom, T = GEOM_TINY, 2
    p = random_params(geom, generator=gen)
    cache = CommitReplayCache.allocate(geom, 3, T)
    good = window_inputs(geom, 2, T, F32, "cpu", gen)
    bad = [
        dict(good, x=good["x"][:, :1]),                                     # window length != T
        dict(good, x=good["x"].half(), z=good["z"].half(), B=good["B"].half(), C=good["C"].half()),  # != cache
        dict(good, C=good["C"][..., :8]),
        dict(good, dt=good["dt"][:1]),
    ]
    for inp in bad:
        with pytest.raises(ValueError):
            spec_verify(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias)
    with pytest.raises(ValueError):
        spec_verify(cache, good["x"], good["dt"], p.A, good["B"], good["C"], slots=torch.tensor([0, 7]))
    for acc in ([0, 1], [1, T + 1], [[1, 1]]):
        with pytest.raises(ValueError, match="num_accepted"):
            spec_commit(cache, torch.tensor(acc), p.A)
    with pytest.raises(ValueError):
        spec_commit(cache, torch.tensor([1, 1]), p.A.double())
    with pytest.raises(ValueError):
        spec_commit(cache, torch.tensor([1, 1]), p.A[:1])
    with pytest.raises(ValueError):
        spec_reset(cache, torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError):
        spec_commit(object(), torch.tensor([1, 1]), p.A)
    assert cache.state.eq(0).all() and cache.x.eq(0).all() and cache.dt.eq(0).all()
    for kw in (dict(window=0), dict(window=17), dict(act_dtype=torch.int8), dict(state_dtype=torch.float64)):
        with pytest.raises(ValueError):
            CommitReplayCache.allocate(**(dict(geometry=geom, num_slots=2, window=2) | kw))
    with pytest.raises(ValueError, match="dstate"):
        CommitReplayCache.allocate(Mamba2Geometry(2, 16, 512, 1), 1, 2, device="meta")


@pytest.mark.skipif(not interpreter_active(), reason="only the Triton interpreter rejects bf16")
def test_commit_replay_bf16_rejected_under_interpreter(gen):
    geom, T = GEOM_TINY, 2
    p = random_params(geom, generator=gen)
    cache = CommitReplayCache.allocate(geom, 2, T, act_dtype=BF16)
    inp = window_inputs(geom, 2, T, BF16, "cpu", gen)
    with pytest.raises(ValueError, match="bfloat16"):
        spec_verify(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], backend="triton")
