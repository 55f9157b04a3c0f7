"""tree_verify(route="verify_fold"): the Gated DeltaNet tree verify on the ring verify's prep / verify / fold kernels
(replayssm/delta_rule/spec_launch.py; the prep built with IS_TREE, the ancestor mask; the verify and the fold are the
chain's builds) against the same oracles as the fused tree kernel (tests/replayssm/test_tree.py): every node's output
against the float64 path recurrence, the ring's caches against the ref ring after every commit, each row's
committed state against a float64 serial replay of the accepted tokens; random trees per row, NULL slots, permuted
slots (desynchronised cursors), early flushes and ring wrap, outputs NaN-poisoned before each verify. Added here:
the GPU tiles run by the interpreter, a chain tree against spec_verify on the same route, ring rows past the
committed history poisoned after a tree commit (the verify and the fold read only the moved, committed entries),
the prep's path masks against tree_ring's ancestor tables (the helpers KDA's preps call too: their tree is
tests/replayssm/kda/test_kda_tree_verify_fold.py), the route name taken by every backend, and a bad route and
N > 8 refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from replayssm import gdn
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.delta_rule.spec_launch import MAX_TREE_NODES
from replayssm.delta_rule.spec_prep import path_holds, window_path, window_rows
from replayssm.gdn.inputs import random_state, random_step
from replayssm.geometry import GDNGeometry, get_geometry
from replayssm.testing import rel_err, tolerance
from tests.replayssm.test_tree import _run_trees, steps_forcing_flush
from tests.replayssm.tree_cases import GDNFamily, chain, depth_of, full_binary, random_commit, random_tree, star

ROUTE = "verify_fold"
F16, F32 = torch.float16, torch.float32
CACHE = ("u", "k", "g", "state", "write_pos", "origin", "is_flush")


class RouteFamily(GDNFamily):
    """GDNFamily whose tree_verify calls name a route (the ref ring's too: every backend takes it)."""

    def __init__(self, gen, route: str = ROUTE, **geo):
        super().__init__(gen, **geo)
        self.route = route

    def verify(self, ring, w, parents, backend, slots=None, out=None):
        return gdn.tree_verify(ring, **w, parents=parents, slots=slots, out=out, backend=backend, route=self.route)


def _unchanged(ring, snapshot) -> None:
    for n in CACHE:
        assert torch.equal(getattr(ring, n), getattr(snapshot, n)), n


@pytest.mark.parametrize("shape", ["binary", "random"])
def test_tree_matches_path_recurrence(shape, gen):
    """Per-row trees (binary: the full 2-ary tree of 7 nodes; random: a random tree of 8 nodes per row, the
    route's largest) against the path recurrence, with a NULL row and permuted slots, until every live row has
    flushed."""
    fam = RouteFamily(gen)
    N = 7 if shape == "binary" else MAX_TREE_NODES
    trees = [full_binary(N) if shape == "binary" else random_tree(N, gen) for _ in range(3)]
    steps = steps_forcing_flush(8, max(depth_of(t) for t in trees))
    run = _run_trees(fam, ("triton",), trees, steps=steps, gen=gen, history_len=8)
    assert run.every_row_flushed(), run.flushed


def test_fp16_activations_and_l2norm(gen):
    """fp16 activations; and q / k L2-normalised in the prep (the norms from the Gram matrix's diagonal)."""
    fam = RouteFamily(gen)
    trees = [random_tree(5, gen), star(5), random_tree(5, gen)]
    _run_trees(fam, ("triton",), trees, steps=3, gen=gen, act_dtype=F16)
    rings = {b: fam.ring(3, history_len=8, window=5) for b in ("ref", "triton")}
    rings["triton"].state.copy_(rings["ref"].state)
    parents = torch.tensor(trees, dtype=torch.int32)
    for _ in range(3):
        w = fam.window(3, 5)
        w["q"] *= 1 + 3 * torch.rand(3, 5, 2, 1, generator=gen)                  # norms the kernel must divide out
        w["k"] *= 0.2 + torch.rand(3, 5, 2, 1, generator=gen)
        ys = {b: gdn.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, backend=b, route=ROUTE)
              for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["ref"]) <= tolerance(F32)
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        for b, r in rings.items():
            gdn.tree_commit(r, path, acc, backend=b)
    assert rel_err(rings["triton"].state, rings["ref"].state) <= tolerance(F32)


