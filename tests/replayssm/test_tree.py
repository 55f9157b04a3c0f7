"""Tree speculation on the ring, both families: tree_verify / tree_commit against the float64 path recurrence,
a chain tree against spec_verify / spec_commit bit for bit (torch), long random runs with ring wrap and early
flushes, and bad input refused before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from replayssm.checks import NULL_SLOT
from replayssm.testing import rel_err, tolerance
from tests.replayssm.tree_cases import (
    FAMILIES,
    SHAPES,
    chain,
    depth_of,
    full_binary,
    random_commit,
    random_tree,
    star,
)

TOL = tolerance(torch.float32)


def _snapshot(ring, fam) -> dict:
    names = (*fam.fields, "write_pos", "origin", "is_flush")
    return {n: getattr(ring, n).clone() for n in names}


def _assert_caches_close(a, b, fam, what: str, tol: float = TOL) -> None:
    for n in fam.fields:
        err = rel_err(getattr(a, n), getattr(b, n))
        assert err <= tol, f"{what}: ring.{n} differs, rel err {err:.2e}"
    for n in ("write_pos", "origin", "is_flush"):
        assert torch.equal(getattr(a, n), getattr(b, n)), f"{what}: cursor {n} differs"


# The chain tree against the chain API on the same backend: torch is exact; the C tree kernel adds the chain
# kernel's terms in the same order, but gcc contracts multiply-adds into FMAs per function (-ffp-contract=fast),
# so a few outputs differ in the last bit (measured: rel err <= 6e-8 over 14 steps): held to 1e-6, where a
# wrong mask or prefix sum errs by O(1).
CHAIN_TOL = {"torch": 0.0, "cpu": 1e-6}


def _same(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return torch.equal(a, b) if tol == 0.0 or not a.is_floating_point() else rel_err(a, b) <= tol


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_chain_tree_is_spec(family, backend, gen):
    """parents = [-1, 0, 1, ...] and path = [0, 1, ...]: the tree path equals spec_verify / spec_commit on the
    same backend (torch bit for bit, cpu to CHAIN_TOL), outputs and every cache entry (cursors exactly), over a
    run long enough to wrap the ring and flush."""
    fam = FAMILIES[family](gen)
    tol = CHAIN_TOL[backend]
    T, batch = 4, 3
    chain_ring = fam.ring(4, history_len=8, window=T)
    tree_ring_ = fam.ring(4, history_len=8, window=T)
    tree_ring_.state.copy_(chain_ring.state)
    slots = torch.tensor([2, NULL_SLOT, 0], dtype=torch.int32)
    parents = torch.tensor(chain(T), dtype=torch.int32)
    path = torch.arange(T, dtype=torch.int32).expand(batch, T).contiguous()
    flushed = 0
    for _ in range(14):
        w = fam.window(batch, T)
        flushed += int(chain_ring.is_flush[[2, 0]].sum())
        y_chain = fam.chain_verify(chain_ring, w, backend, slots=slots)
        y_tree = fam.verify(tree_ring_, w, parents, backend, slots=slots)
        live = slots != NULL_SLOT
        assert _same(y_tree[live], y_chain[live], tol)
        acc = torch.randint(1, T + 1, (batch,), generator=gen, dtype=torch.int32)
        fam.mod.spec_commit(chain_ring, acc, slots, backend=backend)
        fam.mod.tree_commit(tree_ring_, path, acc, slots, backend=backend)
        for n in (*fam.fields, "write_pos", "origin", "is_flush"):
            assert _same(getattr(tree_ring_, n), getattr(chain_ring, n), tol), n
    assert flushed > 0


def steps_forcing_flush(history_len: int, depth: int) -> int:
    """Steps after which every live row has flushed at least once, whatever the draws: a row that has not
    flushed has write_pos >= k after k commits (each accepts >= 1), so commit k = history_len - depth + 1 at
    the latest flags is_flush (write_pos + depth + N > history_len + N), seen before the verify of step k."""
    return history_len - depth + 2


@dataclass
class Run:
    """What a _run_trees run went through, [steps, batch] bool per live row (padding rows False):
    flushed = the verify of that step folded the history; wrapped = its history or window crossed ring row
    R - 1 into row 0."""
    flushed: torch.Tensor
    wrapped: torch.Tensor
    live: torch.Tensor

    def every_row_flushed(self) -> bool:
        return bool(self.flushed[:, self.live].any(0).all())


def _run_trees(fam, backends, trees, steps, gen, history_len=8, null_row=True, act_dtype=torch.float32,
               state_dtype=torch.float32, fixed_acc=None) -> Run:
    """Drive one ring per backend and the ref ring in lockstep with the same random windows and branches;
    compare every node's output and the caches to the ref, and each row's committed state to a float64
    serial replay of the accepted tokens. fixed_acc {row: count} pins some rows' accepted counts (capped at
    the drawn branch's length); the rest are drawn."""
    N = len(trees[0])
    batch = len(trees)
    depth = max(depth_of(t) for t in trees)
    num_slots = batch + 1
    tol = tolerance(act_dtype, state_dtype)
    rings = {b: fam.ring(num_slots, history_len, N, act_dtype=act_dtype, state_dtype=state_dtype)
             for b in ("ref", *backends)}
    for b in backends:
        rings[b].state.copy_(rings["ref"].state)
    # desynchronised rows: slots in a shuffled order, one padding row
    slots = torch.randperm(num_slots, generator=gen)[:batch].to(torch.int32)
    if null_row:
        slots[batch // 2] = NULL_SLOT
    live = slots != NULL_SLOT
    parents = torch.tensor(trees, dtype=torch.int32)
    expected = fam.committed(rings["ref"], slots)
    flushed = torch.zeros(steps, batch, dtype=torch.bool)
    wrapped = torch.zeros(steps, batch, dtype=torch.bool)
    ref = rings["ref"]
    for step in range(steps):
        w = fam.window(batch, N, act_dtype)
        sl = slots[live].long()
        flushed[step, live] = ref.is_flush[sl] != 0
        wrapped[step, live] = ref.origin[sl] + ref.write_pos[sl] + N > ref.ring_len
        y_ref = fam.verify(ref, w, parents, "ref", slots=slots)
        for b in backends:
            out = torch.full_like(y_ref, float("nan"))
            y = fam.verify(rings[b], w, parents, b, slots=slots, out=out)
            assert torch.isnan(y[~live]).all(), "a padding row was written"
            err = rel_err(y[live], y_ref[live])
            assert err <= tol, f"{b} step {step}: node outputs differ from the path recurrence, rel err {err:.2e}"
        path, acc = random_commit(trees, depth, gen)
        for r, a in (fixed_acc or {}).items():
            acc[r] = min(a, int((path[r] >= 0).sum()))
        for b in ("ref", *backends):
            fam.mod.tree_commit(rings[b], path, acc, slots, backend=b)
        for b in backends:
            _assert_caches_close(rings[b], ref, fam, f"{b} step {step}", tol)
        for r in range(batch):
            if live[r]:
                nodes = path[r, : int(acc[r])].tolist()
                expected[r] = fam.serial(expected[r], w, r, nodes)
        got = fam.committed(ref, slots)
        err = rel_err(got[live], expected[live])
        assert err <= tol, f"step {step}: committed state != serial replay of the accepted tokens ({err:.2e})"
    return Run(flushed, wrapped, live)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("backend", ["torch", "triton", "cpu"])
def test_tree_matches_path_recurrence(family, shape, backend, gen):
    """Random trees of each shape (random shapes differ per row) against the float64 path recurrence, node by
    node, with the caches after every commit; Triton (interpreter) on the branching shapes, fewer steps.
    Enough steps that every live row flushes whatever the draws (steps_forcing_flush)."""
    if backend == "triton" and shape in ("chain", "star"):
        pytest.skip("the interpreter is slow: Triton runs the branching shapes (binary, random)")
    fam = FAMILIES[family](gen)
    N = 7 if shape == "binary" else 5
    trees = [SHAPES[shape](N, gen) for _ in range(3)]
    depth = max(depth_of(t) for t in trees)
    steps = max(8 if backend == "torch" else 5, steps_forcing_flush(8, depth))
    run = _run_trees(fam, (backend,), trees, steps=steps, gen=gen, history_len=8)
    assert run.every_row_flushed(), run.flushed


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["torch", "triton", "cpu"])
def test_fp16_activations(family, backend, gen):
    """fp16 ring activations (rounded where stored, as the oracle rounds them), random trees per row."""
    fam = FAMILIES[family](gen)
    trees = [random_tree(5, gen) for _ in range(3)]
    _run_trees(fam, (backend,), trees, steps=3 if backend == "triton" else 6, gen=gen, act_dtype=torch.float16)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("act_dtype,state_dtype", [(torch.float32, torch.float16), (torch.float32, torch.bfloat16),
                                                   (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16)],
                         ids=str)
