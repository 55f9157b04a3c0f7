"""The speculative ring's cursor protocol, one implementation for the Mamba-2 and the GDN ring.

Both SpecRings (replayssm/mamba2/cache.py, replayssm/gdn/ring.py) keep three int32 cursors per slot:
write_pos h (committed history entries since the checkpoint), origin (ring row of history entry 0) and
is_flush (the next verify folds the history into the checkpoint first). With window T, logical length
L = history_len + T = ring.max_len and a power-of-two ring of R = ring.ring_len rows, per live row:

    commit(a):  if is_flush: origin = (origin + h) & (R - 1), h = a    (the verify folded the history:
                                                                         the accepted window becomes it)
                else:        h = h + a
                is_flush = h + 2T > L                                    (early flush: the next window fits)
    reset:      h = origin = 0, is_flush = 2T > L                        (0: both rings require B >= T)

a = the row's accepted count (1..T, bonus token included). A row whose slot is NULL_SLOT is padding: it is
skipped and its count is not checked. The cursors live on the device and the Triton backend moves them with
a tiny kernel, so a speculative step (verify + commit) is CUDA-graph capturable.

Three backends leave the same cursors: "triton" (_commit_kernel / _reset_kernel), "torch" (vectorised) and
"ref" (one row at a time in Python ints: the oracle). `commit` and `reset` validate their arguments
(ValueError before any write) and dispatch; each family's spec_commit / spec_reset checks the ring type
first. A ring here is any object with write_pos, origin, is_flush, window, max_len, ring_len, null_slot,
num_slots and device.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from replayssm.checks import (
    NULL_SLOT,
    check_backend,
    check_num_accepted,
    check_ring_lengths,
    check_same_device,
    check_slots,
    next_pow2,
    skip_value_checks,
)

# triton.language, bound by _kernels() on the first Triton-backend call. The kernels below are plain
# functions until then, so importing this module does not import triton: the torch and ref backends work
# where triton is absent or TRITON_INTERPRET is set after replayssm is imported (triton.jit reads it when
# it wraps a function).
tl = None


def check_commit_args(ring, num_accepted: torch.Tensor, slots: torch.Tensor | None,
                      backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a commit: num_accepted int [batch] in 1..T on the live rows, slots int32 [batch] (default
    arange(batch)). Returns (num_accepted int32 [batch], slots int32 [batch])."""
    if not isinstance(num_accepted, torch.Tensor) or num_accepted.dim() != 1:
        got = tuple(num_accepted.shape) if isinstance(num_accepted, torch.Tensor) else type(num_accepted).__name__
        raise ValueError(f"num_accepted must be a 1-D integer tensor [batch], got {got}")
    check_backend(backend, num_accepted, ring.write_pos)
    check_same_device(num_accepted=num_accepted, write_pos=ring.write_pos)
    batch = num_accepted.shape[0]
    slots = check_slots(slots, batch, ring.num_slots, ring.device, ring.null_slot)
    return check_live_counts(num_accepted, slots, ring.null_slot, ring.window), slots


def check_live_counts(num_accepted: torch.Tensor, slots: torch.Tensor, null_slot: int, window: int) -> torch.Tensor:
    """Accepted counts int [batch] of a commit, each in 1..window on the live rows (padding rows may carry any
    count); returns them int32. While a CUDA graph is captured only the shape and dtype are checked: reading
    the values would be a host sync, and even the `slots != null_slot` mask would put an elementwise kernel
    into every captured step. Shared by both rings and every speculative baseline."""
    batch = slots.shape[0]
    if skip_value_checks():
        return check_num_accepted(num_accepted, batch, window)       # an int32 tensor comes back as it is
    live = slots != null_slot
    check_num_accepted(num_accepted[live], int(live.sum()), window)
    return num_accepted.to(torch.int32)


