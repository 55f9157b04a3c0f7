"""What one accuracy series is made of: the method table, the two workloads and the float64 trajectories.

A *group* is (model, workload, activation dtype): one draw of inputs (a fixed generator seed per group, so
every method and state dtype of the group decodes exactly the same tokens) and its float64 truth, computed
once with the plain recurrence (replayssm/<family>/ref.py):
    AR    y_t and S_t of ssm_step_ref / gdn_step_ref chained over `steps` tokens;
    spec  window_ref from the committed float64 state, which then advances by each row's accepted count
          (the truth of a speculative path is the recurrence over the accepted tokens only).
A *series* is one method x state dtype (x buffer length / window) run over a group's inputs.

Workloads:
    realistic    replayssm/<family>/inputs.py as is (Mamba-2 decay exp(A dt) in about [0.2, 1); GDN
                 exp(g) in [0.5, 0.999]; KDA per key channel in about [0.1, 0.999]).
    long_memory  the same draws with the decay pushed towards 1, where rounding accumulates most:
                 Mamba-2 |A| in [0.05, 0.5] and dt0 = softplus(dt_bias) in [1e-3, 1e-2] (A dt' ~ 5e-5..5e-3,
                 a memory of 200..20,000 tokens); GDN g in [-1e-2, -1e-4] (exp(g) in [0.99, 0.9999]), KDA
                 the same per key channel.
                 The input process stays stationary; only its memory is long.
The initial (prefill-like) state is drawn once per group and rounded to bf16, so it is exactly
representable in every state dtype: every error measured is made by the decode itself.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from experiments.harness.methods import REGISTRY
from experiments.harness.points import ModelSpec, Point
from experiments.harness.sweeps import ACCURACY_WORKLOADS
from experiments.harness.workload import Workload
from replayssm import state_format as sf
from replayssm.geometry import Mamba2Geometry

WORKLOADS = ACCURACY_WORKLOADS    # the sweep schema's vocabulary (experiments/harness/sweeps.py)


# ------------------------------------------------------------------------------------------ method table

def _tensor_state(cache, family, backend, A):
    if isinstance(cache, sf.FormattedState):          # int8 / fp8 / SR: dequantised (float64: exactly)
        return cache.read(dtype=torch.float64)
    return cache                                      # the baseline's pool is the state itself


# The family packages are imported where a family's series runs: each loads its Triton kernels.

def _replay_state(cache, family, backend, A):
    if family == "mamba2":
        from replayssm.mamba2.decode import materialize
        return materialize(cache, backend=backend, A=A)
    if family == "kda":
        from replayssm.kda.decode import materialize as kda_materialize
        return kda_materialize(cache, backend=backend)
    from replayssm.gdn.decode import materialize
    return materialize(cache, backend=backend)


def _snapshot_state(cache, family, backend, A):
    return cache.committed()                         # snapshot `last` holds the committed state (dequantised)


def _checkpoint_state(cache, family, backend, A):
    return sf.read_state(cache, slice(None))          # commit replay folds the accepted prefix into it


def _ring_state(cache, family, backend, A):
    if family == "mamba2":
        from replayssm.mamba2.spec import spec_materialize
        return spec_materialize(cache, backend=backend, A=A)
    if family == "kda":
        from replayssm.kda.spec import spec_materialize as kda_spec_materialize
        return kda_spec_materialize(cache, backend=backend)
    from replayssm.gdn.spec import spec_materialize
    return spec_materialize(cache, backend=backend)


@dataclass(frozen=True)
class AccuracyMethod:
    """A harness method (experiments.harness.methods: allocate, set_state, step / verify + commit) and how to
    read its committed state [rows, *state_shape] back for the comparison with float64."""

    harness: str
    committed_state: Callable
    # state formats it runs (replayssm/state_format.py); every method's cache stores all of them on the torch / ref
    # backends (experiments/accuracy.py checks the backend), a new method may take the plain ones only
    formats: tuple[str, ...] = sf.PLAIN_FORMATS

    @property
    def entry(self):
        return REGISTRY[self.harness]


# name -> entry. Tests add a deliberately wrong method here (and its harness entry) to check detection.
METHODS: dict[str, AccuracyMethod] = {
    "baseline_ar": AccuracyMethod("baseline_ar", _tensor_state, formats=sf.FORMAT_NAMES),
    "replay_ar": AccuracyMethod("replay_ar", _replay_state, formats=sf.FORMAT_NAMES),
    "baseline_spec": AccuracyMethod("baseline_spec", _snapshot_state, formats=sf.FORMAT_NAMES),
    "commit_replay_spec": AccuracyMethod("commit_replay_spec", _checkpoint_state, formats=sf.FORMAT_NAMES),
    "replay_spec": AccuracyMethod("replay_spec", _ring_state, formats=sf.FORMAT_NAMES),
}


# -------------------------------------------------------------------------------------------- geometry

def few_heads(spec: ModelSpec, heads: int) -> ModelSpec:
    """The model with `heads` value heads (Mamba-2 nheads / GDN, KDA HV) of its real headdim/dstate or K/V.
    Mamba-2 keeps one group; GDN / KDA keep the model's HV/H ratio when `heads` allows it, else one key head."""
    g = spec.geometry
    if isinstance(g, Mamba2Geometry):
        geo = Mamba2Geometry(nheads=heads, headdim=g.headdim, dstate=g.dstate, ngroups=1)
    else:
        ratio = g.HV // g.H
        H = heads // ratio if heads >= ratio else 1
        geo = type(g)(H=H, HV=H * ratio if heads >= ratio else heads, K=g.K, V=g.V)   # GDN or KDA geometry
    return replace(spec, geometry=geo)


