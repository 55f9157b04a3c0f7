"""Vectorised PyTorch backend for Mamba-2 ReplaySSM speculative decoding (backend="torch": CPU timing).

Same function and cache contents as spec_ref.py (see its docstring for the protocol), in fp32, with every
row of the batch handled at once. Non-flush rows read their checkpoint once and write no state. Flush rows
also fold their committed history into it, in place (state *= exp(A cum_{h-1}), then one batched
GEMM-accumulate), and write it once; their outputs come from S1 through the identity
S1 C_t = exp(A cum_{h-1}) (S0 C_t) + sum_{k<h} w_k x_k (B_k . C_t), so S1 is not read back.
The bc scratch is not used here (it is the GPU kernels' hand-off between two launches).
Inputs arrive validated by replayssm.mamba2.spec; `slots is None` means rows 0..batch-1 are slots
0..batch-1, which lets the checkpoint be read (and, fp32, folded) as a view: no gather copy.
State formats (replayssm/state_format.py): the checkpoint is read dequantised (read_state) and the flush fold is
stored by write_state (a cast, a fresh per-(slot, head) scale, or stochastic rounding keyed by the slot's sr_step),
the one place the state is written; a flush row with an empty history writes nothing (no SR draw either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.ref import SOFTPLUS_THRESHOLD
from replayssm.state_format import format_of, read_state, write_state
from replayssm.tree_ring import ancestor_tables, tree_prefix


def processed_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool) -> torch.Tensor:
    """dt [..., nheads] raw -> fp32 processed dt (bias, softplus with threshold 20), as the ring stores it."""
    out = dt.float()
    if dt_bias is not None:
        out = out + dt_bias.float()
    if dt_softplus:
        out = F.softplus(out, threshold=SOFTPLUS_THRESHOLD)
    return out


def _clamped_exp(t: torch.Tensor) -> torch.Tensor:
    return torch.exp(t.clamp_(max=0.0))


def _live_rows(ring: SpecRing, batch: int, slots: torch.Tensor | None):
    """(row indices or None for all rows, slot ids long [n]) of the rows that are not padding."""
    if slots is None:
        return None, torch.arange(batch, device=ring.device)
    live = slots != ring.null_slot
    if bool(live.all()):
        return None, slots.long()
    rows = live.nonzero().squeeze(1)
    return rows, slots[rows].long()


class _Live:
    """The ring entries of n slots in the ring's physical row order (no reordering copy), each row tagged
    with its logical position j = (row - origin) & (R - 1), and the prefix sums of dt in logical order.

    x [n, nheads, R, headdim] fp32 and B [n, ngroups, R, dstate] fp32: views of the cache when the rows are
    slots 0..n-1 (and the act dtype is fp32), else one contiguous copy per slot;
    j [n, R]; dt, cum [n, R, nheads] (rows with j >= count zeroed); cum_log [n, R, nheads] = cum in logical
    order; total [n, nheads] = cum_{h-1} (0 where h = 0); decay [n, nheads] = exp(A cum_{h-1});
    hist_w [n, R, nheads] = dt_j exp(A (cum_{h-1} - cum_j)) for j < h (the fold weights), else 0.
    """

    def __init__(self, ring: SpecRing, sl: torch.Tensor, h: torch.Tensor, count: torch.Tensor, A: torch.Tensor,
                 rows_are_slots: bool):
        n, R, H = sl.shape[0], ring.ring_len, ring.geometry.nheads
        pick = (lambda t: t[:n]) if rows_are_slots else (lambda t: t[sl])
        self.x, self.B = pick(ring.x).float(), pick(ring.B).float()
        rr = torch.arange(R, device=ring.device)
        origin = ring.origin[sl].long()[:, None]
        self.j = (rr[None, :] - origin) & (R - 1)                                # [n, R]
        self.dt = pick(ring.dt).transpose(1, 2) * (self.j < count[:, None]).unsqueeze(-1)
        by_pos = ((origin + rr[None, :]) & (R - 1))[..., None].expand(n, R, H)   # physical row of position k
        self.cum_log = torch.cumsum(self.dt.gather(1, by_pos), 1)
        self.cum = self.cum_log.gather(1, self.j[..., None].expand(n, R, H))
        total = self.cum_log.gather(1, (h - 1).clamp(min=0)[:, None, None].expand(n, 1, H)).squeeze(1)
        self.total = torch.where(h[:, None] > 0, total, torch.zeros_like(total))
        self.hist_w = (self.dt * _clamped_exp(A * (self.total[:, None, :] - self.cum))
                       * (self.j < h[:, None]).unsqueeze(-1))
        self.decay = _clamped_exp(A * self.total)


def _fold_into(state: torch.Tensor, live: _Live, rows: torch.Tensor | slice, hpg: int) -> None:
    """state[i] <- exp(A cum_{h-1}) state[i] + sum_{k<h} w_k x_k B_k^T, in place, for the live rows `rows`.

    state [m, nheads, headdim, dstate] fp32 contiguous (the cache itself or a copy), m = len(rows).
    """
    x, w, B = live.x[rows], live.hist_w[rows], live.B[rows]                  # [m,H,R,P], [m,R,H], [m,G,R,N]
    m, H, R, P = x.shape
    G, N = B.shape[1], B.shape[-1]
    # x_k w_k laid out [m, H, P, R] (the GEMM's left operand) by the multiply itself: no transpose copy.
    xw_t = torch.empty(m, H, P, R, dtype=torch.float32, device=state.device)
    torch.mul(x.transpose(-1, -2), w.transpose(1, 2)[:, :, None, :], out=xw_t)
    state.mul_(live.decay[rows][..., None, None])
    state.view(m * G, hpg * P, N).baddbmm_(xw_t.reshape(m * G, hpg * P, R), B.reshape(m * G, R, N))


def _checkpoint(ring: SpecRing, sl: torch.Tensor, n: int, rows_are_slots: bool) -> torch.Tensor:
    """The rows' checkpoints in fp32 [n, nheads, headdim, dstate]: a view of the cache for an fp32 state whose
    rows are slots 0..n-1 (folded in place), else a copy (a cast, or dequantised with its per-head scale)."""
    if format_of(ring).plain:
        return (ring.state[:n] if rows_are_slots else ring.state[sl]).float()
    return read_state(ring, slice(None, n) if rows_are_slots else sl).contiguous()


def _readout(state: torch.Tensor, C: torch.Tensor, hpg: int) -> torch.Tensor:
    """S C_t for every window token: state [n, nheads, headdim, dstate] fp32, C [n, T, ngroups, dstate] fp32
    -> [n, T, nheads, headdim]."""
    n, H, P, N = state.shape
    return torch.einsum("bgjpn,btgn->btgjp", state.view(n, -1, hpg, P, N), C).reshape(n, C.shape[1], H, P)


def _tree_masks(ring: SpecRing, live: _Live, sl, h, first, wrows, parents):
    """Tree form of verify_torch's (cum_p, cum_rows, summed): node s sits at logical position h + s and sees
    history entry j < h and window node j' iff j' is an ancestor of s or s itself; cum is the tree prefix sum
    of dt along the path, history first (replayssm/tree_ring.py, tree_prefix)."""
    n, N, R, dev = sl.shape[0], ring.window, ring.ring_len, ring.device
    anc, depth, seq = ancestor_tables(parents)
    ar = torch.arange(n, device=dev)[:, None]
    node_dt = live.dt[ar, wrows]                                                    # [n, N, H]
    by_pos = ((ring.origin[sl].long()[:, None] + torch.arange(R, device=dev)) & (R - 1))
    hist_seq = live.dt[ar, by_pos] * (torch.arange(R, device=dev)[None, :] < h[:, None]).unsqueeze(-1)
    cum_p = tree_prefix(node_dt, hist_seq, seq, depth)                             # [n, N, H]
    cum_rows = live.cum.clone()
    cum_rows[ar, wrows] = cum_p
    j = live.j                                                                      # [n, R]
    win = j - h[:, None]
    in_win = (win >= 0) & (win < N)
    anc_rs = anc.gather(2, win.clamp(0, N - 1)[:, None, :].expand(n, N, R)).transpose(1, 2)   # [n, R, N]
    summed = (j >= first[:, None])[..., None] & ((j < h[:, None])[..., None] | (in_win[..., None] & anc_rs))
    return cum_p, cum_rows, summed


def verify_torch(ring: SpecRing, x, dt, A, B, C, D, z, dt_bias, dt_softplus: bool, slots: torch.Tensor | None,
                 out: torch.Tensor, parents: torch.Tensor | None = None) -> torch.Tensor:
    """x, z [batch, T, nheads, headdim]; dt [batch, T, nheads] raw; B, C [batch, T, ngroups, dstate].

    parents int32 [batch, T] (a draft tree of T nodes, replayssm.mamba2.tree): the causal mask becomes the
    ancestor mask and the window's prefix sums of dt tree prefix sums (history first, then the node's path).
    For a chain every mask, prefix sum and product equals the parents=None path's, bit for bit."""
    geo, T, R = ring.geometry, ring.window, ring.ring_len
    hpg, H, P = geo.heads_per_group, geo.nheads, geo.headdim
    rows, sl = _live_rows(ring, x.shape[0], slots)
    if sl.numel() == 0:
        return out
    if rows is not None:
        x, dt, B, C = x[rows], dt[rows], B[rows], C[rows]
        z = None if z is None else z[rows]
        parents = None if parents is None else parents[rows]
    n, rows_are_slots = sl.shape[0], slots is None
    h = ring.write_pos[sl].long()
    flush = ring.is_flush[sl] != 0
    A = A.float()

    # Scatter the window after the committed history: ring rows (origin + h + t) & (R - 1).
    wrows = (ring.origin[sl].long()[:, None] + h[:, None] + torch.arange(T, device=ring.device)) & (R - 1)
    ring.x[sl[:, None], :, wrows] = x                      # advanced indices split by a slice: [n, T] first
    ring.B[sl[:, None], :, wrows] = B
    ring.dt[sl[:, None], :, wrows] = processed_dt(dt, dt_bias, dt_softplus)

    live = _Live(ring, sl, h, h + T, A, rows_are_slots)
    # Flush rows restart at S1: sums start at j = h and decays are relative to cum_{h-1}.
    first = torch.where(flush, h, torch.zeros_like(h))
    base = torch.where(flush[:, None], live.total, torch.zeros_like(live.total))         # [n, nheads]
    # cum_p [n, T, nheads]: prefix sum of dt up to each window token; cum_rows [n, R, nheads]: up to each ring
    # row's position; summed [n, R, T]: ring row r enters token t's output.
    if parents is None:
        pos = h[:, None] + torch.arange(T, device=ring.device)               # [n, T] logical window positions
        cum_p = live.cum_log.gather(1, pos[..., None].expand(n, T, H))
        cum_rows = live.cum
        j = live.j[:, :, None]
        summed = (j >= first[:, None, None]) & (j <= pos[:, None, :])        # causal: first <= j <= p_t
    else:
        cum_p, cum_rows, summed = _tree_masks(ring, live, sl, h, first, wrows, parents)

    # Weights W[r, t] = dt_j exp(A (cum_p - cum_j)) (B_j . C_t) where summed, j = pos(row r).
    C32 = C.float()
    bc = torch.einsum("bgrn,btgn->bgrt", live.B, C32)                         # [n, G, R, T]
    span = cum_p.transpose(1, 2)[:, :, None, :] - cum_rows.transpose(1, 2)[:, :, :, None]   # [n, H, R, T]
    W = _clamped_exp(A[None, :, None, None] * span).mul_(live.dt.transpose(1, 2)[..., None])
    W = W.view(n, -1, hpg, R, T).mul_((bc * summed[:, None]).unsqueeze(2))   # [n, G, hpg, R, T]
    y = torch.einsum("bgjrp,bgjrt->btgjp", live.x.view(n, -1, hpg, R, P), W).reshape(n, T, H, P)

    # Checkpoint readout S0 C_t: one read of each checkpoint (a view when rows are slots and the format plain;
    # an int8 / e4m3 checkpoint is dequantised with its per-head scale, replayssm/state_format.py).
    fmt = format_of(ring)
    S = _checkpoint(ring, sl, n, rows_are_slots)
    readout = _readout(S, C32, hpg)
    if bool(flush.any()):
        fr = flush.nonzero().squeeze(1)
        all_rows = fr.numel() == n
        sel = slice(None) if all_rows else fr                               # no gather copies when all flush
        G = geo.ngroups
        # S1 C_t = exp(A cum_{h-1}) S0 C_t + sum_{k<h} w_k x_k (B_k . C_t): the readout of the folded state.
        bc_w = bc[sel].view(-1, G, 1, R, T) * live.hist_w[sel].transpose(1, 2).reshape(-1, G, hpg, R, 1)
        hist = torch.einsum("bgjrp,bgjrt->btgjp", live.x[sel].view(-1, G, hpg, R, P), bc_w).reshape(-1, T, H, P)
        readout[sel] = readout[sel] * live.decay[sel][:, None, :, None] + hist
        # Fold in place: on the cache itself when S is an fp32 view of exactly the flush rows (h == 0 rows
        # are then multiplied by 1 and added 0), else on a copy stored back by the format's rule (a cast, a
        # fresh per-head scale, or stochastic rounding keyed by the slot's sr_step): the one state write.
        target = S if all_rows else S[fr]
        _fold_into(target, live, sel, hpg)
        if not (fmt.plain and all_rows and rows_are_slots and ring.state_dtype == torch.float32):
            keep = (h[fr] > 0).nonzero().squeeze(1)
            if keep.numel():
                write_state(ring, sl[fr[keep]], target[keep])
    y.add_(_clamped_exp(A * (cum_p - base[:, None, :])).unsqueeze(-1) * readout)
    if D is not None:
        y.add_(D.float()[:, None] * x.float())
    if z is not None:
        zf = z.float()
        y.mul_(zf * torch.sigmoid(zf))
    if rows is None:
        out.copy_(y)
    else:
        out[rows] = y.to(out.dtype)
    return out


def materialize_torch(ring: SpecRing, A: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The committed state per row, fp32 [batch, nheads, headdim, dstate]; NULL rows are NaN."""
    geo = ring.geometry
    out = torch.full((slots.shape[0], geo.nheads, geo.headdim, geo.dstate), float("nan"), device=ring.device)
    rows = (slots != ring.null_slot).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    sl = slots[rows].long()
    h = ring.write_pos[sl].long()
    live = _Live(ring, sl, h, h, A.float(), rows_are_slots=False)
    state = read_state(ring, sl)                                             # a copy (dequantised): fold in place
    _fold_into(state, live, slice(None), geo.heads_per_group)
    out[rows] = state
    return out
