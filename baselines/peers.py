"""Optional adapters to installed peers, with our call shapes, so a run can time them beside our baselines.

    mamba_ssm_selective_state_update() -> fn(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                                             dt_softplus=True, slots=None, out=None) -> y [batch, nheads, headdim]
        mamba_ssm's Triton `selective_state_update` (the kernel vLLM adapted). It takes A [nheads, headdim,
        dstate], dt [batch, nheads, headdim], D and dt_bias [nheads, headdim]: we pass our per-head vectors as
        stride-0 broadcasts (its "tie_hdim" fast path), and `state_batch_indices` for slots.
    fla_fused_recurrent_gated_delta_rule() -> fn(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False,
                                                 slots=None, out=None) -> o [batch, HV, V]
        FLA's pool-indexed recurrent delta-rule kernel for one decode token, run on our K-last pool
        [slots, HV, V, K] in place with its own slot indexing (no state copies, no host sync).
    fla_fused_recurrent_kda() -> fn(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None,
                                    out=None) -> o [batch, HV, V]
        The same FLA kernel as the KDA peer of baselines/kda_recurrent.py: g [batch, HV, K] goes in as it is.
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


def _import_fla_pool_recurrent():
    """FLA's in-place, pool-indexed recurrent kernel. FLA 0.6's GDN `fused_recurrent_gated_delta_rule` takes an
    initial state and returns a new final one (no pool indexing); its KDA recurrent forward takes the pool
    itself with `ssm_state_indices` and updates it in place (the continuous-batching path vLLM uses). KDA is
    GDN with a per-key-channel decay: with the head's decay broadcast over K it computes GDN exactly."""
    if importlib.util.find_spec("fla") is None:
        raise PeerUnavailable("not installed")
    try:
        with warnings.catch_warnings():   # FLA warns on import when it sees no GPU; the interpreter still runs it
            warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
            module = importlib.import_module("fla.ops.kda.fused_recurrent")
        fwd = module.fused_recurrent_kda_fwd
    except Exception as err:  # noqa: BLE001
        raise PeerUnavailable(f"fla import failed: {type(err).__name__}: {err}") from err
    params = inspect.signature(fwd).parameters
    needed = ("ssm_state_indices", "inplace_final_state", "state_v_first", "cu_seqlens")
    missing = [n for n in needed if n not in params]
    if missing:
        raise PeerUnavailable(f"the installed fla's fused_recurrent_kda_fwd lacks {', '.join(missing)}")
    return fwd


def fla_fused_recurrent_gated_delta_rule() -> Callable[..., torch.Tensor]:
    """FLA's recurrent delta-rule kernel for one token per row, on our pool in place, with our GDN call shape.

    state [num_slots, HV, V, K] (K-last = FLA's `state_v_first`, each slot's [HV, V, K] contiguous) updated in
    place through FLA's own slot indexing (`ssm_state_indices`): no gather, transpose or scatter of the state,
    no host sync, so the call is CUDA-graph capturable with any slot layout. q, k [batch, H, K]; v [batch, HV, V];
    g (log decay), beta [batch, HV]. The decay goes in as FLA's per-key-channel gate (g broadcast over K, one
    [batch, HV, K] fp32 tensor: K/(V K) of the state bytes). With `slots`, rows are ordered live-first and run as
    variable-length sequences (cu_seqlens): a NULL_SLOT row is a zero-length sequence, which FLA skips before
    touching the pool, and its output is left as it was. Costs beyond the kernel: the [batch]-sized ordering
    and the gathers of the rows' inputs (never the state)."""
    return _fla_pool_step(per_channel=False)


def fla_fused_recurrent_kda() -> Callable[..., torch.Tensor]:
    """FLA's fused recurrent KDA kernel (fla.ops.kda.fused_recurrent) for one token per row, on our K-last pool in
    place, with our KDA call shape: g [batch, HV, K] fp32 is FLA's own per-key-channel gate. Otherwise exactly
    fla_fused_recurrent_gated_delta_rule (slot indexing, NULL rows, no host sync)."""
    return _fla_pool_step(per_channel=True)


def _fla_pool_step(per_channel: bool) -> Callable[..., torch.Tensor]:
    fwd = _import_fla_pool_recurrent()

    def call(state, q, k, v, g, beta, scale=None, use_qk_l2norm=False, slots=None, out=None):
        batch, HV, V = v.shape
        K = q.shape[-1]
        if out is None:
            out = torch.zeros_like(v)
        if batch == 0:
            return out
        if state.dim() != 4 or state.stride(3) != 1 or state.stride(2) != K or state.stride(1) != V * K:
            raise ValueError("fla peer: each slot's state [HV, V, K] must be contiguous (the pool's slot stride is "
                             f"free), got strides {tuple(state.stride())}")
        gate = g.float() if per_channel else g.float()[..., None].expand(batch, HV, K)
        common = dict(initial_state=state, inplace_final_state=True, state_v_first=True, scale=scale,
                      use_qk_l2norm_in_kernel=use_qk_l2norm)
        if slots is None:
            idx = torch.arange(batch, dtype=torch.int32, device=v.device)
            o, _ = fwd(q[:, None], k[:, None], v[:, None], gate[:, None].contiguous(), beta.float()[:, None],
                       ssm_state_indices=idx, **common)
            return out.copy_(o[:, 0])
        live = slots != NULL_SLOT
        order = torch.argsort((~live).to(torch.int8), stable=True)           # live rows first, batch order kept
        cu_seqlens = torch.zeros(batch + 1, dtype=torch.int64, device=v.device)
        cu_seqlens[1:] = torch.cumsum(live[order], 0)                          # NULL rows: zero-length sequences
        o, _ = fwd(q[order][None], k[order][None], v[order][None], gate[order][None].contiguous(),
                   beta.float()[order][None], cu_seqlens=cu_seqlens, ssm_state_indices=slots[order].to(torch.int32),
                   **common)
        o = o[0][torch.argsort(order)]
        return out.copy_(torch.where(live[:, None, None], o.to(out.dtype), out))

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
