"""FP8 (e4m3, per-head scale) checkpoint for the ReplaySSM AR caches (torch and ref backends only).

The rules of every state format now live in replayssm/state_format.py (this is its float8_e4m3fn format);
this module keeps the fp8 names its callers use.

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

from replayssm import state_format as sf

FP8_STATE_DTYPE = torch.float8_e4m3fn
E4M3_MAX = sf.FORMATS["float8_e4m3fn"].qmax  # torch.finfo(torch.float8_e4m3fn).max
STATE_BLOCK_DIMS = sf.STATE_BLOCK_DIMS


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_STATE_DTYPE


def quantize(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S [..., nheads, a, b] (float32 or float64) -> (e4m3 [..., nheads, a, b], float32 scale [..., nheads])."""
    return sf.quantize_scaled(S, "float8_e4m3fn")


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 [..., nheads, a, b] and float32 scale [..., nheads] -> [..., nheads, a, b] in `dtype`."""
    return sf.dequantize(q, scale, dtype)


# Every format's checkpoint goes through these (replayssm/state_format.py): the names stay for their callers.
read_checkpoint = sf.read_state
write_checkpoint = sf.write_state


def allocate_scale(state: torch.Tensor) -> torch.Tensor | None:
    """The float32 [num_slots, nheads] scale of an fp8 state (ones: a zero checkpoint), else None."""
    return sf.allocate_extras(state, FP8_STATE_DTYPE)["state_scale"] if is_fp8(state.dtype) else None
