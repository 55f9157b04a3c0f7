"""tree_verify(route="verify_fold"): the Mamba-2 tree verify on the prep / verify / fold kernels
(replayssm/mamba2/spec_verify_fold.py with IS_TREE, the ancestor mask) against the same oracles as the fused
tree kernel (tests/replayssm/test_tree.py): every node's output against the float64 path recurrence, the ring's
caches against the ref ring after every commit, each row's committed state against a float64 serial replay of
the accepted tokens; random trees per row, NULL slots, permuted slots, early flushes and ring wrap. Added here:
the GPU tiles run by the interpreter (unrolled verify chunks, a fold loop of several trips, a masked headdim
tile), a chain tree against spec_verify on the same route, the route name taken by every backend, and a bad
route (and N > 32) refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch

from replayssm import mamba2
from replayssm.checks import NULL_SLOT
from replayssm.geometry import Mamba2Geometry, get_geometry
from replayssm.mamba2.inputs import random_params, random_state, random_step
from replayssm.testing import rel_err, tolerance
from tests.replayssm.test_tree import _run_trees, steps_forcing_flush
from tests.replayssm.tree_cases import Mamba2Family, chain, depth_of, full_binary, random_commit, random_tree, star

ROUTE = "verify_fold"
F16, F32 = torch.float16, torch.float32


class RouteFamily(Mamba2Family):
    """Mamba2Family whose tree_verify calls name a route (the ref ring's too: every backend takes it)."""

    def __init__(self, gen, route: str = ROUTE, **geo):
        super().__init__(gen, **geo)
        self.route = route

    def verify(self, ring, w, parents, backend, slots=None, out=None):
        p = self.p
        return mamba2.tree_verify(ring, w["x"], w["dt"], p.A, w["B"], w["C"], p.D, w["z"], p.dt_bias,
                                  parents=parents, slots=slots, out=out, backend=backend, route=self.route)


@pytest.mark.parametrize("shape", ["binary", "random"])
def test_tree_matches_path_recurrence(shape, gen):
    """Per-row trees (binary: the full 2-ary tree of 7 nodes; random: a random tree of 5 nodes per row) against
    the path recurrence, with a NULL row and permuted slots, until every live row has flushed."""
    fam = RouteFamily(gen)
    N = 7 if shape == "binary" else 5
    trees = [full_binary(N) if shape == "binary" else random_tree(N, gen) for _ in range(3)]
    steps = steps_forcing_flush(8, max(depth_of(t) for t in trees))
    run = _run_trees(fam, ("triton",), trees, steps=steps, gen=gen, history_len=8)
    assert run.every_row_flushed(), run.flushed


def test_fp16_activations(gen):
    fam = RouteFamily(gen)
    trees = [random_tree(5, gen), star(5), random_tree(5, gen)]
    _run_trees(fam, ("triton",), trees, steps=3, gen=gen, act_dtype=F16)


def test_long_run_wraps_and_flushes(gen):
    """Rows flushing at different steps and a window crossing the ring's end (test_tree.py's long run, shorter):
    row 0 accepts 1 token and flushes at steps 5 and 10; the chain row (row 3, depth 4) accepts 4, flushes every
    other step from step 2 and wraps from step 4 (L = 8 + 4, R = 16); row 2 is padding."""
    fam = RouteFamily(gen, nheads=2, headdim=4, dstate=8, ngroups=1)
    trees = [random_tree(4, gen) for _ in range(3)] + [chain(4)]
    run = _run_trees(fam, ("triton",), trees, steps=12, gen=gen, history_len=8, fixed_acc={0: 1, 3: 4})
    assert run.live.tolist() == [True, True, False, True]
    assert run.flushed[:, 0].nonzero().flatten().tolist() == [5, 10]
    assert run.flushed[:, 3].nonzero().flatten().tolist() == list(range(2, 12, 2))
    assert run.wrapped[:, 3].any()


def test_gpu_tiles_under_interpreter(gen, monkeypatch):
    """The GPU launch configs (REPLAYSSM_TARGET_ARCH=90) run by the interpreter against the torch backend on
    random trees of 7 nodes: headdim 96 in 64-row tiles (a masked second tile), dstate 128 in two unrolled 64-wide
    verify chunks and a 4-trip 32-wide fold loop, a history of 8 (ring 16), fp16 activations (the tf32x2 split),
    a NULL row; every live row flushes."""
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    from replayssm.mamba2.spec_verify_fold import TREE_KERNELS, default_vf_config

    geo, N = Mamba2Geometry(nheads=2, headdim=96, dstate=128, ngroups=1), 7
    verify, fold = (default_vf_config(k, geo.headdim, geo.dstate, 90) for k in TREE_KERNELS[1:])
    assert verify.block_n < geo.dstate and fold.block_n * 2 < geo.dstate and verify.block_m < geo.headdim
    prm = random_params(geo, generator=gen)
    rings = {b: mamba2.SpecRing.allocate(geo, 3, 8, N, F32, F16) for b in ("triton", "torch")}
    state0 = random_state(geo, 3, F32, generator=gen)
    for r in rings.values():
        r.state.copy_(state0)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    trees = [random_tree(N, gen), full_binary(N), random_tree(N, gen)]
    parents = torch.tensor(trees, dtype=torch.int32)
    flushes = set()
    for step in range(steps_forcing_flush(8, max(depth_of(t) for t in trees))):
        flushes |= {s for s in (2, 0) if int(rings["torch"].is_flush[s])}
        w = random_step(geo, 3, F16, window=N, generator=gen)
        ys = {b: mamba2.tree_verify(r, w["x"], w["dt"], prm.A, w["B"], w["C"], prm.D, w["z"], prm.dt_bias,
                                    parents=parents, slots=slots, backend=b, route=ROUTE) for b, r in rings.items()}
        assert rel_err(ys["triton"][[0, 2]], ys["torch"][[0, 2]]) <= tolerance(F16), step
        assert rel_err(rings["triton"].state, rings["torch"].state) <= 1e-5, step
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        for b, r in rings.items():
            mamba2.tree_commit(r, path, acc, slots, backend=b)
    assert flushes == {0, 2} and not torch.equal(rings["triton"].state, state0)
    assert torch.equal(rings["triton"].state[1], state0[1])


def test_chain_tree_is_the_chain_route(gen):
    """parents = [-1, 0, 1, ...], path = [0, 1, ...]: the tree build equals spec_verify on the same route (the
    chain build) up to the order of the dt sums (a tree's cum_k is a masked sum, the chain's a cumsum): outputs,
    checkpoints and every ring entry, over a run that flushes; a wrong mask or prefix sum errs by O(1)."""
    fam = Mamba2Family(gen)
    T, batch = 4, 3
    rings = {k: fam.ring(4, history_len=8, window=T) for k in ("chain", "tree")}
    rings["tree"].state.copy_(rings["chain"].state)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    live = slots != NULL_SLOT
    parents = torch.tensor(chain(T), dtype=torch.int32)
    path = torch.arange(T, dtype=torch.int32).expand(batch, T).contiguous()
    p = fam.p
    flushed = 0
    for _ in range(6):
        w = fam.window(batch, T)
        flushed += int(rings["chain"].is_flush[[2, 0]].sum())
        args = (w["x"], w["dt"], p.A, w["B"], w["C"], p.D, w["z"], p.dt_bias)
        y_chain = mamba2.spec_verify(rings["chain"], *args, slots=slots, route=ROUTE)
        y_tree = mamba2.tree_verify(rings["tree"], *args, parents=parents, slots=slots, route=ROUTE)
        assert rel_err(y_tree[live], y_chain[live]) <= 1e-6
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        mamba2.spec_commit(rings["chain"], acc, slots)
        mamba2.tree_commit(rings["tree"], path, acc, slots)
        for n in ("x", "B", "dt", "state", "write_pos", "origin", "is_flush"):
            a, b = getattr(rings["tree"], n), getattr(rings["chain"], n)
            assert (torch.equal(a, b) if not a.is_floating_point() else rel_err(a, b) <= 1e-6), n
    assert flushed > 0


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_other_backends_take_the_route(backend, gen):
    """The route names Triton kernels: every other backend accepts it and computes the same function as with
    the default route, bit for bit."""
    fams = {r: RouteFamily(gen, route=r) for r in ("fused", ROUTE)}
    fams[ROUTE].p = fams["fused"].p
    rings = {r: f.ring(3, history_len=8, window=5) for r, f in fams.items()}
    rings[ROUTE].state.copy_(rings["fused"].state)
    trees = [random_tree(5, gen) for _ in range(2)]
    parents = torch.tensor(trees, dtype=torch.int32)
    for _ in range(6):
        w = fams["fused"].window(2, 5)
        ys = {r: f.verify(rings[r], w, parents, backend) for r, f in fams.items()}
        assert torch.equal(ys[ROUTE], ys["fused"])
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        for r in fams:
            mamba2.tree_commit(rings[r], path, acc, backend=backend)
    for n in ("x", "B", "dt", "state", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(rings[ROUTE], n), getattr(rings["fused"], n)), n


@pytest.mark.parametrize("backend", ["triton", "torch", "ref", "cpu"])
def test_unknown_route_refused_before_touching_the_ring(backend, gen):
    fam = RouteFamily(gen, route="fused_fold")
    ring = fam.ring(2, history_len=4, window=3)
    snapshot = ring.clone()
    with pytest.raises(ValueError, match="spec route"):
        fam.verify(ring, fam.window(2, 3), torch.tensor(star(3), dtype=torch.int32), backend)
    for attr in ("state", "x", "B", "dt", "bc", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, attr), getattr(snapshot, attr)), attr