def test_long_run_wraps_and_flushes(gen):
    """Rows flushing at different steps and a window crossing the ring's end (test_tree.py's long run, shorter):
    row 0 accepts 1 token and flushes at steps 5 and 10; the chain row (row 3, depth 4) accepts 4, flushes every
    other step from step 2 and wraps from step 4 (L = 8 + 4, R = 16); row 2 is padding."""
    fam = RouteFamily(gen, H=1, HV=2, K=8, V=4)
    trees = [random_tree(4, gen) for _ in range(3)] + [chain(4)]
    run = _run_trees(fam, ("triton",), trees, steps=12, gen=gen, history_len=8, fixed_acc={0: 1, 3: 4})
    assert run.live.tolist() == [True, True, False, True]
    assert run.flushed[:, 0].nonzero().flatten().tolist() == [5, 10]
    assert run.flushed[:, 3].nonzero().flatten().tolist() == list(range(2, 12, 2))
    assert run.wrapped[:, 3].any()


def test_stale_ring_rows_never_read_after_a_tree_commit(gen):
    """After each tree commit every ring row past a slot's committed history (the rejected branches' entries, the
    free rows) is NaN in u, k and g: the next verify's outputs and its fold (plain and flushing rows) equal a twin
    ring's that was never poisoned, and the state stays finite. A verify or fold that read a row by the node index
    rather than the committed position, or past write_pos, would read a NaN."""
    fam = RouteFamily(gen)
    N = 7
    rings = {k: fam.ring(4, history_len=8, window=N) for k in ("clean", "poisoned")}
    rings["poisoned"].state.copy_(rings["clean"].state)
    origin = torch.randint(0, rings["clean"].ring_len, (4,), generator=gen, dtype=torch.int32)   # desynchronised,
    for r in rings.values():                                                                    # windows wrap early
        r.origin.copy_(origin)
    slots = torch.tensor([3, 0, 2], dtype=torch.int32)
    trees = [full_binary(N), random_tree(N, gen), star(N)]
    parents = torch.tensor(trees, dtype=torch.int32)
    depth = max(depth_of(t) for t in trees)
    folded = 0
    for _ in range(steps_forcing_flush(8, depth) + 2):
        folded += int((rings["clean"].is_flush[slots.long()] != 0).sum())
        w = fam.window(3, N)
        ys = {k: fam.verify(r, w, parents, "triton", slots=slots) for k, r in rings.items()}
        assert torch.isfinite(ys["poisoned"]).all() and torch.equal(ys["poisoned"], ys["clean"])
        path, acc = random_commit(trees, depth, gen)
        for r in rings.values():
            gdn.tree_commit(r, path, acc, slots)
        p = rings["poisoned"]
        for s in slots.tolist():
            h, origin = int(p.write_pos[s]), int(p.origin[s])
            stale = [(origin + j) % p.ring_len for j in range(h, p.ring_len)]
            for name in ("u", "k", "g"):
                getattr(p, name)[s][:, stale] = float("nan")
        assert torch.equal(p.state, rings["clean"].state) and torch.isfinite(p.state).all()
    assert folded >= 3


