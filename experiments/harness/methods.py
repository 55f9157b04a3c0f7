"""The method registry: one entry per method, so adding a method touches one place.

Each entry knows, per SSM family, which module implements it (imported lazily: a missing module makes
the point `skipped` with the reason, never a crash), how to allocate its persistent cache for a pool of
slots, how to load a committed state into a fresh cache (for the correctness gate), how to call one
decode step (AR) or one verify + commit (spec), and its analytic bytes per step (replayssm/traffic.py: the
`<family>_<name>` functions; a family without one gets no bytes column, never a crash). backend=cpu runs the
fused C kernels of every family (KDA through GDN's, per-channel mode); a method without them runs on torch
(cpu_families) and its rows say so.

    name                kind  families   what it is (families: mamba2, gdn, kda unless named)
    baseline_ar         ar    all        selective state update / fused recurrent step (state read+write)
    replay_ar           ar    all        ReplaySSM checkpoint + buffer, flush every L steps (route column)
    baseline_spec       spec  all        vLLM native: one state snapshot per draft token
    commit_replay_spec  spec  all        frozen checkpoint, replay the accepted prefix at commit
    replay_spec         spec  all        ReplaySSM ring: verify from one checkpoint, early flush
    peer:mamba_ssm      ar    mamba2     installed mamba_ssm selective_state_update (baselines.peers)
    peer:fla            ar    gdn, kda   installed FLA, its pool-indexed recurrent kernel (fused_recurrent_kda_fwd:
                                         KDA's own per-channel gate; GDN's decay broadcast over K; baselines.peers)

The API functions an entry returns from `api()` are the raw public functions; the harness may wrap
them in torch.compile, then calls them through `step` / `verify` / `commit`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import torch

from replayssm import state_format as sf
from replayssm.checks import SPEC_ROUTES, interpreter_active

REGISTRY: dict[str, Method] = {}


class MethodUnavailable(Exception):
    """The method cannot run here (module missing, peer not installed): the point is skipped."""


def register(method: Method) -> Method:
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def import_module(path: str):
    try:
        return importlib.import_module(path)
    except ImportError as exc:
        raise MethodUnavailable(f"{path} is not importable ({exc})") from None


def _traffic():
    try:
        return importlib.import_module("replayssm.traffic")
    except ImportError:
        return None


class Method:
    """Base entry. Subclasses set the class attributes and the per-family module table."""

    name: str = ""
    kind: str = "ar"                       # "ar" (one token per row per step) or "spec" (verify + commit)
    families: tuple[str, ...] = ("mamba2", "gdn", "kda")
    uses_buffer: bool = False              # buffer_len applies (and the gate runs L+1 steps)
    uses_history: bool = False             # history_len applies (spec ring)
    modules: dict[str, str] = {}
    # The method a speedup of this one is measured against (aggregate's pairing); rows carry the byte
    # model's partner/self ratio for it, the ceiling a purely bandwidth-bound speedup can reach.
    partner: str | None = None

    # Families whose modules have backend="cpu" kernels (replayssm/cpu); a sweep with backend=cpu runs the
    # others on the torch backend, and their rows say backend=torch.
    cpu_families: tuple[str, ...] = ("mamba2", "gdn", "kda")

    def backend_for(self, backend: str, family: str | None = None) -> str:
        if backend == "cpu" and family is not None and family not in self.cpu_families:
            return "torch"
        return backend

    def routes(self, family: str, backend: str = "triton") -> tuple[str | None, ...]:
        return (None,)

    def route_for(self, family: str, backend: str, requested: str | None) -> str | None:
        """The route a single-route sweep (sweep.route) runs: `requested` where this method has it on `backend`,
        else its first route (None for a method without routes)."""
        routes = self.routes(family, backend)
        return requested if requested in routes else routes[0]

    def module(self, family: str):
        return import_module(self.modules[family])

    def unavailable(self, family: str, device: str, backend: str) -> str | None:
        """None when the method can run here, else the reason it is skipped."""
        try:
            self.module(family)
        except MethodUnavailable as exc:
            return str(exc)
        return None

    def api(self, family: str) -> dict[str, Callable]:
        raise NotImplementedError

    def allocate(self, p, wl, num_slots: int, device: str):
        raise NotImplementedError

    def set_state(self, cache, state: torch.Tensor) -> None:
        """Make a freshly allocated cache hold `state` [num_slots, ...] as its committed state."""
        cache.state.copy_(state)

    def footprint(self, cache) -> int:
        """Persistent bytes of the cache (all slots)."""
        return int(cache.nbytes())

    def gate_steps(self, p, default: int) -> int:
        return default

    def flush_cursor(self, cache):
        """The write_pos tensor to set to L-1 to time a lone flush step (AR replay), else None."""
        return None

    def cursor_tensors(self, cache) -> list[torch.Tensor]:
        """Every per-slot cursor of the cache: zeroed, they are the state right after set_state (a fold or a
        fresh checkpoint); saved and copied back, a timed step is repeated from the same ring positions."""
        return []

    def traffic(self, p, wl, accepted: torch.Tensor | None):
        """Analytic bytes per step per sequence (a replayssm.traffic.Traffic), None when not modelled."""
        return None

    # AR: `kw` is Workload.call_kwargs(inputs), built once per input set (outside any timed region)
    def step(self, fns, cache, p, kw: dict, slots, out):
        raise NotImplementedError

    # spec
    def verify(self, fns, cache, p, kw: dict, slots, out):
        raise NotImplementedError

    def commit(self, fns, cache, p, num_accepted: torch.Tensor, slots, A: torch.Tensor | None) -> None:
        raise NotImplementedError


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def state_spec(wl):
    """The state format a workload allocates: its `state_format` name (replayssm/state_format.py; the accuracy
    study sets it for the formats a dtype cannot name, e.g. float16_sr), else its state dtype."""
    return getattr(wl, "state_format", None) or wl.state_dtype


def sr_seed(p) -> int:
    """The stochastic-rounding seed of a point's caches: its seed, as a 32-bit unsigned int."""
    return int(getattr(p, "seed", 0) or 0) & sf.U32


