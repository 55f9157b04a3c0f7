"""State formats: how a recurrent state (a ReplaySSM checkpoint or a baseline's state) is stored.

One name per format, used by the API (`state_dtype=` of every cache allocation, `FormattedState` of the
baselines), the configs and the result rows:

    name            storage            per-(slot, head) scale    write rounding
    float32         float32            -                         exact
    float16         float16            -                         to nearest even
    bfloat16        bfloat16           -                         to nearest even
    float16_sr      float16            -                         stochastic (replayssm/stochastic_rounding.py)
    bfloat16_sr     bfloat16           -                         stochastic
    int8            int8               absmax / 127              to nearest even, clamped to [-127, 127]
    float8_e4m3fn   float8_e4m3fn      absmax / 448              to nearest even (e4m3)

Why a format and not a dtype: float16 and float16_sr share a storage dtype but not a write rule, and an 8-bit
state is meaningless without its scale, so the rule travels with the name. A plain torch dtype is accepted
where it names one format unambiguously (float32 / float16 / bfloat16 / float8_e4m3fn / int8).

Scaled formats (int8, e4m3): S = q * scale[slot, head], scale = absmax(head's [a, b] block) / qmax, 1 for an
all-zero head (0/0 would poison it). Per (slot, head) because heads of one layer differ in magnitude by orders;
one scale per slot would push the small heads into subnormals (e4m3) or zero (int8). int8 is symmetric
(-128 unused) so that rounding is odd-symmetric and a sign flip of S flips q exactly.

Stochastic formats: the write draws one Philox uint32 per element keyed by (seed, step, slot, element), where
`step` is the slot's write counter `sr_step[slot]` (an int32 device tensor advanced by every write) and `seed`
the holder's `sr_seed`. No host state per step: a captured graph replays with fresh draws because the counter
lives on the device. set_state (a new request in the slot) restarts the counter, so a request's draws depend only
on (seed, slot, its own writes), never on what the slot's previous request did.

Non-finite guard (TensorRT-LLM #14509: a NaN or inf that reaches a stored low-precision state poisons every later
step, and for a scaled format the whole head through its absmax): scaled writes take the absmax over the finite
elements only, map NaN to 0 and saturate +-inf / overflow to +-qmax; SR writes inherit stochastic_rounding's guard
(NaN -> 0, saturate). The plain formats round as a cast does, exactly like the Triton and C kernels.

Backends: torch and ref store every format in every cache (AR caches, spec rings, the baselines' FormattedState
and spec states). Triton stores the plain ones everywhere, the SR formats in the kernels of TRITON_SR_KERNELS
(ReplaySSM's AR fold routes and the baselines' AR steps) and int8 / e4m3 in those of TRITON_SCALED_KERNELS
(ReplaySSM's AR folds, one program per head: replayssm/scaled_rounding.py; see SCALED_ON_TRITON for the others).
The C kernels (cpu) store the plain ones and, in their AR kernels (every route's flush, the baselines' steps), the
SR formats (float16_sr where the compiler has _Float16, as float16); the spec rings on cpu keep the plain ones
(checks.check_ring_format), and int8 / e4m3 stay off C. The Triton and C SR writes draw the same bits as
sr_round_torch for the same (seed, slot, sr_step, element) and advance sr_step in the kernel.

The float64 oracle ("ref" backend) quantises with the same rules in float64 (the scale rounded to its float32
storage first), and for SR draws the same bits through sr_round_torch, so it models the rounding rather than
hiding it: a wrong scale or a biased rounding shows as a torch-vs-ref mismatch, not inside a tolerance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replayssm.slot_pool import SlotPool

U32 = 0xFFFFFFFF

STATE_BLOCK_DIMS = 2  # every state is [..., heads, a, b]: a scale covers the last two dims


@dataclass(frozen=True)
class StateFormat:
    name: str
    storage: torch.dtype
    qmax: float | None = None     # scaled formats: the largest stored magnitude; None: no scale
    stochastic: bool = False

    @property
    def scaled(self) -> bool:
        return self.qmax is not None

    @property
    def plain(self) -> bool:
        """Stored by a cast (what the Triton and C kernels do)."""
        return not self.scaled and not self.stochastic


FORMATS: dict[str, StateFormat] = {f.name: f for f in (
    StateFormat("float32", torch.float32),
    StateFormat("float16", torch.float16),
    StateFormat("bfloat16", torch.bfloat16),
    StateFormat("float16_sr", torch.float16, stochastic=True),
    StateFormat("bfloat16_sr", torch.bfloat16, stochastic=True),
    StateFormat("int8", torch.int8, qmax=127.0),
    StateFormat("float8_e4m3fn", torch.float8_e4m3fn, qmax=448.0),
)}
FORMAT_NAMES = tuple(FORMATS)
PLAIN_FORMATS = tuple(n for n, f in FORMATS.items() if f.plain)
SR_FORMATS = tuple(n for n, f in FORMATS.items() if f.stochastic)
# What each backend can store in every kernel. Triton adds the stochastic-rounding formats in the kernels of
# TRITON_SR_KERNELS only (check_backend_format's `kernel`); the C backend's four AR kernels (mamba2 ssu / replay,
# gdn step / replay, KDA through the gdn ones) all write them (replayssm/cpu/kernels.c).
BACKEND_FORMATS = {"triton": PLAIN_FORMATS, "cpu": PLAIN_FORMATS + SR_FORMATS, "torch": FORMAT_NAMES,
                   "ref": FORMAT_NAMES}
# The Triton kernels that write float16_sr / bfloat16_sr (named as the AOT report's recipes): ReplaySSM's AR flush
# on its fold routes (the checkpoint written once per L steps) and the baselines' AR steps (the state written every
# step), each drawing sr_round's bits in the kernel, keyed by the slot's device counter sr_step (read in the
# kernel, advanced by a one-program launch after it: graph-capturable). The "*.materialize" entries only read the
# state (a plain load of its storage dtype). Every other Triton kernel stores the plain formats only: the shipped
# GDN / KDA routes (output_only, state_and_output), Mamba-2's state_and_output, the spec rings and trees.
TRITON_SR_WRITERS = ("gdn.replay[output_only_fold]", "kda.replay[output_only_fold]", "mamba2.replay[output_only]",
                     "gdn.recurrent", "kda.recurrent", "mamba2.ssu")
TRITON_SR_KERNELS = TRITON_SR_WRITERS + ("gdn.materialize", "kda.materialize", "mamba2.materialize")
# The Triton kernels that store int8 / float8_e4m3fn (a per-(slot, head) scale: the absmax of the whole new head):
# ReplaySSM's AR folds, which give one program the whole head and walk it twice (replayssm/scaled_rounding.py);
# their step and materialize kernels read it (the stored values times the head's scale).
TRITON_SCALED_WRITERS = ("gdn.replay[output_only_fold]", "kda.replay[output_only_fold]", "mamba2.replay[output_only]")
TRITON_SCALED_KERNELS = TRITON_SCALED_WRITERS + ("gdn.materialize", "kda.materialize", "mamba2.materialize")
SCALED_ON_TRITON = ("int8 / float8_e4m3fn are stored on Triton by " + ", ".join(TRITON_SCALED_WRITERS) + " only: "
                    "their per-(slot, head) scale is the absmax of the whole head, which those folds take in one "
                    "program per head (two passes); every other Triton kernel writes a head from several V-tile "
                    "programs, a reduction across the head that a one-pass tile write cannot compute")
_BY_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.int8: "int8", torch.float8_e4m3fn: "float8_e4m3fn"}


def state_format(spec) -> StateFormat:
    """The format named by `spec`: a StateFormat, a name of FORMAT_NAMES, or a torch dtype naming one."""
    if isinstance(spec, StateFormat):
        return spec
    if isinstance(spec, torch.dtype):
        if spec not in _BY_DTYPE:
            raise ValueError(f"state dtype {spec} names no state format; expected one of {FORMAT_NAMES}")
        return FORMATS[_BY_DTYPE[spec]]
    if isinstance(spec, str) and spec in FORMATS:
        return FORMATS[spec]
    raise ValueError(f"unknown state format {spec!r}; expected one of {FORMAT_NAMES}")


def format_of(holder) -> StateFormat:
    """The format of a cache or FormattedState: its `state_format` name, else its storage dtype's format."""
    name = getattr(holder, "state_format", None)
    return FORMATS[name] if name else state_format(holder.state.dtype)


