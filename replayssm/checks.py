"""Input validation shared by every method: clear ValueErrors before any kernel launch.

Every public entry point (baselines and ReplaySSM, all backends) calls these before touching data, so a
wrong shape, dtype, slot or backend fails the same way everywhere. Checks that would read device memory
(slot values, accepted counts, tree parents) are value checks: skipped while a CUDA graph is being captured,
where a host sync is illegal, and inside `trusted_inputs()`, where the caller validated the same inputs once
(the harness's timed repeats: one host sync per call would be timed as the method's cost).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

NULL_SLOT = -1  # a row whose slot is NULL_SLOT is padding: skipped, its output left as is
# "cpu": the fused C/OpenMP kernels of replayssm/cpu (CPU tensors only; the CPU timing backend)
BACKENDS = ("triton", "torch", "ref", "cpu")
ACT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# bf16 state: kernels load the state, compute in fp32 and store with .to(state_ptr.dtype.element_ty), so a
# bf16 pool is one more storage format (the Triton interpreter cannot run it: check_backend refuses).
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Experimental fp8 checkpoint (replayssm/fp8_checkpoint.py): the ReplaySSM caches, torch/ref backends.
FP8_STATE_DTYPES = (torch.float8_e4m3fn,)
FP8_SCOPE = ("an fp8 (float8_e4m3fn) state is experimental and exists only for the ReplaySSM caches "
             "(replayssm.mamba2 / replayssm.gdn / replayssm.kda ReplayCache and SpecRing) and a baseline's "
             "FormattedState on backend 'torch' or 'ref'")
# The other non-plain state formats (float16_sr, bfloat16_sr, int8; replayssm/state_format.py): the same scope.
STATE_FORMAT_SCOPE = ("the quantised and stochastic-rounding state formats exist only for the ReplaySSM caches "
                      "(AR ReplayCache and SpecRing) and a baseline's FormattedState (replayssm/state_format.py), "
                      "on backend 'torch' or 'ref' (Triton also writes float16_sr / bfloat16_sr in the AR kernels "
                      "of state_format.TRITON_SR_WRITERS)")


# The normal-step forms of a ReplaySSM AR step. "output_only_fold" (GDN and KDA, replayssm/delta_rule/): the
# output-only readout on every step, flush rows included, with the per-key-head work in a precompute kernel and the
# flush as a separate K-chunked fold of the whole buffer (the current token appended as its last entry).
ROUTES = ("output_only", "state_and_output", "output_only_fold")
FAMILY_ROUTES = {"mamba2": ROUTES[:2], "gdn": ROUTES, "kda": ROUTES}   # which family's kernels have which


def check_route(route, family: str | None = None) -> None:
    """A replay step's or byte model's route: one of ROUTES (of FAMILY_ROUTES[family] when a family is named)."""
    allowed = ROUTES if family is None else FAMILY_ROUTES[family]
    if route not in allowed:
        raise ValueError(f"unknown route {route!r}{'' if family is None else f' for {family}'}; "
                         f"expected one of {allowed}")


# The Triton forms of a ReplaySSM ring verify (spec_verify's `route`). "fused": the shipped kernel, one launch per
# window whose programs also fold the history into the checkpoint on a flush row. "verify_fold" (issue 35): the
# verify and the fold as separate specializations (a row of the other phase exits at once) with the window's
# per-(row, head) work in a precompute; the float64, torch and C backends accept both names and compute the same
# function.
SPEC_ROUTES = ("fused", "verify_fold")


def check_spec_route(route) -> None:
    if route not in SPEC_ROUTES:
        raise ValueError(f"unknown spec route {route!r}; expected one of {SPEC_ROUTES}")


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1 before import)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def aot_capture_active() -> bool:
    """True while scripts/kernels/kernel_report.py captures launches to compile them ahead of time: kernels are
    not run, so CPU tensors may be passed to the Triton backend without the interpreter."""
    return os.environ.get("REPLAYSSM_AOT_CAPTURE", "0") == "1"


def kernel_arch(device: torch.device | str) -> int:
    """The GPU architecture launch configs are chosen for, as major*10+minor (90 = Hopper, 100 = Blackwell).

    0 means the Triton interpreter (pick the biggest legal blocks: it costs per program, not per FLOP).
    REPLAYSSM_TARGET_ARCH overrides it (the AOT kernel report builds for sm_90 and sm_100 on a CPU box).
    """
    override = os.environ.get("REPLAYSSM_TARGET_ARCH")
    if override:
        return int(override)
    if interpreter_active() or torch.device(device).type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def check_backend(backend: str, *tensors: torch.Tensor | None) -> None:
    """Reject an unknown backend, and bf16 where the Triton interpreter would compute garbage."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "triton":
        devices = {t.device.type for t in tensors if t is not None}
        if "cpu" in devices and not (interpreter_active() or aot_capture_active()):
            raise ValueError("backend='triton' on CPU tensors needs TRITON_INTERPRET=1 set before importing triton")
        if interpreter_active() and any(t is not None and t.dtype == torch.bfloat16 for t in tensors):
            raise ValueError("bfloat16 is not supported by the Triton interpreter (TRITON_INTERPRET=1): "
                             "it computes on the raw bit patterns; use float16/float32 on CPU")
        if any(t is not None and t.dtype in FP8_STATE_DTYPES for t in tensors):
            raise ValueError(f"backend='triton' has no fp8 state kernels: {FP8_SCOPE}")
    if backend == "cpu":
        devices = {t.device.type for t in tensors if t is not None}
        if devices - {"cpu"}:
            raise ValueError(f"backend='cpu' runs on CPU tensors only, got tensors on {sorted(devices)}")
        if any(t is not None and t.dtype in FP8_STATE_DTYPES for t in tensors):
            raise ValueError(f"backend='cpu' has no fp8 state kernels: {FP8_SCOPE}")
        from replayssm.cpu.ops import check_cpu_dtypes
        check_cpu_dtypes(**{f"tensor {i}": t for i, t in enumerate(tensors)
                            if t is not None and t.is_floating_point() and t.dtype.itemsize == 2})


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        hint = f" ({FP8_SCOPE})" if t.dtype in FP8_STATE_DTYPES else ""
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in allowed]}{hint}")


