"""State-safe launch-config tuning of one kernel at one geometry (any kernel that resolves through
replayssm/launch_table.py: ReplaySSM and baselines alike, one procedure and one budget for both).

Triton's autotuner cannot be used: it re-runs a kernel that writes its state (or ring, or stash) in place, so
every trial after the first would start from a state the previous one changed. Here the caller names every
tensor a call may write (`touched`: the cache's tensors, the output buffer), and

    trials = tune("mamba2_ssu_ar", call, touched, candidates)     # call() -> the outputs to compare
    best(trials).config                                             # -> the device table's entry

1. snapshots `touched`, runs `call` once under the default config (launch_table.use_defaults) and keeps its
   outputs and the written tensors as the reference, then restores the snapshot;
2. per candidate, from the snapshot: runs `call` once under `launch_table.override(kernel, candidate)` (any
   other kernel the call launches at its default) and
   checks outputs and every touched tensor against the reference (relative error within `tol`, the same NaN
   positions, integers exact): a config that computes something else is rejected, never timed;
3. restores the snapshot and times the candidate with `timer(fn)` (default: triton.testing.do_bench, cold L2
   between repetitions; milliseconds). Timed repetitions continue the state the way decoding does (each a
   real step on what the previous one left: the same work per call; a replay cursor cycles through its
   buffer, so flushes are timed at their own rate); then the snapshot is restored.

So no kernel ever runs twice from a state a previous trial changed, and every touched tensor is bit-for-bit
what it was when tuning ends (also after a candidate that raised). The default config is timed too (as the
first trial) so the table can record the gain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from replayssm import launch_table

WARMUP_MS, REP_MS = 5, 20      # the budget of one timed candidate (do_bench), the same for every kernel


@dataclass
class Trial:
    config: object
    ms: float | None = None          # None: rejected or failed (see error)
    error: str = ""
    is_default: bool = False


def do_bench(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS))


def _outputs(value) -> list[torch.Tensor]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for t in value if isinstance(t, torch.Tensor)]


def mismatch(out: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """'' when `out` matches `ref` (integers and bools exactly; floats: the same NaN positions and a relative
    RMSE over the rest within `tol`), else why not."""
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not out.dtype.is_floating_point:
        return "" if torch.equal(out, ref) else "integer tensor differs"
    a, b = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return "NaN positions differ"
    a, b = torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)
    if not torch.isfinite(a).all():
        return "non-finite values"
    denom = b.norm().item()
    err = (a - b).norm().item() / (denom if denom > 0 else 1.0)
    return "" if err <= tol else f"relative error {err:.2e} > {tol:.0e}"


class Snapshot:
    """Clones of every touched tensor; `restore()` copies them back in place."""

    def __init__(self, touched: Sequence[torch.Tensor]):
        self.touched = list(touched)
        self.saved = [t.clone() for t in self.touched]

    def restore(self) -> None:
        for t, s in zip(self.touched, self.saved):
            t.copy_(s)


def tune(kernel: str, call: Callable[[], object], touched: Sequence[torch.Tensor], candidates: Sequence,
         timer: Callable[[Callable[[], object]], float] | None = None, tol: float = 1e-4,
         time_default: bool = True) -> list[Trial]:
    """One Trial per candidate (in order), preceded by the default's when `time_default`; see the module
    docstring. `call()` runs the kernel's public entry once and returns its output tensor(s)."""
    timer = timer or do_bench
    snap = Snapshot(touched)
    try:
        with launch_table.use_defaults():
            ref_out = [t.clone() for t in _outputs(call())]
        ref_state = [t.clone() for t in snap.touched]
        snap.restore()
        trials = []
        if time_default:
            trial = Trial(None, is_default=True)
            try:
                with launch_table.use_defaults():
                    trial.ms = timer(call)
            finally:
                snap.restore()
            trials.append(trial)
        for cfg in candidates:
            trial = Trial(cfg)
            try:
                # every other kernel of the call keeps its default (use_defaults), as in the reference run
                with launch_table.use_defaults(), launch_table.override(kernel, cfg):
                    outs = _outputs(call())
                    why = next((f"{name}: {w}" for name, w in
                                [(f"output {i}", mismatch(o, r, tol)) for i, (o, r) in enumerate(zip(outs, ref_out))]
                                + [(f"state {i}", mismatch(t, r, tol)) for i, (t, r) in
                                   enumerate(zip(snap.touched, ref_state))] if w), "")
                    if why:
                        trial.error = f"differs from the default config: {why}"
                    else:
                        snap.restore()
                        trial.ms = timer(call)
            except Exception as exc:  # a candidate that does not build or run is a finding, not a crash
                trial.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            finally:
                snap.restore()
            trials.append(trial)
        return trials
    finally:
        snap.restore()


def best(trials: list[Trial]) -> Trial:
    """The fastest candidate trial that ran (the default's trial is a reference, not a candidate); ValueError
    when none did."""
    ran = [t for t in trials if t.ms is not None and not t.is_default]
    if not ran:
        raise ValueError("no candidate ran: " + "; ".join(f"{t.config}: {t.error}" for t in trials
                                                          if not t.is_default))
    return min(ran, key=lambda t: t.ms)


def default_ms(trials: list[Trial]) -> float | None:
    return next((t.ms for t in trials if t.is_default), None)