def _tr_args(wl) -> dict:
    return {"state_bytes": _bytes(wl.state_dtype), "act_bytes": _bytes(wl.act_dtype)}


def _tr_fn(tr, family: str, name: str):
    """replayssm.traffic's `<family>_<name>` byte model, or None where the family has none (no bytes column)."""
    return getattr(tr, f"{family}_{name}", None) if tr is not None else None


# --------------------------------------------------------------------------------------------- AR methods

class BaselineAR(Method):
    name, kind = "baseline_ar", "ar"
    modules = {"mamba2": "baselines.mamba2_ssu", "gdn": "baselines.gdn_recurrent", "kda": "baselines.kda_recurrent"}

    def api(self, family):
        mod = self.module(family)
        return {"step": mod.selective_state_update if family == "mamba2" else mod.fused_recurrent_step}

    def allocate(self, p, wl, num_slots, device):
        """A bare tensor for a plain format; a FormattedState (scale / SR counters, torch and ref backends) for
        the others, which the baseline steps accept in place of the tensor."""
        fmt = sf.state_format(state_spec(wl))
        if not fmt.plain:
            return sf.FormattedState.allocate((num_slots, *wl.state_shape), fmt.name, device=device,
                                              sr_seed=sr_seed(p))
        return torch.zeros(num_slots, *wl.state_shape, dtype=wl.state_dtype, device=device)

    def set_state(self, cache, state):
        if isinstance(cache, sf.FormattedState):
            sf.set_state(cache, state)        # quantised like a step's write; the SR counters restart
        else:
            cache.copy_(state)

    def footprint(self, cache):
        if isinstance(cache, sf.FormattedState):
            return int(cache.nbytes())
        return cache.numel() * cache.element_size()

    def step(self, fns, cache, p, kw, slots, out):
        return fns["step"](cache, **kw, slots=slots, out=out, backend=p.backend)

    def traffic(self, p, wl, accepted):
        fn = _tr_fn(_traffic(), wl.family, "baseline_ar")
        return None if fn is None else fn(wl.geometry, **_tr_args(wl))


