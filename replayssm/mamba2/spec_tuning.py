"""State-safe tile tuning of the Mamba-2 spec verify kernels (the space: spec_kernels.spec_tile_candidates).

Triton's autotuner cannot be used: it re-runs a kernel that writes the ring and, on flush rows, the
checkpoint in place, so every trial after the first would start from a state the previous one changed. Here
each trial runs from a snapshot of everything a verify touches (checkpoint, ring x / B / dt, bc scratch, the
cursors) and puts it back afterwards, so the ring is bit-for-bit what it was when tuning ends:

    trials = tune_spec_tiles(ring, inputs, slots=slots)           # inputs: spec_verify's x, dt, A, B, C, ...
    best(trials).config                                            # -> spec_kernels.TUNED_SPEC_TILES entry

A trial first checks its outputs and folded checkpoint against the default config's (relative error within
the fp32 tolerance: a tile that computes something else is rejected, not timed), then times verify with
`timer` (default: triton.testing.do_bench, milliseconds; repeated runs refold flush rows, the same work).
scripts/kernels/tune_spec_tiles.py runs it on a GPU for every production geometry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from replayssm.mamba2 import spec
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_kernels import SpecLaunchConfig, spec_tile_candidates, use_spec_tiles
from replayssm.testing import rel_err, tolerance

# Every ring field a verify may write (state on flush rows, the window's ring rows, bc); the cursors are not
# written by verify but are restored too, so a trial can never leave a moved cursor behind.
TOUCHED = ("state", "x", "B", "dt", "bc", "write_pos", "origin", "is_flush")


@dataclass
class Trial:
    config: SpecLaunchConfig
    ms: float | None = None          # None: rejected or failed (see error)
    error: str = ""


def _do_bench(fn: Callable[[], None]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=20))


class _Snapshot:
    def __init__(self, ring: SpecRing):
        self.ring = ring
        self.saved = {name: getattr(ring, name).clone() for name in TOUCHED}

    def restore(self) -> None:
        for name, t in self.saved.items():
            getattr(self.ring, name).copy_(t)


def tune_spec_tiles(ring: SpecRing, inputs: dict, slots: torch.Tensor | None = None,
                    candidates: list[SpecLaunchConfig] | None = None,
                    timer: Callable[[Callable[[], None]], float] | None = None) -> list[Trial]:
    """Time spec_verify(ring, **inputs) under each candidate (default: the geometry's tile space); every
    trial starts from, and leaves, the ring as it was. Returns one Trial per candidate, in order."""
    geo = ring.geometry
    candidates = spec_tile_candidates(geo.headdim, ring.window) if candidates is None else candidates
    timer = timer or _do_bench
    snap = _Snapshot(ring)
    tol = tolerance(ring.act_dtype, ring.state_dtype, torch.float32)
    try:
        ref_out = spec.spec_verify(ring, **inputs, slots=slots)
        ref_state = ring.state.clone()
        snap.restore()
        trials = []
        for cfg in candidates:
            trial = Trial(cfg)
            try:
                with use_spec_tiles(cfg):
                    out = spec.spec_verify(ring, **inputs, slots=slots)
                    err = max(rel_err(out, ref_out), rel_err(ring.state, ref_state))
                    if err > tol:
                        trial.error = f"differs from the default config: relative error {err:.2e} > {tol:.0e}"
                    else:
                        snap.restore()
                        trial.ms = timer(lambda out=out: spec.spec_verify(ring, **inputs, slots=slots, out=out))
            except Exception as exc:  # a candidate that does not build or run is a finding, not a crash
                trial.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            finally:
                snap.restore()
            trials.append(trial)
        return trials
    finally:
        snap.restore()


def best(trials: list[Trial]) -> Trial:
    """The fastest trial that ran; ValueError when none did."""
    ran = [t for t in trials if t.ms is not None]
    if not ran:
        raise ValueError("no tile candidate ran: " + "; ".join(f"{t.config.label}: {t.error}" for t in trials))
    return min(ran, key=lambda t: t.ms)