def test_cpu_half_precision(family, act_dtype, state_dtype, gen):
    """The C tree kernels on fp16 / bf16 checkpoints and activations (the state rounded where a flush stores it,
    the ring where it stores), against the float64 path recurrence run on the same ring dtypes."""
    fam = FAMILIES[family](gen)
    trees = [random_tree(5, gen) for _ in range(2)] + [full_binary(5)]
    steps = max(8, steps_forcing_flush(8, max(depth_of(t) for t in trees)))
    run = _run_trees(fam, ("cpu",), trees, steps=steps, gen=gen, act_dtype=act_dtype, state_dtype=state_dtype)
    assert run.every_row_flushed(), run.flushed


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cpu_other_branches_never_read(family, gen):
    """The C kernels sum over a node's own path only, never multiplying another branch's terms by a zero mask:
    NaN inputs at node 1 of a star leave every other node's output finite and equal to the path recurrence."""
    fam = FAMILIES[family](gen)
    N = 4
    rings = {b: fam.ring(2, history_len=8, window=N) for b in ("ref", "cpu")}
    rings["cpu"].state.copy_(rings["ref"].state)
    parents = torch.tensor(star(N), dtype=torch.int32)
    w = fam.window(2, N)
    for name in ("x", "B") if family == "mamba2" else ("k", "v"):
        w[name][:, 1] = float("nan")
    y = {b: fam.verify(r, w, parents, b) for b, r in rings.items()}
    assert torch.isnan(y["ref"][:, 1]).all()
    others = [0, 2, 3]
    assert rel_err(y["cpu"][:, others], y["ref"][:, others]) <= TOL


