"""Baseline Gated DeltaNet AR decode: the fused recurrent step engines run today (vLLM / FLA style).

    fused_recurrent_step(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None,
                         backend="triton") -> o [batch, HV, V]

state [num_slots, HV, V, K] (K-last) is read and written back in place every step:
    q, k <- L2-normalised (if asked); q <- q * scale
    S <- exp(g) S;  u = beta (v - S k);  S <- S + u k^T;  o = S q
Inputs: q, k [batch, H, K] and v [batch, HV, V] in one act dtype; g, beta [batch, HV] fp32. Value head hv
reads key head hv // (HV / H). slots int32 [batch] maps rows to state slots (NULL_SLOT rows skipped).
Backends: "triton" (one kernel), "torch" (vectorised, one read + in-place update), "ref" (float64 loops).
State formats (replayssm/state_format.py): a bare tensor is float32 / float16 / bfloat16, stored by a cast; a
FormattedState carries any format (float16_sr, bfloat16_sr, int8, float8_e4m3fn on torch / ref: the step runs on
a float working copy of the live rows and writes the state back by the format's rule, every step). On Triton the
kernel writes float16_sr / bfloat16_sr itself: its store goes through stochastic_rounding.sr_round with key
(sr_seed, sr_step[slot]) and the element's flat index in the slot's [HV, V, K] block (one Philox call per 4
elements along K when K % 4 == 0), the bits of the torch / ref write, and a one-program launch after it advances
the live rows' sr_step on the device (no host state per step: graph-capturable). int8 / e4m3 stay torch / ref:
the per-(slot, head) scale is an absmax across the head's V-tile programs, a reduction the one-pass tile write
cannot take.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm import launch_registry, launch_table
from replayssm.checks import (
    NULL_SLOT,
    STATE_DTYPES,
    check_backend,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_slots,
    kernel_arch,
    next_pow2,
)
from replayssm.delta_rule.ar_fold import launch_sr_advance
from replayssm.gdn.decode import check_step_inputs
from replayssm.gdn.decode_torch import fold_into_state_, prepare_qk_fp32, state_times
from replayssm.gdn.ref import gdn_step_ref
from replayssm.state_format import formatted_work, unwrap_state
from replayssm.stochastic_rounding import sr_key, sr_round


@dataclass(frozen=True)
class RecurrentLaunchConfig:
    block_v: int
    num_warps: int
    num_stages: int


def recurrent_launch_config(K: int, V: int, state_dtype: torch.dtype, arch: int,
                            per_channel: bool = False) -> RecurrentLaunchConfig:
    """This device's tuned entry for kernel "gdn_recurrent" (per_channel: "kda_recurrent", the KDA build,
    tuned apart) in replayssm/launch_table.py, else the default."""
    kernel = "kda_recurrent" if per_channel else "gdn_recurrent"
    return launch_table.resolve(kernel, launch_registry.key(kernel, K=K, V=V), state_dtype, arch,
                                default_recurrent_config(K, V, state_dtype, arch))


def default_recurrent_config(K: int, V: int, state_dtype: torch.dtype, arch: int) -> RecurrentLaunchConfig:
    """Each program holds a [BV, K] state tile (whole K: the rank-1 update and both reductions need it).

    Interpreter: BV = V (one program per (row, value head)). GPU: a [16, 128] fp32 tile over 4 warps,
    16 elements per thread; built ahead of time for sm_90 at K = V = 128 (fp32 state, bf16 act): 48
    registers, no local memory, 16-byte loads and stores along K, full occupancy. FLA's choice (BV 8,
    1 warp) needs 72 registers in our build. Not yet timed on a GPU: revisit with measurements.
    """
    if arch == 0:
        return RecurrentLaunchConfig(max(16, next_pow2(V)), 4, 1)
    block_v = min(16, next_pow2(V))
    return RecurrentLaunchConfig(block_v, 4 if K >= 128 else 2, 1)


@triton.heuristics({"SR": lambda a: a["sr_step_ptr"] is not None})
@triton.jit(do_not_specialize=["sr_seed"])
def _gdn_recurrent_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, slots_ptr, state_ptr,
    stride_q_b, stride_q_h, stride_k_b, stride_k_h, stride_v_b, stride_v_h,
    stride_g_b, stride_g_h, stride_beta_b, stride_beta_h, stride_o_b, stride_o_h,
    stride_s_slot, stride_s_h, stride_s_v,
    scale, sr_step_ptr, sr_seed,
    NULL_ID: tl.constexpr, HV_PER_H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr, PER_CHANNEL: tl.constexpr = False,
    SR: tl.constexpr = False,
):
    """PER_CHANNEL (KDA, baselines/kda_recurrent.py): g [batch, HV, K] (unit stride on K), S <- S diag(exp(g)).
    SR (sr_step_ptr given: a float16_sr / bfloat16_sr state): the store is stochastically rounded; o is read from
    the unrounded S, as the torch / ref backends' formatted step does."""
    i_v = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if slot == NULL_ID:
        return
    i_h = i_hv // HV_PER_H
    offs_k = tl.arange(0, BK)
    mask_k = offs_k < K
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_v = offs_v < V
    q = tl.load(q_ptr + i_b * stride_q_b + i_h * stride_q_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + i_b * stride_k_b + i_h * stride_k_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
    q = q * scale
    v = tl.load(v_ptr + i_b * stride_v_b + i_hv * stride_v_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    if PER_CHANNEL:
        alpha = tl.exp(tl.load(g_ptr + i_b * stride_g_b + i_hv * stride_g_h + offs_k, mask=mask_k, other=0.0))
    else:
        alpha = tl.exp(tl.load(g_ptr + i_b * stride_g_b + i_hv * stride_g_h))
    beta = tl.load(beta_ptr + i_b * stride_beta_b + i_hv * stride_beta_h)

    s_ptrs = state_ptr + slot * stride_s_slot + i_hv * stride_s_h + offs_v[:, None] * stride_s_v + offs_k[None, :]
    s_mask = mask_v[:, None] & mask_k[None, :]
    if PER_CHANNEL:
        S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32) * alpha[None, :]
    else:
        S = tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32) * alpha
    u = beta * (v - tl.sum(S * k[None, :], 1))
    S = S + u[:, None] * k[None, :]
    o = tl.sum(S * q[None, :], 1)
    if SR:                                      # each row's first element index: (hv, v, 0) of its [HV, V, K] block
        first = i_hv * (V * K) + offs_v * K
        key = sr_key(sr_seed, tl.load(sr_step_ptr + slot))
        tl.store(s_ptrs, sr_round(S, key, slot, first, state_ptr.dtype.element_ty, ALIGNED=K % 4 == 0)
                 .to(state_ptr.dtype.element_ty), mask=s_mask)
    else:
        tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=s_mask)
    tl.store(o_ptr + i_b * stride_o_b + i_hv * stride_o_h + offs_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)