def scaled_args(fmt) -> dict:
    """The QMAX / IS_INT8 constexprs of replayssm/scaled_rounding.py's `quantize` for a scaled format (a
    StateFormat); {} for the other formats, whose kernel builds keep their defaults (unused: SCALED is False)."""
    if not fmt.scaled:
        return {}
    return dict(QMAX=float(fmt.qmax), IS_INT8=not fmt.storage.is_floating_point)


def plain_state(holder) -> torch.Tensor | None:
    """The holder's state tensor for checks.check_backend's dtype rules (a bf16 state under the interpreter), or
    None for a scaled format, whose storage dtype (e4m3: "no fp8 kernels") check_backend_format rules on per
    kernel instead."""
    return None if format_of(holder).scaled else holder.state


def check_backend_format(backend: str, fmt, kernel: str | None = None) -> None:
    """Refuse, before any launch, a format the backend cannot store, naming what it can. `kernel`: the Triton
    kernel about to write the state (a TRITON_SR_KERNELS name; None: one without stochastic rounding)."""
    f = state_format(fmt)
    allowed = BACKEND_FORMATS.get(backend, FORMAT_NAMES)
    if f.name in allowed:
        return
    if backend == "triton" and f.scaled and kernel in TRITON_SCALED_KERNELS:
        return
    if backend == "triton" and f.stochastic:
        if kernel in TRITON_SR_KERNELS:
            return
        raise ValueError(f"backend='triton' has no kernel writing state format {f.name!r} in "
                         f"{kernel or 'this kernel'}: {', '.join(SR_FORMATS)} are written on Triton by "
                         f"{', '.join(TRITON_SR_WRITERS)} only (ReplaySSM: replay_step route='output_only_fold' "
                         "for GDN / KDA, route='output_only' for Mamba-2; the baselines' AR steps); the shipped "
                         "GDN / KDA output_only / state_and_output routes, Mamba-2 state_and_output and the spec "
                         f"rings store {', '.join(PLAIN_FORMATS)}; every kernel runs it on backends 'torch' and "
                         "'ref'")
    why = f" ({SCALED_ON_TRITON})" if backend == "triton" and f.scaled else ""
    sr = (f" (and {', '.join(SR_FORMATS)} in {', '.join(TRITON_SR_WRITERS)})" if backend == "triton" else "")
    raise ValueError(f"backend={backend!r} has no kernels for state format {f.name!r}: it supports "
                     f"{', '.join(allowed)}{sr}; {f.name} is implemented on backends 'torch' and 'ref' only{why}")