@pytest.mark.parametrize("family", list(FAMILIES))
def test_long_random_run_wraps_and_flushes(family, gen):
    """A long run of random trees per row on a small ring: the ring wraps, rows flush at different steps.
    Forced, not hoped for: row 0 always accepts 1 token and flushes at steps 5, 10, ...; the chain row
    (row 3, depth 4 = the ring's lookahead) always accepts 4 and flushes at steps 2, 4, ..., its window
    crossing ring row 15 from step 4 on (L = 8 + 4, R = 16); row 1 draws its counts and flushes at least
    every 5 steps; row 2 is padding."""
    fam = FAMILIES[family](gen, **({"nheads": 2, "headdim": 4, "dstate": 8, "ngroups": 1} if family == "mamba2"
                                   else {"H": 1, "HV": 2, "K": 8, "V": 4}))
    trees = [random_tree(4, gen) for _ in range(3)] + [chain(4)]
    run = _run_trees(fam, ("torch", "cpu"), trees, steps=24, gen=gen, history_len=8, fixed_acc={0: 1, 3: 4})
    assert run.live.tolist() == [True, True, False, True]
    per_row = run.flushed.sum(0)
    assert (per_row[run.live] >= 4).all(), per_row
    assert not torch.equal(run.flushed[:, 0], run.flushed[:, 3]), "rows 0 and 3 flushed at the same steps"
    assert run.flushed[:, 0].nonzero().flatten().tolist() == [5, 10, 15, 20]
    assert run.flushed[:, 3].nonzero().flatten().tolist() == list(range(2, 24, 2))
    assert run.wrapped[:, 3].any(), "the chain row's window never crossed the ring's end"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_tree_flush_rule_boundary(family, backend, gen):
    """is_flush = write_pos + depth + N > L: a star of N = 4 (depth 2) on B = 8 (L = 12) flushes from
    write_pos 7 on, not at 6; a full-depth path (depth = N) gives the chain rule write_pos + 2N > L."""
    fam = FAMILIES[family](gen)
    N = 4
    ring = fam.ring(1, history_len=8, window=N)
    parents = torch.tensor(star(N), dtype=torch.int32)
    path = torch.tensor([[0, 2]], dtype=torch.int32)
    seen = []
    for _ in range(4):
        fam.verify(ring, fam.window(1, N), parents, backend)
        fam.mod.tree_commit(ring, path, torch.tensor([2], dtype=torch.int32), backend=backend)
        seen.append((int(ring.write_pos[0]), int(ring.is_flush[0])))
    assert seen[:4] == [(2, 0), (4, 0), (6, 0), (8, 1)], seen
    ring2 = fam.ring(1, history_len=8, window=N)
    ring2.write_pos[0] = 3
    full = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    fam.verify(ring2, fam.window(1, N), torch.tensor(chain(N), dtype=torch.int32), backend)
    fam.mod.tree_commit(ring2, full, torch.tensor([1], dtype=torch.int32), backend=backend)
    assert (int(ring2.write_pos[0]), int(ring2.is_flush[0])) == (4, 0)          # 4 + 8 = 12: fits
    fam.verify(ring2, fam.window(1, N), torch.tensor(chain(N), dtype=torch.int32), backend)
    fam.mod.tree_commit(ring2, full, torch.tensor([1], dtype=torch.int32), backend=backend)
    assert (int(ring2.write_pos[0]), int(ring2.is_flush[0])) == (5, 1)          # 5 + 8 > 12: flush


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bad_input_refused_before_any_write(family, gen):
    fam = FAMILIES[family](gen)
    N = 4
    ring = fam.ring(3, history_len=8, window=N)
    w = fam.window(2, N)
    good = torch.tensor(full_binary(N), dtype=torch.int32)
    fam.verify(ring, w, good, "torch")
    before = _snapshot(ring, fam)
    bad_parents = {
        "parent not earlier": ([-1, 0, 3, 1], "earlier node"),
        "root parent": ([0, 0, 1, 1], r"parents\[:, 0\] must be -1"),
        "self parent": ([-1, 1, 0, 0], "earlier node"),
    }
    for par, msg in bad_parents.values():
        with pytest.raises(ValueError, match=msg):
            fam.verify(ring, w, torch.tensor(par, dtype=torch.int32), "torch")
    with pytest.raises(ValueError, match="parents must be"):
        fam.verify(ring, w, torch.tensor([good.tolist()] * 3, dtype=torch.int32), "torch")
    with pytest.raises(ValueError, match="ring.window|window"):
        fam.verify(ring, fam.window(2, N + 1), torch.tensor(chain(N + 1), dtype=torch.int32), "torch")
    acc = torch.tensor([2, 2], dtype=torch.int32)
    bad_commits = [
        (torch.tensor([[0, 3, -1], [0, 1, 3]], dtype=torch.int32), acc, "not a branch"),   # 3's parent is 1
        (torch.tensor([[1, 3, -1], [0, 1, 3]], dtype=torch.int32), acc, r"path\[:, 0\] must be 0"),
        (torch.tensor([[0, 1, 3, 0, 0]], dtype=torch.int32).expand(2, 5), acc, "depth 5 must be in 1..N=4"),
        (torch.tensor([[0, 1, 3], [0, 1, 3]], dtype=torch.int32), torch.tensor([4, 1], dtype=torch.int32),
         "num_accepted must be in 1..depth=3"),
        (torch.tensor([[0, 1, 9], [0, 1, 3]], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32),
         "node indices in 0..N-1"),
    ]
    for path, a, msg in bad_commits:
        for backend in ("torch", "ref", "triton", "cpu"):
            with pytest.raises(ValueError, match=msg):
                fam.mod.tree_commit(ring, path, a, backend=backend)
    for par, msg in bad_parents.values():                                              # the C kernel's path
        with pytest.raises(ValueError, match=msg):
            fam.verify(ring, w, torch.tensor(par, dtype=torch.int32), "cpu")
    ring.write_pos[0] += 9                                  # a broken cursor: 9 + N = 13 > L = 12
    with pytest.raises(ValueError, match="write_pos \\+ N > L"):
        fam.verify(ring, w, good, "cpu")
    ring.write_pos[0] -= 9
    for n, t in before.items():
        assert torch.equal(getattr(ring, n), t), f"a refused call wrote ring.{n}"
    # a valid branch is accepted (3 is a child of 1 in the full binary tree of 4 nodes)
    fam.mod.tree_commit(ring, torch.tensor([[0, 1, 3], [0, 2, -1]], dtype=torch.int32), acc, backend="torch")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("move_tile", [4096, 8])
