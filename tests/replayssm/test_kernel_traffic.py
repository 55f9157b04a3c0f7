"""The interpreter traffic counter (replayssm/testing_traffic.py) held against the kernels' defining properties,
and experiments/report/kernels/traffic.py against replayssm/traffic.py at the small geometries.

State bytes per slot: a non-flush ReplaySSM step stores none, a flush stores one state, native spec stores T
snapshots, commit replay's commit reads and writes one state; no kernel loads the state twice in a launch.
Run with the GPU launch tables forced (several programs per head) and with the interpreter's.
"""

from __future__ import annotations

import pytest
import torch

import baselines.gdn_commit_replay as gdn_commit_replay
import baselines.gdn_recurrent_spec as gdn_native
import baselines.mamba2_commit_replay as m2_commit_replay
import baselines.mamba2_ssu as m2_native
from replayssm.checks import interpreter_active
from replayssm.gdn import decode as gdn_decode
from replayssm.gdn import spec as gdn_spec
from replayssm.gdn.inputs import random_step as gdn_step
from replayssm.geometry import GDNGeometry, Mamba2Geometry
from replayssm.mamba2 import decode as m2_decode
from replayssm.mamba2 import spec as m2_spec
from replayssm.mamba2.cache import ReplayCache as M2Cache
from replayssm.mamba2.inputs import random_params
from replayssm.mamba2.inputs import random_step as m2_step
from replayssm.testing_traffic import TrafficCounter

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="the counter hooks the Triton interpreter")

GDN = GDNGeometry(H=1, HV=2, K=32, V=40)                      # GPU tables: three V-tile programs per head
M2 = Mamba2Geometry(nheads=2, headdim=48, dstate=32, ngroups=1)
SLOT = torch.tensor([1], dtype=torch.int32)                   # slot 1 of 2: slot 0 idle
F32, F16 = torch.float32, torch.float16
T = 2


@pytest.fixture(params=["0", "90"], ids=["interpreter-tiles", "gpu-tiles"])
def arch(request, monkeypatch):
    if request.param != "0":
        monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", request.param)
    return request.param


def state_bytes(geom) -> int:
    n = geom.HV * geom.V * geom.K if isinstance(geom, GDNGeometry) else geom.nheads * geom.headdim * geom.dstate
    return 4 * n


def state_io(counter: TrafficCounter) -> tuple[int, int]:
    """(unique state bytes loaded, stored) over the counted launches; asserts no launch re-reads the state."""
    load = store = 0
    for launch in counter.launches:
        for name, t in launch.tensors.items():
            if name.split("|")[0].startswith("state"):
                assert t.load_issued == t.load_unique, f"{launch.kernel} loads the state twice"
                assert t.store_issued == t.store_unique, f"{launch.kernel} stores the state twice"
                load, store = load + t.load_unique, store + t.store_unique
    return load, store


def _m2_args(window=None):
    p, x = random_params(M2), m2_step(M2, 1, act_dtype=F16, window=window)
    return dict(x=x["x"], dt=x["dt"], A=p.A, B=x["B"], C=x["C"], D=p.D, z=x["z"], dt_bias=p.dt_bias, slots=SLOT)


@pytest.mark.parametrize("family, route", [("gdn", "output_only"), ("gdn", "output_only_fold"),
                                           ("mamba2", "output_only")])
