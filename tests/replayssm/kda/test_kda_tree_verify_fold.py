"""kda.tree_verify(route="verify_fold"): the Kimi Delta Attention tree verify on the ring verify's prep / verify /
fold kernels (replayssm/delta_rule/spec_launch.py), KDA's preps built with IS_TREE: spec_prep_kda_kernel (the stacked
[2N, K] tile, N <= 4) and spec_prep_kda_tok_kernel (token-major, N up to 8), so every case runs at an N of each.
The oracles are GDN's (tests/replayssm/gdn/test_gdn_tree_verify_fold.py, tests/replayssm/test_tree.py): every
node's output against the float64 path recurrence of replayssm.kda.tree's ref backend, the ring's caches against the
ref ring after every commit, each row's committed state against a float64 serial replay of the accepted tokens
(kda_step_ref, a decay per key channel); NULL rows, permuted slots, random accepts, early flushes, ring wrap,
outputs NaN-poisoned before each verify. Added for KDA: trees redrawn every step (a prep that left a previous
tree's coefficient entries in the workspace would reuse them), and the per-channel decay sweep along a branch.
"""

from __future__ import annotations

import pytest
import torch

from replayssm import kda
from replayssm.checks import NULL_SLOT, interpreter_active
from replayssm.delta_rule.spec_launch import MAX_TREE_NODES
from replayssm.geometry import KDAGeometry, get_geometry
from replayssm.kda.inputs import random_state, random_step
from replayssm.kda.ref import kda_step_ref
from replayssm.testing import rel_err, tolerance
from tests.replayssm.test_tree import _run_trees, steps_forcing_flush
from tests.replayssm.tree_cases import chain, depth_of, full_binary, random_commit, random_tree, star

ROUTE = "verify_fold"
F16, F32 = torch.float16, torch.float32
CACHE = ("u", "k", "g", "state", "write_pos", "origin", "is_flush")
# one N per prep kernel: 2N <= 8 rows take the stacked tile, more the token-major one (spec_launch)
STACKED, TOKEN_MAJOR = 4, MAX_TREE_NODES


class KDAFamily:
    """tests/replayssm/tree_cases.py's family interface for KDA (g [batch, N, HV, K]), its tree_verify on `route`
    (every backend takes the name)."""

    name = "kda"
    mod = kda
    fields = ("u", "k", "g", "state")

    def __init__(self, gen: torch.Generator, route: str = ROUTE, H=2, HV=4, K=16, V=8):
        self.geo = KDAGeometry(H=H, HV=HV, K=K, V=V)
        self.gen = gen
        self.route = route

    def ring(self, num_slots: int, history_len: int, window: int, act_dtype=F32, state_dtype=F32):
        r = kda.SpecRing.allocate(self.geo, num_slots, history_len, window, state_dtype=state_dtype,
                                  act_dtype=act_dtype)
        r.state.copy_(random_state(self.geo, num_slots, generator=self.gen))
        return r

    def window(self, batch: int, n: int, act_dtype=F32) -> dict:
        return random_step(self.geo, batch, act_dtype=act_dtype, window=n, generator=self.gen)

    def verify(self, ring, w, parents, backend, slots=None, out=None):
        return kda.tree_verify(ring, **w, parents=parents, slots=slots, out=out, backend=backend, route=self.route)

    def chain_verify(self, ring, w, backend, slots=None):
        return kda.spec_verify(ring, **w, slots=slots, backend=backend, route=self.route)

    def committed(self, ring, slots) -> torch.Tensor:
        return kda.spec_materialize(ring, slots, backend="torch").double()

    def serial(self, state: torch.Tensor, w: dict, b: int, nodes: list[int]) -> torch.Tensor:
        """state float64 [HV, V, K] advanced by the KDA recurrence over the window tokens `nodes` of row b."""
        S = state[None].clone()
        for s in nodes:
            S = kda_step_ref(S, *(w[n][b:b + 1, s] for n in ("q", "k", "v", "g", "beta")))[0]
        return S[0]


def _unchanged(ring, snapshot) -> None:
    for n in CACHE:
        assert torch.equal(getattr(ring, n), getattr(snapshot, n)), n


@pytest.mark.parametrize("shape,N", [("binary", STACKED), ("random", STACKED), ("binary", 7),
                                     ("random", TOKEN_MAJOR)])