def checkpoints(n_steps: int, count: int) -> list[int]:
    """`count` log-spaced step indices in 1..n_steps (1-based, unique, n_steps always included), plus 1,000
    and 10,000 when in range (the bf16 table of experiments/report/accuracy.py reads those)."""
    pts = np.unique(np.round(np.geomspace(1, n_steps, max(count, 2))).astype(int))
    return sorted(set(int(p) for p in pts) | {n_steps} | {t for t in (1000, 10000) if t <= n_steps})


def per_head_err(out: torch.Tensor, ref: torch.Tensor) -> np.ndarray:
    """Relative L2 error per (row, head) in float64: out, ref [rows, heads, ...] -> [rows * heads].
    A non-finite value anywhere in a (row, head) gives inf."""
    o, r = out.detach().double().cpu().flatten(2), ref.detach().double().cpu().flatten(2)
    err = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-300)
    err = torch.where(torch.isfinite(o).all(-1), err, torch.full_like(err, math.inf))
    return err.flatten().numpy()


# ------------------------------------------------------------------------------------------- workloads

def make_workload(spec: ModelSpec, point: Point, workload: str, generator: torch.Generator) -> Workload:
    """The harness workload of the group, with the long-memory parameters when asked (Mamba-2)."""
    wl = Workload(spec, point, point.device, generator)
    if workload == "long_memory" and wl.family == "mamba2":
        h = wl.geometry.nheads
        A = -torch.exp(torch.empty(h).uniform_(math.log(0.05), math.log(0.5), generator=generator))
        dt0 = torch.exp(torch.empty(h).uniform_(math.log(1e-3), math.log(1e-2), generator=generator))
        wl.params["A"] = A.to(point.device)
        wl.params["dt_bias"] = (dt0 + torch.log(-torch.expm1(-dt0))).to(point.device)   # softplus^-1(dt0)
    return wl


def draw(wl: Workload, workload: str, rows: int, window: int | None = None) -> dict:
    """One step (or window) of inputs; GDN / KDA long memory redraws the log decay g (per head / per key channel)
    close to 0."""
    inp = wl.inputs(rows, window=window)
    if workload == "long_memory" and wl.family in ("gdn", "kda"):
        g = -torch.exp(torch.empty(inp["g"].shape).uniform_(math.log(1e-4), math.log(1e-2), generator=wl.generator))
        inp["g"] = g.to(device=wl.device, dtype=torch.float32)
    return inp


def with_state_dtype(wl: Workload, dtype) -> Workload:
    """The same workload (inputs, parameters, generator) allocating caches in another state format: a torch
    dtype or a replayssm/state_format.py name (`state_format` carries it to the harness's allocate; `state_dtype`
    is its storage dtype)."""
    fmt = sf.state_format(dtype)
    out = copy.copy(wl)
    out.state_dtype, out.state_format = fmt.storage, fmt.name
    return out


# ------------------------------------------------------------------------------------------ trajectories

@dataclass
class ARTrajectory:
    """inputs[t] (dicts), kwargs[t] (the public API's), y [steps, rows, heads, headdim] float64 and the truth
    state after token t at each checkpoint t (1-based)."""

    inputs: list[dict]
    kwargs: list[dict]
    y: torch.Tensor
    states: dict[int, torch.Tensor]


@dataclass
class SpecTrajectory:
    """windows[w] (dicts), kwargs[w], counts [W, rows] int32, y [W, rows, T, heads, headdim] float64, the truth
    committed state after window w at each checkpoint window (1-based) and committed tokens [W, rows]."""

    windows: list[dict]
    kwargs: list[dict]
    counts: torch.Tensor
    y: torch.Tensor
    states: dict[int, torch.Tensor]
    committed: np.ndarray


def ar_trajectory(wl: Workload, workload: str, S0: torch.Tensor, steps: int, ckpts: list[int]) -> ARTrajectory:
    rows = S0.shape[0]
    state, ys, states, inputs, kwargs = S0.double(), [], {}, [], []
    want = set(ckpts)
    for t in range(1, steps + 1):
        inp = draw(wl, workload, rows)
        state, y = wl.oracle_step(state, inp)
        inputs.append(inp)
        kwargs.append(wl.call_kwargs(inp))
        ys.append(y.cpu())
        if t in want:
            states[t] = state.cpu().clone()
    return ARTrajectory(inputs, kwargs, torch.stack(ys), states)


def spec_trajectory(wl: Workload, workload: str, S0: torch.Tensor, windows: int, T: int, counts: torch.Tensor,
                    ckpts: list[int]) -> SpecTrajectory:
    rows = S0.shape[0]
    state, ys, states, wins, kwargs = S0.double(), [], {}, [], []
    want = set(ckpts)
    idx = torch.arange(rows)
    for w in range(1, windows + 1):
        win = draw(wl, workload, rows, window=T)
        snaps, y = wl.oracle_window(state, win)
        state = snaps[idx.to(snaps.device), counts[w - 1].long().to(snaps.device) - 1]
        wins.append(win)
        kwargs.append(wl.call_kwargs(win))
        ys.append(y.cpu())
        if w in want:
            states[w] = state.cpu().clone()
    committed = counts.long().cumsum(0).numpy()
    return SpecTrajectory(wins, kwargs, counts, torch.stack(ys), states, committed)
