"""ReplaySSM AR decode for Mamba-2: one token per row from a checkpoint + input buffer (ReplaySSM blog §5.1).

    replay_step(cache, x, dt, A, B, C, ...) -> y [batch, nheads, headdim]
    materialize(cache, slots=None)          -> state [batch, nheads, headdim, dstate] fp32

Protocol per row (slot s, h = cache.write_pos[s], L = cache.buffer_len):
    h <  L-1  normal step: y from the checkpoint + the h cached entries + the current token; the current
              x, B, processed dt are appended at buffer row h; write_pos <- h + 1. The checkpoint is not written.
    h == L-1  flush: the state after the current token is rebuilt and stored into the checkpoint (rounded
              to the state dtype); nothing is appended; write_pos <- 0. L = 1 is the plain state update.
Routes (normal steps only; a flush always rebuilds the state):
    "output_only"      y = abar (S0 C) + sum_j s_j (B_j . C) x_j  with B_j . C precomputed once per group
    "state_and_output" S_t = abar S0 + X^T (s * B) with a dot over the buffer axis, then y = S_t C
Backends compute the same function and leave the same cache contents (state, x, B, dt, write_pos):
"triton" (decode_kernels.py), "torch" (decode_torch.py, vectorised: the CPU timing backend) and "ref"
(decode_ref.py, float64 loops: the protocol oracle). cache.bc is the output-only route's scratch: only
the Triton output-only route writes it.

The Triton path is CUDA-graph capturable: no host reads of device values (slot validation in
replayssm/checks.py is skipped during capture), every tensor preallocated in the cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from replayssm import launch_registry, launch_table
from replayssm.checks import (
    check_backend,
    check_dtype,
    check_last_dim_contiguous,
    check_route,
    check_same_device,
    check_shape,
    check_slots,
    kernel_arch,
    next_pow2,
)
from replayssm.geometry import Mamba2Geometry
from replayssm.mamba2.cache import ReplayCache
from replayssm.ring_cursors import keep_shared_cursor
from replayssm.state_format import check_backend_format, format_of, plain_state, scaled_args

DT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DSTATE = 256  # dstate is held whole in one register tile
_A_ATTR = "_replay_A"  # where replay_step leaves the layer's A on the cache object for materialize


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes and warps of one (geometry, buffer_len, route, arch) point."""

    block_m: int       # headdim rows per program of the main kernel
    block_n: int       # dstate, whole, padded to a power of 2 (>= 16 for tl.dot)
    block_l: int       # buffer axis padded to a power of 2 >= 16 (tl.dot needs K >= 16)
    num_warps: int
    precompute_warps: int
    dot_precision: str  # fp32 parity for the reconstruction dot: plain tf32 drifts ~1e-3
    block_k: int = 32   # output-only step: the dstate chunk accumulated elementwise; fold: the chunk per iteration


def launch_config(geometry: Mamba2Geometry, buffer_len: int, route: str, arch: int, state_dtype=None,
                  kernel: str = "mamba2_replay_ar") -> LaunchConfig:
    """The config of `kernel` (mamba2_replay_ar: the step and its flush; mamba2_replay_materialize): this
    device's tuned entry (replayssm/launch_table.py, keyed by headdim, dstate, L and route), else the rule."""
    key = launch_registry.key(kernel, geometry, L=buffer_len, route=route)
    rule = default_fold_config if kernel == "mamba2_replay_ar_fold" else default_launch_config
    return launch_table.resolve(kernel, key, state_dtype, arch, rule(geometry, buffer_len, route, arch))