def test_tree_matches_path_recurrence(shape, N, gen):
    """Per-row trees (binary: the full 2-ary tree of N nodes; random: a random tree per row) against the path
    recurrence, with a NULL row and permuted slots, until every live row has flushed."""
    fam = KDAFamily(gen)
    trees = [full_binary(N) if shape == "binary" else random_tree(N, gen) for _ in range(3)]
    steps = steps_forcing_flush(8, max(depth_of(t) for t in trees))
    run = _run_trees(fam, ("triton",), trees, steps=steps, gen=gen, history_len=8)
    assert run.every_row_flushed(), run.flushed


@pytest.mark.parametrize("N", [3, 6])
def test_fp16_activations_and_l2norm(N, gen):
    """fp16 activations; and q / k L2-normalised in the prep, against the ref backend."""
    fam = KDAFamily(gen)
    trees = [random_tree(N, gen), star(N), random_tree(N, gen)]
    _run_trees(fam, ("triton",), trees, steps=3, gen=gen, act_dtype=F16)
    rings = {b: fam.ring(3, history_len=8, window=N) for b in ("ref", "triton")}
    rings["triton"].state.copy_(rings["ref"].state)
    parents = torch.tensor(trees, dtype=torch.int32)
    for _ in range(3):
        w = fam.window(3, N)
        w["q"] *= 1 + 3 * torch.rand(3, N, 2, 1, generator=gen)                  # norms the kernel must divide out
        w["k"] *= 0.2 + torch.rand(3, N, 2, 1, generator=gen)
        ys = {b: kda.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, backend=b, route=ROUTE)
              for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["ref"]) <= tolerance(F32)
        # the path padded to N: the early-flush rule (write_pos + depth + N > L, depth = the path's width) must cover
        # the next step's tree, redrawn and possibly deeper than this one (a width of this step's depth let a
        # chain accepted in full overflow the ring: write_pos 9 + N 8 > L 16)
        path, acc = random_commit(trees, N, gen)
        for b, r in rings.items():
            kda.tree_commit(r, path, acc, backend=b)
    assert rel_err(rings["triton"].state, rings["ref"].state) <= tolerance(F32)


def test_long_run_wraps_and_flushes(gen):
    """Rows flushing at different steps and a window crossing the ring's end: row 0 accepts 1 token and flushes at
    steps 5 and 10; the chain row (row 3, depth 4) accepts 4, flushes every other step from step 2 and wraps from
    step 4 (L = 8 + 4, R = 16); row 2 is padding."""
    fam = KDAFamily(gen, H=1, HV=2, K=16, V=4)
    trees = [random_tree(4, gen) for _ in range(3)] + [chain(4)]
    run = _run_trees(fam, ("triton",), trees, steps=12, gen=gen, history_len=8, fixed_acc={0: 1, 3: 4})
    assert run.live.tolist() == [True, True, False, True]
    assert run.flushed[:, 0].nonzero().flatten().tolist() == [5, 10]
    assert run.flushed[:, 3].nonzero().flatten().tolist() == list(range(2, 12, 2))
    assert run.wrapped[:, 3].any()


@pytest.mark.parametrize("N", [STACKED, TOKEN_MAJOR])
def test_trees_redrawn_every_step(N, gen):
    """A new random tree per row at every step (the workspace is the ring's, kept across verifies): each verify
    and each commit against the ref ring, so coefficients of the slot's previous tree (an ancestor pair that is
    no longer one) must not survive into the next verify."""
    fam = KDAFamily(gen)
    rings = {b: fam.ring(4, history_len=8, window=N) for b in ("ref", "triton")}
    rings["triton"].state.copy_(rings["ref"].state)
    slots = torch.tensor([3, 1, 0], dtype=torch.int32)
    for step in range(6):
        trees = [random_tree(N, gen) for _ in range(3)]
        trees[step % 3] = chain(N) if step % 2 else star(N)            # the deepest and the shallowest trees too
        parents = torch.tensor(trees, dtype=torch.int32)
        w = fam.window(3, N)
        ys = {b: fam.verify(r, w, parents, b, slots=slots) for b, r in rings.items()}
        assert rel_err(ys["triton"], ys["ref"]) <= tolerance(F32), step
        # the path padded to N: the early-flush rule (write_pos + depth + N > L, depth = the path's width) must cover
        # the next step's tree, redrawn and possibly deeper than this one (a width of this step's depth let a
        # chain accepted in full overflow the ring: write_pos 9 + N 8 > L 16)
        path, acc = random_commit(trees, N, gen)
        for b, r in rings.items():
            kda.tree_commit(r, path, acc, slots, backend=b)
        assert rel_err(rings["triton"].state, rings["ref"].state) <= tolerance(F32), step


