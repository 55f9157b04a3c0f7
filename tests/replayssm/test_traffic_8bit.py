"""An 8-bit state (int8 / fp8 e4m3) in the byte model: one byte per element plus one fp32 scale per (slot, head),
read with every state read and written with every state write (replayssm/traffic*.py), held in the footprint
(Footprint.scales). Every total below is counted by hand at a small geometry."""

from __future__ import annotations

import pytest
import torch

from replayssm import step_time as st
from replayssm import traffic as tr
from replayssm.gdn.cache import ReplayCache as GDNReplayCache
from replayssm.geometry import GDNGeometry, KDAGeometry, Mamba2Geometry
from replayssm.mamba2.cache import ReplayCache

M2 = Mamba2Geometry(nheads=4, headdim=16, dstate=32, ngroups=2)
GDN = GDNGeometry(H=2, HV=4, K=16, V=32)
KDA = KDAGeometry(H=2, HV=4, K=16, V=32)

# by hand, bf16 activations, 8-bit state with 4 heads: elements 2048 B, scales 4 x 4 B
M2_CKPT = 4 * 16 * 32 * 1 + 4 * 4                     # 2064
M2_IN = 4 * 16 * 2 + 2 * 2 * 32 * 2 + 4 * 4            # x, B and C, raw dt fp32: 400
M2_OUT = 4 * 16 * 2                                    # y: 128
M2_ENTRY = 4 * 16 * 2 + 2 * 32 * 2 + 4 * 4             # x, B, dt fp32: 272
DR_CKPT = 4 * 32 * 16 * 1 + 4 * 4                      # GDN / KDA: [HV, V, K] bytes + HV scales: 2064
GDN_IN = 2 * 2 * 16 * 2 + 4 * 32 * 2 + 2 * 4 * 4       # q, k, v, g and beta fp32: 416
GDN_OUT = 4 * 32 * 2                                   # o: 256
GDN_ENTRY = 4 * 32 * 2 + 2 * 16 * 2 + 4 * 4            # u, k, g fp32: 336
GDN_STASH = 4 * 32 * 2 + 2 * 16 * 2 + 2 * 4 * 4        # v, k, g, beta: 352
KDA_IN = 2 * 2 * 16 * 2 + 4 * 32 * 2 + 4 * 17 * 4      # q, k, v, g [HV, K] and beta fp32: 656
KDA_ENTRY = 4 * 32 * 2 + 2 * 16 * 2 + 4 * 16 * 4       # u, k, g [HV, K] fp32: 576
KDA_STASH = 4 * 32 * 2 + 2 * 16 * 2 + 4 * 17 * 4       # 592

SIZES = {"mamba2": (M2, M2_CKPT, M2_IN, M2_OUT, M2_ENTRY, M2_ENTRY),
         "gdn": (GDN, DR_CKPT, GDN_IN, GDN_OUT, GDN_ENTRY, GDN_STASH),
         "kda": (KDA, DR_CKPT, KDA_IN, GDN_OUT, KDA_ENTRY, KDA_STASH)}


def _fn(fam: str, name: str):
    return getattr(tr, f"{fam}_{name}")


@pytest.mark.parametrize("fam", sorted(SIZES))
def test_the_8bit_sizes_by_hand(fam):
    geom, ckpt, inp, out, entry, stash = SIZES[fam]
    assert _fn(fam, "state_bytes")(geom, 1) == 2048
    assert _fn(fam, "scale_bytes")(geom, 1) == 16
    assert _fn(fam, "checkpoint_bytes")(geom, 1) == ckpt
    assert _fn(fam, "input_bytes")(geom) == inp and _fn(fam, "output_bytes")(geom) == out
    assert _fn(fam, "entry_bytes")(geom) == entry
    if fam != "mamba2":
        assert _fn(fam, "stash_bytes")(geom) == stash


@pytest.mark.parametrize("fam", sorted(SIZES))
@pytest.mark.parametrize("state_bytes", [2, 4])
def test_no_scales_at_2_and_4_bytes(fam, state_bytes):
    geom = SIZES[fam][0]
    assert _fn(fam, "scale_bytes")(geom, state_bytes) == 0
    assert _fn(fam, "checkpoint_bytes")(geom, state_bytes) == _fn(fam, "state_bytes")(geom, state_bytes)
    assert tr.cache_footprint("replay_ar", geom, L=4, state_bytes=state_bytes).scales == 0


@pytest.mark.parametrize("fam", sorted(SIZES))
def test_baselines_read_and_write_the_scales_every_step(fam):
    geom, ckpt, inp, out, entry, stash = SIZES[fam]
    base = _fn(fam, "baseline_ar")(geom, 1)
    assert (base.read, base.write) == (ckpt + inp, ckpt + out)
    native = _fn(fam, "baseline_spec")(geom, 2, 1)                      # T = 2: one read, T snapshot writes
    assert (native.read, native.write) == (ckpt + 2 * inp, 2 * ckpt + 2 * out)
    commit = _fn(fam, "commit_replay_spec")(geom, 2, 1, 1)              # verify + commit (accepted 1)
    assert commit.read == ckpt + 2 * inp + ckpt + 1 * stash
    assert commit.write == 2 * out + 2 * stash + ckpt