@functools.lru_cache(maxsize=256)
def default_launch_config(geometry: Mamba2Geometry, buffer_len: int, route: str, arch: int) -> LaunchConfig:
    """The default rule. arch 0 = Triton interpreter: biggest legal blocks, so the grid is tiny (it costs
    per program). GPU (sm_90 / sm_100 alike):
    output_only (ar_kernels.py's readout; no flush code): BLOCK_M 32 (16 where 32 does not divide headdim, e.g.
    Nano's 80) on 2 warps, dstate in K chunks of 16 accumulated elementwise. AOT (scripts/kernels/kernel_report.py,
    sm_90, bf16 activations, b256 L16, triton 3.7.1 / 3.6.0), Super-120B fp32 state: 40 / 44 registers, 48 / 40 warps
    per SM, issue floor 131 / 130 us, against 72 / 72 registers, 28 warps and 372 / 432 us of the shipped BLOCK_M
    16 x 4 warps step with its flush branch: fewer registers and a lower floor under both, so it ships without a
    GPU. Lower floors cost registers and are the GPU's to decide (launch table, mamba2_replay_ar): BLOCK_M 64 x 2
    warps 72 registers, 28 warps, 65 us; BLOCK_M 32 x 1 warp 80 registers, 24 warps, 60 us. BLOCK_M 64 x 4 warps
    spills 4 B at fp16 state (dropped from the space, replayssm/launch_registry.py).
    state_and_output: the official fork's BLOCK_M 32 at 4 warps (BLOCK_M 64 spills at fp32 with dstate 128; 1 warp
    spills 300+ bytes, 4 warps use 117-161 registers; materialize likewise)."""
    if geometry.dstate > MAX_DSTATE:
        raise ValueError(f"cannot tile dstate={geometry.dstate}: the kernel holds dstate whole in one tile "
                         f"(at most {MAX_DSTATE})")
    block_n = max(16, next_pow2(geometry.dstate))
    block_l = max(16, next_pow2(buffer_len))
    if arch == 0:
        return LaunchConfig(max(16, next_pow2(geometry.headdim)), block_n, block_l, 1, 1, "ieee", block_n)
    if route == "output_only":
        return LaunchConfig(32 if geometry.headdim % 32 == 0 else 16, block_n, block_l, 2, 2, "tf32x3", 16)
    return LaunchConfig(32, block_n, block_l, 4, 2, "tf32x3")


@functools.lru_cache(maxsize=256)
def default_fold_config(geometry: Mamba2Geometry, buffer_len: int, route: str, arch: int) -> LaunchConfig:
    """The output-only route's fold (ar_kernels.py; flush rows only): BLOCK_M headdim rows per program, dstate
    walked in block_k chunks (one live at a time), the split dot of the activation dtype (FP32 side: tf32x3 on
    the GPU, ieee in the interpreter). Interpreter: whole tiles. 4 warps: on 2, the fold with a 2-byte state
    spills 8-16 B at sm_100 under both Tritons (56 registers); on 4 it does not (Super-120B, fp32 state, b256: the
    step's issue floor 148 us, 0.52x its byte time, against 142 on 2 warps)."""
    block_n = max(16, next_pow2(geometry.dstate))
    block_l = max(16, next_pow2(buffer_len))
    if arch == 0:
        return LaunchConfig(max(16, next_pow2(geometry.headdim)), block_n, block_l, 1, 1, "ieee", block_n)
    return LaunchConfig(32, block_n, block_l, 4, 1, "tf32x3", min(32, block_n))


def _validate_common(cache: ReplayCache, backend: str, kernel: str = "mamba2.materialize") -> None:
    """`kernel`: the TRITON_SR_KERNELS name of the launch (replayssm/state_format.py: which Triton kernels store a
    stochastic-rounding format; materialize only reads the state)."""
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"expected a replayssm.mamba2.ReplayCache, got {type(cache).__name__}")
    if backend == "triton" and cache.geometry.dstate > MAX_DSTATE:
        raise ValueError(f"cannot tile dstate={cache.geometry.dstate}: the Triton kernels hold dstate whole in one "
                         f"tile (at most {MAX_DSTATE}); use backend='torch' or 'ref'")
    check_backend(backend, plain_state(cache), cache.x)      # the state's format: check_backend_format's
    check_backend_format(backend, format_of(cache), kernel)
    for name in ("state", "x", "B", "dt", "bc"):  # kernels take outer strides only
        check_last_dim_contiguous(f"cache.{name}", getattr(cache, name))


