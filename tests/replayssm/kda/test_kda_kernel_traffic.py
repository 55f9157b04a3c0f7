"""The KDA kernels under the interpreter traffic counter (replayssm/testing_traffic.py), held to the byte model
(replayssm/traffic_kda.py): state bytes as GDN's (a non-flush ReplaySSM step stores no state, a flush one; native
spec T snapshots; commit-replay one read + one write at commit; no launch reads the state twice), and the
per-channel g: every cached entry reads and writes K fp32 per value head. Run with the interpreter's launch
tables and with the GPU ones forced (several V-tile programs per head, K walked in tiles)."""

from __future__ import annotations

import pytest
import torch

import baselines.kda_commit_replay as kda_commit_replay
import baselines.kda_recurrent_spec as kda_native
from replayssm import traffic as tr
from replayssm.checks import interpreter_active
from replayssm.geometry import KDAGeometry
from replayssm.kda import ReplayCache, SpecRing, replay_step, spec_commit, spec_reset, spec_verify
from replayssm.kda.inputs import random_step
from replayssm.testing_traffic import TrafficCounter

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="the counter hooks the Triton interpreter")

GM = KDAGeometry(H=1, HV=2, K=32, V=40)
SLOT = torch.tensor([1], dtype=torch.int32)
F16 = torch.float16
T = 2
STATE = 4 * GM.HV * GM.V * GM.K
G_ENTRY = 4 * GM.HV * GM.K                           # one entry's g: K fp32 per value head


@pytest.fixture(params=["0", "90"], ids=["interpreter-tiles", "gpu-tiles"])
def arch(request, monkeypatch):
    if request.param != "0":
        monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", request.param)
    return request.param


def io(counter: TrafficCounter, prefix: str) -> tuple[int, int]:
    """(unique bytes loaded, stored) of the tensors whose argument name starts with `prefix`; no re-reads."""
    load = store = 0
    for launch in counter.launches:
        for name, t in launch.tensors.items():
            if name.split("|")[0].startswith(prefix):
                if prefix == "state":
                    assert t.load_issued == t.load_unique, f"{launch.kernel} loads the state twice"
                load, store = load + t.load_unique, store + t.store_unique
    return load, store


def test_replay_ar_state_and_g_bytes(arch):
    L = 3
    cache = ReplayCache.allocate(GM, 2, L, act_dtype=F16)
    with TrafficCounter() as counter:
        for h in range(L):
            counter.clear()
            replay_step(cache, **random_step(GM, 1, act_dtype=F16), slots=SLOT)
            assert io(counter, "state") == (STATE, STATE if h == L - 1 else 0), h
            g_load, g_store = io(counter, "gbuf")
            assert g_load == h * G_ENTRY and g_store == (0 if h == L - 1 else G_ENTRY), h
            assert io(counter, "g_ptr")[0] == G_ENTRY                  # the step's own g [HV, K]
    assert tr.kda_entry_bytes(GM, act_bytes=2) - tr.gdn_entry_bytes(GM, act_bytes=2) == G_ENTRY - 4 * GM.HV


def test_replay_spec_state_and_g_bytes(arch):
    ring = SpecRing.allocate(GM, 2, 2, T, act_dtype=F16)
    spec_reset(ring)
    flushes = 0
    with TrafficCounter() as counter:
        for _ in range(4):
            flush, h = bool(ring.is_flush[1]), int(ring.write_pos[1])
            counter.clear()
            spec_verify(ring, **random_step(GM, 1, act_dtype=F16, window=T), slots=SLOT)
            assert io(counter, "state") == (STATE, STATE if flush and h > 0 else 0)
            assert io(counter, "ring_g") == (h * G_ENTRY, T * G_ENTRY)
            flushes += flush and h > 0
            spec_commit(ring, torch.tensor([T], dtype=torch.int32), slots=SLOT)
    assert flushes > 0


def test_native_spec_and_commit_replay_state_bytes(arch):
    args = dict(random_step(GM, 1, act_dtype=F16, window=T), slots=SLOT)
    states = kda_native.SpecStates.allocate(GM, 2, T)
    cache = kda_commit_replay.CommitReplayCache.allocate(GM, 2, T, act_dtype=F16)
    accepted = torch.tensor([1], dtype=torch.int32)
    with TrafficCounter() as counter:
        kda_native.spec_verify(states, **args)
        assert io(counter, "state") == (STATE, T * STATE)
        counter.clear()
        kda_commit_replay.spec_verify(cache, **args)
        assert io(counter, "state") == (STATE, 0)
        assert io(counter, "sg")[1] == T * G_ENTRY                     # the stash holds g per channel
        counter.clear()
        kda_commit_replay.spec_commit(cache, accepted, slots=SLOT)
        assert io(counter, "state") == (STATE, STATE)