def check_reset_slots(ring, slots: torch.Tensor | None, backend: str) -> torch.Tensor:
    """Validate the slots of a reset: int [n] slot ids (NULL_SLOT allowed), default every slot. Returns int32 [n]."""
    if slots is not None and (not isinstance(slots, torch.Tensor) or slots.dim() != 1):
        got = tuple(slots.shape) if isinstance(slots, torch.Tensor) else type(slots).__name__
        raise ValueError(f"slots must be a 1-D integer tensor [n], got {got}")
    check_backend(backend, slots, ring.write_pos)
    n = ring.num_slots if slots is None else slots.shape[0]
    return check_slots(slots, n, ring.num_slots, ring.device, ring.null_slot)


@dataclass
class SpecCursor:
    """One set of speculative-ring cursors per decode row, shared by every layer's ring (Mamba-2 and GDN alike).

    A request's history length, ring origin and flush flag are the same in every layer: each layer verified
    the same window and accepted the same tokens. Rings allocated with `cursor=` hold these very tensors, so
    a step is every layer's verify, then ONE `cursor.commit(num_accepted, slots)` (one tiny launch per step
    instead of one per layer); `cursor.reset(slots)` starts requests in every layer at once. A ring that
    shares a cursor refuses its own spec_commit / spec_reset (they would move the cursor once per layer).

    write_pos, origin, is_flush [num_slots] int32, as in the rings (module docstring).
    """

    history_len: int
    window: int
    write_pos: torch.Tensor
    origin: torch.Tensor
    is_flush: torch.Tensor
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, num_slots: int, history_len: int, window: int, device="cpu") -> SpecCursor:
        for name, value in (("num_slots", num_slots), ("history_len", history_len), ("window", window)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        check_ring_lengths(history_len, window)
        zeros = lambda: torch.zeros(num_slots, dtype=torch.int32, device=device)  # noqa: E731
        cursor = cls(history_len, window, zeros(), zeros(), zeros())
        cursor.is_flush.fill_(_reset_flush(cursor))
        return cursor

    @property
    def max_len(self) -> int:
        return self.history_len + self.window

    @property
    def ring_len(self) -> int:
        return next_pow2(self.max_len)

    @property
    def num_slots(self) -> int:
        return self.write_pos.shape[0]

    @property
    def device(self) -> torch.device:
        return self.write_pos.device

    def check_ring(self, num_slots: int, history_len: int, window: int, device) -> dict[str, torch.Tensor]:
        """The cursor tensors for a ring of this shape (ValueError when the ring's lengths differ)."""
        mine = (self.num_slots, self.history_len, self.window, torch.device(device))
        theirs = (num_slots, history_len, window, torch.device(device) if device is not None else self.device)
        if mine != theirs:
            raise ValueError(f"shared cursor is for (num_slots, history_len, window, device) = {mine}, the ring "
                             f"asks for {theirs}")
        return dict(write_pos=self.write_pos, origin=self.origin, is_flush=self.is_flush)

    def commit(self, num_accepted: torch.Tensor, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
        """Once per step, after every layer's verify: the ring protocol's commit on the shared cursors."""
        commit(self, num_accepted, slots, backend)

    def reset(self, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
        """Start requests in `slots` (default all) in every layer sharing this cursor."""
        reset(self, slots, backend)


@dataclass
class DecodeCursor:
    """One AR buffer cursor per decode row, shared by every layer's ReplaySSM cache (Mamba-2 and GDN alike).

    Every layer of a request has cached the same number of tokens since its last flush, so one write_pos
    serves them all. Caches allocated with `cursor=` (ReplayCache.allocate) hold this tensor and their
    replay_step leaves it alone; a decode step is every layer's replay_step, then ONE
    `cursor.advance(slots)`: write_pos <- (write_pos + 1) mod L for the live rows (one tiny launch per step
    instead of one per layer). `cursor.reset(slots)` empties the buffers of every layer at once.

    write_pos [num_slots] int32; buffer_len L (every sharing cache has the same).
    """

    buffer_len: int
    write_pos: torch.Tensor
    null_slot: int = NULL_SLOT

    @classmethod
    def allocate(cls, num_slots: int, buffer_len: int, device="cpu") -> DecodeCursor:
        for name, value in (("num_slots", num_slots), ("buffer_len", buffer_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        return cls(buffer_len, torch.zeros(num_slots, dtype=torch.int32, device=device))

    @property
    def num_slots(self) -> int:
        return self.write_pos.shape[0]

    @property
    def device(self) -> torch.device:
        return self.write_pos.device

    def check_cache(self, num_slots: int, buffer_len: int, device) -> torch.Tensor:
        """The cursor tensor for a cache of this shape (ValueError when the cache's lengths differ)."""
        mine = (self.num_slots, self.buffer_len, self.device)
        theirs = (num_slots, buffer_len, torch.device(device))
        if mine != theirs:
            raise ValueError(f"shared cursor is for (num_slots, buffer_len, device) = {mine}, the cache asks for "
                             f"{theirs}")
        return self.write_pos

    def advance(self, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
        """Once per step, after every layer's replay_step: live rows' write_pos <- (write_pos + 1) mod L."""
        slots = check_reset_slots(self, slots, backend)
        if slots.shape[0] == 0:
            return
        if backend == "triton":
            triton, _, _, advance_kernel = _kernels()
            batch = slots.shape[0]
            block = _cursor_block(batch)
            advance_kernel[(triton.cdiv(batch, block),)](slots, self.write_pos, batch, self.null_slot,
                                                        self.buffer_len, BLOCK_B=block, num_warps=1)
            return
        live = slots[slots != self.null_slot].long()
        h = self.write_pos[live]
        self.write_pos[live] = torch.where(h >= self.buffer_len - 1, 0, h + 1).to(torch.int32)

    def reset(self, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
        """New requests in `slots` (default all): empty buffers in every sharing layer."""
        slots = check_reset_slots(self, slots, backend)
        self.write_pos[slots[slots != self.null_slot].long()] = 0


@contextlib.contextmanager
def keep_shared_cursor(cache):
    """Around a torch / ref step of a cache that shares a DecodeCursor: those backends move write_pos in the
    same pass as the step, so put it back (the cursor advances once per step, for every layer)."""
    saved = cache.write_pos.clone() if cache.shared_cursor else None
    try:
        yield
    finally:
        if saved is not None:
            cache.write_pos.copy_(saved)


def attach(cache, cursor) -> None:
    """Point an allocated cache's cursors at a shared cursor (a DecodeCursor for a ReplayCache, a SpecCursor
    for a SpecRing) and mark it shared: for callers that get caches from a factory that does not take
    `cursor=` (ValueError when the shapes differ)."""
    if isinstance(cursor, DecodeCursor):
        cache.write_pos = cursor.check_cache(cache.num_slots, cache.buffer_len, cache.device)
    elif isinstance(cursor, SpecCursor):
        for name, t in cursor.check_ring(cache.num_slots, cache.history_len, cache.window, cache.device).items():
            setattr(cache, name, t)
    else:
        raise ValueError(f"expected a DecodeCursor or SpecCursor, got {type(cursor).__name__}")
    cache.shared_cursor = True


def _check_not_shared(ring, what: str) -> None:
    if getattr(ring, "shared_cursor", False):
        raise ValueError(f"this ring shares a SpecCursor with other layers: {what} the cursor once per step "
                         f"(cursor.{what}(...)), not each layer's ring")


def commit(ring, num_accepted: torch.Tensor, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Advance each live row's slot by its accepted count (protocol in the module docstring), on the device.

    num_accepted int [batch]; slots int32 [batch] (default arange(batch)); NULL_SLOT rows are skipped.
    """
    _check_not_shared(ring, "commit")
    num_accepted, slots = check_commit_args(ring, num_accepted, slots, backend)
    if slots.shape[0] == 0:
        return
    # backend="cpu": a commit is a handful of integer cursor updates; the torch form is what it runs
    {"triton": commit_triton, "torch": commit_torch, "ref": commit_ref, "cpu": commit_torch}[backend](
        ring, num_accepted, slots)


def reset(ring, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """A new request enters each slot of `slots` (int32 [n], default every slot; NULL_SLOT entries skipped):
    write_pos = origin = 0, is_flush = 2T > L. The caller has put the request's prefill state in ring.state."""
    _check_not_shared(ring, "reset")
    slots = check_reset_slots(ring, slots, backend)
    if slots.shape[0] == 0:
        return
    {"triton": reset_triton, "torch": reset_torch, "ref": reset_ref, "cpu": reset_torch}[backend](ring, slots)


def _reset_flush(ring) -> int:
    """is_flush of an empty history: h + 2T > L at h = 0."""
    return int(2 * ring.window > ring.max_len)


# ------------------------------------------------------------------------------------------------- triton

def _commit_kernel(num_accepted_ptr, slots_ptr, write_pos_ptr, origin_ptr, is_flush_ptr, batch, null_slot,
                   lookahead, window, max_len, ring_len, BLOCK_B: tl.constexpr):
    """Rows [pid * BLOCK_B, (pid + 1) * BLOCK_B) of the batch; every cursor is read and written once."""
    i = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    slot = tl.load(slots_ptr + i, mask=i < batch, other=null_slot)
    live = (i < batch) & (slot != null_slot)
    s = tl.where(live, slot, 0).to(tl.int64)
    a = tl.load(num_accepted_ptr + i, mask=live, other=0)
    h = tl.load(write_pos_ptr + s, mask=live, other=0)
    origin = tl.load(origin_ptr + s, mask=live, other=0)
    flushed = tl.load(is_flush_ptr + s, mask=live, other=0) != 0
    # The step just verified folded the history: the ring now starts where that history ended.
    tl.store(origin_ptr + s, tl.where(flushed, (origin + h) & (ring_len - 1), origin), mask=live)
    h = tl.where(flushed, a, h + a)
    tl.store(write_pos_ptr + s, h, mask=live)
    # Early flush (_flush_next): flush one step ahead so the next window always fits.
    tl.store(is_flush_ptr + s, (h + lookahead + window > max_len).to(tl.int32), mask=live)


def _reset_kernel(slots_ptr, write_pos_ptr, origin_ptr, is_flush_ptr, batch, null_slot, flush0,
                  BLOCK_B: tl.constexpr):
    i = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    slot = tl.load(slots_ptr + i, mask=i < batch, other=null_slot)
    live = (i < batch) & (slot != null_slot)
    s = tl.where(live, slot, 0).to(tl.int64)
    zero = tl.zeros([BLOCK_B], dtype=tl.int32)
    tl.store(write_pos_ptr + s, zero, mask=live)
    tl.store(origin_ptr + s, zero, mask=live)
    tl.store(is_flush_ptr + s, zero + flush0, mask=live)


def _advance_kernel(slots_ptr, write_pos_ptr, batch, null_slot, buffer_len, BLOCK_B: tl.constexpr):
    """AR cursor of a DecodeCursor: write_pos <- (write_pos + 1) mod L on the live rows."""
    i = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    slot = tl.load(slots_ptr + i, mask=i < batch, other=null_slot)
    live = (i < batch) & (slot != null_slot)
    s = tl.where(live, slot, 0).to(tl.int64)
    h = tl.load(write_pos_ptr + s, mask=live, other=0)
    tl.store(write_pos_ptr + s, tl.where(h >= buffer_len - 1, 0, h + 1), mask=live)


@functools.cache
def _kernels():
    """(triton, jitted _commit_kernel, _reset_kernel, _advance_kernel), built on the first Triton-backend call."""
    global tl
    import triton
    import triton.language

    tl = triton.language
    return triton, triton.jit(_commit_kernel), triton.jit(_reset_kernel), triton.jit(_advance_kernel)


def _cursor_block(batch: int) -> int:
    """Rows per program: the whole batch in one program up to 1024 rows (one warp, a few loads per lane)."""
    return min(1024, max(16, next_pow2(batch)))


def _lookahead(ring, lookahead: int | None) -> int:
    """How many entries a row may accept before its next window: a chain's next commit accepts up to T (the
    window); a tree's up to its depth (replayssm/tree_ring.py passes it)."""
    return ring.window if lookahead is None else lookahead


def _flush_next(ring, h, lookahead: int | None):
    """The early-flush rule: flush now if accepting up to `lookahead` more entries and then verifying the next
    window (ring.window entries) could overflow L = max_len."""
    return h + _lookahead(ring, lookahead) + ring.window > ring.max_len


def commit_triton(ring, num_accepted: torch.Tensor, slots: torch.Tensor, lookahead: int | None = None) -> None:
    triton, commit_kernel, _, _ = _kernels()
    batch = slots.shape[0]
    block = _cursor_block(batch)
    commit_kernel[(triton.cdiv(batch, block),)](
        num_accepted, slots, ring.write_pos, ring.origin, ring.is_flush, batch, ring.null_slot,
        _lookahead(ring, lookahead), ring.window, ring.max_len, ring.ring_len, BLOCK_B=block, num_warps=1,
    )


def reset_triton(ring, slots: torch.Tensor) -> None:
    triton, _, reset_kernel, _ = _kernels()
    batch = slots.shape[0]
    block = _cursor_block(batch)
    reset_kernel[(triton.cdiv(batch, block),)](
        slots, ring.write_pos, ring.origin, ring.is_flush, batch, ring.null_slot, _reset_flush(ring),
        BLOCK_B=block, num_warps=1,
    )


# ------------------------------------------------------------------------------------------ torch and ref

def commit_torch(ring, num_accepted: torch.Tensor, slots: torch.Tensor, lookahead: int | None = None) -> None:
    """Vectorised: one gather and one scatter per cursor over the live rows."""
    live = slots != ring.null_slot
    sl, a = slots[live].long(), num_accepted[live]
    h, origin, flushed = ring.write_pos[sl], ring.origin[sl], ring.is_flush[sl] != 0
    ring.origin[sl] = torch.where(flushed, (origin + h) & (ring.ring_len - 1), origin)
    h = torch.where(flushed, a, h + a)
    ring.write_pos[sl] = h
    ring.is_flush[sl] = _flush_next(ring, h, lookahead).to(torch.int32)


def reset_torch(ring, slots: torch.Tensor) -> None:
    sl = slots[slots != ring.null_slot].long()
    ring.write_pos[sl] = 0
    ring.origin[sl] = 0
    ring.is_flush[sl] = _reset_flush(ring)


def commit_ref(ring, num_accepted: torch.Tensor, slots: torch.Tensor, lookahead: int | None = None) -> None:
    """The protocol row by row, in Python ints."""
    mask = ring.ring_len - 1
    for row, slot in enumerate(slots.tolist()):
        if slot == ring.null_slot:
            continue
        a, h = int(num_accepted[row]), int(ring.write_pos[slot])
        if int(ring.is_flush[slot]):
            ring.origin[slot] = (int(ring.origin[slot]) + h) & mask
            h = a
        else:
            h = h + a
        ring.write_pos[slot] = h
        ring.is_flush[slot] = int(_flush_next(ring, h, lookahead))


def reset_ref(ring, slots: torch.Tensor) -> None:
    for slot in slots.tolist():
        if slot == ring.null_slot:
            continue
        ring.write_pos[slot] = 0
        ring.origin[slot] = 0
        ring.is_flush[slot] = _reset_flush(ring)
