"""Tree speculation on the ReplaySSM ring: tree checks, ancestor tables and the tree commit, both families.

A draft tree of N nodes is verified from one checkpoint on a ring allocated with window = N. Nodes are in
topological order: parents[0] = -1 (node 0 is the current token; its parent is the committed history) and
parents[s] < s. Node s is written at logical position h + s (ring row (origin + h + s) & (R - 1)), exactly
where a chain's window token s goes; node s sees the committed history and its own ancestors-or-self.

tree_commit(path, num_accepted) keeps the accepted branch path[0] = 0, path[1], ..., path[a - 1]:
    move the ring entries of node path[i] from logical position h + path[i] to h + i (i = 1..a-1, in
    increasing i: path[i] >= i and path[i'] > i for i' > i, so a move never overwrites a later source;
    moves of a chain are all no-ops), then advance the cursors as spec_commit does with the tree flush rule
        is_flush = write_pos + depth + N > L,   L = history_len + N, depth = path.shape[1]
    Every verify writes N entries after the history, so it needs write_pos + N <= L. A row that does not
    flush at write_pos h may accept up to depth nodes and still verify its next tree: h + depth + N <= L.
    For a chain (depth = N = T) this is the chain rule h + 2T > L. The next tree's depth must not exceed
    the depth used at this commit (a harness runs one tree shape per ring).
No state is written at commit: a few input entries move, then cursors.

Backends: "triton" (one small kernel for the moves per ring field, then the chain's cursor kernel with the
tree's lookahead, replayssm/ring_cursors.py; graph capturable),
"torch" (vectorised), "cpu" (the torch form: the fused C kernels are the verify's, replayssm/cpu/tree_body.h)
and "ref" (Python ints, row by row: the oracle); each advances the cursors with ring_cursors' commit of the
same backend (lookahead = depth). A ring here is any object with
write_pos, origin, is_flush, window, max_len, ring_len, null_slot, num_slots, device, plus the family's
ring fields [num_slots, heads, ring_len(, width)] named by the caller.
"""

from __future__ import annotations

import functools
import weakref

import torch

from replayssm import launch_registry, launch_table, ring_cursors
from replayssm.checks import check_backend, check_same_device, check_slots, kernel_arch, next_pow2, skip_value_checks

MOVE_TILE = 4096  # elements per program of the Triton move kernel (heads split over programs beyond it)
PARENTS_ATTR = "_tree_parents"  # tree_verify leaves its parents [batch, N] on the ring for tree_commit's checks

tl = None  # triton.language, bound by _kernels() on the first Triton call (importing this needs no triton)


# ------------------------------------------------------------------------------------------------ checks