def test_commit_backends_move_the_same_entries(family, move_tile, gen, monkeypatch):
    """The Triton move + cursor kernels (interpreter), torch and ref leave the same ring after a tree commit
    of random branches on rows with random cursors, one padding row and one flushed row; move_tile 8 splits
    the heads of every field over several programs."""
    from replayssm import tree_ring

    monkeypatch.setattr(tree_ring, "MOVE_TILE", move_tile)
    fam = FAMILIES[family](gen)
    N = 7
    trees = [full_binary(N), random_tree(N, gen), star(N), random_tree(N, gen)]
    rings = {b: fam.ring(5, history_len=8, window=N) for b in ("ref", "torch", "triton", "cpu")}
    for n in fam.fields:
        src = getattr(rings["ref"], n)
        src.copy_(torch.randn(src.shape, generator=gen).to(src.dtype))
    wp = torch.randint(0, 8, (5,), generator=gen, dtype=torch.int32)
    org = torch.randint(0, 16, (5,), generator=gen, dtype=torch.int32)
    fl = torch.tensor([0, 1, 0, 0, 1], dtype=torch.int32)
    for b in ("torch", "triton", "cpu"):
        for n in fam.fields:
            getattr(rings[b], n).copy_(getattr(rings["ref"], n))
    slots = torch.tensor([3, 1, NULL_SLOT, 4], dtype=torch.int32)
    path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
    acc[0] = int((path[0] >= 0).sum())                                                 # one full branch
    for b, ring in rings.items():
        ring.write_pos.copy_(wp)
        ring.origin.copy_(org)
        ring.is_flush.copy_(fl)
        fam.mod.tree_commit(ring, path, acc, slots, backend=b, parents=torch.tensor(trees, dtype=torch.int32))
    for b in ("torch", "triton", "cpu"):
        for n in (*fam.fields, "write_pos", "origin", "is_flush"):
            assert torch.equal(getattr(rings[b], n), getattr(rings["ref"], n)), f"{b}: ring.{n}"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["torch", "ref"])