def _validate_step(cache, x, dt, A, B, C, D, z, dt_bias, slots, route, out, backend) -> torch.Tensor:
    """All checks of replay_step; returns int32 slots [batch]."""
    _validate_common(cache, backend, f"mamba2.replay[{route}]")       # SR: the output_only route's fold only
    check_route(route, "mamba2")
    g = cache.geometry
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, nheads, headdim], got shape {tuple(x.shape)}")
    batch = x.shape[0]
    check_backend(backend, x, dt, B, C, z, out)
    for name, t, shape in (("x", x, (batch, g.nheads, g.headdim)), ("z", z, (batch, g.nheads, g.headdim)),
                           ("out", out, (batch, g.nheads, g.headdim)), ("dt", dt, (batch, g.nheads)),
                           ("B", B, (batch, g.ngroups, g.dstate)), ("C", C, (batch, g.ngroups, g.dstate)),
                           ("A", A, (g.nheads,)), ("D", D, (g.nheads,)), ("dt_bias", dt_bias, (g.nheads,))):
        check_shape(name, t, shape)
        check_last_dim_contiguous(name, t)
    for name, t in (("x", x), ("z", z), ("B", B), ("C", C), ("out", out)):
        if t is not None and t.dtype != cache.act_dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but the cache's activation dtype is {cache.act_dtype}")
    check_dtype("dt", dt, DT_DTYPES)
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_dtype(name, t, (torch.float32,))
    device = check_same_device(cache=cache.state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, out=out)
    return check_slots(slots, batch, cache.num_slots, device, cache.null_slot)


def replay_step(cache: ReplayCache, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, dt_softplus: bool = True, slots: torch.Tensor | None = None,
                route: str = "output_only", out: torch.Tensor | None = None, backend: str = "triton") -> torch.Tensor:
    """One AR decode step per row: y from the checkpoint + cached entries, then the token is cached (or folded).

    A row whose buffer is full (write_pos = buffer_len - 1) flushes: the state after this token is stored into
    its checkpoint (rounded to the state dtype) and write_pos returns to 0.

    Args:
        cache: the layer's ReplayCache; buffers, cursors and (on flush rows) the checkpoint change in place.
        x: [batch, nheads, headdim] in cache.act_dtype.
        dt: [batch, nheads] raw time step (float32/16/bf16); dt_bias and softplus are applied here.
        A: [nheads] float32 (negative: the decay is exp(A dt)).
        B, C: [batch, ngroups, dstate] in cache.act_dtype.
        D: optional [nheads] float32 skip (y += D x).
        z: optional [batch, nheads, headdim] gate in cache.act_dtype (y *= silu(z)).
        dt_bias: optional [nheads] float32.
        dt_softplus: apply softplus (threshold 20) to dt + dt_bias.
        slots: int32 [batch], each row's cache slot (default arange(batch)); a NULL_SLOT (-1) row is skipped:
            its output is left as is and no cache entry is touched.
        route: "output_only" (default) or "state_and_output", the normal step's formula (same function).
        out: optional [batch, nheads, headdim] output in cache.act_dtype.
        backend: "triton" (default), "torch", "cpu" or "ref"; all compute the same function and cache contents.

    Returns:
        y [batch, nheads, headdim] in cache.act_dtype (`out` when given).

    Raises:
        ValueError: a bad shape, dtype, device, slot, route or backend, before anything is written.

    Example:
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import ReplayCache, replay_step
        >>> from replayssm.mamba2.inputs import random_params, random_step
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> p = random_params(geom)
        >>> cache = ReplayCache.allocate(geom, num_slots=3, buffer_len=4)
        >>> inp = random_step(geom, batch=2)
        >>> y = replay_step(cache, inp["x"], inp["dt"], p.A, inp["B"], inp["C"], p.D, inp["z"], p.dt_bias,
        ...                 backend="torch")
        >>> tuple(y.shape), cache.write_pos.tolist()
        ((2, 4, 16), [1, 1, 0])
    """
    slot_ids = _validate_step(cache, x, dt, A, B, C, D, z, dt_bias, slots, route, out, backend)
    if out is None:
        out = torch.empty(x.shape, dtype=cache.act_dtype, device=x.device)
    setattr(cache, _A_ATTR, A)  # a reference, for materialize(cache) without A
    if x.shape[0] == 0:
        return out
    if backend == "ref":
        from replayssm.mamba2.decode_ref import replay_step_ref
        with keep_shared_cursor(cache):
            replay_step_ref(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slot_ids, out)
    elif backend == "torch":
        from replayssm.mamba2.decode_torch import replay_step_torch
        # slots=None lets the torch backend read the cache through views (no gather copies)
        with keep_shared_cursor(cache):
            replay_step_torch(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, None if slots is None else slot_ids,
                              out)
    elif backend == "cpu":
        from replayssm.cpu import ops
        with keep_shared_cursor(cache):
            ops.mamba2_replay(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, out, slot_ids, route)
    else:
        _launch_step(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slot_ids, route, out)
    return out


