"""State-safe tile tuning of the Mamba-2 spec verify kernels (the space: spec_kernels.spec_tile_candidates), a
thin front of the generic tuner replayssm/tuning.py for kernel "mamba2_replay_spec":

    trials = tune_spec_tiles(ring, inputs, slots=slots)           # inputs: spec_verify's x, dt, A, B, C, ...
    best(trials).config                                            # -> the device table's mamba2_replay_spec entry

Each trial runs from a snapshot of everything a verify touches (checkpoint, ring x / B / dt, bc scratch, the
cursors: TOUCHED), is checked against the default config's outputs and folded checkpoint (relative error
within the fp32 tolerance), then timed with `timer` (default: triton.testing.do_bench); the ring is bit-for-bit
what it was when tuning ends. experiments/tune.py tunes every kernel this way and writes the device table; this
front keeps the ring-level entry point (a ring and spec_verify's inputs, no harness) for tests and notebooks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from replayssm import tuning
from replayssm.mamba2 import spec
from replayssm.mamba2.cache import SpecRing
from replayssm.mamba2.spec_kernels import SpecLaunchConfig, spec_tile_candidates
from replayssm.testing import tolerance
from replayssm.tuning import Trial

# Every ring field a verify may write (state on flush rows, the window's ring rows, bc); the cursors are not
# written by verify but are restored too, so a trial can never leave a moved cursor behind.
TOUCHED = ("state", "x", "B", "dt", "bc", "write_pos", "origin", "is_flush")
KERNEL = "mamba2_replay_spec"


def tune_spec_tiles(ring: SpecRing, inputs: dict, slots: torch.Tensor | None = None,
                    candidates: list[SpecLaunchConfig] | None = None,
                    timer: Callable[[Callable[[], None]], float] | None = None) -> list[Trial]:
    """Time spec_verify(ring, **inputs) under each candidate (default: the geometry's tile space); every
    trial starts from, and leaves, the ring as it was. Returns one Trial per candidate, in order."""
    candidates = spec_tile_candidates(ring.geometry.headdim, ring.window) if candidates is None else candidates
    tol = tolerance(ring.act_dtype, ring.state_dtype, torch.float32)
    return tuning.tune(KERNEL, lambda: spec.spec_verify(ring, **inputs, slots=slots),
                       [getattr(ring, name) for name in TOUCHED], candidates, timer=timer, tol=tol,
                       time_default=False)


def best(trials: list[Trial]) -> Trial:
    """The fastest trial that ran; ValueError when none did."""
    try:
        return tuning.best(trials)
    except ValueError as exc:
        raise ValueError(str(exc).replace("no candidate ran", "no tile candidate ran")) from None
