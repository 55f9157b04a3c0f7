"""Optional adapters to installed peers, with our call shapes, so a run can time them beside our baselines.

    mamba_ssm_selective_state_update() -> fn(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                                             dt_softplus=True, slots=None, out=None) -> y [batch, nheads, headdim]
        mamba_ssm's Triton `selective_state_update` (the kernel vLLM adapted). It takes A [nheads, headdim,
        dstate], dt [batch, nheads, headdim], D and dt_bias [nheads, headdim]: we pass our per-head vectors as
        stride-0 broadcasts (its "tie_hdim" fast path), and `state_batch_indices` for slots.
    fla_fused_recurrent_gated_delta_rule() -> fn(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False,
                                                 slots=None, out=None) -> o [batch, HV, V]
        FLA's `fused_recurrent_gated_delta_rule` for one decode token; our state is K-last [slots, HV, V, K]:
        passed as is where the installed FLA has a V-first ([V, K]) state flag, else transposed.
    peer_status() -> {"mamba_ssm": "ok" | "skipped: <reason>", "fla": ..., "flashinfer": ...}
    peer_versions() -> {distribution: version} for provenance.

A missing peer raises PeerUnavailable, whose message starts with "skipped: ". Installing the peers into a
CPU venv (both verified with torch 2.13.0+cpu, triton 3.7.1):
    MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \\
        .venv/bin/pip install --no-build-isolation --no-deps mamba-ssm==2.3.2.post1 einops
    .venv/bin/pip install fla-core==0.6.0
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import types
import warnings
from collections.abc import Callable

import torch

from replayssm.checks import NULL_SLOT

PEERS = ("mamba_ssm", "fla", "flashinfer")
_DISTRIBUTIONS = {"mamba_ssm": "mamba-ssm", "fla": "fla-core", "flashinfer": "flashinfer-python"}


class PeerUnavailable(RuntimeError):
    """The peer cannot be used here; str() is "skipped: <reason>"."""

    def __init__(self, reason: str):
        super().__init__(f"skipped: {reason}")


def _import_mamba_ssm_ssu():
    """mamba_ssm.ops.triton.selective_state_update. Without the CUDA extensions (a CPU build) the package
    __init__ fails on `import selective_scan_cuda`; the Triton op does not need it, so register the package
    without running its __init__ and import the op module alone."""
    if importlib.util.find_spec("mamba_ssm") is None:
        raise PeerUnavailable("not installed")
    try:
        return importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    except ImportError:
        for name in [n for n in sys.modules if n == "mamba_ssm" or n.startswith("mamba_ssm.")]:
            del sys.modules[name]
    spec = importlib.util.find_spec("mamba_ssm")
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec  # keeps importlib.util.find_spec("mamba_ssm") working afterwards
    sys.modules["mamba_ssm"] = package
    try:
        return importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    except Exception as err:  # noqa: BLE001 - any import failure means the peer is unusable here
        raise PeerUnavailable(f"mamba_ssm import failed: {type(err).__name__}: {err}") from err


@contextlib.contextmanager
def _cpu_cuda_device_guard(t: torch.Tensor):
    """mamba_ssm wraps its launch in `torch.cuda.device(x.device.index)`, which fails for CPU tensors
    (index None); on CPU (interpreter runs) make that a no-op for the duration of the call only."""
    if t.device.type == "cuda":
        yield
        return
    original = torch.cuda.device
    torch.cuda.device = lambda index: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.device = original


def _live(slots: torch.Tensor | None, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, slots) of the non-null rows (int64), default slots = arange(batch)."""
    if slots is None:
        rows = torch.arange(batch, device=device)
        return rows, rows
    rows = torch.nonzero(slots != NULL_SLOT).flatten()
    return rows, slots.long()[rows]