class ReplayAR(Method):
    name, kind, uses_buffer, partner = "replay_ar", "ar", True, "baseline_ar"
    modules = {"mamba2": "replayssm.mamba2.decode", "gdn": "replayssm.gdn.decode", "kda": "replayssm.kda.decode"}

    def routes(self, family, backend="triton"):
        # Mamba-2: both routes on every backend (the C kernels have both). GDN and KDA: the Triton kernel has both
        # (output-only reads the checkpoint with the two vectors k and q); the torch and C forms compute the
        # output-only algebra only, so a state-and-output row there would name a form that did not run.
        if family in ("gdn", "kda") and backend == "triton":   # + the prep / step / fold route (replayssm/delta_rule/)
            return ("output_only", "state_and_output", "output_only_fold")
        if family == "mamba2" or backend == "triton":
            return ("output_only", "state_and_output")
        return ("output_only",)

    def api(self, family):
        return {"step": self.module(family).replay_step}

    def allocate(self, p, wl, num_slots, device):
        cls = import_module(f"replayssm.{wl.family}.cache").ReplayCache
        return cls.allocate(wl.geometry, num_slots, p.buffer_len, state_dtype=state_spec(wl),
                            act_dtype=wl.act_dtype, device=device, sr_seed=sr_seed(p))

    def set_state(self, cache, state):
        sf.set_state(cache, state)      # the checkpoint is quantised like a flush writes it; SR counters restart
        cache.write_pos.zero_()

    def gate_steps(self, p, default):
        return p.buffer_len + 1             # crosses the flush and runs one step after it

    def flush_cursor(self, cache):
        return cache.write_pos

    def cursor_tensors(self, cache):
        return [cache.write_pos]

    def step(self, fns, cache, p, kw, slots, out):
        route = {} if p.route is None else {"route": p.route}
        return fns["step"](cache, **kw, slots=slots, out=out, backend=p.backend, **route)

    def traffic(self, p, wl, accepted):
        fn = _tr_fn(_traffic(), wl.family, "replay_ar_cycle")
        if fn is None:
            return None
        return fn(wl.geometry, p.buffer_len, route=p.route or "output_only", **_tr_args(wl))


# ------------------------------------------------------------------------------------------- spec methods

class SpecMethod(Method):
    kind = "spec"
    # Fused CPU kernels: every spec method of every family.
    cpu_families = ("mamba2", "gdn", "kda")
    commit_takes_A = False
    cache_modules: dict[str, tuple[str, str]] = {}    # family -> (module, class)

    def api(self, family):
        mod = self.module(family)
        # A Mamba-2 commit that replays the accepted prefix needs the layer's A; GDN's does not.
        self.commit_takes_A = "A" in inspect.signature(mod.spec_commit).parameters
        return {"verify": mod.spec_verify, "commit": mod.spec_commit}

    def verify(self, fns, cache, p, kw, slots, out):
        # a ring form only (a caller sharing one call record between AR and spec methods may carry an AR route)
        route = {"route": p.route} if p.route in SPEC_ROUTES else {}
        return fns["verify"](cache, **kw, slots=slots, out=out, backend=p.backend, **route)

    def commit(self, fns, cache, p, num_accepted, slots, A):
        if self.commit_takes_A:
            fns["commit"](cache, num_accepted, A, slots=slots, backend=p.backend)
        else:
            fns["commit"](cache, num_accepted, slots=slots, backend=p.backend)

    def _cache_class(self, family):
        module, cls = self.cache_modules[family]
        return getattr(import_module(module), cls)

    def unavailable(self, family, device, backend):
        reason = super().unavailable(family, device, backend)
        if reason is None:
            try:
                self._cache_class(family)
            except (MethodUnavailable, AttributeError) as exc:
                return str(exc)
        return reason