@pytest.mark.parametrize("method", ["native", "commit_replay", "stree"])
def test_tree_baselines_match_ring(family, backend, method, gen):
    """The tree baselines give the ring's node outputs and, after each commit, the ring's committed state
    (native: a snapshot per node; commit_replay: a frozen state, the accepted branch replayed at commit;
    stree: a ring flushing every step, the branch folded in by the next verify); padding rows untouched."""
    from baselines import commit_replay_tree as crt
    from baselines import native_tree_spec as nts

    fam = FAMILIES[family](gen)
    N, batch = 7, 3
    trees = [full_binary(N), random_tree(N, gen), star(N)]
    parents = torch.tensor(trees, dtype=torch.int32)
    ring = fam.ring(batch, history_len=8, window=N)
    if method == "native":
        mod, cache = nts, nts.TreeSnapshots.allocate(fam.geo, batch, N)
        cache.snapshots[:, 0] = ring.state.float()
    elif method == "commit_replay":
        mod, cache = crt, crt.TreeReplayCache.allocate(fam.geo, batch, N)
        cache.state.copy_(ring.state.float())
    else:                                  # STree: a ring that flushes every step (activation replay)
        mod, cache = None, fam.ring(batch, history_len=N, window=N)
        cache.state.copy_(ring.state)
    slots = torch.tensor([1, NULL_SLOT, 2], dtype=torch.int32)
    live = slots != NULL_SLOT
    for step in range(5):
        w = fam.window(batch, N)
        y_ring = fam.verify(ring, w, parents, "torch", slots=slots)
        out = torch.full_like(y_ring, float("nan"))
        if method == "stree":
            y = fam.verify(cache, w, parents, backend, slots=slots, out=out)
        elif family == "mamba2":
            p = fam.p
            y = mod.mamba2_tree_verify(cache, w["x"], w["dt"], p.A, w["B"], w["C"], p.D, w["z"], p.dt_bias,
                                       parents=parents, slots=slots, out=out, backend=backend)
        else:
            y = mod.gdn_tree_verify(cache, **w, parents=parents, slots=slots, out=out, backend=backend)
        assert torch.isnan(y[~live]).all()
        assert rel_err(y[live], y_ring[live]) <= TOL, f"step {step}"
        path, acc = random_commit(trees, max(depth_of(t) for t in trees), gen)
        fam.mod.tree_commit(ring, path, acc, slots, backend="torch")
        sl = slots[live]
        if method == "stree":
            crt.stree_commit(fam.mod, cache, path, acc, slots, backend=backend)
            assert bool((cache.is_flush[sl.long()] == 1).all())
            got = fam.committed(cache, sl)
        else:
            mod.tree_commit(cache, path, acc, slots, backend=backend)
            got = cache.committed(sl) if method == "native" else crt.committed(cache, sl)
        assert rel_err(got, fam.committed(ring, sl)) <= TOL, f"step {step} committed state"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_tree_beyond_32_nodes_refused(family, backend, gen):
    """The Triton and C kernels keep one 32-bit ancestor bit set per node: N = 33 is refused before any launch."""
    fam = FAMILIES[family](gen)
    ring = fam.ring(1, history_len=33, window=33)
    before = _snapshot(ring, fam)
    with pytest.raises(ValueError, match="N=33 > 32"):
        fam.verify(ring, fam.window(1, 33), torch.tensor(star(33), dtype=torch.int32), backend)
    for n, t in before.items():
        assert torch.equal(getattr(ring, n), t)


def test_ancestor_tables_memo_follows_in_place_changes(gen):
    """The memo of ancestor_tables is keyed on the tensor object and its version: an in-place change of a
    reused parents tensor (and a fresh tensor at a reused address) recomputes."""
    from replayssm.tree_ring import ancestor_tables, ancestor_tables_uncached

    par = torch.tensor(star(6), dtype=torch.int32)[None].repeat(2, 1)
    for _ in range(3):
        assert torch.equal(ancestor_tables(par)[0], ancestor_tables_uncached(par)[0])
        par[:, 1:] = torch.tensor(random_tree(6, gen)[1:], dtype=torch.int32)
    for _ in range(5):                                   # fresh tensors, often at a freed tensor's address
        fresh = torch.tensor([random_tree(6, gen)], dtype=torch.int32)
        assert torch.equal(ancestor_tables(fresh)[0], ancestor_tables_uncached(fresh)[0])
        del fresh