def test_gpu_tiles_under_interpreter(gen, monkeypatch):
    """The GPU launch configs (REPLAYSSM_TARGET_ARCH=90) run by the interpreter against the torch backend on random
    trees of 7 nodes: K = 80 in three 32-wide verify chunks (the last masked) and five 16-wide fold chunks, V = 72
    over BV 64 (a masked second tile), two value heads per key head, a history of 8, fp16 activations, a NULL row;
    every live row flushes."""
    if not interpreter_active():
        pytest.skip("the forced launch configs are an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    from replayssm.delta_rule.spec_launch import default_config, kernel_names

    geo, N = GDNGeometry(H=1, HV=2, K=80, V=72), 7
    prep, verify, fold = (default_config(k, geo.K, geo.V, 90) for k in kernel_names(False, tree=True))
    assert prep["num_warps"] == 1 and verify["BKT"] < geo.K < 3 * verify["BKT"] and verify["BV"] < geo.V
    assert fold["BKT"] * 5 == geo.K
    rings = {b: gdn.SpecRing.allocate(geo, 3, 8, N, F32, F16) for b in ("triton", "torch")}
    state0 = random_state(geo, 3, generator=gen)
    for r in rings.values():
        r.state.copy_(state0)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    trees = [random_tree(N, gen), full_binary(N), random_tree(N, gen)]
    parents = torch.tensor(trees, dtype=torch.int32)
    depth = max(depth_of(t) for t in trees)
    flushes = set()
    for step in range(steps_forcing_flush(8, depth)):
        flushes |= {s for s in (2, 0) if int(rings["torch"].is_flush[s])}
        w = random_step(geo, 3, F16, window=N, generator=gen)
        ys = {b: gdn.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, slots=slots, backend=b, route=ROUTE)
              for b, r in rings.items()}
        assert rel_err(ys["triton"][[0, 2]], ys["torch"][[0, 2]]) <= tolerance(F16), step
        # the state passed through the ring's fp16 u rows: one backend's u a rounding step from the other's moves
        # the fold by ~1e-5 (seed 5: 1.1e-5 against a bare 1e-5); a wrong mask or tile errs by O(1)
        assert rel_err(rings["triton"].state, rings["torch"].state) <= tolerance(F32, F16), step
        path, acc = random_commit(trees, depth, gen)
        for b, r in rings.items():
            gdn.tree_commit(r, path, acc, slots, backend=b)
    assert flushes == {0, 2} and not torch.equal(rings["triton"].state, state0)
    assert torch.equal(rings["triton"].state[1], state0[1])


def test_chain_tree_is_the_chain_route(gen):
    """parents = [-1, 0, 1, ...], path = [0, 1, ...]: the tree build equals spec_verify on the same route (the chain
    build) up to the order of the gate sums (a tree's G of key row c is a masked sum, the chain's a cumsum):
    outputs, checkpoints and every ring entry over a run that flushes; a wrong mask or gate errs by O(1). The chain
    is the deepest tree of N nodes (depth N: A^(N-1) != 0), so the ceil(log2 N) factors of (I + A)^-1 are all
    needed here."""
    fam = GDNFamily(gen)
    T, batch = 8, 3
    rings = {k: fam.ring(4, history_len=8, window=T) for k in ("chain", "tree")}
    rings["tree"].state.copy_(rings["chain"].state)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    live = slots != NULL_SLOT
    parents = torch.tensor(chain(T), dtype=torch.int32)
    path = torch.arange(T, dtype=torch.int32).expand(batch, T).contiguous()
    flushed = 0
    for _ in range(6):
        w = fam.window(batch, T)
        flushed += int(rings["chain"].is_flush[[2, 0]].sum())
        y_chain = gdn.spec_verify(rings["chain"], **w, slots=slots, route=ROUTE)
        y_tree = gdn.tree_verify(rings["tree"], **w, parents=parents, slots=slots, route=ROUTE)
        assert rel_err(y_tree[live], y_chain[live]) <= 1e-6
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        gdn.spec_commit(rings["chain"], acc, slots)
        gdn.tree_commit(rings["tree"], path, acc, slots)
        for n in CACHE:
            a, b = getattr(rings["tree"], n), getattr(rings["chain"], n)
            assert (torch.equal(a, b) if not a.is_floating_point() else rel_err(a, b) <= 1e-6), n
    assert flushed > 0


