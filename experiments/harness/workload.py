"""The inputs and float64 oracle of one point's SSM family, shared by every method of that family.

Mamba-2 (replayssm.mamba2.inputs / ref): per-layer parameters A, D, dt_bias [nheads] fp32; a step is
x, z [batch, nheads, headdim], dt [batch, nheads], B, C [batch, ngroups, dstate] (a T axis after batch for a
spec window); state [slots, nheads, headdim, dstate].
GDN (replayssm.gdn.inputs / ref): a step is q, k [batch, H, K], v [batch, HV, V], g, beta [batch, HV]
(T axis likewise); state [slots, HV, V, K] (K-last).
KDA (replayssm.kda.inputs / ref): as GDN, with the log decay g [batch, HV, K] per key channel.

Every method of a family gets the same inputs, parameters and slot mapping (the fairness rule).
"""

from __future__ import annotations

import torch

from experiments.harness.points import DTYPES, ModelSpec, Point
from replayssm import state_format as sf


def state_storage(name: str) -> torch.dtype:
    """The storage dtype of a point's state_dtype: a dtype name, or a state format's (replayssm/state_format.py)."""
    return sf.FORMATS[name].storage if name in sf.FORMATS else DTYPES[name]


class Workload:
    """Random inputs + oracle for one point. `generator` seeds everything drawn here (CPU draws, then moved)."""

    def __init__(self, spec: ModelSpec, point: Point, device: str, generator: torch.Generator):
        self.spec, self.family, self.geometry = spec, spec.family, spec.geometry
        self.device, self.generator = device, generator
        self.state_dtype, self.act_dtype = state_storage(point.state_dtype), DTYPES[point.act_dtype]
        if point.state_dtype in sf.FORMATS and not sf.FORMATS[point.state_dtype].plain:
            self.state_format = point.state_dtype      # the caches' allocate reads it (methods.state_spec)
        g = self.geometry
        if self.family == "mamba2":
            from replayssm.mamba2 import inputs, ref  # deferred: a family package loads its Triton kernels

            self._inputs, self._ref = inputs, ref
            prm = inputs.random_params(g, device=device, generator=generator)
            self.params = {"A": prm.A, "D": prm.D, "dt_bias": prm.dt_bias}
            self.state_shape = (g.nheads, g.headdim, g.dstate)
            self.out_shape = (g.nheads, g.headdim)
        else:
            if self.family == "gdn":
                from replayssm.gdn import inputs, ref
            else:
                from replayssm.kda import inputs, ref

            self._inputs, self._ref = inputs, ref
            self.params = {}
            self.state_shape = (g.HV, g.V, g.K)
            self.out_shape = (g.HV, g.V)

    # ------------------------------------------------------------------------------------------- inputs
    def inputs(self, batch: int, window: int | None = None) -> dict[str, torch.Tensor]:
        """One AR step (window=None) or one spec window of `window` tokens for `batch` rows."""
        if self.family == "mamba2":
            return self._inputs.random_step(self.geometry, batch, act_dtype=self.act_dtype, device=self.device,
                                            window=window, with_z=self.spec.has_z, generator=self.generator)
        return self._inputs.random_step(self.geometry, batch, act_dtype=self.act_dtype, device=self.device,
                                        window=window, use_qk_l2norm=self.spec.use_qk_l2norm,
                                        generator=self.generator)

    def random_state(self, num_slots: int, on_device: bool = False) -> torch.Tensor:
        """A prefill-like committed state [num_slots, *state_shape] in the state dtype, with the family's scale
        (replayssm.<family>.inputs.random_state: K^-0.5 for the delta rules, so ||S k|| is O(1)).

        on_device: drawn on the device from the global generator (a timed GPU stack of many layers, where a
        CPU draw of gigabytes would dominate the build); else from the workload's generator on the CPU."""
        # a non-plain format's state is drawn in float32 and quantised by the cache's set_state (its rule)
        dtype = torch.float32 if getattr(self, "state_format", None) else self.state_dtype
        if not on_device:
            return self._inputs.random_state(self.geometry, num_slots, dtype=dtype, device=self.device,
                                             generator=self.generator)
        std = 1.0 if self.family == "mamba2" else self.geometry.K ** -0.5
        state = torch.empty(num_slots, *self.state_shape, dtype=dtype, device=self.device)
        return state.normal_(0.0, std)

    def call_kwargs(self, inp: dict) -> dict:
        """Keyword arguments of the family's public API for these inputs (everything but cache/slots/out)."""
        if self.family == "mamba2":
            return dict(x=inp["x"], dt=inp["dt"], A=self.params["A"], B=inp["B"], C=inp["C"], D=self.params["D"],
                        z=inp.get("z"), dt_bias=self.params["dt_bias"], dt_softplus=self.spec.dt_softplus)
        return dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], scale=None,
                    use_qk_l2norm=self.spec.use_qk_l2norm)

    def out(self, batch: int, window: int | None = None) -> torch.Tensor:
        """An output buffer poisoned with NaN, so a method that skips part of it fails the gate."""
        lead = (batch,) if window is None else (batch, window)
        return torch.full((*lead, *self.out_shape), float("nan"), dtype=self.act_dtype, device=self.device)

    def slots(self, batch: int, num_slots: int, layout: str) -> torch.Tensor | None:
        """Rows -> slots: None (identity, the methods' fast path) or a random permutation of the pool."""
        if layout == "identity" and batch == num_slots:
            return None
        perm = torch.randperm(num_slots, generator=self.generator)[:batch]
        return perm.to(device=self.device, dtype=torch.int32)

    # ------------------------------------------------------------------------------------------- oracle
    def oracle_step(self, state64: torch.Tensor, inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(new state, output) in float64 for one AR step of rows whose states are `state64`."""
        if self.family == "mamba2":
            p = self.params
            return self._ref.ssm_step_ref(state64, inp["x"], inp["dt"], p["A"], inp["B"], inp["C"], p["D"],
                                          inp.get("z"), p["dt_bias"], self.spec.dt_softplus)
        step = self._ref.gdn_step_ref if self.family == "gdn" else self._ref.kda_step_ref
        S, o, _ = step(state64, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], None,
                    self.spec.use_qk_l2norm)
        return S, o

    def oracle_window(self, state64: torch.Tensor, win: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(states after each window token [batch, T, ...], outputs [batch, T, ...]) in float64."""
        if self.family == "mamba2":
            p = self.params
            return self._ref.window_ref(state64, win["x"], win["dt"], p["A"], win["B"], win["C"], p["D"],
                                        win.get("z"), p["dt_bias"], self.spec.dt_softplus)
        return self._ref.window_ref(state64, win["q"], win["k"], win["v"], win["g"], win["beta"], None,
                                    self.spec.use_qk_l2norm)