@pytest.mark.parametrize("N", [STACKED, 7])
def test_stale_ring_rows_never_read_after_a_tree_commit(N, gen):
    """After each tree commit every ring row past a slot's committed history (the rejected branches' entries, the
    free rows) is NaN in u, k and g: the next verify's outputs and its fold (plain and flushing rows) equal a twin
    ring's that was never poisoned, and the state stays finite. A prep that read a gate row by node index rather
    than the committed position, or past write_pos, would read a NaN."""
    fam = KDAFamily(gen)
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
            kda.tree_commit(r, path, acc, slots)
        p = rings["poisoned"]
        for s in slots.tolist():
            h, origin = int(p.write_pos[s]), int(p.origin[s])
            stale = [(origin + j) % p.ring_len for j in range(h, p.ring_len)]
            for name in ("u", "k", "g"):
                getattr(p, name)[s][:, stale] = float("nan")
        assert torch.equal(p.state, rings["clean"].state) and torch.isfinite(p.state).all()
    assert folded >= 3


@pytest.mark.parametrize("N", [STACKED, TOKEN_MAJOR])
def test_gpu_tiles_under_interpreter(N, gen, monkeypatch):
    """The GPU launch configs (REPLAYSSM_TARGET_ARCH=90: the tree builds' own, the stacked prep uncapped on one warp,
    the token-major prep on four) run by the interpreter against the torch backend on random trees: K = 80 (the
    prep's whole-K tile masked, the verify's 32-wide chunks), V = 72 over BV 64, two value heads per key head,
    in-kernel L2 norm, a NULL row; every live row flushes. fp32 activations: the 16-bit ones take the bf16x3 split
    (spec_launch._state_dot), whose bfloat16 dots the interpreter does not compute as the GPU does (it refuses
    bfloat16 tensors; the chain's outputs are inf there too)."""
    if not interpreter_active():
        pytest.skip("the forced launch configs are an interpreter-only check")
    monkeypatch.setenv("REPLAYSSM_TARGET_ARCH", "90")
    from replayssm.delta_rule.spec_launch import default_config, kernel_names

    geo = KDAGeometry(H=1, HV=2, K=80, V=72)
    prep = default_config(kernel_names(True, tree=True)[0], geo.K, geo.V, 90, N)
    assert prep["num_warps"] == (1 if N <= 4 else 4) and "maxnreg" not in prep
    rings = {b: kda.SpecRing.allocate(geo, 3, 8, N) for b in ("triton", "torch")}
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
        w = random_step(geo, 3, window=N, use_qk_l2norm=True, generator=gen)
        ys = {b: kda.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, slots=slots, backend=b, route=ROUTE)
              for b, r in rings.items()}
        assert rel_err(ys["triton"][[0, 2]], ys["torch"][[0, 2]]) <= tolerance(F32), step
        assert rel_err(rings["triton"].state, rings["torch"].state) <= tolerance(F32), step
        path, acc = random_commit(trees, depth, gen)
        for b, r in rings.items():
            kda.tree_commit(r, path, acc, slots, backend=b)
    assert flushes == {0, 2} and not torch.equal(rings["triton"].state, state0)
    assert torch.equal(rings["triton"].state[1], state0[1])


@pytest.mark.parametrize("T", [STACKED, TOKEN_MAJOR])
def test_chain_tree_is_the_chain_route(T, gen):
    """parents = [-1, 0, 1, ...], path = [0, 1, ...]: the tree build equals spec_verify on the same route (the chain
    build) to float rounding: outputs, checkpoints and every ring entry over a run that flushes; a wrong mask or
    gate errs by O(1). The chain is the deepest tree of N nodes, so every factor of the inverse is needed."""
    fam = KDAFamily(gen)
    batch = 3
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
        y_chain = fam.chain_verify(rings["chain"], w, "triton", slots=slots)
        y_tree = fam.verify(rings["tree"], w, parents, "triton", slots=slots)
        assert rel_err(y_tree[live], y_chain[live]) <= 1e-6
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        kda.spec_commit(rings["chain"], acc, slots)
        kda.tree_commit(rings["tree"], path, acc, slots)
        for n in CACHE:
            a, b = getattr(rings["tree"], n), getattr(rings["chain"], n)
            assert (torch.equal(a, b) if not a.is_floating_point() else rel_err(a, b) <= 1e-6), n
    assert flushed > 0