def check_parents(parents, batch: int, N: int, device: torch.device, live: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Validate a tree: int [batch, N] or [N] (shared tree) with parents[0] = -1 and 0 <= parents[s] < s.

    Returns int32 [batch, N] (a broadcast view for a shared tree). Values are checked on the live rows
    (live bool [batch], default all) unless a CUDA graph is being captured.
    """
    if not isinstance(parents, torch.Tensor):
        raise ValueError(f"parents must be an int32 tensor [batch, N] or [N], got {type(parents).__name__}")
    if parents.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"parents must be int32 or int64, got {parents.dtype}")
    if parents.dim() == 1:
        parents = parents[None].expand(batch, -1)
    if tuple(parents.shape) != (batch, N):
        raise ValueError(f"parents must be [batch, N] = [{batch}, {N}] or [{N}], got shape {tuple(parents.shape)}")
    if parents.device != device:
        raise ValueError(f"parents on {parents.device}, ring on {device}")
    if not skip_value_checks() and batch:
        rows = parents if live is None else parents[live]
        if rows.numel():
            if bool((rows[:, 0] != -1).any()):
                raise ValueError(f"parents[:, 0] must be -1 (node 0's parent is the committed history), got "
                                 f"{rows[:, 0].unique().tolist()}")
            s = torch.arange(N, device=device)
            bad = (rows[:, 1:] < 0) | (rows[:, 1:] >= s[1:])
            if bool(bad.any()):
                r, c = (int(v) for v in bad.nonzero()[0])
                raise ValueError(f"parents[{r}, {c + 1}] = {int(rows[r, c + 1])}: a parent must be an earlier "
                                 f"node, 0 <= parents[s] < s (topological order)")
    return parents.to(torch.int32)


def check_tree_commit(ring, path, num_accepted, slots, backend: str, parents=None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a tree commit. path int [batch, depth] (1 <= depth <= N), num_accepted int [batch] in
    1..depth; the first num_accepted entries of a live row's path must be a branch from node 0 of the tree
    (parents, default the tree of the ring's last tree_verify). Returns int32 (path, num_accepted, slots)."""
    for name, t, dim in (("path", path, 2), ("num_accepted", num_accepted, 1)):
        if not isinstance(t, torch.Tensor) or t.dim() != dim or t.dtype not in (torch.int32, torch.int64):
            got = (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__)
            raise ValueError(f"{name} must be a {dim}-D integer tensor, got {got}")
    check_backend(backend, path, num_accepted, ring.write_pos)
    check_same_device(path=path, num_accepted=num_accepted, write_pos=ring.write_pos)
    batch, depth = path.shape
    N = ring.window
    if depth < 1 or depth > N:
        raise ValueError(f"path depth {depth} must be in 1..N={N} (the ring's window: a branch of the tree)")
    if num_accepted.shape[0] != batch:
        raise ValueError(f"num_accepted has {num_accepted.shape[0]} rows, path has {batch}")
    slots = check_slots(slots, batch, ring.num_slots, ring.device, ring.null_slot)
    stored = parents is None
    if parents is None:
        parents = getattr(ring, PARENTS_ATTR, None)
        if parents is not None and parents.shape[0] != batch:
            parents = None           # the last verify had another batch: fall back to the index-order check
    if skip_value_checks() or batch == 0:
        return path.to(torch.int32), num_accepted.to(torch.int32), slots
    live = slots != ring.null_slot
    a, p = num_accepted[live].long(), path[live].long()
    if a.numel() == 0:
        return path.to(torch.int32), num_accepted.to(torch.int32), slots
    if int(a.min()) < 1 or int(a.max()) > depth:
        raise ValueError(f"num_accepted must be in 1..depth={depth}, got values in [{int(a.min())}, {int(a.max())}]")
    used = torch.arange(depth, device=path.device)[None, :] < a[:, None]          # the committed path nodes
    if bool((p[:, 0] != 0).any()):
        raise ValueError("path[:, 0] must be 0: every branch starts at node 0, the current token")
    if bool(((p < 0) | (p >= N))[used].any()):
        raise ValueError(f"path entries must be node indices in 0..N-1={N - 1}")
    if parents is not None:
        # the stored tree was validated by tree_verify; an explicit one is validated here
        par = (parents if stored else check_parents(parents, batch, N, ring.device, live))[live].long()
        parent_of = par.gather(1, p.clamp(0, N - 1))                             # parent of each path node
        bad = (parent_of[:, 1:] != p[:, :-1]) & used[:, 1:]
        if bool(bad.any()):
            r, i = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"path is not a branch: node {int(p[r, i + 1])} at depth {i + 1} is not a child "
                             f"of node {int(p[r, i])} (row {r} of the live rows)")
    elif bool(((p[:, 1:] <= p[:, :-1]) & used[:, 1:]).any()):
        raise ValueError("path is not a branch: node indices must increase along it (topological order)")
    return path.to(torch.int32), num_accepted.to(torch.int32), slots


# ---------------------------------------------------------------------------------------- ancestor tables

_TABLES: dict = {}  # id(base tensor) -> (weakref to it, view key, tables): a static tree is walked once