def test_tree_beyond_32_nodes_refused(gen):
    fam = RouteFamily(gen)
    ring = fam.ring(1, history_len=33, window=33)
    snapshot = ring.clone()
    with pytest.raises(ValueError, match="N=33 > 32"):
        fam.verify(ring, fam.window(1, 33), torch.tensor(star(33), dtype=torch.int32), "triton")
    for attr in ("state", "x", "B", "dt", "bc", "write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(ring, attr), getattr(snapshot, attr)), attr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 activations need a GPU (interpreter bf16 is garbage)")
@pytest.mark.gpu
@pytest.mark.parametrize("N", [4, 15])
def test_bf16_matches_torch_on_gpu(N, gen):
    """bf16 activations (the truncated bf16x2 split) at Super TP 4, the full binary tree of N nodes."""
    geo = get_geometry("nemotron3_super_120b", tp=4)
    rings = {b: mamba2.SpecRing.allocate(geo, 8, 16, N, act_dtype=torch.bfloat16, device="cuda")
             for b in ("triton", "torch")}
    state0 = random_state(geo, 8, F32, "cuda", gen)
    prm = random_params(geo, "cuda", gen)
    for r in rings.values():
        r.state.copy_(state0)
    trees = [full_binary(N)] * 8
    parents = torch.tensor(trees, dtype=torch.int32, device="cuda")
    for _ in range(12):
        w = random_step(geo, 8, torch.bfloat16, "cuda", window=N, generator=gen)
        ys = {b: mamba2.tree_verify(r, w["x"], w["dt"], prm.A, w["B"], w["C"], prm.D, w["z"], prm.dt_bias,
                                    parents=parents, backend=b, route=ROUTE) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["torch"]) <= tolerance(torch.bfloat16)
        path, acc = random_commit(trees, depth_of(trees[0]), gen)
        for b, r in rings.items():
            mamba2.tree_commit(r, path.cuda(), acc.cuda(), backend=b)
    assert rel_err(rings["triton"].state, rings["torch"].state) <= 1e-5