@pytest.mark.parametrize("backend", ["ref", "torch", "cpu"])
def test_other_backends_take_the_route(backend, gen):
    """The route names Triton kernels: every other backend accepts it (N > 8 too) and computes the same function as
    with the default route, bit for bit."""
    fams = {r: KDAFamily(gen, route=r) for r in ("fused", ROUTE)}
    N = MAX_TREE_NODES + 1
    rings = {r: f.ring(3, history_len=10, window=N) for r, f in fams.items()}
    rings[ROUTE].state.copy_(rings["fused"].state)
    trees = [random_tree(N, gen) for _ in range(2)]
    parents = torch.tensor(trees, dtype=torch.int32)
    for _ in range(4):
        w = fams["fused"].window(2, N)
        ys = {r: f.verify(rings[r], w, parents, backend) for r, f in fams.items()}
        assert torch.equal(ys[ROUTE], ys["fused"])
        # the path padded to N: the early-flush rule (write_pos + depth + N > L, depth = the path's width) must cover
        # the next step's tree, redrawn and possibly deeper than this one (a width of this step's depth let a
        # chain accepted in full overflow the ring: write_pos 9 + N 8 > L 16)
        path, acc = random_commit(trees, N, gen)
        for r in fams:
            kda.tree_commit(rings[r], path, acc, backend=backend)
    for n in CACHE:
        assert torch.equal(getattr(rings[ROUTE], n), getattr(rings["fused"], n)), n


@pytest.mark.parametrize("backend", ["triton", "torch", "ref", "cpu"])
def test_unknown_route_refused_before_touching_the_ring(backend, gen):
    fam = KDAFamily(gen, route="fused_fold")
    ring = fam.ring(2, history_len=4, window=3)
    snapshot = ring.clone()
    with pytest.raises(ValueError, match="spec route"):
        fam.verify(ring, fam.window(2, 3), torch.tensor(star(3), dtype=torch.int32), backend)
    _unchanged(ring, snapshot)


def test_tree_beyond_the_route_limit_refused(gen):
    """N = MAX_TREE_NODES + 1 on the Triton verify_fold route: a ValueError naming the limit and the fused route
    before any launch; the fused route verifies the same tree."""
    fam = KDAFamily(gen)
    N = MAX_TREE_NODES + 1
    ring = fam.ring(1, history_len=N, window=N)
    snapshot = ring.clone()
    parents = torch.tensor(star(N), dtype=torch.int32)
    w = fam.window(1, N)
    with pytest.raises(ValueError, match=rf"N={N} > {MAX_TREE_NODES}.*route='fused'"):
        fam.verify(ring, w, parents, "triton")
    _unchanged(ring, snapshot)
    assert not hasattr(ring, "_verify_fold_workspace")
    assert torch.isfinite(kda.tree_verify(ring, **w, parents=parents, route="fused")).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreter_active(),
                    reason="needs a CUDA GPU and compiled Triton (TRITON_INTERPRET=0)")
@pytest.mark.parametrize("N", [STACKED, TOKEN_MAJOR])
def test_bf16_matches_torch_on_gpu(N, gen):
    """bf16 activations at Kimi-Linear's geometry (K = V = 128), L2-normalised q / k, the full binary tree of N nodes,
    the commit's moves on the device; a NULL row."""
    geo = get_geometry("kimi_linear_48b_a3b")
    rings = {b: kda.SpecRing.allocate(geo, 8, 16, N, act_dtype=torch.bfloat16, device="cuda")
             for b in ("triton", "torch")}
    state0 = random_state(geo, 8, device="cuda", generator=gen)
    for r in rings.values():
        r.state.copy_(state0)
    slots = torch.tensor([4, NULL_SLOT, 0, 7, 2, 1, 6, 3], dtype=torch.int32, device="cuda")
    trees = [full_binary(N)] * 8
    parents = torch.tensor(trees, dtype=torch.int32, device="cuda")
    for _ in range(12):
        w = random_step(geo, 8, torch.bfloat16, "cuda", window=N, use_qk_l2norm=True, generator=gen)
        ys = {b: kda.tree_verify(r, **w, use_qk_l2norm=True, parents=parents, slots=slots, backend=b, route=ROUTE)
              for b, r in rings.items()}
        live = (slots != NULL_SLOT)
        assert rel_err(ys["triton"][live], ys["torch"][live]) <= tolerance(torch.bfloat16)
        path, acc = random_commit(trees, depth_of(trees[0]), gen)
        for b, r in rings.items():
            kda.tree_commit(r, path.cuda(), acc.cuda(), slots, backend=b)
    # the state passed through the ring's bf16 u rows (each backend rounds its own u): bf16-keyed
    assert rel_err(rings["triton"].state, rings["torch"].state) <= tolerance(torch.float32, torch.bfloat16)