def ancestor_tables(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ancestor_tables_uncached, memoised per parents tensor: a serving loop passes one static tree (EAGLE-style)
    every step. The key is the base tensor object (kept by a weak reference, so a freed tensor never matches)
    plus the view (shape, strides, offset) and its in-place version counter: any write recomputes."""
    base = parents if parents._base is None else parents._base
    key = (tuple(parents.shape), parents.stride(), parents.storage_offset(), parents.dtype, parents._version)
    hit = _TABLES.get(id(base))
    if hit is not None and hit[0]() is base and hit[1] == key:
        return hit[2]
    tables = ancestor_tables_uncached(parents)
    if len(_TABLES) > 64:
        _TABLES.clear()
    _TABLES[id(base)] = (weakref.ref(base), key, tables)
    return tables


def ancestor_tables_uncached(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Device-side tree tables of parents int32 [b, N] (no host sync).

    Returns (anc bool [b, N, N]: anc[s, j] = j is an ancestor of s or s itself; depth long [b, N] (node 0
    at depth 0); seq long [b, N, N]: seq[s, d] = the ancestor of s at depth d for d <= depth[s], else s
    (callers mask d > depth[s])).
    """
    b, N = parents.shape
    dev = parents.device
    cur = torch.arange(N, device=dev).expand(b, N).clone()
    anc = torch.zeros(b, N, N, dtype=torch.bool, device=dev)
    par = parents.long()
    for _ in range(N):                                     # walk every node up one level per pass
        ok = cur >= 0
        anc.scatter_(2, cur.clamp(min=0)[..., None], ok[..., None] | anc.gather(2, cur.clamp(min=0)[..., None]))
        cur = torch.where(ok, par.gather(1, cur.clamp(min=0)), cur)
    depth = anc.sum(-1) - 1
    # the depth-d ancestor of s: the j with anc[s, j] and depth[j] == d (unique)
    hit = anc[:, :, None, :] & (depth[:, None, None, :] == torch.arange(N, device=dev)[None, None, :, None])
    seq = torch.where(hit.any(-1), hit.float().argmax(-1), torch.arange(N, device=dev)[None, :, None])
    return anc, depth, seq


def tree_prefix(values: torch.Tensor, base: torch.Tensor, seq: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """Tree prefix sums cum[s] = base + sum of values over the ancestors-or-self of s, root first.

    values [b, N, ...] (node axis 1), base [b, ...] or a sequence [b, M, ...] summed first. Computed as one
    torch.cumsum per node over (base terms, its ancestors root first, zeros): for a chain this is the same
    sequence of additions as torch.cumsum over the window (adding the zero padding is exact), so a chain
    tree reproduces the chain's prefix sums bit for bit.
    """
    b, N = values.shape[:2]
    rest = values.shape[2:]
    d = torch.arange(N, device=values.device)
    idx = seq.reshape(b, N * N, *([1] * len(rest))).expand(b, N * N, *rest)
    path_vals = values.gather(1, idx).view(b, N, N, *rest)                       # [b, s, d, ...]
    keep = (d[None, None, :] <= depth[:, :, None]).view(b, N, N, *([1] * len(rest)))
    path_vals = path_vals * keep
    if base.dim() == values.dim() - 1:
        base = base[:, None]
    head = base[:, None].expand(b, N, *base.shape[1:])                           # [b, s, M, ...]
    full = torch.cat([head, path_vals], 2)
    return torch.cumsum(full, 2)[:, :, -1]


# ------------------------------------------------------------------------------------------------ commit

def commit(ring, fields: tuple[str, ...], path: torch.Tensor, num_accepted: torch.Tensor, slots: torch.Tensor,
           backend: str) -> None:
    """Move the accepted branch's entries into place and advance the cursors (module docstring).
    Arguments validated by check_tree_commit; fields name the ring tensors [num_slots, heads, R(, width)]."""
    if slots.shape[0] == 0:
        return
    # backend="cpu": a commit moves a few ring entries and writes three cursors per row, no state; the
    # vectorised torch form runs on the CPU tensors as it is (as ring_cursors.commit does for the chain)
    {"triton": _commit_triton, "torch": _commit_torch, "ref": _commit_ref, "cpu": _commit_torch}[backend](
        ring, fields, path, num_accepted, slots)


def _commit_torch(ring, fields, path, num_accepted, slots) -> None:
    """Vectorised: every moved entry is gathered before any is written (so the order of the moves does not
    matter), then scattered; one gather and one scatter per field, none for a chain."""
    live = slots != ring.null_slot
    sl, a, p = slots[live].long(), num_accepted[live].long(), path[live].long()
    R = ring.ring_len
    h, origin = ring.write_pos[sl].long(), ring.origin[sl].long()
    i = torch.arange(path.shape[1], device=path.device)
    move = (i[None, :] < a[:, None]) & (p != i[None, :])                     # [n, depth]; i = 0 never moves
    if bool(move.any()):
        row, col = move.nonzero(as_tuple=True)
        base = origin[row] + h[row]
        src, dst, s_m = (base + p[row, col]) & (R - 1), (base + col) & (R - 1), sl[row]
        for name in fields:
            f = getattr(ring, name)
            f[s_m, :, dst] = f[s_m, :, src]                                   # the right side is read first
    ring_cursors.commit_torch(ring, num_accepted, slots, lookahead=path.shape[1])


def _commit_ref(ring, fields, path, num_accepted, slots) -> None:
    mask = ring.ring_len - 1
    for row, slot in enumerate(slots.tolist()):
        if slot == ring.null_slot:
            continue
        a, h, origin = int(num_accepted[row]), int(ring.write_pos[slot]), int(ring.origin[slot])
        for i in range(1, a):
            src, dst = (origin + h + int(path[row, i])) & mask, (origin + h + i) & mask
            for name in fields:
                f = getattr(ring, name)
                f[slot, :, dst] = f[slot, :, src].clone()
    # then the cursors, as a chain commit does with the tree's lookahead (live slots are distinct: each row's
    # moves read only its own cursors)
    ring_cursors.commit_ref(ring, num_accepted, slots, lookahead=path.shape[1])


# ------------------------------------------------------------------------------------------------- triton

def _move_kernel(f_ptr, path_ptr, num_accepted_ptr, slots_ptr, write_pos_ptr, origin_ptr, null_slot, depth,
                 ring_len, stride_slot, stride_head, stride_row, heads, width,
                 BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """Program (row, head block): entries of path[i] move to logical position h + i, i = 1..a-1, in order.
    A field is [num_slots, heads, ring_len, width] (width 1 for per-head scalars such as dt or g)."""
    row = tl.program_id(0)
    h0 = tl.program_id(1) * BLOCK_H
    slot = tl.load(slots_ptr + row)
    if slot != null_slot:
        s = slot.to(tl.int64)
        a = tl.load(num_accepted_ptr + row)
        base = tl.load(origin_ptr + s) + tl.load(write_pos_ptr + s)
        hh = h0 + tl.arange(0, BLOCK_H)[:, None]
        ww = tl.arange(0, BLOCK_W)[None, :]
        m = (hh < heads) & (ww < width)
        off = s * stride_slot + hh * stride_head + ww
        # a while loop, not `range(1, depth)`: Triton 3.6.0's interpreter (the GPU box's Triton) turns a loop
        # bound taken from a runtime argument into int() of a 1-element array, a TypeError under numpy >= 2.4;
        # a while condition takes bool() of it, which every version does (compiled: one scf.while for every depth)
        i = 1
        while i < depth:
            node = tl.load(path_ptr + row * depth + i)
            if (i < a) & (node != i):
                src = ((base + node) & (ring_len - 1)).to(tl.int64)
                dst = ((base + i) & (ring_len - 1)).to(tl.int64)
                vals = tl.load(f_ptr + off + src * stride_row, mask=m)
                tl.store(f_ptr + off + dst * stride_row, vals, mask=m)
            tl.debug_barrier()                              # move i is stored before move i + 1 loads
            i += 1


@functools.cache
def _kernels():
    global tl
    import triton
    import triton.language

    tl = triton.language
    return triton, triton.jit(_move_kernel)


def _commit_triton(ring, fields, path, num_accepted, slots) -> None:
    triton, move_kernel = _kernels()
    batch, depth = path.shape
    path = path.contiguous()
    if depth > 1:
        # kernel "tree_ring_move" in the launch tables (replayssm/launch_table.py): no tuning space yet (its
        # time is a copy of the accepted path's rows), so the default unless a table names one
        cfg = launch_table.resolve("tree_ring_move", launch_registry.key("tree_ring_move", depth=depth),
                                   ring.state.dtype, kernel_arch(path.device),
                                   {"move_tile": MOVE_TILE, "num_warps": 4})
        for name in fields:                               # moves first: they read the cursors before the advance
            f = getattr(ring, name)
            width = f.shape[3] if f.dim() == 4 else 1
            # at most MOVE_TILE elements per program (~32 fp32 registers a thread at 4 warps)
            block_w = next_pow2(width)
            block_h = min(next_pow2(f.shape[1]), max(1, cfg["move_tile"] // block_w))
            move_kernel[(batch, triton.cdiv(f.shape[1], block_h))](
                f, path, num_accepted, slots, ring.write_pos, ring.origin, ring.null_slot, depth, ring.ring_len,
                f.stride(0), f.stride(1), f.stride(2), f.shape[1], width,
                BLOCK_H=block_h, BLOCK_W=block_w, num_warps=cfg["num_warps"],
            )
    ring_cursors.commit_triton(ring, num_accepted, slots, lookahead=depth)   # the chain's cursor kernel
