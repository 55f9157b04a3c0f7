"""Triton kernels of the Mamba-2 state-caching baselines (selective state update and its vLLM-native spec form).

Both kernels follow mamba_ssm's `selective_state_update` structure, as serving engines run it today:
grid (cdiv(headdim, BLOCK_M), batch, nheads); each program owns a [BLOCK_M, dstate] tile of one head's
state, reads it once, keeps the recurrence in fp32 registers and writes it back (AR: once; native spec:
once per window token, into that token's snapshot). dstate is never split, so y = S C is a row reduction
inside the program.

Launch configs (no triton autotune: it would rerun an in-place kernel, and the interpreter cannot benchmark):
the default is mamba_ssm's hand table keyed by dstate gives every thread 4 consecutive state elements, i.e. one 16-byte
load per fp32 row chunk. With an fp16 state the same tile would give 8-byte loads, so we halve the warps
(8 fp16 elements = 16 bytes per thread). Under the Triton interpreter (kernel_arch == 0) the cost is per
program, so one program covers the whole headdim. Every launch goes through replayssm/launch_table.py, so a
tuned entry of this device's table (experiments/tune.py, state-safe) replaces the default per kernel:
mamba2_ssu_ar, mamba2_ssu_spec (native spec), mamba2_cr_verify and mamba2_cr_commit (commit replay).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from replayssm import launch_registry, launch_table
from replayssm.checks import kernel_arch, next_pow2
from replayssm.stochastic_rounding import sr_key, sr_round

MAX_DSTATE = 256  # dstate is held whole in one tile row; beyond this the tile would spill

# dstate bucket -> (BLOCK_M, num_warps) for a 4-byte state: mamba_ssm's table (4 elements per thread).
_GPU_TILES_FP32 = {16: (32, 4), 32: (16, 4), 64: (8, 4), 128: (4, 4), 256: (4, 8)}


KERNELS = ("mamba2_ssu_ar", "mamba2_ssu_spec", "mamba2_cr_verify", "mamba2_cr_commit")


class SSULaunchConfig(NamedTuple):
    """A [block_m, block_n] state tile per program (unpacks as (BLOCK_M, BLOCK_N, num_warps))."""

    block_m: int
    block_n: int
    num_warps: int


def default_launch_config(headdim: int, dstate: int, state_dtype: torch.dtype, arch: int) -> SSULaunchConfig:
    """The hand rule. GPU (sm_90 / sm_100 alike): mamba_ssm's tiles, warps halved for 2-byte states so that
    each thread still loads 16 contiguous bytes. Interpreter (arch 0): the whole headdim in one program."""
    block_n = max(16, next_pow2(dstate))
    if arch == 0:
        return SSULaunchConfig(next_pow2(headdim), block_n, 4)
    block_m, warps = _GPU_TILES_FP32[block_n]
    if torch.empty(0, dtype=state_dtype).element_size() == 2:
        warps = max(1, warps // 2)
    # A tile taller than headdim would only add masked rows.
    block_m = min(block_m, max(1, next_pow2(headdim)))
    return SSULaunchConfig(block_m, block_n, warps)


def launch_config(headdim: int, dstate: int, state_dtype: torch.dtype, device,
                  kernel: str = "mamba2_ssu_ar") -> SSULaunchConfig:
    """(BLOCK_M, BLOCK_N, num_warps) for a [BLOCK_M, dstate] state tile of `kernel` (one of KERNELS): this
    device's tuned entry, else the default rule."""
    arch = kernel_arch(device)
    return launch_table.resolve(kernel, launch_registry.key(kernel, headdim=headdim, dstate=dstate), state_dtype, arch,
                                default_launch_config(headdim, dstate, state_dtype, arch))


@triton.jit
def softplus_fp32(v):
    """softplus with threshold 20 (identity above), log1p computed accurately.

    dt' is typically 1e-3..1e-1: log(1 + e) would lose ~3 significant digits there, so use the
    log1p(e) = log(u) * e / (u - 1), u = 1 + e identity (exact to a few ulps)."""
    e = tl.exp(tl.minimum(v, 20.0))
    u = 1.0 + e
    denom = tl.where(u == 1.0, 1.0, u - 1.0)
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / denom))
    return tl.where(v <= 20.0, lp, v)