def check_pool_alloc(geometry, geometry_type: type, state_dtype, act_dtype: torch.dtype | None = None,
                     all_formats: bool = False, allow_fp8: bool = False, **sizes: int) -> torch.dtype:
    """The arguments every cache allocation shares: the geometry's type, its sizes (num_slots, buffer_len,
    history_len, window, ...: ints >= 1, bools refused) and the state / activation dtypes. `state_dtype`: a state
    format name (replayssm/state_format.py) or a torch dtype naming one. `all_formats`: the cache implements every
    state format (the ReplaySSM AR caches and spec rings); other caches take the plain ones (float32 / float16 /
    bfloat16). `allow_fp8`: its former name, same meaning. Returns the format's storage dtype."""
    from replayssm.state_format import FORMAT_NAMES, PLAIN_FORMATS, state_format
    if not isinstance(geometry, geometry_type):
        raise ValueError(f"expected a {geometry_type.__name__}, got {type(geometry).__name__}")
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    allowed = FORMAT_NAMES if all_formats or allow_fp8 else PLAIN_FORMATS
    try:
        fmt = state_format(state_dtype)
    except ValueError:
        raise ValueError(f"state_dtype {state_dtype!r} names no state format; expected one of {allowed}") from None
    if fmt.name not in allowed:
        hint = FP8_SCOPE if fmt.storage in FP8_STATE_DTYPES else STATE_FORMAT_SCOPE
        raise ValueError(f"state_dtype {fmt.name!r} is not available for this cache; expected one of {allowed} "
                         f"({hint})")
    if act_dtype is not None:
        check_dtype("act_dtype", torch.empty(0, dtype=act_dtype), ACT_DTYPES)
    return fmt.storage


def check_ring_format(ring, backend: str, kernel: str) -> None:
    """A speculative cache's state format on `backend`, before any launch (a ReplaySSM spec ring, a commit-replay
    baseline's checkpoint): every format on torch / ref, the plain ones on triton / cpu. `kernel`: the kernel about
    to run, named as the AOT report's recipes (e.g. "gdn.replay_spec[verify_fold]"). state_format.
    check_backend_format words the refusal where it refuses (a format the backend has in no kernel, or a Triton
    kernel outside its SR / scaled lists); a format the backend stores in its AR kernels only (the C backend's SR
    formats) is refused here, naming the same alternatives."""
    from replayssm.state_format import PLAIN_FORMATS, check_backend_format, format_of
    fmt = format_of(ring)
    check_backend_format(backend, fmt, kernel)
    if backend == "cpu" and not fmt.plain:
        raise ValueError(f"backend='cpu' has no kernel writing state format {fmt.name!r} in {kernel}: its C "
                         f"kernels store {', '.join(PLAIN_FORMATS)} (the C kernels write the stochastic-rounding "
                         f"formats in the AR steps only); {fmt.name} runs {kernel} on backends 'torch' and 'ref'")


