"""Experimental FP8 (e4m3, per-head scale) checkpoint for the ReplaySSM AR caches (torch and ref backends only).

Storage: the checkpoint `state` is torch.float8_e4m3fn [num_slots, nheads, a, b] and `state_scale` is
float32 [num_slots, nheads]; the value it stands for is
    S = state.to(float) * state_scale[..., None, None]                      (dequantise)
The checkpoint is written only at a flush (and by set_state / write_checkpoint), and every write quantises
    scale = absmax(S over the head's [a, b] block) / 448   (448 = e4m3's largest finite value)
    state = (S / scale) rounded to e4m3 (round to nearest even)
with scale = 1 for an all-zero head (0 / 0 would poison it). Why per (slot, head): heads of one layer differ
in magnitude by orders (decays and dt differ per head), and e4m3 has only ~2^17 of dynamic range with 3
mantissa bits, so one scale for a whole slot would push the small heads into subnormals; a per-head
scale keeps every head at e4m3's full relative precision (half an ulp, at most 2^-4 relative).

ReplaySSM rounds the checkpoint once per flush, not once per token, which is what makes an 8-bit
checkpoint thinkable at all; the buffer entries (x, B / u, k) stay in the activation dtype.

The ref backend quantises with the same rule in float64 (scale rounded to its float32 storage first, then
S / scale rounded to e4m3), so the float64 oracle models the rounding instead of hiding it: an oracle that
dequantised exactly would need a tolerance wide enough to hide a wrong scale. (torch converts float64 to
e4m3 through float32, so a value within float32 rounding of an e4m3 tie may round the other way: immaterial
next to e4m3's 2^-4 half-ulp.)
"""

from __future__ import annotations

import torch

FP8_STATE_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
STATE_BLOCK_DIMS = 2  # every cache's state is [..., heads, a, b]: the scale covers the last two dims


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_STATE_DTYPE


def quantize(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S [..., nheads, a, b] (float32 or float64) -> (e4m3 [..., nheads, a, b], float32 scale [..., nheads]).

    The division runs in S's dtype with the stored (float32) scale, so dequantise(quantize(S)) is exactly
    what a reader of the cache sees.
    """
    absmax = S.abs().amax(dim=(-2, -1))
    scale = torch.where(absmax > 0, absmax / E4M3_MAX, torch.ones_like(absmax)).to(torch.float32)
    q = (S / scale.to(S.dtype)[..., None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_STATE_DTYPE)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 [..., nheads, a, b] and float32 scale [..., nheads] -> [..., nheads, a, b] in `dtype`."""
    return q.to(dtype) * scale.to(dtype)[..., None, None]


def read_checkpoint(cache, index, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The checkpoint of the slots `index` (int, slice, or long tensor), as `dtype` (a copy for fp8)."""
    if is_fp8(cache.state.dtype):
        return dequantize(cache.state[index], cache.state_scale[index], dtype)
    return cache.state[index].to(dtype)


def write_checkpoint(cache, index, S: torch.Tensor) -> None:
    """Store S [..., nheads, a, b] as the checkpoint of the slots `index`, rounded to the state dtype
    (quantised with a fresh per-head scale when the state is fp8)."""
    if is_fp8(cache.state.dtype):
        q, scale = quantize(S)
        cache.state[index] = q
        cache.state_scale[index] = scale
    else:
        cache.state[index] = S.to(cache.state.dtype)


def allocate_scale(state: torch.Tensor) -> torch.Tensor | None:
    """The float32 [num_slots, nheads] scale of an fp8 state (ones: a zero checkpoint), else None."""
    if not is_fp8(state.dtype):
        return None
    return torch.ones(state.shape[:-STATE_BLOCK_DIMS], dtype=torch.float32, device=state.device)