# ------------------------------------------------------------------------------------------ quantisation

def quantize_scaled(S: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """S [..., heads, a, b] (float32 / float64) -> (storage [..., heads, a, b], float32 scale [..., heads]).

    The division runs in S's dtype with the stored (float32) scale, so dequantize(quantize(S)) is exactly what a
    reader sees. Non-finite guard: see the module docstring."""
    f = state_format(fmt)
    finite = torch.isfinite(S)
    absmax = torch.where(finite, S, 0.0).abs().amax(dim=(-2, -1))
    # a tensor divisor: a Python-scalar one is a multiply by its reciprocal on CPU, not the rounded division the
    # Triton kernels take (scaled_rounding.py)
    scale = torch.where(absmax > 0, absmax / torch.full_like(absmax, f.qmax), 1.0)
    scale = scale.clamp(max=torch.finfo(torch.float32).max).to(torch.float32)
    x = S / scale.to(S.dtype)[..., None, None]
    x = torch.nan_to_num(x, nan=0.0, posinf=f.qmax, neginf=-f.qmax).clamp(-f.qmax, f.qmax)
    if f.storage == torch.int8:
        x = torch.round(x)                                       # half to even
    return x.to(f.storage), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored [..., heads, a, b] (and its scale [..., heads], None for unscaled formats) -> `dtype`."""
    if scale is None:
        return q.to(dtype)
    return q.to(dtype) * scale.to(dtype)[..., None, None]


def slot_ids(index, num_slots: int, device) -> torch.Tensor:
    """The long slot ids an index (int, slice, or int tensor) of a [num_slots, ...] state selects."""
    if isinstance(index, torch.Tensor):
        return index.reshape(-1).to(device=device, dtype=torch.long)
    if isinstance(index, slice):
        return torch.arange(num_slots, device=device)[index]
    return torch.tensor([int(index)], dtype=torch.long, device=device)


def read_state(holder, index, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The state of the slots `index` (int, slice or long tensor) of a cache / FormattedState, as `dtype` (a copy
    whenever a conversion or a scale is involved)."""
    if format_of(holder).scaled:
        return dequantize(holder.state[index], holder.state_scale[index], dtype)
    return holder.state[index].to(dtype)


def write_state(holder, index, S: torch.Tensor) -> None:
    """Store S [..., heads, a, b] (float32 / float64) as the state of the slots `index`, by the holder's format:
    a cast (plain), a fresh per-head scale (int8 / e4m3), or stochastic rounding with the slots' write counters
    (then advanced by one)."""
    f = format_of(holder)
    if f.scaled:
        q, scale = quantize_scaled(S, f)
        holder.state[index] = q
        holder.state_scale[index] = scale
    elif f.stochastic:
        ids = slot_ids(index, holder.state.shape[0], holder.state.device)
        block = S.reshape(ids.numel(), *holder.state.shape[1:])
        step = holder.sr_step[ids].long()
        q = _sr_round(block, holder.sr_seed, ids, step, f.storage)
        holder.state[index] = q.reshape(holder.state[index].shape)
        holder.sr_step[ids] += 1
    else:
        holder.state[index] = S.to(f.storage)


def _sr_round(x, seed: int, ids, step, dtype):
    """sr_round_torch, bound here so a test can swap in a deterministic-rounding mutant. Imported on first use:
    replayssm/stochastic_rounding.py imports triton, which the torch / ref backends must not need."""
    from replayssm.stochastic_rounding import sr_round_torch
    return sr_round_torch(x, seed, ids, step, dtype)


def set_state(holder, S: torch.Tensor, slots=None) -> None:
    """A new request's state S enters `slots` (default every slot): the SR write counters restart at 0 and the
    scales are recomputed from S (the slot reuse guard: nothing of the previous request survives)."""
    index = slice(None) if slots is None else slot_ids(slots, holder.state.shape[0], holder.state.device)
    if getattr(holder, "sr_step", None) is not None:
        holder.sr_step[index] = 0
    write_state(holder, index, S)


# ------------------------------------------------------------------------------------------ storage

def allocate_extras(state: torch.Tensor, fmt) -> dict:
    """The tensors a format adds to a zero state [num_slots, heads, a, b]: state_scale (scaled formats: ones, a
    zero checkpoint), sr_step (stochastic formats: int32 zeros), and the format's name."""
    f = state_format(fmt)
    lead = state.shape[:-STATE_BLOCK_DIMS]
    scale = torch.ones(lead, dtype=torch.float32, device=state.device) if f.scaled else None
    step = torch.zeros(state.shape[0], dtype=torch.int32, device=state.device) if f.stochastic else None
    return {"state_scale": scale, "sr_step": step, "state_format": f.name}


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= U32:
        raise ValueError(f"sr_seed must be a 32-bit unsigned int, got {seed!r}")
    return seed


@dataclass
class FormattedState(SlotPool):
    """A baseline's recurrent state in any format: what fused_recurrent_step / selective_state_update accept in
    place of a bare tensor when the format needs more than the tensor (a scale, SR counters, a name).

    state       [num_slots, heads, a, b]   storage dtype of the format
    state_scale [num_slots, heads] fp32    scaled formats, else None
    sr_step     [num_slots] int32          stochastic formats (writes so far per slot), else None
    """

    state: torch.Tensor
    state_scale: torch.Tensor | None = None
    sr_step: torch.Tensor | None = None
    sr_seed: int = 0
    state_format: str | None = None

    @classmethod
    def allocate(cls, shape, state_dtype="float32", device="cpu", sr_seed: int = 0) -> FormattedState:
        """A zero state of `shape` [num_slots, heads, a, b] in the format `state_dtype` (a name or a dtype)."""
        f = state_format(state_dtype)
        if len(shape) != 4 or any(not isinstance(n, int) or n < 1 for n in shape):
            raise ValueError(f"shape must be [num_slots, heads, a, b] of ints >= 1, got {tuple(shape)}")
        state = torch.zeros(*shape, dtype=f.storage, device=device)
        return cls(state=state, sr_seed=check_seed(sr_seed), **allocate_extras(state, f))

    def read(self, slots=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return read_state(self, slice(None) if slots is None else slots, dtype)

    def with_state(self, state: torch.Tensor) -> FormattedState:
        return dataclasses.replace(self, state=state)


class formatted_work:
    """Context manager of a baseline step on a FormattedState with a non-plain format (torch / ref backends):
    the live rows' states are read into a working tensor (float32 for torch, float64 for ref), the step runs on
    it with slots remapped to its rows, and on exit the result is written back by the format's rule (so the
    state is rounded once per step, exactly where a kernel would store it).

        with formatted_work(store, slots, batch, backend) as (work, work_slots): step(work, work_slots)
    """

    def __init__(self, store: FormattedState, slots: torch.Tensor | None, batch: int, backend: str,
                 null_slot: int = -1):
        device = store.state.device
        if slots is None:
            self.ids = torch.arange(batch, device=device)
            self.work_slots = torch.arange(batch, dtype=torch.int32, device=device)
        else:
            live = slots != null_slot
            self.ids = slots[live].long()
            self.work_slots = torch.full_like(slots, null_slot, dtype=torch.int32)
            self.work_slots[live] = torch.arange(self.ids.numel(), dtype=torch.int32, device=device)
        self.store = store
        self.dtype = torch.float64 if backend == "ref" else torch.float32

    def __enter__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.work = read_state(self.store, self.ids, self.dtype).contiguous()
        return self.work, self.work_slots

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.ids.numel():
            write_state(self.store, self.ids, self.work)


def unwrap_state(state, backend: str, kernel: str | None = None) -> tuple[FormattedState | None, torch.Tensor, bool]:
    """A baseline's `state` argument -> (its FormattedState or None, the storage tensor, whether the format needs
    formatted_work). A format the backend lacks is refused here, before any launch. `kernel`: the baseline's
    TRITON_SR_KERNELS name (its Triton or C step writes an SR format itself: no formatted_work there)."""
    if not isinstance(state, FormattedState):
        return None, state, False
    f = format_of(state)
    check_backend_format(backend, f, kernel)
    return state, state.state, not f.plain and not (backend in ("triton", "cpu") and f.stochastic)