@triton.jit
def _mask_kernel(anc_ptr, onp_ptr, strict_ptr, holds_ptr, T: tl.constexpr, TW: tl.constexpr, IS_TREE: tl.constexpr):
    """The prep's masks for batch row b as int32: on_path and strict [TW, TW], path_holds [T, TW] (the helpers KDA's
    preps call as well)."""
    b = tl.program_id(0)
    offs_r, is_k, is_q, live, tok, _ = window_rows(0, 0, 1023, T, TW)
    anc_r, on_path, strict = window_path(anc_ptr, b * T, offs_r, is_k, live, tok, IS_TREE)
    tile = b * TW * TW + offs_r[:, None] * TW + offs_r[None, :]
    tl.store(onp_ptr + tile, on_path.to(tl.int32))
    tl.store(strict_ptr + tile, strict.to(tl.int32))
    for c in tl.static_range(T):
        tl.store(holds_ptr + b * T * TW + c * TW + offs_r, path_holds(anc_r, tok, c, IS_TREE).to(tl.int32), mask=live)



@pytest.mark.parametrize("N", [3, 8])
def test_path_masks_are_the_ancestor_tables(N, gen):
    """window_path / path_holds (replayssm/delta_rule/spec_prep.py) against tree_ring.ancestor_tables on random
    trees, a star and a chain: on_path[r, c] = key c is an ancestor-or-self of row r's node (key rows r and query
    rows T + r alike, never a padding row or a query column), strict = that on the key rows less the diagonal,
    path_holds(c) = on_path's column c on the live rows; and the chain build (IS_TREE off) is the chain tree's."""
    from replayssm.mamba2.spec_kernels import ancestor_bits
    from replayssm.tree_ring import ancestor_tables

    if not interpreter_active():
        pytest.skip("CPU tensors: an interpreter check")
    trees = [random_tree(N, gen), random_tree(N, gen), star(N), chain(N)]
    parents = torch.tensor(trees, dtype=torch.int32)
    TW = max(16, 1 << (2 * N - 1).bit_length())
    b = len(trees)
    results = {}
    for is_tree in (True, False):
        onp, strict = (torch.full((b, TW, TW), -1, dtype=torch.int32) for _ in range(2))
        holds = torch.full((b, N, TW), -1, dtype=torch.int32)
        _mask_kernel[(b,)](ancestor_bits(parents).contiguous() if is_tree else None, onp, strict, holds, T=N, TW=TW,
                     IS_TREE=is_tree)
        results[is_tree] = onp, strict, holds
    anc = ancestor_tables(parents)[0].to(torch.int32)                             # [b, node, ancestor]
    want = torch.zeros(b, TW, TW, dtype=torch.int32)
    want[:, :N, :N] = anc
    want[:, N:2 * N, :N] = anc
    onp, strict, holds = results[True]
    assert torch.equal(onp, want)
    eye = torch.eye(N, dtype=torch.int32)
    want_strict = torch.zeros_like(want)
    want_strict[:, :N, :N] = anc * (1 - eye)
    assert torch.equal(strict, want_strict)
    assert torch.equal(holds[:, :, :2 * N], want[:, :2 * N, :N].transpose(1, 2))
    # the chain build on the chain tree's row (padding rows aside: the chain's masks there are never used)
    c_onp, c_strict, c_holds = results[False]
    assert torch.equal(c_onp[3, :2 * N], onp[3, :2 * N]) and torch.equal(c_strict[3], strict[3])
    assert torch.equal(c_holds[3, :, :2 * N], holds[3, :, :2 * N])


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_other_backends_take_the_route(backend, gen):
    """The route names Triton kernels: every other backend accepts it (N > 8 too) and computes the same function as
    with the default route, bit for bit."""
    fams = {r: RouteFamily(gen, route=r) for r in ("fused", ROUTE)}
    N = MAX_TREE_NODES + 1
    rings = {r: f.ring(3, history_len=10, window=N) for r, f in fams.items()}
    rings[ROUTE].state.copy_(rings["fused"].state)
    trees = [random_tree(N, gen) for _ in range(2)]
    parents = torch.tensor(trees, dtype=torch.int32)
    for _ in range(5):
        w = fams["fused"].window(2, N)
        ys = {r: f.verify(rings[r], w, parents, backend) for r, f in fams.items()}
        assert torch.equal(ys[ROUTE], ys["fused"])
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        for r in fams:
            gdn.tree_commit(rings[r], path, acc, backend=backend)
    for n in CACHE:
        assert torch.equal(getattr(rings[ROUTE], n), getattr(rings["fused"], n)), n


