"""Vectorised PyTorch backend of the Mamba-2 ReplaySSM AR decode step (backend="torch"): the CPU timing path.

Same function and cache contents as decode_ref.py, computed in fp32 over all rows at once (rows with
different write_pos are handled by masking the buffer axis with j < h). What it costs per step:
    normal rows: the checkpoint is read once (einsum over dstate) and never written; the buffer term is
                 a [L]-long weighted sum; appends are index writes of one buffer row.
    flush rows:  the state is rebuilt as abar S0 + X^T (s * B) (one batched matmul) and written once; when
                 the rows are slots 0..n-1 and the state is fp32 this happens in place (mul_ + baddbmm_).
When slots is None the rows are slots 0..batch-1 and the cache is read through views: no gather copies.
Inputs are validated by replayssm/mamba2/decode.py before this runs (host syncs here are fine: this
path is not captured in CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replayssm.mamba2.ref import SOFTPLUS_THRESHOLD
from replayssm.state_format import dequantize, format_of, write_state


@dataclass
class _Slots:
    """The cache slots of n rows: slots 0..n-1 (read through views) or an index (gathered)."""

    n: int
    index: torch.Tensor | None  # long [n]; None = slots 0..n-1

    def read(self, t: torch.Tensor) -> torch.Tensor:
        return t[: self.n] if self.index is None else t.index_select(0, self.index)

    def write(self, t: torch.Tensor, value: torch.Tensor) -> None:
        if self.index is None:
            t[: self.n].copy_(value)
        else:
            t.index_copy_(0, self.index, value.to(t.dtype))

    @property
    def key(self) -> slice | torch.Tensor:
        """What indexes these slots' rows of a cache tensor."""
        return slice(None, self.n) if self.index is None else self.index

    def ids(self, device) -> torch.Tensor:
        return torch.arange(self.n, device=device) if self.index is None else self.index

    def subset(self, rows: torch.Tensor) -> _Slots:
        return _Slots(rows.numel(), self.ids(rows.device)[rows])


def _process_dt(dt, dt_bias, dt_softplus: bool) -> torch.Tensor:
    """dt [n, nheads] raw -> processed fp32 (bias, softplus with threshold 20)."""
    out = dt.float()
    if dt_bias is not None:
        out = out + dt_bias
    return F.softplus(out, threshold=SOFTPLUS_THRESHOLD) if dt_softplus else out


def _buffer_weights(cache, sel: _Slots, h: torch.Tensor, A: torch.Tensor, dt_cur: torch.Tensor | None):
    """Weights of the cached entries j < h (plus the current token's dt_cur when given).

    Returns s [n, nheads, L] (0 for j >= h), abar [n, nheads]; with dt_cur, s_h = dt_cur is implicit.
    """
    L = cache.buffer_len
    before = torch.arange(L, device=h.device)[None, :] < h[:, None]                  # [n, L]
    dt_buf = sel.read(cache.dt).masked_fill(~before[:, None, :], 0.0)                 # [n, nheads, L]
    c = torch.cumsum(dt_buf, dim=-1)
    c_tot = c[..., -1] if dt_cur is None else c[..., -1] + dt_cur                     # [n, nheads]
    s = dt_buf * torch.exp(A[:, None] * (c_tot[..., None] - c))
    return s, torch.exp(A * c_tot)


def _read_state(cache, sel: _Slots) -> torch.Tensor:
    """The rows' checkpoint in fp32 (dequantised with its per-head scale for an int8 / e4m3 format)."""
    if format_of(cache).scaled:
        return dequantize(sel.read(cache.state), sel.read(cache.state_scale))
    state = sel.read(cache.state)
    return state if state.dtype == torch.float32 else state.float()


def _normal_rows(cache, sel, h, dtp, x, B, C, A) -> torch.Tensor:
    """y [n, nheads, headdim] fp32 by the output-only formula; the checkpoint is read once, not written."""
    g, n = cache.geometry, sel.n
    G, k, P, N, L = g.ngroups, g.heads_per_group, g.headdim, g.dstate, cache.buffer_len
    s, abar = _buffer_weights(cache, sel, h, A, dtp)
    Cf = C.float()
    s0c = torch.einsum("bgkpn,bgn->bgkp", _read_state(cache, sel).reshape(n, G, k, P, N), Cf)   # [n, G, k, P]
    bc = torch.einsum("bgln,bgn->bgl", sel.read(cache.B).float(), Cf)                         # [n, G, L]
    bc_cur = (B.float() * Cf).sum(-1)                                                         # [n, G]
    w = s.view(n, G, k, L) * bc[:, :, None, :]                                                # [n, G, k, L]
    y = abar.view(n, G, k, 1) * s0c + torch.einsum("bgkl,bgklp->bgkp", w, sel.read(cache.x).float().view(n, G, k, L, P))
    y = y.view(n, g.nheads, P)
    return y.add_((dtp.view(n, G, k) * bc_cur[:, :, None]).view(n, g.nheads, 1) * x.float())