@triton.jit
def process_dt(dt_raw, dt_bias_ptr, h, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr):
    """Raw dt scalar -> processed dt (fp32): + dt_bias[h], then softplus."""
    dt = dt_raw.to(tl.float32)
    if HAS_DT_BIAS:
        dt = dt + tl.load(dt_bias_ptr + h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = softplus_fp32(dt)
    return dt


@triton.jit
def gate_output(y, x, D_ptr, z_ptrs, h, mask_m, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """y + D[h] x, then * silu(z)."""
    if HAS_D:
        y = y + tl.load(D_ptr + h).to(tl.float32) * x
    if HAS_Z:
        z = tl.load(z_ptrs, mask=mask_m, other=0.0).to(tl.float32)
        y = y * z * tl.sigmoid(z)
    return y


@triton.heuristics({"SR": lambda a: a["sr_step_ptr"] is not None})
@triton.jit(do_not_specialize=["sr_seed"])
def ssu_ar_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, slots_ptr, out_ptr,
    heads_per_group, null_slot,
    s_slot, s_head, s_dim,
    x_batch, x_head, dt_batch, dt_head, B_batch, B_group, C_batch, C_group, z_batch, z_head, o_batch, o_head,
    sr_step_ptr, sr_seed,
    HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SR: tl.constexpr = False,
):
    """One decode token: S = exp(A dt') S + dt' x B^T (stored), y = S C + D x, * silu(z).

    state [num_slots, nheads, headdim, dstate]; x, z, out [batch, nheads, headdim]; dt [batch, nheads];
    B, C [batch, ngroups, dstate]; A, D, dt_bias [nheads]; slots [batch] int32.
    SR (sr_step_ptr given: a float16_sr / bfloat16_sr state): the store goes through stochastic_rounding.sr_round
    with key (sr_seed, sr_step[slot]) and the element's flat index in the slot's [nheads, headdim, dstate] block
    (one Philox call per 4 elements along dstate when DSTATE % 4 == 0), the torch / ref write's bits; y is read
    from the unrounded S, as there. The caller advances sr_step after the launch (delta_rule/ar_fold.py's
    sr_advance_kernel)."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    if slot == null_slot:
        return
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < HEADDIM
    mask_n = offs_n < DSTATE
    mask = mask_m[:, None] & mask_n[None, :]

    # Issue the big state read first; the small per-token inputs overlap its latency.
    s_ptrs = state_ptr + slot * s_slot + h * s_head + offs_m[:, None] * s_dim + offs_n[None, :]
    S = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * x_batch + h * x_head + offs_m, mask=mask_m, other=0.0).to(tl.float32)
    Bv = tl.load(B_ptr + b * B_batch + g * B_group + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * C_batch + g * C_group + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    dt = process_dt(tl.load(dt_ptr + b * dt_batch + h * dt_head), dt_bias_ptr, h, HAS_DT_BIAS, DT_SOFTPLUS)
    decay = tl.exp(tl.load(A_ptr + h).to(tl.float32) * dt)

    S = S * decay + (dt * x)[:, None] * Bv[None, :]
    if SR:
        first = h * (HEADDIM * DSTATE) + offs_m * DSTATE                     # each row's first element index
        key = sr_key(sr_seed, tl.load(sr_step_ptr + slot))
        tl.store(s_ptrs, sr_round(S, key, slot, first, state_ptr.dtype.element_ty, ALIGNED=DSTATE % 4 == 0)
                 .to(state_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=mask)
    y = tl.sum(S * Cv[None, :], axis=1)
    y = gate_output(y, x, D_ptr, z_ptr + b * z_batch + h * z_head + offs_m, h, mask_m, HAS_D, HAS_Z)
    tl.store(out_ptr + b * o_batch + h * o_head + offs_m, y.to(out_ptr.dtype.element_ty), mask=mask_m)


@triton.jit
def ssu_spec_kernel(
    state_ptr, last_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, dt_bias_ptr, slots_ptr, out_ptr,
    heads_per_group, null_slot,
    s_slot, s_snap, s_head, s_dim,
    x_batch, x_tok, x_head, dt_batch, dt_tok, dt_head, B_batch, B_tok, B_group, C_batch, C_tok, C_group,
    z_batch, z_tok, z_head, o_batch, o_tok, o_head,
    T: tl.constexpr, HEADDIM: tl.constexpr, DSTATE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """vLLM-native speculative verify: load snapshot last[slot], run the T window tokens serially in
    registers, store the state after token t into snapshot t, emit y_t.

    state [num_slots, T, nheads, headdim, dstate]; last [num_slots] int32; x, z, out [batch, T, nheads,
    headdim]; dt [batch, T, nheads]; B, C [batch, T, ngroups, dstate]. The tile is loaded before any
    store, and tiles of different programs are disjoint, so snapshot `last` may be among those overwritten."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    if slot == null_slot:
        return
    g = h // heads_per_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < HEADDIM
    mask_n = offs_n < DSTATE
    mask = mask_m[:, None] & mask_n[None, :]

    last = tl.load(last_ptr + slot).to(tl.int64)
    tile = slot * s_slot + h * s_head + offs_m[:, None] * s_dim + offs_n[None, :]
    S = tl.load(state_ptr + tile + last * s_snap, mask=mask, other=0.0).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    for t in tl.static_range(T):
        x = tl.load(x_ptr + b * x_batch + t * x_tok + h * x_head + offs_m, mask=mask_m, other=0.0).to(tl.float32)
        Bv = tl.load(B_ptr + b * B_batch + t * B_tok + g * B_group + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + b * C_batch + t * C_tok + g * C_group + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        dt = process_dt(tl.load(dt_ptr + b * dt_batch + t * dt_tok + h * dt_head), dt_bias_ptr, h,
                        HAS_DT_BIAS, DT_SOFTPLUS)
        S = S * tl.exp(A * dt) + (dt * x)[:, None] * Bv[None, :]
        tl.store(state_ptr + tile + t * s_snap, S.to(state_ptr.dtype.element_ty), mask=mask)
        y = tl.sum(S * Cv[None, :], axis=1)
        y = gate_output(y, x, D_ptr, z_ptr + b * z_batch + t * z_tok + h * z_head + offs_m, h, mask_m, HAS_D, HAS_Z)
        tl.store(out_ptr + b * o_batch + t * o_tok + h * o_head + offs_m, y.to(out_ptr.dtype.element_ty),
                 mask=mask_m)


@triton.jit
def set_cursor_kernel(cursor_ptr, slots_ptr, values_ptr, batch, null_slot, offset,
                      HAS_VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """cursor[slots[i]] = values[i] + offset (or 0 without values) for every non-null row; one program,
    device-only, so a commit/reset is CUDA-graph capturable."""
    offs = tl.arange(0, BLOCK)
    in_batch = offs < batch
    slot = tl.load(slots_ptr + offs, mask=in_batch, other=null_slot)
    live = in_batch & (slot != null_slot)
    if HAS_VALUES:
        value = tl.load(values_ptr + offs, mask=live, other=0) + offset
    else:
        value = tl.zeros([BLOCK], dtype=tl.int32)
    tl.store(cursor_ptr + slot, value.to(tl.int32), mask=live)