def materialize(cache: ReplayCache, slots: torch.Tensor | None = None, backend: str = "triton", *,
                A: torch.Tensor | None = None) -> torch.Tensor:
    """The state after the entries cached so far (checkpoint decayed + buffer folded in); nothing is written.

    Args:
        cache: the layer's ReplayCache.
        slots: int32 [batch] slot ids (default every slot, batch = num_slots).
        backend: "triton" (default), "torch", "cpu" (the torch form) or "ref".
        A: [nheads] float32, the layer's A (the cache stores processed dt, not A dt); default: the A of the last
            replay_step on this cache object (a clone() does not carry it).

    Returns:
        state [batch, nheads, headdim, dstate] float32; NULL_SLOT rows are NaN.

    Raises:
        ValueError: no A known, or a bad slot, shape, dtype, device or backend.

    Example:
        >>> from replayssm.geometry import Mamba2Geometry
        >>> from replayssm.mamba2 import ReplayCache, materialize
        >>> from replayssm.mamba2.inputs import random_params
        >>> geom = Mamba2Geometry(nheads=4, headdim=16, dstate=16, ngroups=1)
        >>> cache = ReplayCache.allocate(geom, num_slots=3, buffer_len=4)
        >>> tuple(materialize(cache, backend="torch", A=random_params(geom).A).shape)
        (3, 4, 16, 16)
    """
    _validate_common(cache, backend)
    if A is None:
        A = getattr(cache, _A_ATTR, None)
        if A is None:
            raise ValueError("materialize needs A [nheads]: pass A=..., or run replay_step on this cache first")
    check_shape("A", A, (cache.geometry.nheads,))
    check_dtype("A", A, (torch.float32,))
    check_last_dim_contiguous("A", A)
    check_same_device(cache=cache.state, A=A)
    if slots is not None and slots.dim() != 1:
        raise ValueError(f"slots must be 1-D [batch], got shape {tuple(slots.shape)}")
    batch = cache.num_slots if slots is None else slots.shape[0]
    slot_ids = check_slots(slots, batch, cache.num_slots, cache.device, cache.null_slot)
    g = cache.geometry
    out = torch.full((batch, g.nheads, g.headdim, g.dstate), float("nan"), dtype=torch.float32, device=cache.device)
    if batch == 0:
        return out
    if backend == "ref":
        from replayssm.mamba2.decode_ref import materialize_ref
        materialize_ref(cache, A, slot_ids, out)
    elif backend in ("torch", "cpu"):        # cpu: a debug / gate read, not a timed path: the torch form
        from replayssm.mamba2.decode_torch import materialize_torch
        materialize_torch(cache, A, None if slots is None else slot_ids, out)
    else:
        _launch_materialize(cache, A, slot_ids, out)
    return out


# ----------------------------------------------------------------------------------------------- launchers