def _flush_rows(cache, sel, h, dtp, x, B, C, A) -> torch.Tensor:
    """Fold the buffer and the current token into the checkpoint; y = S C. Returns y [n, nheads, headdim]."""
    g, n = cache.geometry, sel.n
    G, k, P, N, L = g.ngroups, g.heads_per_group, g.headdim, g.dstate, cache.buffer_len
    s, abar = _buffer_weights(cache, sel, h, A, dtp)
    # Entries 0..L-1 of the buffer plus the current token as entry L (its weight is dt_cur).
    xs = torch.cat([s[..., None] * sel.read(cache.x).float(), (dtp[..., None] * x.float())[:, :, None]], dim=2)
    Bs = torch.cat([sel.read(cache.B).float(), B.float()[:, :, None]], dim=2)              # [n, G, L+1, N]
    xsT = xs.view(n, G, k, L + 1, P).permute(0, 1, 2, 4, 3).reshape(n * G, k * P, L + 1)
    Bs = Bs.view(n * G, L + 1, N)
    if sel.index is None and cache.state.dtype == torch.float32 and cache.state.is_contiguous():
        S = cache.state[:n]
        S.mul_(abar[..., None, None]).view(n * G, k * P, N).baddbmm_(xsT, Bs)
    else:
        S = _read_state(cache, sel).to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        S.mul_(abar[..., None, None]).view(n * G, k * P, N).baddbmm_(xsT, Bs)
        if not format_of(cache).plain:
            write_state(cache, sel.key, S)             # fresh per-head scale, or stochastic rounding
        else:
            sel.write(cache.state, S.to(cache.state_dtype))
    return torch.einsum("bgkpn,bgn->bgkp", S.view(n, G, k, P, N), C.float()).reshape(n, g.nheads, P)


def replay_step_torch(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, out) -> None:
    """One step for every row (shapes as in decode.replay_step); slots None means rows are slots 0..batch-1."""
    batch, L = x.shape[0], cache.buffer_len
    rows = None                                   # live rows of the batch, None = all
    if slots is None:
        sel = _Slots(batch, None)
    else:
        live = slots != cache.null_slot
        if bool(live.all()):
            sel = _Slots(batch, slots.long())
        else:
            rows = live.nonzero().squeeze(1)
            sel = _Slots(rows.numel(), slots.long()[rows])
            x, dt, B, C = x[rows], dt[rows], B[rows], C[rows]
            z = None if z is None else z[rows]
    if sel.n == 0:
        return
    h = sel.read(cache.write_pos).long()
    dtp = _process_dt(dt, dt_bias, dt_softplus)
    flush = h >= L - 1
    n_flush = int(flush.sum())
    if n_flush == 0:
        y = _normal_rows(cache, sel, h, dtp, x, B, C, A)
    elif n_flush == sel.n:
        y = _flush_rows(cache, sel, h, dtp, x, B, C, A)
    else:
        fi, ni = flush.nonzero().squeeze(1), (~flush).nonzero().squeeze(1)
        y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        y[fi] = _flush_rows(cache, sel.subset(fi), h[fi], dtp[fi], x[fi], B[fi], C[fi], A)
        y[ni] = _normal_rows(cache, sel.subset(ni), h[ni], dtp[ni], x[ni], B[ni], C[ni], A)

    # Appends for the normal rows (after every read of the buffers), then the cursors.
    if n_flush < sel.n:
        ni = None if n_flush == 0 else (~flush).nonzero().squeeze(1)
        ids = sel.ids(x.device) if ni is None else sel.ids(x.device)[ni]
        hn = h if ni is None else h[ni]
        cache.x[ids, :, hn] = x if ni is None else x[ni]
        cache.B[ids, :, hn] = B if ni is None else B[ni]
        cache.dt[ids, :, hn] = dtp if ni is None else dtp[ni]
    sel.write(cache.write_pos, torch.where(flush, 0, h + 1).to(torch.int32))

    if D is not None:
        y.add_(D[:, None] * x.float())
    if z is not None:
        y.mul_(F.silu(z.float()))
    if rows is None:
        out.copy_(y)
    else:
        out[rows] = y.to(out.dtype)


def materialize_torch(cache, A, slots, out) -> None:
    """out [batch] = the state after the cached entries (fp32), for live rows; nothing written to the cache."""
    g = cache.geometry
    if slots is None:
        rows, sel = None, _Slots(out.shape[0], None)
    else:
        rows = (slots != cache.null_slot).nonzero().squeeze(1)
        sel = _Slots(rows.numel(), slots.long()[rows])
    if sel.n == 0:
        return
    n, G, k, P, N, L = sel.n, g.ngroups, g.heads_per_group, g.headdim, g.dstate, cache.buffer_len
    h = sel.read(cache.write_pos).long()
    s, abar = _buffer_weights(cache, sel, h, A, None)
    xsT = (s[..., None] * sel.read(cache.x).float()).view(n, G, k, L, P).permute(0, 1, 2, 4, 3).reshape(n * G, k * P, L)
    S = _read_state(cache, sel) * abar[..., None, None]
    S.view(n * G, k * P, N).baddbmm_(xsT, sel.read(cache.B).float().reshape(n * G, L, N))
    if rows is None:
        out.copy_(S)
    else:
        out[rows] = S