def _launch(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, per_channel: bool = False,
            store=None) -> None:
    """per_channel: KDA (g [batch, HV, K]); GDN passes nothing and launches what it did before. store: the
    FormattedState of a float16_sr / bfloat16_sr state (its sr_step advanced after the step), else None."""
    batch, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    cfg = recurrent_launch_config(K, V, state.dtype, kernel_arch(q.device), per_channel)
    grid = (triton.cdiv(V, cfg.block_v), batch, HV)
    sr_step = None if store is None else store.sr_step
    _gdn_recurrent_step_kernel[grid](
        q, k, v, g, beta, out, slots, state,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), out.stride(0), out.stride(1),
        state.stride(0), state.stride(1), state.stride(2),
        scale, sr_step, 0 if store is None else store.sr_seed,
        NULL_ID=NULL_SLOT, HV_PER_H=HV // H, K=K, V=V, BK=max(16, next_pow2(K)), BV=cfg.block_v,
        USE_L2NORM=bool(use_qk_l2norm), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"PER_CHANNEL": True} if per_channel else {}),
    )
    if sr_step is not None:           # every live row wrote its state: its counter moves, after every program read it
        launch_sr_advance(slots, None, sr_step)


def _step_torch(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out) -> None:
    """One read of the state for S k and S q (a batched GEMV from the pre-update state), then one chunked
    in-place pass S <- alpha S + u k^T; u = beta (v - alpha S k) and o = alpha S q + u (k . q) are the
    same algebra as the kernel's. slots None means row i uses slot i (no gather); else int32 [batch]."""
    HV, H, V, K = v.shape[1], q.shape[1], v.shape[2], q.shape[2]
    rows = None
    if slots is not None:
        rows = torch.nonzero(slots != NULL_SLOT).flatten()
        if rows.numel() == 0:
            return
        q, k, v, g, beta = q[rows], k[rows], v[rows], g[rows], beta[rows]
    n = q.shape[0]
    target = slice(0, n) if rows is None else slots[rows].long()
    S = state[target]                                       # a view when rows is None, else a gathered copy
    qf, kf = prepare_qk_fp32(q, k, scale, use_qk_l2norm)
    S_kq = state_times(S, torch.stack((kf, qf), 2), HV)                         # [n, HV, V, 2]
    alpha = torch.exp(g)
    u = beta[..., None] * (v.float() - alpha[..., None] * S_kq[..., 0])
    kq = (kf * qf).sum(-1).repeat_interleave(HV // H, dim=1)
    o = alpha[..., None] * S_kq[..., 1] + u * kq[..., None]
    if rows is None:
        out.copy_(o)
    else:
        out[rows] = o.to(out.dtype)
    in_place = rows is None and S.dtype == torch.float32 and S.is_contiguous()
    Sf = S if in_place else S.float().contiguous()
    fold_into_state_(Sf.view(n * HV, V, K), alpha.reshape(-1), u.reshape(n * HV, V), kf.reshape(n * H, K))
    if not in_place:
        state[target] = Sf.to(state.dtype)


def _step_ref(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out) -> None:
    """float64 loops (replayssm/gdn/ref.py), for either decay shape: g [batch, HV] or, KDA, [batch, HV, K]."""
    for row, slot in enumerate(slots.tolist()):
        if slot == NULL_SLOT:
            continue
        r = slice(row, row + 1)
        S, o, _ = gdn_step_ref(state[slot:slot + 1], q[r], k[r], v[r], g[r], beta[r], scale, use_qk_l2norm)
        state[slot] = S[0].to(state.dtype)
        out[row] = o[0].to(out.dtype)


def fused_recurrent_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None, use_qk_l2norm: bool = False,
                         slots: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         backend: str = "triton") -> torch.Tensor:
    """One baseline GDN decode step; state [num_slots, HV, V, K] (fp32/fp16) is updated in place.

    q, k [batch, H, K]; v [batch, HV, V] (same act dtype); g, beta [batch, HV] fp32; returns o [batch, HV, V].
    """
    return run_recurrent_step(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend,
                              per_channel=False, torch_step=_step_torch)


def run_recurrent_step(state, q, k, v, g, beta, scale, use_qk_l2norm, slots, out, backend: str, *,
                       per_channel: bool, torch_step) -> torch.Tensor:
    """fused_recurrent_step for either decay shape: GDN, and KDA (baselines/kda_recurrent.py, per_channel:
    g [batch, HV, K]). `torch_step`: the family's torch form; the Triton kernel, the C kernel and the float64
    loops take either shape."""
    store, state, formatted = unwrap_state(state, backend, "kda.recurrent" if per_channel else "gdn.recurrent")
    check_backend(backend, q, k, v, out, state)
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError("state must be a tensor [num_slots, HV, V, K] or a FormattedState")
    if not formatted:
        check_dtype("state", state, STATE_DTYPES)
    check_last_dim_contiguous("state", state)
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or not isinstance(v, torch.Tensor) or v.dim() != 3:
        raise ValueError("q must be [batch, H, K] and v [batch, HV, V]")
    num_slots, HV, V, K = state.shape
    H = q.shape[1]
    if H == 0 or HV % H:
        raise ValueError(f"HV={HV} (state) is not a multiple of H={H} (q)")
    batch = check_step_inputs(q, k, v, g, beta, out, H=H, HV=HV, K=K, V=V, act_dtype=q.dtype, scale=scale,
                              use_qk_l2norm=use_qk_l2norm, per_channel_g=per_channel)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, out=out, state=state)
    slots_i32 = check_slots(slots, batch, num_slots, device)
    scale = K ** -0.5 if scale is None else float(scale)
    if out is None:
        out = (torch.empty if slots is None else torch.zeros)(batch, HV, V, dtype=q.dtype, device=device)
    if batch == 0:
        return out
    if formatted:                    # torch / ref: the step on a float working copy, stored back by the format
        with formatted_work(store, None if slots is None else slots_i32, batch, backend) as (work, work_slots):
            if backend == "torch":
                torch_step(work, q, k, v, g, beta, scale, use_qk_l2norm, work_slots, out)
            else:
                _step_ref(work, q, k, v, g, beta, scale, use_qk_l2norm, work_slots, out)
        return out
    if backend == "triton":          # a FormattedState here is float16_sr / bfloat16_sr (unwrap_state refused the rest)
        sr = store if store is not None and store.sr_step is not None else None
        _launch(state, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out, per_channel=per_channel, store=sr)
    elif backend == "torch":
        torch_step(state, q, k, v, g, beta, scale, use_qk_l2norm, None if slots is None else slots_i32, out)
    elif backend == "cpu":
        from replayssm.cpu import ops
        ops.gdn_step(state, q, k, v, g, beta, scale, use_qk_l2norm, out, slots_i32, store)   # store: SR counter
    else:
        _step_ref(state, q, k, v, g, beta, scale, use_qk_l2norm, slots_i32, out)
    return out