class BaselineSpec(SpecMethod):
    name = "baseline_spec"
    modules = {"mamba2": "baselines.mamba2_ssu", "gdn": "baselines.gdn_recurrent_spec",
               "kda": "baselines.kda_recurrent_spec"}
    cache_modules = {"mamba2": ("baselines.mamba2_ssu", "SpecStates"),
                     "gdn": ("baselines.gdn_recurrent_spec", "SpecStates"),
                     "kda": ("baselines.kda_recurrent_spec", "SpecStates")}

    def allocate(self, p, wl, num_slots, device):
        """Every state format on the torch / ref backends (baselines/spec_formats.py); the plain ones on triton /
        cpu, whose verify refuses the others before any launch."""
        return self._cache_class(wl.family).allocate(wl.geometry, num_slots, p.spec_T, state_dtype=state_spec(wl),
                                                     device=device, sr_seed=sr_seed(p))

    def set_state(self, cache, state):
        if sf.format_of(cache).plain:
            cache.state[:, 0].copy_(state)      # snapshot 0 holds the committed state of a fresh request
        else:                                   # every snapshot by the format's rule (one block per slot)
            sf.set_state(cache, state[:, None].expand(-1, cache.state.shape[1], *state.shape[1:]))
        cache.last.zero_()

    def traffic(self, p, wl, accepted):
        fn = _tr_fn(_traffic(), wl.family, "baseline_spec")
        return None if fn is None else fn(wl.geometry, p.spec_T, **_tr_args(wl))


class CommitReplaySpec(SpecMethod):
    name, partner = "commit_replay_spec", "baseline_spec"
    modules = {"mamba2": "baselines.mamba2_commit_replay", "gdn": "baselines.gdn_commit_replay",
               "kda": "baselines.kda_commit_replay"}
    cache_modules = {"mamba2": ("baselines.mamba2_commit_replay", "CommitReplayCache"),
                     "gdn": ("baselines.gdn_commit_replay", "CommitReplayCache"),
                     "kda": ("baselines.kda_commit_replay", "CommitReplayCache")}

    def allocate(self, p, wl, num_slots, device):
        """Every state format on the torch / ref backends (baselines/spec_formats.py); the plain ones on triton /
        cpu, whose verify refuses the others before any launch."""
        return self._cache_class(wl.family).allocate(wl.geometry, num_slots, p.spec_T, state_dtype=state_spec(wl),
                                                     act_dtype=wl.act_dtype, device=device, sr_seed=sr_seed(p))

    def set_state(self, cache, state):
        sf.set_state(cache, state)      # the checkpoint is quantised like a commit writes it; SR counters restart

    def traffic(self, p, wl, accepted):
        fn = _tr_fn(_traffic(), wl.family, "commit_replay_spec")
        if fn is None or accepted is None:
            return None
        counts = torch.bincount(accepted.flatten().long(), minlength=p.spec_T + 1).tolist()
        total = None
        for a, c in enumerate(counts):
            if c:
                t = fn(wl.geometry, p.spec_T, a, **_tr_args(wl)) * c
                total = t if total is None else total + t
        return total / accepted.numel()