def test_replay_ar_stores_state_only_on_the_flush(family, route, arch):
    """Every step reads the checkpoint once; a route whose flush is a kernel of its own (GDN's output_only_fold,
    Mamba-2's output_only: the readout, then the fold of the flushing rows) reads it a second time on the flush
    step only, in the fold right after the readout (L2-hot: experiments/report/kernels/traffic.py's L2 reuse)."""
    L = 3
    if family == "gdn":
        cache = gdn_decode.ReplayCache.allocate(GDN, 2, L, act_dtype=F16)
        step = lambda: gdn_decode.replay_step(cache, **gdn_step(GDN, 1, act_dtype=F16), slots=SLOT,  # noqa: E731
                                              route=route)
        geom = GDN
    else:
        cache = M2Cache.allocate(M2, 2, L, act_dtype=F16)
        step = lambda: m2_decode.replay_step(cache, **_m2_args(), route=route)  # noqa: E731
        geom = M2
    separate_fold = (family, route) in (("gdn", "output_only_fold"), ("mamba2", "output_only"))
    with TrafficCounter() as counter:
        for h in range(L):
            counter.clear()
            step()
            load, store = state_io(counter)
            assert load == state_bytes(geom) * (2 if separate_fold and h == L - 1 else 1), h
            assert store == (state_bytes(geom) if h == L - 1 else 0), h


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
def test_replay_spec_stores_state_only_when_it_flushes(family, arch):
    mod, geom = (gdn_spec, GDN) if family == "gdn" else (m2_spec, M2)
    ring = mod.SpecRing.allocate(geom, 2, 2, T, act_dtype=F16)
    mod.spec_reset(ring)
    flushes = 0
    with TrafficCounter() as counter:
        for _ in range(4):
            flush, h = bool(ring.is_flush[1]), int(ring.write_pos[1])
            args = (dict(gdn_step(GDN, 1, act_dtype=F16, window=T), slots=SLOT) if family == "gdn"
                    else _m2_args(T))
            counter.clear()
            mod.spec_verify(ring, **args)
            load, store = state_io(counter)
            assert load == state_bytes(geom)
            assert store == (state_bytes(geom) if flush and h > 0 else 0)
            flushes += flush and h > 0
            mod.spec_commit(ring, torch.tensor([T], dtype=torch.int32), slots=SLOT)
    assert flushes > 0


@pytest.mark.parametrize("family", ["gdn", "mamba2"])
def test_native_spec_stores_T_states_and_commit_replay_commits_one(family, arch):
    geom = GDN if family == "gdn" else M2
    native, replay = (gdn_native, gdn_commit_replay) if family == "gdn" else (m2_native, m2_commit_replay)
    args = (dict(gdn_step(GDN, 1, act_dtype=F16, window=T), slots=SLOT) if family == "gdn" else _m2_args(T))
    extra = {} if family == "gdn" else {"A": args["A"]}
    states = native.SpecStates.allocate(geom, 2, T)
    cache = replay.CommitReplayCache.allocate(geom, 2, T, act_dtype=F16)
    accepted = torch.tensor([1], dtype=torch.int32)
    with TrafficCounter() as counter:
        native.spec_verify(states, **args)
        assert state_io(counter) == (state_bytes(geom), T * state_bytes(geom))
        counter.clear()
        native.spec_commit(states, accepted, slots=SLOT)
        assert state_io(counter) == (0, 0)
        counter.clear()
        replay.spec_verify(cache, **args)
        assert state_io(counter) == (state_bytes(geom), 0)
        counter.clear()
        replay.spec_commit(cache, accepted, slots=SLOT, **extra)
        assert state_io(counter) == (state_bytes(geom), state_bytes(geom))


def test_counter_attributes_masked_bytes_to_tensors():
    """A masked load of 3 of 16 fp16 elements and a store of 5 fp32, one program: exact bytes, per tensor."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(src, dst, n_in, n_out, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(src + i, mask=i < n_in, other=0.0)
        tl.store(dst + i, x.to(tl.float32) + 1.0, mask=i < n_out)

    src, dst = torch.ones(16, dtype=F16), torch.zeros(16)
    with TrafficCounter() as counter:
        kernel[(1,)](src, dst, 3, 5, BLOCK=16)
    (launch,) = counter.launches
    assert launch.tensors["src"].load_unique == 6 and launch.tensors["dst"].store_unique == 20
    assert "dst" not in {n for n, t in launch.tensors.items() if t.load_unique}
    assert dst.tolist() == [2.0] * 3 + [1.0] * 2 + [0.0] * 11              # the kernel still ran


def test_kernel_traffic_script_agrees_with_the_model_at_small_geometries(capsys):
    from experiments.report.kernels import traffic as kernel_traffic

    assert kernel_traffic.main(["--geometry", "small"]) == 0
    out = capsys.readouterr().out
    assert "gdn.replay_spec" in out and "mamba2.commit_replay" in out and "DIFFERS" not in out
    # KDA's rows at gdn_small's head shape, and the side-by-side table pairing them with GDN's
    assert "kda.replay_spec" in out and "kda.commit_replay" in out and "kda_small" in out
    beside = out[out.index("KDA beside GDN"):]
    assert "| replay_spec " in beside and "gdn_small" in beside and "kda_small" in beside
