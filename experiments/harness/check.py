"""The correctness gate: before a point is timed, its method runs a few steps from a fresh cache on fresh
random inputs, and its outputs are compared with the float64 oracle (experiments/kernel/run.py).

    AR    steps = L + 1 for a method with a buffer (crosses the flush, then one step after it), else
          `check_ar_steps`; oracle = replayssm.<family>.ref step, chained in float64.
    spec  steps = B + 2 for the ring (reaches an early flush even at one accepted token per step), else
          `check_ar_steps`; accepted counts from the point's acceptance model; oracle = window_ref from
          the committed float64 state, which then advances by the accepted count of each row.

Outputs are poisoned (NaN) before every call, so a method that leaves rows unwritten fails. The error is
the relative RMSE over every output of every step (replayssm.testing.rel_err) against
replayssm.testing.tolerance(act_dtype, state_dtype). The gate runs on at most `max_batch` rows of the
point, with the point's slot layout, pool and cursor layout (experiments/harness/fixture.py: a staggered
batch is primed through the method's own steps, the oracle following), so the float64 oracle stays cheap at
serving batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from experiments.harness.acceptance import Acceptance
from experiments.harness.fixture import PointFixture
from experiments.harness.methods import Method
from experiments.harness.points import Point
from experiments.harness.workload import Workload
from replayssm.testing import rel_err, tolerance


@dataclass
class GateResult:
    rel_err: float
    tol: float
    steps: int
    rows: int

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tol

    def message(self) -> str:
        verdict = "passed" if self.ok else "FAILED"
        return (f"gate {verdict}: rel_err {self.rel_err:.2e} vs tol {self.tol:.0e} over {self.steps} steps x "
                f"{self.rows} rows")


def gate(method: Method, fns: dict, wl: Workload, p: Point, *, max_batch: int, ar_steps: int,
         acceptance: Acceptance | None = None) -> GateResult:
    """Run the gate for one point with the API functions `fns` (eager or compiled)."""
    rows = min(p.batch, max_batch)
    fx = PointFixture.build(method, fns, wl, p, rows, oracle=True)   # the point's pool and cursor layout
    cache, slots, ref_state = fx.caches[0], fx.slots, fx.ref_state
    steps = method.gate_steps(p, ar_steps)
    outs, refs = [], []
    if method.kind == "ar":
        for _ in range(steps):
            inp = wl.inputs(rows)
            out = wl.out(rows)
            y = method.step(fns, cache, p, wl.call_kwargs(inp), slots, out)
            ref_state, y_ref = wl.oracle_step(ref_state, inp)
            outs.append(y.detach().clone())
            refs.append(y_ref)
    else:
        counts = acceptance.sample(p.spec_T, rows, steps, wl.generator).to(wl.device)
        A = wl.params.get("A")
        for s in range(steps):
            win = wl.inputs(rows, window=p.spec_T)
            out = wl.out(rows, window=p.spec_T)
            y = method.verify(fns, cache, p, wl.call_kwargs(win), slots, out)
            method.commit(fns, cache, p, counts[s], slots, A)
            states, y_ref = wl.oracle_window(ref_state, win)
            ref_state = states[torch.arange(rows, device=states.device), counts[s].long().to(states.device) - 1]
            outs.append(y.detach().clone())
            refs.append(y_ref)
    err = rel_err(torch.stack(outs), torch.stack(refs))
    return GateResult(rel_err=err, tol=tolerance(wl.act_dtype, wl.state_dtype), steps=steps, rows=rows)