@pytest.mark.parametrize("fam", sorted(SIZES))
def test_replay_ar_reads_the_scales_every_step_and_writes_them_at_a_flush(fam):
    geom, ckpt, inp, out, entry, _ = SIZES[fam]
    L = 4
    step = (lambda h: tr.mamba2_replay_ar(geom, L, h, state_bytes=1)) if fam == "mamba2" else \
        (lambda h: _fn(fam, "replay_ar")(geom, L, h, state_bytes=1))
    for h in range(L):
        t = step(h)
        assert t.read == ckpt + h * entry + inp
        assert t.write == out + (ckpt if h == L - 1 else entry)
    cycle = (tr.mamba2_replay_ar_cycle(geom, L, state_bytes=1) if fam == "mamba2"
             else _fn(fam, "replay_ar_cycle")(geom, L, state_bytes=1))
    assert cycle.total == pytest.approx(sum(step(h).total for h in range(L)) / L)


@pytest.mark.parametrize("fam", sorted(SIZES))
def test_spec_ring_reads_the_scales_every_step_and_writes_them_at_a_flush(fam):
    geom, ckpt, inp, out, entry, _ = SIZES[fam]
    T = 2
    flush = _fn(fam, "replay_spec_step")(geom, T, 3, True, 1)
    assert (flush.read, flush.write) == (ckpt + 3 * entry + T * inp, T * entry + T * out + ckpt)
    plain = _fn(fam, "replay_spec_step")(geom, T, 3, False, 1)
    assert (plain.read, plain.write) == (ckpt + 3 * entry + T * inp, T * entry + T * out)
    cycle = tr.spec_cycle(8, T, 2)
    mean = _fn(fam, "replay_spec")(geom, 8, T, 2, state_bytes=1)
    assert mean.total == pytest.approx(sum(_fn(fam, "replay_spec_step")(geom, T, h, f, 1).total
                                           for h, f in cycle) / len(cycle))


@pytest.mark.parametrize("fam", sorted(SIZES))
def test_8bit_footprint_by_hand(fam):
    geom, _, _, _, entry, stash = SIZES[fam]
    bc = 2 * 4 if fam == "mamba2" else 0                               # Mamba-2's bc scratch per row: G fp32
    fp = tr.cache_footprint("baseline_ar", geom, state_bytes=1)
    assert (fp.states, fp.scales, fp.total) == (2048, 16, 2064)
    fp = tr.cache_footprint("replay_ar", geom, L=4, state_bytes=1)
    assert fp.total == 2048 + 16 + 4 * entry + 4 * bc + 4
    fp = tr.cache_footprint("baseline_spec", geom, T=3, state_bytes=1)  # T states, each with its scales
    assert (fp.states, fp.scales, fp.total) == (3 * 2048, 3 * 16, 3 * 2064 + 4)
    fp = tr.cache_footprint("replay_spec", geom, B_hist=12, T=4, state_bytes=1)
    assert fp.total == 2064 + 16 * entry + 16 * 4 * bc + 3 * 4         # ring next_pow2(12 + 4) = 16
    fp = tr.cache_footprint("commit_replay_spec", geom, T=4, state_bytes=1)
    assert fp.total == 2064 + 4 * stash
    assert tr.max_concurrency(10 * 2064 * 3, tr.cache_footprint("baseline_ar", geom, state_bytes=1), 3) == 10


def test_8bit_footprint_matches_the_fp8_caches():
    fp8 = torch.float8_e4m3fn
    cache = ReplayCache.allocate(M2, 3, buffer_len=8, state_dtype=fp8, act_dtype=torch.bfloat16)
    assert tr.cache_footprint("replay_ar", M2, L=8, state_bytes=1).total * 3 == cache.nbytes()
    gcache = GDNReplayCache.allocate(GDN, 2, buffer_len=4, state_dtype=fp8, act_dtype=torch.bfloat16)
    assert tr.cache_footprint("replay_ar", GDN, L=4, state_bytes=1).total * 2 == gcache.nbytes()


def test_step_time_and_tree_take_the_8bit_model():
    assert st.layer_traffic(GDN, "baseline_ar", state_bytes=1) == tr.gdn_baseline_ar(GDN, 1)
    assert st.layer_traffic(M2, "replay_ar", L=4, state_bytes=1) == tr.mamba2_replay_ar_cycle(M2, 4, state_bytes=1)
    assert st.layer_traffic(KDA, "replay_spec", T=2, B_hist=8, accepted=2, state_bytes=1) == \
        tr.kda_replay_spec(KDA, 8, 2, 2, state_bytes=1)
    assert tr.tree_traffic(GDN, "native_tree", N=3, depth=2, accepted=1, state_bytes=1) == \
        tr.gdn_baseline_spec(GDN, 3, 1)
    stree = tr.tree_traffic(M2, "stree", N=3, depth=2, accepted=1, state_bytes=1)
    assert stree.read == M2_CKPT + M2_ENTRY + 3 * M2_IN and stree.write == M2_CKPT + 3 * M2_ENTRY + 3 * M2_OUT


def test_other_state_sizes_are_refused():
    with pytest.raises(ValueError, match="state_bytes"):
        tr.gdn_baseline_ar(GDN, 3)