@pytest.mark.parametrize("backend", ["triton", "torch", "ref", "cpu"])
def test_unknown_route_refused_before_touching_the_ring(backend, gen):
    fam = RouteFamily(gen, route="fused_fold")
    ring = fam.ring(2, history_len=4, window=3)
    snapshot = ring.clone()
    with pytest.raises(ValueError, match="spec route"):
        fam.verify(ring, fam.window(2, 3), torch.tensor(star(3), dtype=torch.int32), backend)
    _unchanged(ring, snapshot)


def test_tree_beyond_the_route_limit_refused(gen):
    """N = MAX_TREE_NODES + 1 on the Triton verify_fold route: a ValueError naming the limit and the fused route
    before any launch; the fused route verifies the same tree."""
    fam = RouteFamily(gen)
    N = MAX_TREE_NODES + 1
    ring = fam.ring(1, history_len=N, window=N)
    snapshot = ring.clone()
    parents = torch.tensor(star(N), dtype=torch.int32)
    w = fam.window(1, N)
    with pytest.raises(ValueError, match=rf"N={N} > {MAX_TREE_NODES}.*route='fused'"):
        fam.verify(ring, w, parents, "triton")
    _unchanged(ring, snapshot)
    assert not hasattr(ring, "_verify_fold_workspace")
    assert torch.isfinite(gdn.tree_verify(ring, **w, parents=parents, route="fused")).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(),
                    reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("N", [4, 8])
def test_bf16_matches_torch_on_gpu(N, gen):
    """bf16 activations (the split dots against the raw window rows) at Qwen3.5-4B, L2-normalised q / k, the full
    binary tree of N nodes, the commit's moves on the device; a NULL row."""
    geo = get_geometry("qwen35_4b")
    rings = {b: gdn.SpecRing.allocate(geo, 8, 16, N, act_dtype=torch.bfloat16, device="cuda")
             for b in ("triton", "torch")}
    state0 = random_state(geo, 8, device="cuda", generator=gen)
    for r in rings.values():
        r.state.copy_(state0)
    slots = torch.tensor([4, NULL_SLOT, 0, 7, 2, 1, 6, 3], dtype=torch.int32, device="cuda")
    trees = [full_binary(N)] * 8
    parents = torch.tensor(trees, dtype=torch.int32, device="cuda")
    for _ in range(12):
        w = random_step(geo, 8, torch.bfloat16, "cuda", window=N, generator=gen)
        ys = {b: gdn.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, slots=slots, backend=b, route=ROUTE)
              for b, r in rings.items()}
        live = (slots != NULL_SLOT)
        assert rel_err(ys["triton"][live], ys["torch"][live]) <= tolerance(torch.bfloat16)
        path, acc = random_commit(trees, depth_of(trees[0]), gen)
        for b, r in rings.items():
            gdn.tree_commit(r, path.cuda(), acc.cuda(), slots, backend=b)
    # the state passed through the ring's bf16 u rows (each backend rounds its own u): bf16-keyed
    assert rel_err(rings["triton"].state, rings["torch"].state) <= tolerance(torch.float32, torch.bfloat16)