def _launch_step(cache, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, route, out) -> None:
    from replayssm.mamba2 import decode_kernels as k

    g, L, batch = cache.geometry, cache.buffer_len, x.shape[0]
    cfg = launch_config(g, L, route, kernel_arch(x.device), cache.state.dtype)
    output_only = route == "output_only"
    if output_only:
        k._bc_precompute_kernel[(batch, g.ngroups)](
            B, C, slots, cache.write_pos, cache.B, cache.bc,
            g.dstate, L,
            B.stride(0), B.stride(1), C.stride(0), C.stride(1),
            cache.B.stride(0), cache.B.stride(1), cache.B.stride(2), cache.bc.stride(0), cache.bc.stride(1),
            BLOCK_N=cfg.block_n, BLOCK_L=cfg.block_l, num_warps=cfg.precompute_warps,
        )
    # Absent optional tensors: any valid pointer; the constexpr flags keep the kernel from reading it.
    z_arg = z if z is not None else x
    if output_only:
        _launch_readout_and_fold(cache, x, dt, A, B, C, D, z_arg, dt_bias, dt_softplus, slots, out, cfg, z is not None)
    else:
        _launch_rebuild(cache, x, dt, A, B, C, D, z_arg, dt_bias, dt_softplus, slots, out, cfg, z is not None)
    if not cache.shared_cursor:       # a DecodeCursor shared by every layer advances once per step
        _launch_advance_cursor(cache, slots, batch)


def _launch_readout_and_fold(cache, x, dt, A, B, C, D, z_arg, dt_bias, dt_softplus, slots, out, cfg, has_z) -> None:
    """The output-only route after its precompute: the readout of every row, then the fold of the flush rows."""
    from replayssm.mamba2 import ar_kernels as k

    g, L, batch = cache.geometry, cache.buffer_len, x.shape[0]
    fmt = format_of(cache)
    state_scale = cache.state_scale if fmt.scaled else None               # int8 / float8_e4m3fn
    scale_stride = state_scale.stride(0) if state_scale is not None else 0
    k.mamba2_ar_step_kernel[(_cdiv(g.headdim, cfg.block_m), batch, g.nheads)](
        x, dt, A, C, D if D is not None else A, z_arg, dt_bias if dt_bias is not None else A, out, slots,
        cache.state, cache.x, cache.dt, cache.bc, cache.write_pos, state_scale,
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), C.stride(0), C.stride(1),
        z_arg.stride(0), z_arg.stride(1), out.stride(0), out.stride(1),
        cache.state.stride(0), cache.state.stride(1), cache.state.stride(2),
        cache.x.stride(0), cache.x.stride(1), cache.x.stride(2),
        cache.dt.stride(0), cache.dt.stride(1), cache.bc.stride(0), cache.bc.stride(1), scale_stride,
        headdim=g.headdim, dstate=g.dstate, L=L, HEADS_PER_GROUP=g.heads_per_group,
        HAS_D=D is not None, HAS_Z=has_z, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=min(cfg.block_k, cfg.block_n), BLOCK_L=cfg.block_l,
        num_warps=cfg.num_warps,
    )
    fcfg = launch_config(g, L, "output_only", kernel_arch(x.device), cache.state.dtype, "mamba2_replay_ar_fold")
    sr_step = cache.sr_step if fmt.stochastic else None                  # float16_sr / bfloat16_sr
    # a scaled format's fold: one program per head (its scale is the whole head's absmax: ar_kernels.py)
    fold_m = max(16, next_pow2(g.headdim)) if state_scale is not None else fcfg.block_m
    k.mamba2_ar_fold_kernel[(_cdiv(g.headdim, fold_m), batch, g.nheads)](
        x, dt, A, B, dt_bias if dt_bias is not None else A, slots, cache.state, cache.x, cache.B, cache.dt,
        cache.write_pos, sr_step, cache.sr_seed if sr_step is not None else 0, state_scale,
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1),
        cache.state.stride(0), cache.state.stride(1), cache.state.stride(2),
        cache.x.stride(0), cache.x.stride(1), cache.x.stride(2),
        cache.B.stride(0), cache.B.stride(1), cache.B.stride(2), cache.dt.stride(0), cache.dt.stride(1),
        scale_stride, headdim=g.headdim, dstate=g.dstate, L=L, HEADS_PER_GROUP=g.heads_per_group,
        HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=bool(dt_softplus),
        BLOCK_M=fold_m, BLOCK_K=min(fcfg.block_k, fcfg.block_n), BLOCK_L=fcfg.block_l,
        FP32_DOT=fcfg.dot_precision, num_warps=fcfg.num_warps, **scaled_args(fmt),
    )
    if sr_step is not None:           # after the fold (its programs read the counter), before the cursor moves
        from replayssm.delta_rule.ar_fold import launch_sr_advance
        launch_sr_advance(slots, cache.write_pos, sr_step, L)