def spec_kernel(family: str, what: str, route: str | None = None) -> str:
    """The name check_ring_format gives a spec ring's Triton kernel: "<family>.<what>[<route>]" ("fused" is the
    bare name, as the AOT recipes spell it)."""
    return f"{family}.{what}" + (f"[{route}]" if route not in (None, "fused") else "")


def check_ring_lengths(history_len: int, window: int) -> None:
    """A speculative ring needs history B >= window T, so that a flushed window still fits."""
    if history_len < window:
        raise ValueError(f"history_len B={history_len} < window T={window}: the ring needs B >= T "
                         "so that a flushed window still fits")


def check_shape(name: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """Exact shape check; None passes (optional tensors)."""
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)}")


def check_last_dim_contiguous(name: str, t: torch.Tensor | None) -> None:
    """Kernels accept arbitrary strides on outer dims but need unit stride on the innermost one."""
    if t is not None and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride on its last dim (got strides {t.stride()})")


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")
    return next(iter(devices.values()))


def capturing() -> bool:
    """True while a CUDA graph is being captured on the current stream (no host syncs allowed then)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_trusted_depth = 0


@contextmanager
def trusted_inputs() -> Iterator[None]:
    """Skip the value checks (the ones that read tensors back to the host) inside this block; shapes, dtypes,
    devices and backends are still checked. For a timed loop that repeats calls whose inputs were validated
    once before it: the harness runs its warm-up with every check, then its timed repeats trusted."""
    global _trusted_depth
    _trusted_depth += 1
    try:
        yield
    finally:
        _trusted_depth -= 1


def skip_value_checks() -> bool:
    """True where a value check must not sync with the host: during graph capture or inside trusted_inputs()."""
    return _trusted_depth > 0 or capturing()


def default_slots(batch: int, num_slots: int, device: torch.device) -> torch.Tensor:
    if batch > num_slots:
        raise ValueError(f"batch={batch} exceeds num_slots={num_slots}; pass slots explicitly")
    return torch.arange(batch, dtype=torch.int32, device=device)


def check_slots(slots: torch.Tensor | None, batch: int, num_slots: int, device: torch.device,
                null_slot: int = NULL_SLOT) -> torch.Tensor:
    """Return int32 slots [batch]; reject a wrong shape/dtype, a slot out of range, or a slot used twice."""
    if slots is None:
        return default_slots(batch, num_slots, device)
    if slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be int32 or int64, got {slots.dtype}")
    check_shape("slots", slots, (batch,))
    if slots.device != device:
        raise ValueError(f"slots on {slots.device}, cache on {device}")
    if not skip_value_checks():
        live = slots[slots != null_slot]
        if live.numel():
            lo, hi = int(live.min()), int(live.max())
            if lo < 0 or hi >= num_slots:
                raise ValueError(f"slot out of range: slots span [{lo}, {hi}] but the pool has {num_slots} slots "
                                 f"(null slot is {null_slot})")
            if live.unique().numel() != live.numel():
                raise ValueError("a slot appears in more than one row of the batch")
    return slots.to(torch.int32)


def check_num_accepted(num_accepted: torch.Tensor, batch: int, window: int) -> torch.Tensor:
    """Accepted counts include the bonus token: each in 1..T."""
    check_shape("num_accepted", num_accepted, (batch,))
    if num_accepted.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"num_accepted must be an integer tensor, got {num_accepted.dtype}")
    if not skip_value_checks() and num_accepted.numel():
        lo, hi = int(num_accepted.min()), int(num_accepted.max())
        if lo < 1 or hi > window:
            raise ValueError(f"num_accepted must be in 1..T={window}, got values in [{lo}, {hi}]")
    return num_accepted.to(torch.int32)


def check_cache_type(cache, cls: type) -> None:
    """A family's entry points accept only their own cache class: GDN and KDA caches share a base class
    (replayssm/gdn/cache.py) but a KDA cache is not a GDN one, nor the other way round."""
    if not isinstance(cache, cls):
        package = cls.__module__.rsplit(".", 1)[0] if cls.__module__.startswith("replayssm.") else cls.__module__
        raise ValueError(f"expected a {package}.{cls.__name__}, got {type(cache).__name__}")