def mamba_ssm_selective_state_update() -> Callable[..., torch.Tensor]:
    """mamba_ssm's selective_state_update with our call shape (state updated in place)."""
    ssu = _import_mamba_ssm_ssu().selective_state_update

    def call(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=True, slots=None, out=None):
        batch, nheads, headdim = x.shape
        dstate = state.shape[-1]
        zeros = torch.zeros(nheads, dtype=torch.float32, device=x.device)
        # Always pass dt_bias and D: mamba_ssm 2.3.2 crashes on None for both (stride of None).
        bias = (zeros if dt_bias is None else dt_bias)[:, None].expand(nheads, headdim)
        skip = (zeros if D is None else D)[:, None].expand(nheads, headdim)
        with _cpu_cuda_device_guard(x):
            y = ssu(state, x, dt[..., None].expand(batch, nheads, headdim), A[:, None, None].expand(nheads, headdim,
                    dstate), B, C, D=skip, z=z, dt_bias=bias, dt_softplus=dt_softplus,
                    state_batch_indices=None if slots is None else slots.to(torch.int32))
        if out is None:
            return y
        # Null rows: mamba_ssm writes zeros into its own output; ours are left as they were. A select, not a
        # gather of the live rows, so the call stays CUDA-graph capturable (no host sync).
        if slots is None:
            return out.copy_(y)
        return out.copy_(torch.where((slots != NULL_SLOT)[:, None, None], y.to(out.dtype), out))

    return call


def _import_fla_fused_recurrent():
    if importlib.util.find_spec("fla") is None:
        raise PeerUnavailable("not installed")
    try:
        with warnings.catch_warnings():   # FLA warns on import when it sees no GPU; the interpreter still runs it
            warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
            module = importlib.import_module("fla.ops.gated_delta_rule")
        return module.fused_recurrent_gated_delta_rule
    except Exception as err:  # noqa: BLE001
        raise PeerUnavailable(f"fla import failed: {type(err).__name__}: {err}") from err


def _fla_v_first_flag(fn) -> str | None:
    """The keyword that makes FLA keep the state V-first ([V, K], i.e. our K-last layout), if any."""
    params = inspect.signature(fn).parameters
    for name in ("state_v_first", "transpose_state_layout"):
        if name in params:
            return name
    return None


def fla_fused_recurrent_gated_delta_rule() -> Callable[..., torch.Tensor]:
    """FLA's fused_recurrent_gated_delta_rule for one token per row, with our GDN call shape.

    state [num_slots, HV, V, K] (K-last) updated in place; q, k [batch, H, K]; v [batch, HV, V];
    g (log decay), beta [batch, HV]. FLA reads an initial state and returns a final one (fp32): we gather the
    rows' states and scatter the results back, as an engine without in-place pool indexing would."""
    fn = _import_fla_fused_recurrent()
    flag = _fla_v_first_flag(fn)

    def call(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None):
        batch, HV, V = v.shape
        rows, live_slots = _live(slots, batch, v.device)
        if out is None:
            out = torch.empty_like(v)
        if rows.numel() == 0:
            return out
        h0 = state[live_slots]
        kwargs = {flag: True} if flag else {}
        if flag is None:
            h0 = h0.transpose(-1, -2).contiguous()                               # -> [n, HV, K, V]
        o, ht = fn(q[rows, None], k[rows, None], v[rows, None], g=g[rows, None].float(),
                   beta=beta[rows, None].float(), scale=scale, initial_state=h0.float().contiguous(),
                   output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, **kwargs)
        if flag is None:
            ht = ht.transpose(-1, -2)
        state[live_slots] = ht.to(state.dtype)
        out[rows] = o[:, 0].to(out.dtype)
        return out

    return call


_ADAPTERS: dict[str, Callable[[], Callable]] = {
    "mamba_ssm": mamba_ssm_selective_state_update,
    "fla": fla_fused_recurrent_gated_delta_rule,
}


def peer_status() -> dict[str, str]:
    """"ok" for each peer whose adapter can be built here, else "skipped: <reason>" (nothing is launched)."""
    status = {}
    for name in PEERS:
        if name not in _ADAPTERS:
            installed = importlib.util.find_spec(name) is not None
            status[name] = "skipped: installed, but no adapter is written for it" if installed else \
                "skipped: not installed"
            continue
        try:
            _ADAPTERS[name]()
            status[name] = "ok"
        except PeerUnavailable as err:
            status[name] = str(err)
    return status


def peer_versions() -> dict[str, str | None]:
    """Installed versions of the peers' distributions (None when absent), for run provenance."""
    versions = {}
    for dist in _DISTRIBUTIONS.values():
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions
