"""Comparison helpers shared by the tests and the harness's correctness gate.

Error metric: relative RMSE, ||out - ref||_2 / ||ref||_2 (FLA's `assert_close` metric), computed in
float64. It is scale-free, so one tolerance per dtype pair works for every geometry. Tolerances are keyed
by the lowest-precision dtype that touches the result (activations, state).
"""

from __future__ import annotations

import torch

# Relative-RMSE tolerance per storage dtype. fp32: far below tf32 drift (~1e-3), so a kernel that lets
# `tl.dot` fall back to plain tf32 fails. fp16/bf16: a few ulps of output rounding.
REL_TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    # Experimental fp8 checkpoint (e4m3 + per-head scale, replayssm/fp8_checkpoint.py): one e4m3 ulp, 2^-3.
    # One quantisation errs by at most half an ulp per element (RMS 2-3.6%); the readout S.C can lose a
    # little more through cancellation, and a few flushes add up. The tail is set by steps with a single live
    # row whose readout cancels (tests/replayssm/test_fp8_checkpoint.py): the worst per-step error over 3,000
    # random 14-step schedules at the tiny test geometries was 9.3% for Mamba-2 (99.9th percentile 9.0%), over
    # 2,000 for GDN 7.0% (99.9th percentile 4.8%). A missing, wrong or per-slot scale errs by O(1).
    torch.float8_e4m3fn: 0.125,
    # int8 checkpoint (per-(slot, head) scale absmax / 127, replayssm/state_format.py): a quantum is 1/127 of the
    # head's absmax, RMS error ~ absmax / 440 per element (~1 % of a Gaussian head's RMS); 5x that for the
    # readout's cancellation and a few flushes: the LOOSE bound tests/replayssm/test_state_formats.py holds the
    # torch / ref backends to against the float64 recurrence over flushes. A wrong scale errs by O(1).
    torch.int8: 5e-2,
}


def tolerance(*dtypes: torch.dtype) -> float:
    """The tolerance for a result that passed through every dtype in `dtypes` (the loosest wins)."""
    return max(REL_TOL[d] for d in dtypes)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMSE in float64. NaN anywhere in `out` gives inf (never passes)."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: {tuple(out64.shape)} vs reference {tuple(ref64.shape)}")
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    if denom == 0.0:
        return diff
    return diff / denom


# A per-row check beside the pooled one: the pooled relative error of a [slots, heads, ...] tensor is an RMS
# over every row, so one wrong head among 64 adds only 1/8 of its own error to it and can hide under a bf16
# tolerance. Each row (one slot's one head) is held to ROW_SLACK x the pooled tolerance: the worst of many
# rows' rounding errors exceeds their RMS by a small factor, a wrong row by orders of magnitude. A row whose
# reference is near zero is measured against ROW_FLOOR x the RMS row norm (else its relative error is noise).
ROW_SLACK = 4.0
ROW_FLOOR = 0.1


def row_rel_err(out: torch.Tensor, ref: torch.Tensor, row_dims: int) -> torch.Tensor:
    """Relative error of every row, [prod(shape[:row_dims])] float64: a row is one index of the leading
    `row_dims` dims (e.g. 2 for [slot, head, V, K]), its norm taken over the rest. NaN anywhere gives inf."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: {tuple(out64.shape)} vs reference {tuple(ref64.shape)}")
    if not 1 <= row_dims <= out64.dim():
        raise ValueError(f"row_dims must be in 1..{out64.dim()}, got {row_dims}")
    rows = int(torch.tensor(out64.shape[:row_dims]).prod())
    d, r = (out64 - ref64).reshape(rows, -1), ref64.reshape(rows, -1)
    if rows == 0:
        return torch.zeros(0, dtype=torch.float64)
    ref_norm = r.norm(dim=1)
    floor = ROW_FLOOR * ref_norm.square().mean().sqrt()
    err = d.norm(dim=1) / torch.maximum(ref_norm, floor).clamp_min(torch.finfo(torch.float64).tiny)
    return torch.where(torch.isfinite(out64.reshape(rows, -1)).all(dim=1), err, torch.inf)


def assert_rel_close(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float, row_dims: int | None = None) -> None:
    """Pooled relative error <= tol and, with `row_dims`, every row's <= ROW_SLACK * tol (see ROW_SLACK)."""
    err = rel_err(out, ref)
    assert err <= tol, f"{name}: relative error {err:.3e} exceeds {tol:.1e}"
    if row_dims:
        rows = row_rel_err(out, ref, row_dims)
        worst = int(rows.argmax()) if rows.numel() else 0
        assert not rows.numel() or rows[worst] <= ROW_SLACK * tol, (
            f"{name}: row {worst} of {tuple(out.shape[:row_dims])} has relative error {float(rows[worst]):.3e} "
            f"> {ROW_SLACK:g} x {tol:.1e} (pooled error {err:.3e})")


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so a kernel that forgets to write part of an output fails loudly."""
    return t.fill_(float("nan"))


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def split_route(backend: str) -> tuple[str, dict]:
    """A test's backend id with an optional route: 'triton:state_and_output' -> ('triton', {'route':
    'state_and_output'}); a plain 'triton' -> ('triton', {}) (the function's default route)."""
    name, _, route = backend.partition(":")
    return name, ({"route": route} if route else {})