class ReplaySpec(SpecMethod):
    name, uses_history, partner = "replay_spec", True, "baseline_spec"
    modules = {"mamba2": "replayssm.mamba2.spec", "gdn": "replayssm.gdn.spec", "kda": "replayssm.kda.spec"}
    cache_modules = {"mamba2": ("replayssm.mamba2.cache", "SpecRing"), "gdn": ("replayssm.gdn.ring", "SpecRing"),
                     "kda": ("replayssm.kda.cache", "SpecRing")}

    def routes(self, family, backend="triton"):
        # the Triton ring verify's two forms (replayssm/checks.py SPEC_ROUTES); the torch and C forms compute one
        # algebra, so a verify_fold row there would name a form that did not run
        return SPEC_ROUTES if backend == "triton" else ("fused",)

    def route_for(self, family, backend, requested):
        """A single-route sweep's route names an AR form (sweep.route): the ring keeps its default form (None,
        as its points carry it), unless the request names another of its own Triton forms."""
        return requested if requested != "fused" and requested in self.routes(family, backend) else None

    def allocate(self, p, wl, num_slots, device):
        """Every state format (replayssm/state_format.py) on the torch / ref backends; the plain ones on triton /
        cpu, whose verify refuses the others before any launch (a recorded failure, never a crash)."""
        return self._cache_class(wl.family).allocate(wl.geometry, num_slots, p.history_len, p.spec_T,
                                                     state_dtype=state_spec(wl), act_dtype=wl.act_dtype,
                                                     device=device, sr_seed=sr_seed(p))

    def set_state(self, cache, state):
        sf.set_state(cache, state)      # the checkpoint is quantised like a flush writes it; SR counters restart
        for cursor in self.cursor_tensors(cache):
            cursor.zero_()

    def cursor_tensors(self, cache):
        return [cache.write_pos, cache.origin, cache.is_flush]

    def gate_steps(self, p, default):
        return p.history_len + 2            # even accepting 1 per step, the history overflows into a flush

    def traffic(self, p, wl, accepted):
        """Mean over the drawn schedule, every row simulated with the ring's commit rule from a reset."""
        step = _tr_fn(_traffic(), wl.family, "replay_spec_step")
        if step is None or accepted is None:
            return None
        B, T = p.history_len, p.spec_T
        total, n = None, 0
        for row in accepted.t().tolist():                    # per row: its counts over the steps
            write_pos, is_flush = 0, 2 * T > B + T
            for a in row:
                t = step(wl.geometry, T, write_pos, is_flush, **_tr_args(wl))
                total, n = (t if total is None else total + t), n + 1
                write_pos = a if is_flush else write_pos + a
                is_flush = write_pos + 2 * T > B + T
        return total / n


# ------------------------------------------------------------------------------------------------ peers

class PeerAR(Method):
    """An installed third-party kernel behind baselines.peers, timed beside our baseline (fairness rule).
    `adapter` names the baselines.peers factory that returns a function with our call shape."""

    kind = "ar"
    peer: str = ""
    adapter: str = ""

    def adapter_for(self, family: str) -> str:
        return self.adapter

    def backend_for(self, backend, family=None):
        return "triton"                      # peers are their projects' Triton kernels

    def module(self, family):
        return import_module("baselines.peers")

    def unavailable(self, family, device, backend):
        try:
            self.api(family)
        except MethodUnavailable as exc:
            return str(exc)
        if device == "cpu" and not interpreter_active():
            return f"{self.peer} is a Triton kernel: needs a CUDA device (or TRITON_INTERPRET=1)"
        return None

    def api(self, family):
        mod = self.module(family)
        try:
            return {"step": getattr(mod, self.adapter_for(family))()}
        except mod.PeerUnavailable as exc:          # str() is "skipped: <reason>"
            raise MethodUnavailable(str(exc).removeprefix("skipped: ")) from None

    def allocate(self, p, wl, num_slots, device):
        fmt = sf.state_format(state_spec(wl))
        if not fmt.plain:
            raise ValueError(f"{self.peer} stores a plain state only ({', '.join(sf.PLAIN_FORMATS)}), not "
                             f"{fmt.name}: the formats with a scale or stochastic rounding are this harness's")
        return torch.zeros(num_slots, *wl.state_shape, dtype=wl.state_dtype, device=device)

    def set_state(self, cache, state):
        cache.copy_(state)

    def footprint(self, cache):
        return cache.numel() * cache.element_size()

    def step(self, fns, cache, p, kw, slots, out):
        return fns["step"](cache, **kw, slots=slots, out=out)

    def traffic(self, p, wl, accepted):
        return BaselineAR.traffic(self, p, wl, accepted)


class PeerMambaSSM(PeerAR):
    name, families, peer, adapter = "peer:mamba_ssm", ("mamba2",), "mamba_ssm", "mamba_ssm_selective_state_update"


class PeerFLA(PeerAR):
    name, families, peer = "peer:fla", ("gdn", "kda"), "fla"
    adapters = {"gdn": "fla_fused_recurrent_gated_delta_rule", "kda": "fla_fused_recurrent_kda"}

    def adapter_for(self, family):
        return self.adapters[family]               # one entry, one adapter per family: rows stay `peer:fla`


for _cls in (BaselineAR, ReplayAR, BaselineSpec, CommitReplaySpec, ReplaySpec, PeerMambaSSM, PeerFLA):
    register(_cls())