def _launch_rebuild(cache, x, dt, A, B, C, D, z_arg, dt_bias, dt_softplus, slots, out, cfg, has_z) -> None:
    """The state-and-output route: one kernel rebuilds the state tile on every step (and stores it on a flush)."""
    from replayssm.mamba2 import decode_kernels as k

    g, L, batch = cache.geometry, cache.buffer_len, x.shape[0]
    k._replay_step_kernel[(_cdiv(g.headdim, cfg.block_m), batch, g.nheads)](
        x, dt, A, B, C, D if D is not None else A, z_arg, dt_bias if dt_bias is not None else A, out, slots,
        cache.state, cache.x, cache.B, cache.dt, cache.write_pos,
        g.headdim, g.dstate, L, g.heads_per_group,
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        z_arg.stride(0), z_arg.stride(1), out.stride(0), out.stride(1),
        cache.state.stride(0), cache.state.stride(1), cache.state.stride(2),
        cache.x.stride(0), cache.x.stride(1), cache.x.stride(2),
        cache.B.stride(0), cache.B.stride(1), cache.B.stride(2),
        cache.dt.stride(0), cache.dt.stride(1),
        HAS_D=D is not None, HAS_Z=has_z, HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_L=cfg.block_l,
        DOT_PRECISION=cfg.dot_precision, num_warps=cfg.num_warps,
    )


def _launch_advance_cursor(cache: ReplayCache, slots: torch.Tensor, batch: int) -> None:
    from replayssm.mamba2 import decode_kernels as k

    block_b = min(1024, max(16, next_pow2(batch)))
    k._advance_cursor_kernel[(_cdiv(batch, block_b),)](
        slots, cache.write_pos, batch, cache.buffer_len, BLOCK_B=block_b, num_warps=1 if block_b <= 128 else 4,
    )


def _launch_materialize(cache: ReplayCache, A: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> None:
    from replayssm.mamba2 import decode_kernels as k

    g, batch = cache.geometry, slots.shape[0]
    cfg = launch_config(g, cache.buffer_len, "state_and_output", kernel_arch(cache.device), cache.state.dtype,
                        "mamba2_replay_materialize")
    k._materialize_kernel[(_cdiv(g.headdim, cfg.block_m), batch, g.nheads)](
        A, slots, cache.state, cache.x, cache.B, cache.dt, cache.write_pos, out,
        g.headdim, g.dstate, cache.buffer_len, g.heads_per_group,
        cache.state.stride(0), cache.state.stride(1), cache.state.stride(2),
        cache.x.stride(0), cache.x.stride(1), cache.x.stride(2),
        cache.B.stride(0), cache.B.stride(1), cache.B.stride(2),
        cache.dt.stride(0), cache.dt.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_L=cfg.block_l, DOT_PRECISION=cfg.dot_precision,
        num_warps=cfg.num_warps, **_scaled_read_args(cache),
    )


def _scaled_read_args(cache) -> dict:
    """An int8 / float8_e4m3fn checkpoint's scale for materialize; nothing for the other formats (builds unchanged)."""
    scale = cache.state_scale if format_of(cache).scaled else None
    return {} if scale is None else dict(scale_ptr=scale, stride_sc_slot=scale.stride(0), SCALED=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
